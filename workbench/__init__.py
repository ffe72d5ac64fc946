"""pipeline-workbench: profile a model, partition it PipeDream-style, build any training schedule,
simulate it and run it for real with torch.distributed.

    model --profile()--> Profile --partition(topology)--> Plan --schedules.build()--> Schedule
          --simulate()--> Timeline (modeled)    --runtime.train()--> Timeline (measured)

``import workbench`` does not import torch; :func:`profile` and the runtime do, when called.
"""
from .plan import Plan, Stage
from .profiler import Profile, profile, project
from .topology import Topology
# The functions shadow their same-named submodules on purpose (``workbench.partition(...)``);
# import submodule contents with ``from workbench.partition import ...``.
from .partition import partition  # noqa: E402
from .simulate import SimResult, simulate  # noqa: E402
from . import schedules  # noqa: E402

__version__ = "0.1.0"

__all__ = ["Plan", "Stage", "Profile", "profile", "project", "Topology", "partition", "simulate", "SimResult",
           "schedules"]

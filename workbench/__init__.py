"""pipeline-workbench: profile a model, partition it PipeDream-style, build any training schedule,
simulate it and run it for real with torch.distributed.

    model --profile()--> Profile --partition(topology)--> Plan --schedules.build()--> Schedule
          --simulate()--> Timeline (modeled)    --runtime.train()--> Timeline (measured)
"""
from .plan import Plan, Stage
from .profiler import Profile

__version__ = "0.1.0"


def __getattr__(name):  # lazy: keep `import workbench` light (no torch import)
    if name == "partition":
        from .partition import partition
        return partition
    if name == "Topology":
        from .topology import Topology
        return Topology
    if name == "simulate":
        from .simulate import simulate
        return simulate
    if name == "profile":
        from .profiler import profile
        return profile
    raise AttributeError(f"module 'workbench' has no attribute {name!r}")


__all__ = ["Plan", "Stage", "Profile", "partition", "Topology", "simulate", "profile"]

"""pipeline-workbench: profile a model, partition it PipeDream-style, build any training schedule,
simulate it and run it for real with torch.distributed.

    model --profile()--> Profile --partition(topology)--> Plan --schedules.build()--> Schedule
          --simulate()--> Timeline (modeled)    --runtime.train()--> Timeline (measured)

The package's folders are the steps of that flow, and imports run down this list, never back up
(tests/test_import_graph.py checks the order):

    io/            what every step writes and shows: safe result folders, result cards, the timeline schema
    models/        the model zoo and the offline data sets
    profiling/     measure a model (Profile), split any nn.Module, import PipeDream's graph.txt, roofline
    cost/          the one cost model and what it prices: Topology, Plan
    schedules/     generators -> Schedule (per-worker op lists + weight versions); registry
    simulation/    discrete-event simulator: Schedule + cost model -> modeled Timeline
    partitioning/  PipeDream's dynamic program and optimizer (pure), refinement by simulation above them
    runtime/       launch, execution, transport, executors; this machine's calibration
    viz/           plotly timelines, Perfetto traces, ipywidgets tools
    cli/           the ``workbench`` command

The PipeDream reproduction is not part of the library: it lives beside the notebooks
(``notebooks/repro/``, import name ``repro``), imports only public names of this package and adds
``workbench reproduce`` as a plugin of the command.

Folders are nouns and the public functions verbs (``profile``, ``partition``, ``simulate``), so no
function shares its name with a module. ``import workbench`` imports nothing heavy (no torch, no
pandas): each name below, and each floor (``workbench.runtime``), is imported on first use (PEP 562), so
that ``workbench --help`` starts fast.
"""

from __future__ import annotations

import importlib
import pkgutil

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS = {
    "Plan": "workbench.cost.plan",
    "Stage": "workbench.cost.plan",
    "Topology": "workbench.cost.topology",
    "CostOptions": "workbench.cost.model",
    "Profile": "workbench.profiling.table",
    "profile": "workbench.profiling.measure",
    "project": "workbench.profiling.measure",
    "partition": "workbench.partitioning.search",
    "PartitionOptions": "workbench.partitioning.options",
    "simulate": "workbench.simulation",
    "SimOptions": "workbench.simulation",
    "SimResult": "workbench.simulation",
    "schedules": None,
}

__all__ = list(_EXPORTS)


def _floors() -> list[str]:
    """The package's floors (its sub-packages), each an attribute too: ``workbench.runtime.train``."""
    return [m.name for m in pkgutil.iter_modules(__path__) if m.ispkg]


def __getattr__(name: str):
    if name not in _EXPORTS and name not in _floors():
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    module = _EXPORTS.get(name)
    value = importlib.import_module(f"workbench.{name}" if module is None else module)
    if module is not None:
        value = getattr(value, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS) | set(_floors()))

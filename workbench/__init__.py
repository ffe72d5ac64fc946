"""pipeline-workbench: profile a model, partition it PipeDream-style, build any training schedule,
simulate it and run it for real with torch.distributed.

    model --profile()--> Profile --partition(topology)--> Plan --schedules.build()--> Schedule
          --simulate()--> Timeline (modeled)    --runtime.train()--> Timeline (measured)

``import workbench`` imports nothing heavy (no torch, no pandas): each name below is imported on
first use (PEP 562), so that the ``workbench`` command starts fast (``workbench --help``).
"""

from __future__ import annotations

import importlib
import sys
import types

__version__ = "0.1.0"

#: public name -> the module that defines it
_EXPORTS = {
    "Plan": ".plan",
    "Stage": ".plan",
    "Profile": ".profiler",
    "profile": ".profiler",
    "project": ".profiler",
    "Topology": ".topology",
    "partition": ".partition",
    "PartitionOptions": ".partition",
    "simulate": ".simulate",
    "SimOptions": ".simulate",
    "CostOptions": ".costmodel",
    "SimResult": ".simulate",
    "schedules": None,
}
#: functions that share their name with a submodule (``workbench.partition(...)``): the package
#: attribute stays the function even after ``import workbench.partition`` (the import system sets
#: the submodule as the package's attribute; :class:`_Package` keeps the function instead). Import
#: submodule contents with ``from workbench.partition import ...``.
_SHADOWED = ("partition", "simulate")

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    module = _EXPORTS[name]
    value = importlib.import_module(f".{name}" if module is None else module, __name__)
    if module is not None:
        value = getattr(value, name)
    setattr(sys.modules[__name__], name, value)
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))


class _Package(types.ModuleType):
    def __setattr__(self, name, value):
        if name in _SHADOWED and isinstance(value, types.ModuleType):
            value = getattr(value, name)  # the function of the submodule that bears its name
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

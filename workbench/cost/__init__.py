"""The one cost model and what it prices: the topology (levels of links), the plan (stages and
replicas) and the model that charges each operation. ``import workbench.cost`` imports nothing
else: each name below is imported on first use (PEP 562)."""

from __future__ import annotations

import importlib

#: public name -> the module that defines it
_EXPORTS = {
    "Plan": "workbench.cost.plan",
    "Stage": "workbench.cost.plan",
    "Topology": "workbench.cost.topology",
    "GBPS": "workbench.cost.topology",
    "CostModel": "workbench.cost.model",
    "CostOptions": "workbench.cost.model",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))

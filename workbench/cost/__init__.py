"""The one cost model and what it prices: the topology (levels of links), the plan (stages and
replicas) and the model that charges each operation. ``import workbench.cost`` imports nothing
else: each name below is imported on first use (PEP 562)."""

from __future__ import annotations

from workbench.io.lazy import lazy_exports

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

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

"""Measure a model (:mod:`.measure`), split any ``nn.Module`` (:mod:`.layering`), the Profile type
(:mod:`.table`) and the readers of other formats, registered here so that ``Profile.from_pipedream``
works whichever module was imported first. The names below are imported on first use (PEP 562)."""

from __future__ import annotations

import workbench.profiling.pipedream  # noqa: F401  (registers the graph.txt reader with the Profile type)
from workbench.io.lazy import lazy_exports

#: public name -> the module that defines it
_EXPORTS = {
    "Profile": "workbench.profiling.table",
    "analyze": "workbench.profiling.measure",
    "project": "workbench.profiling.measure",
    "threads_per_rank": "workbench.profiling.measure",
    "GPUS": "workbench.profiling.measure",
    "SHIPPED": "workbench.profiling.pipedream",
    "shipped": "workbench.profiling.pipedream",
    "authors_batch": "workbench.profiling.pipedream",
    "authors_config": "workbench.profiling.pipedream",
    "profiled_batch": "workbench.profiling.pipedream",
}

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

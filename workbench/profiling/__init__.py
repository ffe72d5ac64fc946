"""Measure a model (:mod:`.measure`), split any ``nn.Module`` (:mod:`.layering`), the Profile type
(:mod:`.table`) and the readers of other formats, registered here so that ``Profile.from_pipedream``
works whichever module was imported first. The names below are imported on first use (PEP 562)."""

from __future__ import annotations

import importlib

import workbench.profiling.pipedream  # noqa: F401  (registers the graph.txt reader with the Profile type)

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


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))

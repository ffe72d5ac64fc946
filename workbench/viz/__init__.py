"""Plotly timelines, Perfetto traces, ipywidgets tools. ``import workbench.viz`` imports nothing
else (no plotly): each name below is imported on first use (PEP 562)."""

from __future__ import annotations

import importlib

#: public name -> the module that defines it
_EXPORTS = {
    "PALETTE": "workbench.viz.plot",
    "compare_figure": "workbench.viz.plot",
    "timeline_figure": "workbench.viz.plot",
    "save_html": "workbench.viz.plot",
    "plotlyjs_source": "workbench.viz.plot",
    "SHARED_PLOTLYJS_ENV": "workbench.viz.plot",
    "write_shared_plotlyjs": "workbench.viz.plot",
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

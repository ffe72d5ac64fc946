"""Plotly timelines, Perfetto traces, ipywidgets tools. ``import workbench.viz`` imports nothing
else (no plotly): each name below is imported on first use (PEP 562)."""

from __future__ import annotations

from workbench.io.lazy import lazy_exports

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

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

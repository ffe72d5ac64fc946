"""What every step writes and shows: safe result folders, result cards, the timeline schema.
``import workbench.io`` imports nothing else: each name below is imported on first use (PEP 562)."""

from __future__ import annotations

from workbench.io.lazy import lazy_exports

#: public name -> the module that defines it
_EXPORTS = {
    "fresh_path": "workbench.io.folders",
    "run_folder": "workbench.io.folders",
    "run_id": "workbench.io.folders",
    "lazy_exports": "workbench.io.lazy",
}

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

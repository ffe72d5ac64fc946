"""What every step writes and shows: safe result folders, result cards, the timeline schema.
``import workbench.io`` imports nothing else: each name below is imported on first use (PEP 562)."""

from __future__ import annotations

import importlib

#: public name -> the module that defines it
_EXPORTS = {
    "fresh_path": "workbench.io.folders",
    "run_folder": "workbench.io.folders",
    "run_id": "workbench.io.folders",
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

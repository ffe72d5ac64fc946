"""Names of a package imported on first use (PEP 562): importing the package imports none of the
modules that define them, so ``workbench --help`` and ``import workbench`` stay light.

A package declares ``{public name: defining module}`` once and takes both module hooks::

    __getattr__, __dir__ = lazy_exports(__name__, {"Plan": "workbench.cost.plan", "schedules": None})

A module given as None means the name is the package's submodule of that name.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str | None]) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``package``: its public name ``n`` is imported from the module
    ``exports[n]`` (absolute, or relative to ``package``) when first read, then kept in the package;
    an unknown name is an ``AttributeError`` naming the package."""

    def __getattr__(name: str):
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = exports[name]
        if module is None:
            value = importlib.import_module(f"{package}.{name}")
        else:
            value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports))

    return __getattr__, __dir__

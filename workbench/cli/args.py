"""Command-line arguments built from the run options' one declaration (the fields of
:mod:`workbench.runtime.launch.jobspec`): ``workbench train`` takes every option with ``cli`` metadata,
``workbench simulate`` the schedule's two. Only argparse calls: building a parser imports neither
torch nor pandas."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import Field
from typing import Any

from workbench.runtime.launch.jobspec import cli_fields

_TYPES = {"int": int, "float": float, "str": str}


def flag_of(f: Field, meta: dict[str, Any]) -> str:
    """The flag of run option ``f``: its metadata's ``flag``, else ``--`` and its name with dashes."""
    return meta.get("flag") or "--" + f.name.replace("_", "-")


def add_option_argument(
    p: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup,
    f: Field,
    meta: dict[str, Any],
    option_type: Callable[[str], tuple],
) -> None:
    """The flag of run option ``f`` (``dest`` its name): a bool is a switch (``negate``: the flag
    sets False), a ``key_value`` mapping a repeatable ``KEY=VALUE`` parsed by ``option_type``, any
    other a value of the field's type (its annotation's, or the metadata's ``type``)."""
    flag = flag_of(f, meta)
    metavar = meta.get("metavar") or flag[2:].upper().replace("-", "_")
    kw: dict[str, Any] = dict(dest=f.name, help=meta.get("help"))
    annotation = str(f.type).replace(" | None", "")
    if annotation == "bool":
        kw.update(action="store_false" if meta.get("negate") else "store_true")
    elif meta.get("key_value"):
        kw.update(type=option_type, action="append", default=[], metavar=metavar)
    else:
        choices = meta.get("choices")
        kw.update(type=meta.get("type") or _TYPES[annotation], default=f.default, metavar=metavar)
        if choices is not None:
            kw.update(choices=choices() if callable(choices) else choices)
    p.add_argument(flag, **kw)


def add_run_option_arguments(p: argparse.ArgumentParser, option_type: Callable[[str], tuple]) -> None:
    """One flag per run option with ``cli`` metadata; options of one ``exclusive`` group exclude
    each other."""
    groups: dict[str, argparse._MutuallyExclusiveGroup] = {}
    for f, meta in cli_fields():
        name = meta.get("exclusive")
        if name and name not in groups:
            groups[name] = p.add_mutually_exclusive_group()
        add_option_argument(groups[name] if name else p, f, meta, option_type)


def add_schedule_arguments(p: argparse.ArgumentParser, option_type: Callable[[str], tuple]) -> None:
    """``--schedule NAME`` and the repeatable ``--schedule-option KEY=VALUE`` (the run options
    ``schedule`` and ``schedule_options``), each option parsed by ``option_type`` into a (key, value)
    pair."""
    for f, meta in cli_fields():
        if f.name in ("schedule", "schedule_options"):
            add_option_argument(p, f, meta, option_type)


FLAT_WORKERS, FLAT_BANDWIDTH = 4, 10e9  # the flat topology when neither --topology nor --workers is given

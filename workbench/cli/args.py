"""Command-line arguments that ``workbench simulate`` and ``workbench train`` both take, declared
once. Only argparse calls: building a parser imports neither torch nor pandas."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def add_schedule_arguments(p: argparse.ArgumentParser, option_type: Callable[[str], tuple]) -> None:
    """``--schedule NAME`` and the repeatable ``--schedule-option KEY=VALUE``, each parsed by
    ``option_type`` into a (key, value) pair."""
    p.add_argument("--schedule", default="pipedream", help="schedule name (`workbench schedules` lists them)")
    p.add_argument(
        "--schedule-option",
        type=option_type,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="schedule option, e.g. chunks=2 (repeatable; `workbench schedules` lists them)",
    )

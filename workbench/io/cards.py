"""Jupyter manners shared by every result object: one-line ``__repr__`` and a short HTML card.

Every object a notebook displays (Profile, Plan, Schedule, SimResult, run results) renders through
:func:`card`: a title, a two-column table of key figures *with units*, an optional label line
(measured where / modeled from what) and an optional small DataFrame. Nothing here computes a
figure; callers pass the numbers they already hold, so a number shown here is the same number the
object reports elsewhere.
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence

import pandas as pd

Row = tuple[str, object, str]  # (name, value, unit)


def fmt(value, unit: str = "") -> str:
    """Format a number with 4 significant digits and its unit; strings pass through."""
    if isinstance(value, bool) or value is None:
        text = str(value)
    elif isinstance(value, int):
        text = f"{value:,}"
    elif isinstance(value, float):
        text = "n/a" if not math.isfinite(value) else f"{value:.4g}"
    else:
        text = str(value)
    return f"{text} {unit}".strip()


def one_line(kind: str, rows: Iterable[Row]) -> str:
    """``Kind(name=value unit, ...)``: the ``__repr__`` of a result object."""
    return f"{kind}(" + ", ".join(f"{n}={fmt(v, u)}" for n, v, u in rows) + ")"


def card(
    title: str,
    rows: Sequence[Row],
    label: str | None = None,
    table: pd.DataFrame | None = None,
    max_rows: int = 12,
    *,
    extra_html: str = "",
) -> str:
    """A compact HTML card: title, key figures with units, label, and the first rows of ``table``."""
    body = "".join(
        f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(n)}</th>"
        f"<td style='text-align:right'>{html.escape(fmt(v, u))}</td></tr>"
        for n, v, u in rows
    )
    parts = [f"<div class='workbench-card'><b>{html.escape(title)}</b>", f"<table style='margin:4px 0'>{body}</table>"]
    if label:
        parts.append(f"<div style='color:#555;font-size:90%'>{html.escape(label)}</div>")
    if table is not None and len(table):
        shown = table.head(max_rows)
        parts.append(shown.to_html(float_format=lambda x: f"{x:.4g}", border=0))
        if len(table) > max_rows:
            parts.append(f"<div style='color:#555;font-size:90%'>… {len(table) - max_rows} more rows</div>")
    parts.append(extra_html)
    parts.append("</div>")
    return "".join(parts)

"""Output helpers of notebooks 03 and 04: several figures in one standalone page, slim run folders,
and run folders' timelines with their times rounded for the reader (:func:`round_run_timelines`)."""

from __future__ import annotations

import html
import io
import os
import re
import shutil
from pathlib import Path

import pandas as pd

from workbench.viz import plotlyjs_source

#: decimals of ms a run folder's timeline CSVs keep (0.1 µs), once every number has been computed
TIME_DECIMALS = 4
TIMELINE_FILES = ("timeline.csv", "timeline_modeled.csv")


def save_page(figs: dict, path, title: str) -> Path:
    """Several plotly figures in one standalone HTML page that works offline: plotly.js embedded once,
    or loaded from the run's shared ``plotly.min.js`` when ``workbench reproduce`` provides one
    (:func:`workbench.viz.plot.plotlyjs_source`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    source = plotlyjs_source(path)
    parts = [
        f.to_html(full_html=False, include_plotlyjs=source if i == 0 else False) for i, f in enumerate(figs.values())
    ]
    path.write_text(
        f"<html><head><meta charset='utf-8'><title>{html.escape(title)}</title></head><body>"
        f"<h2>{html.escape(title)}</h2>" + "".join(parts) + "</body></html>"
    )
    return path


def slim_runs(summaries, drop=("checkpoints",)) -> None:
    """Remove bulky parts of finished run folders that are not results (resume checkpoints: weights
    per epoch; for training-curve runs also the per-op ``timeline.csv``); metrics.csv and summary.json stay."""
    for s in summaries:
        for name in drop:
            p = Path(s["out"]) / name
            shutil.rmtree(p, ignore_errors=True) if p.is_dir() else p.unlink(missing_ok=True)


def time_columns(timeline: pd.DataFrame) -> list[str]:
    """The float columns of a timeline that hold times in ms: ``start``, ``end`` and every ``*_ms`` /
    ``*_at`` (``wait_ms``, ``send_ms``, ``data_ms``, ``send_at``); ids, counters and ``bytes`` are not."""
    return [
        c
        for c in timeline.columns
        if (c in ("start", "end") or str(c).endswith(("_ms", "_at"))) and pd.api.types.is_float_dtype(timeline[c])
    ]


def rounded_times(timeline: pd.DataFrame, decimals: int = TIME_DECIMALS) -> pd.DataFrame:
    """A copy of ``timeline`` with its :func:`time_columns` rounded to ``decimals`` (default 0.1 µs
    on ms): what is written for the reader, never what a number is computed from."""
    return timeline.assign(**{c: timeline[c].round(decimals) for c in time_columns(timeline)})


def round_timeline_csv(path, decimals: int = TIME_DECIMALS) -> tuple[int, int]:
    """Rewrite the timeline CSV ``path`` with :func:`rounded_times`, every other column as it was
    (floats read back exactly; missing values and line ends spelt as the file spelt them: the runtime
    writes ``nan`` and ``\\r\\n`` (:mod:`csv`), pandas an empty field and ``\\n``); atomic.
    Returns its size in bytes (before, after)."""
    path = Path(path)
    raw = path.read_bytes().decode("utf-8")
    na = "nan" if re.search(r"(^|,)nan(,|\r?$)", raw, re.M) else ""
    eol = "\r\n" if "\r\n" in raw else "\n"
    text = rounded_times(pd.read_csv(io.StringIO(raw)), decimals).to_csv(index=False, na_rep=na, lineterminator=eol)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(text.encode("utf-8"))
    os.replace(tmp, path)
    return len(raw.encode("utf-8")), len(text.encode("utf-8"))


def round_run_timelines(summaries, names=TIMELINE_FILES, decimals: int = TIME_DECIMALS) -> tuple[int, int]:
    """:func:`round_timeline_csv` on each of ``names`` present in each finished run's folder (call it
    once the runs' numbers are computed). Returns the total bytes (before, after)."""
    before = after = 0
    for s in summaries:
        for name in names:
            p = Path(s["out"]) / name
            if p.exists():
                b, a = round_timeline_csv(p, decimals)
                before, after = before + b, after + a
    return before, after

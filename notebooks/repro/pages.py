"""Output helpers of notebooks 03 and 04: several figures in one standalone page, and slim run folders."""

from __future__ import annotations

import html
import shutil
from pathlib import Path

from workbench.viz import plotlyjs_source


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

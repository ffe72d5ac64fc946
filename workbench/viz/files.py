"""A modeled run's files: the timeline as CSV, its metrics, its plotly page and its Perfetto trace."""

from __future__ import annotations

import json
from pathlib import Path

from workbench.io.folders import json_ready, run_folder
from workbench.simulation import SimResult
from workbench.viz.plot import save_html, timeline_figure
from workbench.viz.trace import to_chrome_trace


def save_simulation(result: SimResult, directory) -> Path:
    """Write ``timeline.csv``, ``metrics.json``, ``timeline.html`` and ``trace.json`` (Perfetto,
    :mod:`workbench.viz.trace`) of ``result`` into a new folder ``directory`` (or ``directory-2``, ...
    when it exists: nothing earlier is overwritten); the files are written to a temporary folder
    first and moved into place. Returns the folder."""
    name = result.schedule.name
    with run_folder(directory) as d:
        result.timeline.to_csv(d / "timeline.csv", index=False)
        meta = result.metrics | {"label": result.label, "schedule": name}
        (d / "metrics.json").write_text(json.dumps(json_ready(meta), indent=1))
        unit = result.metrics.get("time_unit", "ms")
        save_html(timeline_figure(result.timeline, title=f"{name} — {result.label}", unit=unit), d / "timeline.html")
        to_chrome_trace(result.timeline, d / "trace.json", label=f"{name} (modeled): {result.label}")
    return d.final

"""Plotly timelines of schedules: modeled (``simulate``) and measured (runtime) alike.

A timeline is a DataFrame with at least ``worker, kind, start, end`` (ms or unit time) and
optionally ``stage, microbatch, version, lane, src, dst``. :func:`timeline_figure` draws a
Gantt chart: one row per worker (``w3``) and, when the timeline has communication rows
(``lane == "comm"``), a second row below it (``w3 comm``). Each op is a horizontal bar
(``go.Bar`` with ``base=start``) coloured by microbatch (a qualitative palette, cycling);
backward-type ops (B, BI, BW) carry a diagonal hatch and a dark outline and are labelled with
their kind, forwards are plain; communication bars are translucent. There is one trace per kind,
so the legend toggles kinds. Hover shows stage, microbatch, kind, version, start and end.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

PALETTE = qualitative.Plotly + qualitative.Safe
FORWARD_KINDS = ("F",)
BACKWARD_KINDS = ("B", "BI", "BW")
MAX_OPS = 20_000  # more boxes than this make the browser sluggish: keep a time window
_STYLE = {
    "F": dict(pattern="", line="rgba(0,0,0,0.25)", width=0.5, opacity=1.0),
    "B": dict(pattern="/", line="rgba(0,0,0,0.9)", width=1.5, opacity=1.0),
    "BI": dict(pattern="/", line="rgba(0,0,0,0.9)", width=1.5, opacity=1.0),
    "BW": dict(pattern="x", line="rgba(0,0,0,0.9)", width=1.5, opacity=1.0),
    "STEP": dict(pattern="", line="rgba(0,0,0,1)", width=1.0, opacity=0.6),
}
_COMM_STYLE = dict(pattern=".", line="rgba(60,60,60,0.8)", width=0.5, opacity=0.55)


def _check(timeline: pd.DataFrame) -> pd.DataFrame:
    if not isinstance(timeline, pd.DataFrame):
        raise ValueError(f"a timeline must be a pandas DataFrame, got {type(timeline).__name__}")
    missing = {"worker", "kind", "start", "end"} - set(timeline.columns)
    if missing:
        raise ValueError(
            f"timeline lacks columns {sorted(missing)}; need worker, kind, start, end "
            f"(plus stage, microbatch, version if known)"
        )
    tl = timeline.copy()
    for col, default in (("stage", -1), ("microbatch", -1), ("version", -1), ("lane", "compute")):
        if col not in tl:
            tl[col] = default
    tl["kind"] = tl["kind"].astype(str)
    return tl


def _cap(tl: pd.DataFrame, max_ops: int) -> pd.DataFrame:
    """Keep the first ``max_ops`` ops in time (a prefix window), warning about the rest."""
    if len(tl) <= max_ops:
        return tl
    cut = float(np.sort(tl["start"].to_numpy())[max_ops - 1])
    kept = tl[tl["start"] <= cut]
    warnings.warn(
        f"timeline has {len(tl)} ops; drawing the {len(kept)} that start by t={cut:.4g} "
        f"(pass max_ops= to change the cap)",
        stacklevel=3,
    )
    return kept


def _rows(tl: pd.DataFrame) -> tuple[list[str], pd.Series]:
    has_comm = (tl["lane"] == "comm").any()
    workers = sorted(int(w) for w in tl["worker"].unique())
    order = []
    for w in workers:
        order.append(f"w{w}")
        if has_comm:
            order.append(f"w{w} comm")
    label = "w" + tl["worker"].astype(int).astype(str) + np.where(tl["lane"] == "comm", " comm", "")
    return order, label


def _trace_specs(tl: pd.DataFrame, row_label: pd.Series, showlegend: bool = True, group: str = "") -> list[dict]:
    """The properties of one horizontal ``go.Bar`` per op kind present (plain dicts and arrays)."""
    specs = []
    kinds = list(dict.fromkeys(list(_STYLE) + sorted(tl["kind"].unique())))
    labels = row_label.to_numpy()
    groups = {k: idx for k, idx in tl.groupby("kind", sort=False).indices.items()}
    cols = {c: tl[c].to_numpy() for c in ("lane", "microbatch", "stage", "version", "start", "end")}
    for kind in kinds:
        idx = groups.get(kind)
        if idx is None or not len(idx):
            continue
        comm = bool((cols["lane"][idx] == "comm").all())
        style = _COMM_STYLE if comm or kind not in _STYLE else _STYLE[kind]
        mb = cols["microbatch"][idx].astype(int)
        start, end = cols["start"][idx].astype(float), cols["end"][idx].astype(float)
        colors = [("#bbbbbb" if m < 0 else PALETTE[m % len(PALETTE)]) for m in mb.tolist()]
        # compact on the page: integer ids, float32 lengths (binary-encoded by plotly), starts to 0.1 µs
        # (plotly writes ``base`` as text), which is more than a drawn bar or its hover shows
        custom = np.stack([cols["stage"][idx], mb, cols["version"][idx]], axis=1).astype(np.int32)
        specs.append(
            dict(
                x=(end - start).astype(np.float32),
                base=np.round(start, 4),
                y=labels[idx],
                orientation="h",
                name=f"{group}{kind}",
                legendgroup=f"{group}{kind}",
                showlegend=showlegend,
                marker=dict(
                    color=colors,
                    opacity=style["opacity"],
                    line=dict(color=style["line"], width=style["width"]),
                    pattern=dict(shape=style["pattern"], fillmode="overlay", fgcolor="rgba(0,0,0,0.55)", size=6),
                ),
                text=kind if kind in BACKWARD_KINDS else None,
                textposition="inside",
                insidetextanchor="middle",
                customdata=custom,
                hovertemplate=(
                    f"<b>{kind}</b> stage %{{customdata[0]}} microbatch %{{customdata[1]}}"
                    "<br>version %{customdata[2]}<br>start %{base:.4g} duration %{x:.4g}"
                    "<extra>%{y}</extra>"
                ),
            )
        )
    return specs


def _traces(tl: pd.DataFrame, row_label: pd.Series, showlegend: bool = True, group: str = "") -> list[go.Bar]:
    return [go.Bar(**spec) for spec in _trace_specs(tl, row_label, showlegend, group)]


def timeline_traces(timeline: pd.DataFrame, max_ops: int = MAX_OPS) -> tuple[list[dict], list[str]]:
    """The properties of the traces :func:`timeline_figure` draws (one dict per op kind, see
    ``go.Bar``) and its row order (top first): for updating an existing figure's data in place
    (``workbench.viz.widgets``) without building new figure objects."""
    tl = _cap(_check(timeline), max_ops)
    order, label = _rows(tl)
    return _trace_specs(tl, label), order


def timeline_figure(
    timeline: pd.DataFrame, title: str | None = None, max_ops: int = MAX_OPS, unit: str = "ms"
) -> go.Figure:
    """Gantt chart of ``timeline`` (see module docstring); one trace per op kind; ``unit``: of
    ``start`` and ``end`` (``"ms"``, or ``"unit"`` for a simulation with unit costs), on the x axis."""
    tl = _cap(_check(timeline), max_ops)
    order, label = _rows(tl)
    fig = go.Figure(_traces(tl, label))
    heading = f"{title} — {len(tl)} ops" if title else f"{len(tl)} ops"
    fig.update_layout(
        barmode="overlay",
        bargap=0.15,
        title=heading,
        xaxis_title=f"time ({unit})",
        legend_title_text="op kind",
        height=max(250, 28 * len(order) + 120),
        meta={"ops": int(len(tl))},
    )
    fig.update_yaxes(categoryorder="array", categoryarray=order[::-1], type="category")
    return fig


def compare_figure(
    timelines: dict[str, pd.DataFrame],
    title: str | None = None,
    max_ops: int = MAX_OPS,
    align: bool = True,
    unit: str = "ms",
) -> go.Figure:
    """Timelines side by side (stacked, one subplot each, sharing the time axis), e.g.
    ``compare_figure({"modeled": sim.timeline, "measured": run.timeline})``. With ``align`` each
    timeline is shifted so that its first operation starts at 0 (a measured run's clock starts
    at process launch, a simulation's at 0)."""
    if not timelines:
        raise ValueError("compare_figure needs at least one timeline, e.g. {'modeled': tl}")
    names = list(timelines)
    fig = make_subplots(rows=len(names), cols=1, shared_xaxes=True, subplot_titles=names, vertical_spacing=0.08)
    total_rows = 0
    for i, name in enumerate(names, start=1):
        tl = _check(timelines[name])
        if align and len(tl):
            t0 = tl["start"].min()
            tl = tl.assign(start=tl["start"] - t0, end=tl["end"] - t0)
        tl = _cap(tl, max_ops)
        order, label = _rows(tl)
        total_rows += len(order)
        for tr in _traces(tl, label, showlegend=(i == 1)):
            tr.legendgroup = tr.name  # one legend entry per kind toggles it in every panel
            fig.add_trace(tr, row=i, col=1)
        fig.update_yaxes(categoryorder="array", categoryarray=order[::-1], type="category", row=i, col=1)
    fig.update_layout(
        barmode="overlay",
        bargap=0.15,
        title=title,
        legend_title_text="op kind",
        height=max(300, 28 * total_rows + 150 * len(names)),
    )
    fig.update_xaxes(title_text=f"time ({unit})", row=len(names), col=1)
    return fig


#: Environment variable naming one shared ``plotly.min.js`` (see :func:`save_html`).
SHARED_PLOTLYJS_ENV = "WORKBENCH_PLOTLYJS"


def save_html(fig: go.Figure, path) -> Path:
    """Write an HTML file that works offline. plotly.js (4.8 MB) is embedded, unless the
    environment variable ``WORKBENCH_PLOTLYJS`` names a shared ``plotly.min.js`` file: then the page
    loads it by relative path (``workbench reproduce`` does this so that a run folder holds one
    copy of plotly.js, not one per figure)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(str(path), include_plotlyjs=plotlyjs_source(path), full_html=True)
    return path


def plotlyjs_source(path) -> str | bool:
    """How an HTML page written to ``path`` gets plotly.js: the relative path of the shared
    ``plotly.min.js`` that ``WORKBENCH_PLOTLYJS`` names, ``"cdn"`` where it says ``cdn`` (plotly's
    CDN, pinned to the installed version: a page to commit), else ``True`` (embed it, 4.8 MB)."""
    shared = os.environ.get(SHARED_PLOTLYJS_ENV)
    if shared == "cdn":
        return "cdn"
    return os.path.relpath(shared, Path(path).resolve().parent) if shared else True


def write_shared_plotlyjs(directory) -> Path:
    """Write plotly.js once into ``directory`` (``plotly.min.js``) and return its path."""
    from plotly.offline import get_plotlyjs

    path = Path(directory) / "plotly.min.js"
    path.write_text(get_plotlyjs(), encoding="utf-8")
    return path

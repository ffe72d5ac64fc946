"""Plotly ``FigureWidget`` s that are built once and then updated in place.

A fresh plotly figure costs 85-140 ms to build and makes the notebook flicker; these figures keep
a fixed set of traces (one per op kind for timelines, one per bar series for stages) and a change
only replaces their data with one ``plotly_update`` (one message to the browser).

Figures are first built and drawn as plain ``go.Figure`` s and then wrapped by :func:`widget`,
whose comm opens with the complete figure: plotly's ``FigureWidget`` otherwise opens its comm
empty and sends the figure in a second message, which a loaded browser can apply after the view
rendered (its ``do_data`` is a no-op), leaving an empty plot.

Their browser side is ``figure_loader.js``, a small module in front of plotly's 5 MB widget bundle:
anywidget drops every kernel message to a model whose module took more than 2 s to load and
initialize, which the bundle itself often does in a busy browser (a figure that rendered and then
never updated); the loader initializes at once, imports the bundle once per page and replays the
messages that arrived before it.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd
import plotly
import plotly.graph_objects as go
import traitlets
from plotly.subplots import make_subplots

from workbench.viz.plot import timeline_traces

#: every op kind a timeline can hold: compute kinds (AR: a measured all-reduce on the compute
#: stream), then communication kinds (simulate.COMM_KINDS)
TIMELINE_KINDS = (
    "F",
    "B",
    "BI",
    "BW",
    "STEP",
    "AR",
    "send_act",
    "send_grad",
    "allreduce",
    "fetch_weights",
    "send_wgrad",
    "alltoall",
)
_COPY = ("x", "base", "y", "marker", "text", "customdata", "hovertemplate", "textposition", "insidetextanchor")
_STAGE_COLORS = ("#4C78A8", "#F58518", "#54A24B", "#444444", "#72B7B2", "#E45756")  # traces of stage_widget
#: the widgets' figure font (the explorer's figures share it)
FONT = dict(family="Inter, Helvetica, Arial, sans-serif", size=12)


@cache
def _plotly_bundle() -> str:
    """plotly's widget bundle (the module plotly's own ``FigureWidget`` sends as its ``_esm``)."""
    return (Path(plotly.__file__).parent / "package_data" / "widgetbundle.js").read_text(encoding="utf-8")


class _FullStateFigureWidget(go.FigureWidget):
    """A ``FigureWidget`` whose comm opens after the figure is set and whose browser module is
    ``figure_loader.js`` (see the module docstring)."""

    _esm = Path(__file__).with_name("figure_loader.js")
    _bundle = traitlets.Unicode("").tag(sync=True)
    _bundle_version = traitlets.Unicode(plotly.__version__).tag(sync=True)

    def __init__(self, *args, **kwargs):
        self._defer_open = True
        super().__init__(*args, **kwargs)
        self._bundle = _plotly_bundle()
        self._defer_open = False
        self.open()

    def open(self):
        if not getattr(self, "_defer_open", False):
            super().open()

    def _send_update_msg(self, restyle_data, relayout_data, trace_indexes=None, source_view_id=None):
        """plotly's ``Plotly.update`` message, sent as one state message and not reset to None
        right after: plotly's browser side reads the *current* value when its handler runs, so a
        late handler saw None and dropped the update (a timeline that kept its old data). The
        message carries new edit ids, so it always differs from the previous one."""
        trace_indexes = self._normalize_trace_indexes(trace_indexes)
        with self.hold_sync():
            self._last_trace_edit_id += 1
            self._last_layout_edit_id += 1
            self._trace_edit_in_process = self._layout_edit_in_process = True
            self._py2js_update = {
                "style_data": restyle_data,
                "layout_data": relayout_data,
                "style_traces": trace_indexes,
                "trace_edit_id": self._last_trace_edit_id,
                "layout_edit_id": self._last_layout_edit_id,
                "source_view_id": source_view_id,
            }


def widget(fig: go.Figure) -> go.FigureWidget:
    """``fig`` as a ``FigureWidget`` that the browser receives complete in one message."""
    return _FullStateFigureWidget(fig)


def timeline_widget(title: str, time_unit: str = "ms", width: int = 820) -> go.Figure:
    """An empty Gantt figure with one bar trace per kind of :data:`TIMELINE_KINDS` (wrap it
    with :func:`widget` after the first :func:`update_timeline`)."""
    traces = [
        go.Bar(x=[], base=[], y=[], orientation="h", name=k, legendgroup=k, visible=False) for k in TIMELINE_KINDS
    ]
    fig = go.Figure(traces)
    fig.update_layout(
        barmode="overlay",
        bargap=0.15,
        title=dict(text=title, x=0.01, font=dict(size=14)),
        xaxis_title=f"time ({time_unit})",
        legend_title_text="op kind",
        height=300,
        width=width,
        margin=dict(l=70, r=20, t=50, b=45),
        font=FONT,
        template="plotly_white",
        legend=dict(orientation="h", yanchor="bottom", y=1.0, x=1.0, xanchor="right"),
    )
    fig.update_yaxes(type="category")
    return fig


def _plain(v):
    return v.tolist() if hasattr(v, "tolist") else v


def update_timeline(fig: go.Figure, timeline: pd.DataFrame, title: str) -> None:
    """Replace the data of ``fig`` (from :func:`timeline_widget`) by ``timeline``'s ops, in place:
    one ``plotly_update`` (restyle of every kind's trace + relayout), which writes the new arrays
    without building figure objects (the specs come from :func:`workbench.viz.plot.timeline_traces`,
    the same drawing as :func:`~workbench.viz.plot.timeline_figure`)."""
    specs, order = timeline_traces(timeline)
    by_name = {s["name"]: s for s in specs}
    unknown = set(by_name) - set(TIMELINE_KINDS)
    if unknown:
        raise ValueError(f"timeline has op kinds {sorted(unknown)} that the widget does not draw")
    names = [tr.name for tr in fig.data]
    empty: dict[str, Any] = dict(
        x=[], base=[], y=[], customdata=[], text=None, marker={}, hovertemplate=None, visible=False
    )
    restyle: dict[str, list] = {k: [] for k in _COPY + ("visible",)}
    for name in names:
        spec = by_name.get(name)
        for k in restyle:
            restyle[k].append(empty.get(k) if spec is None else (True if k == "visible" else _plain(spec.get(k))))
    relayout = {
        "title.text": title,
        "height": max(260, 24 * len(order) + 130),
        "yaxis.categoryarray": order[::-1],
        "yaxis.categoryorder": "array",
        "xaxis.autorange": True,
    }
    fig.plotly_update(restyle_data=restyle, relayout_data=relayout, trace_indexes=list(range(len(names))))


def _level_line(name: str, color: str, dash: str, group: str, **line) -> go.Scatter:
    """An empty dashed line trace (a bound or a limit across the bars; data set by the update)."""
    return go.Scatter(x=[], y=[], name=name, mode="lines", line=dict(color=color, dash=dash, **line), legendgroup=group)


def stage_widget(memory_title: str = "peak memory per worker (GB, simulated)") -> go.Figure:
    """Per-stage time bars (compute, all-reduce, cut) beside per-worker memory against the limit."""
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.55, 0.45],
        horizontal_spacing=0.12,
        subplot_titles=("time per minibatch per stage (ms, modeled)", memory_title),
    )
    for name, color in zip(("compute", "all-reduce", "cut to next stage"), _STAGE_COLORS):
        fig.add_trace(go.Bar(x=[], y=[], name=name, marker_color=color, legendgroup="time"), row=1, col=1)
    fig.add_trace(_level_line("bottleneck (predicted)", _STAGE_COLORS[3], "dot", "time", width=1.5), row=1, col=1)
    fig.add_trace(go.Bar(x=[], y=[], name="memory", marker_color=_STAGE_COLORS[4], legendgroup="mem"), row=1, col=2)
    fig.add_trace(_level_line("memory limit", _STAGE_COLORS[5], "dash", "mem"), row=1, col=2)
    fig.update_annotations(font_size=13)
    w = fig
    w.update_layout(
        barmode="group",
        height=330,
        width=820,
        margin=dict(l=55, r=15, t=40, b=40),
        font=FONT,
        template="plotly_white",
        legend=dict(orientation="h", x=0, y=-0.22, font=dict(size=11)),
    )
    w.update_xaxes(title_text="stage", type="category", row=1, col=1)
    w.update_xaxes(title_text="worker", type="category", row=1, col=2)
    w.update_yaxes(title_text="ms", row=1, col=1)
    w.update_yaxes(title_text="GB", row=1, col=2)
    return w


def update_stages(
    fig: go.Figure, table: pd.DataFrame, memory_bytes: list[float], limit_bytes: float | None, bottleneck_ms: float
) -> None:
    """``table`` from :func:`core.stage_table`; ``memory_bytes`` per worker; the limit as a line."""
    stages = [str(s) for s in table.index]
    ar = table["comm_ms"]
    workers = [str(w) for w in range(len(memory_bytes))]
    gb = [m / 1e9 for m in memory_bytes]
    limit = float(limit_bytes or 0.0)
    over = limit > 0
    colors = ["#E45756" if over and m > limit else "#72B7B2" for m in memory_bytes]
    xs = [stages, stages, stages, stages, workers, workers if over else []]
    ys = [
        table["compute_ms"].tolist(),
        ar.tolist(),
        table["cut_ms"].tolist(),
        [bottleneck_ms] * len(stages),
        gb,
        [limit / 1e9] * len(workers) if over else [],
    ]
    # one message per change: plotly's browser side reads the latest update message when it gets
    # to it, so two updates in a row can lose the first
    restyle = {
        "x": xs,
        "y": ys,
        "visible": [True] * 5 + [bool(over)],
        "marker.color": list(_STAGE_COLORS[:4]) + [colors, _STAGE_COLORS[5]],
    }
    relayout = {f"{ax}.autorange": True for ax in ("xaxis", "yaxis", "xaxis2", "yaxis2")}  # rescale to the new data
    fig.plotly_update(restyle_data=restyle, relayout_data=relayout, trace_indexes=list(range(6)))

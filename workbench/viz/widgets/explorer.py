"""``ScheduleExplorer``: any schedule on identical stages with unit costs, its timeline, bubble and
per-worker memory live, beside the closed form where the literature gives one.

Costs are in *units* (a forward of one stage on one microbatch costs ``fwd``); the simulator's unit
mode charges ``bwd`` for a backward and ``bwd / 2`` each for the split BI / BW of zero-bubble
schedules, ``transfer`` per activation or gradient message between workers.
"""

from __future__ import annotations

import html
import math

import ipywidgets as W
import numpy as np
import plotly.graph_objects as go

from workbench import schedules
from workbench.io.cards import card
from workbench.simulation import SimResult, simulate
from workbench.viz.widgets import controls
from workbench.viz.widgets.figures import FONT, timeline_widget, update_timeline, widget


def closed_form_bubble(
    name: str, S: int, M: int, fwd: float, bwd: float, *, chunks: int = 2
) -> tuple[float, str] | None:
    """Mean bubble fraction ``1 - busy / makespan`` in closed form of schedule ``name`` as
    :func:`explore` builds it (``S`` workers, ``M`` microbatches, a worker's share of the model
    costing ``fwd`` / ``bwd``), from the form its registration names
    (:mod:`workbench.schedules.closed_forms`); None where no paper states one."""
    value, formula = schedules.closed_form_bubble(_build(name, S, M, chunks), fwd, bwd)
    return None if math.isnan(value) else (value, formula)


def _build(name: str, workers: int, microbatches: int, chunks: int) -> schedules.Schedule:
    takes_chunks = any(o.name == "chunks" for o in schedules.spec(name).options)
    return schedules.build_for_workers(
        name, workers, microbatches, options={"chunks": chunks} if takes_chunks else None
    )


def explore(
    name: str,
    stages: int,
    microbatches: int,
    fwd: float = 1.0,
    bwd: float = 2.0,
    *,
    transfer: float = 0.0,
    chunks: int = 2,
) -> SimResult:
    """Build schedule ``name`` on ``stages`` workers (``chunks`` virtual stages each where the
    schedule takes them) with ``microbatches`` and simulate it with unit costs: the model costs
    ``stages`` x (``fwd``, ``bwd``), split evenly over the schedule's stages (a worker's share of a
    pipeline costs ``fwd``; a data-parallel worker's whole model ``stages x fwd``)."""
    sched = _build(name, stages, microbatches, chunks)
    share = stages / sched.num_stages
    return simulate(sched, fwd=fwd * share, bwd=bwd * share, transfer=transfer)


def _memory_figure() -> go.Figure:
    """The bar chart of peak stashed activations per worker (data filled by ``update``)."""
    fig = go.Figure(go.Bar(x=[], y=[], marker_color="#72B7B2", name="peak activations"))
    fig.update_layout(
        title=dict(text="peak stashed activations per worker (microbatches)", x=0.01, font=dict(size=13)),
        height=240,
        width=320,
        margin=dict(l=50, r=10, t=45, b=40),
        font=FONT,
        template="plotly_white",
        xaxis=dict(title="worker", type="category"),
        yaxis=dict(title="microbatches"),
    )
    return fig


class ScheduleExplorer:
    """Pick a schedule and its shape; timeline, bubble and per-worker memory update in place."""

    def __init__(
        self,
        schedule: str = "pipedream-flush",
        stages: int = 4,
        microbatches: int = 8,
        fwd: float = 1.0,
        bwd: float = 2.0,
        *,
        transfer: float = 0.0,
    ):
        self._build_controls(schedule, stages, microbatches, fwd, bwd, transfer=transfer)
        self.stats = W.HTML(layout=W.Layout(width="500px"))
        self.timeline_fig = timeline_widget("timeline", "units")
        self.memory_fig = _memory_figure()
        self.result: SimResult | None = None
        for w in (self.schedule, self.stages, self.microbatches, self.fwd, self.bwd, self.transfer, self.chunks):
            w.observe(lambda _: self.update(), names="value")
        self.update()  # the first draw goes into plain figures, which become widgets complete
        self.memory_fig, self.timeline_fig = widget(self.memory_fig), widget(self.timeline_fig)
        self.ui = W.VBox(
            [
                W.HTML(
                    "<h3 style='margin:4px 0'>Schedule explorer</h3><div style='color:#555'>Unit costs, "
                    "identical stages, <b>modeled</b> by the discrete-event simulator.</div>"
                ),
                W.HBox([self.schedule, self.stages, self.microbatches]),
                W.HBox([self.fwd, self.bwd, self.transfer]),
                self.chunks,
                W.HBox([self.stats, self.memory_fig]),
                self.timeline_fig,
            ]
        )

    def _build_controls(
        self, schedule: str, stages: int, microbatches: int, fwd: float, bwd: float, *, transfer: float
    ):
        self.schedule = controls.dropdown(schedules.NAMES, schedule, "schedule", "220px")
        self.stages = controls.int_slider(stages, 1, 16, "stages (workers)", "300px")
        self.microbatches = controls.int_slider(microbatches, 1, 64, "microbatches", "300px")
        self.fwd = controls.float_box(fwd, 0.01, 100, 0.1, "forward (units)", width="190px")
        self.bwd = controls.float_box(bwd, 0.0, 100, 0.1, "backward incl. weight grad (units)", width="290px")
        self.transfer = controls.float_box(transfer, 0, 100, 0.1, "communication per message (units)", width="290px")
        self.chunks = controls.int_slider(2, 1, 8, "chunks (interleaved)", "300px")

    def _ipython_display_(self):
        from IPython.display import display

        display(self.ui)

    def __repr__(self) -> str:
        return (
            f"ScheduleExplorer(schedule={self.schedule.value!r}, stages={self.stages.value}, "
            f"microbatches={self.microbatches.value})"
        )

    def update(self) -> SimResult | None:
        """Simulate the current settings and redraw; a bad combination shows one line instead."""
        name, S, M = self.schedule.value, int(self.stages.value), int(self.microbatches.value)
        f, b, c, v = float(self.fwd.value), float(self.bwd.value), float(self.transfer.value), int(self.chunks.value)
        try:
            res = explore(name, S, M, f, b, transfer=c, chunks=v)
        except Exception as e:  # noqa: BLE001 - one line, never a traceback, in a widget callback
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
            self.stats.value = (
                f"<div style='color:#b00020'>⚠ {html.escape(lines[0] if lines else type(e).__name__)}</div>"
            )
            return None
        self.result = res
        m = res.metrics
        sim_bubble = float(np.mean(m["bubble_fraction"]))
        rows = [("makespan", m["makespan"], "units"), ("bubble (simulated, mean)", sim_bubble, "")]
        form = schedules.closed_form_bubble(res.schedule, f, b) if c == 0 else (math.nan, "")
        if not math.isnan(form[0]):
            rows.append((f"bubble, closed form {form[1]}", form[0], ""))
        else:
            rows.append(("bubble, closed form", "n/a" if c == 0 else "n/a (communication > 0)", ""))
        rows += [
            ("peak activations (max over workers)", max(m["peak_activations"]), "microbatches"),
            ("weight versions (max)", max(m["weight_versions"]), ""),
        ]
        self.stats.value = card(
            f"{name}: {schedules.DESCRIPTIONS[name]}", rows, label=f"{res.label}; F={f:g}, B={b:g}, comm={c:g} units"
        )
        self.memory_fig.plotly_update(
            restyle_data={
                "x": [[str(w) for w in range(len(m["peak_activations"]))]],
                "y": [list(m["peak_activations"])],
            },
            relayout_data={"xaxis.autorange": True, "yaxis.autorange": True},
            trace_indexes=[0],
        )
        update_timeline(self.timeline_fig, res.timeline, f"{name}: {S} workers, {M} microbatches (modeled, units)")
        return res

"""``PartitionTuner``: tune a PipeDream partition with controls and see plan, costs and timeline live.

Every change of a control runs one update (:func:`core.run_settings`: re-partition, price the
manual plan, build the schedule, simulate) and writes the result into the widgets that already
exist: the plan cards (HTML), the stage bars and the timeline (``FigureWidget``, data replaced in
``batch_update``). A bad setting (an infeasible memory limit, a manual plan that does not cover the
layers, ...) shows one line in the status bar and leaves the last valid figures in place.
"""

from __future__ import annotations

import html
import math
import time
from pathlib import Path

import ipywidgets as W
import pandas as pd
import plotly.graph_objects as go

from workbench import models as zoo
from workbench.cost.plan import Plan
from workbench.cost.topology import Topology
from workbench.io.cards import card
from workbench.io.folders import fresh_path, run_id
from workbench.partitioning.compare import CostComparison, compare_costs
from workbench.partitioning.pipedream_optimizer import profile_for
from workbench.profiling.measure import Profile
from workbench.profiling.measure import profile as measure_profile
from workbench.profiling.pipedream import SHIPPED, shipped
from workbench.runtime import train
from workbench.viz.widgets import controls, core
from workbench.viz.widgets.figures import stage_widget, timeline_widget, update_stages, update_timeline, widget

MEASURABLE = ("mlp", "vgg16", "alexnet")  # zoo models small enough ("mini") to profile here in seconds
_LEVEL_NAMES = ("inside a server", "between servers", "between racks")


def _status_html(text: str, kind: str = "info") -> str:
    color = {"info": "#555", "ok": "#2a7d2a", "error": "#b00020", "busy": "#8a6d00", "warning": "#8a6d00"}[kind]
    icon = {"info": "", "ok": "✓ ", "error": "⚠ ", "busy": "… ", "warning": "⚠ "}[kind]
    return f"<div style='color:{color};font-size:13px;min-height:1.4em'>{icon}{html.escape(text)}</div>"


class PartitionTuner:
    """Widget-driven partition tuning (display it in Jupyter; ``tuner.ui`` is the widget tree).

    ``profile_or_model``: a :class:`Profile`, a zoo model name in :data:`MEASURABLE` (measured here,
    mini size), a model object (profiled with :func:`workbench.profile`), or None (PipeDream's
    published VGG-16 GPU profile). ``topology``: a :class:`Topology` (default: 8 workers at 12 GB/s).
    ``memory_gb``: the memory limit per worker (GB; 0: none); by default the topology's device memory
    (``Topology.preset`` names it: a V100's 16 GiB), else none.
    ``cost``: the cost model the optimizer prices with (a toggle: ``"workbench"`` or PipeDream's
    own, ``"pipedream"``); ``compare=True`` adds both models' choices side by side to the cards
    (:func:`workbench.partitioning.compare.compare_costs`).
    """

    def __init__(
        self,
        profile_or_model=None,
        topology: Topology | None = None,
        *,
        schedule: str = core.DEFAULT_SCHEDULE,
        microbatches: int = 16,
        per_step: int = 4,
        memory_gb: float | None = None,
        straight: bool = False,
        out_dir="results/widgets",
        cost: str = "workbench",
        compare: bool = False,
    ):
        self.out_dir = Path(out_dir)
        self.topology = topology or Topology.flat(8, 12e9)
        self.runnable: str | None = None  # zoo model name when the profile was measured here
        self.outcome: core.Outcome | None = None
        self.last_update_ms = math.nan
        self._best: core.Plan | None = None
        self._best_key: tuple | None = None
        self._busy = False
        self.compare = bool(compare)
        self.comparison: CostComparison | None = None  # the last one shown (compare=True)
        if memory_gb is None:  # the device's memory where the topology names it (a preset), else no limit
            memory_gb = (self.topology.memory_bytes or 0.0) / 1e9
        self._build_controls(schedule, microbatches, per_step, memory_gb, straight)
        self.cost = W.ToggleButtons(
            options=[("workbench cost model", "workbench"), ("PipeDream's optimizer", "pipedream")],
            value=cost,
            style={"button_width": "160px"},
        )
        self.cost.observe(self._on_change, names="value")
        self.cards = W.HTML(layout=W.Layout(width="auto"))
        self.export_msg = W.HTML()
        self.stages_fig, self.timeline_fig = stage_widget(), timeline_widget("simulated timeline")
        self.measured_fig: go.FigureWidget | None = None
        self.profile = self._initial_profile(profile_or_model)
        self._name_given()
        self._reset_manual()
        self.update()  # the first draw goes into plain figures, which become widgets complete
        self.stages_fig, self.timeline_fig = widget(self.stages_fig), widget(self.timeline_fig)
        self._build_outputs()

    # ---- construction ---------------------------------------------------------------------
    def _initial_profile(self, obj) -> Profile:
        if obj is None:
            self._busy = True
            try:
                self.source.value = "shipped:vgg16"
            finally:
                self._busy = False
            return shipped("vgg16")
        if isinstance(obj, Profile):
            return obj
        if isinstance(obj, str):
            prof = self._measure(obj)
            self._busy = True  # show the choice without re-measuring
            try:
                self.source.value = f"measure:{obj}"
            finally:
                self._busy = False
            return prof
        self.status.value = _status_html("profiling the given model here (measured) ...", "busy")
        return measure_profile(obj, batch_size=64)

    def _build_controls(self, schedule, microbatches, per_step, memory_gb, straight):
        self._source_controls()
        self._topology_controls()
        self.memory = controls.float_box(memory_gb, 0, 1e4, 1, "memory limit per worker (GB, 0 = none)", width="330px")
        self.straight = W.ToggleButtons(
            options=[("replicated stages", False), ("straight pipeline", True)],
            value=straight,
            style={"button_width": "140px"},
        )
        self.schedule = controls.dropdown(list(core.PLAN_SCHEDULES), schedule, "schedule", "240px")
        self.microbatches = controls.int_slider(microbatches, 1, 64, "microbatches", "330px")
        self.per_step = controls.int_slider(per_step, 1, 64, "in flight per flush / update", "360px")
        self._plan_controls()
        self.progress = W.IntProgress(value=0, min=0, max=4, layout=W.Layout(width="160px"))
        self.status = W.HTML(_status_html("ready"), layout=W.Layout(width="auto"))
        self._connect_controls()

    def _source_controls(self):
        """Where the profile comes from: given, PipeDream's shipped, measured here, or a file."""
        opts = (
            [("profile given to the tuner", "given")]
            + [(f"PipeDream {n} (GPU, published)", f"shipped:{n}") for n in SHIPPED]
            + [(f"{n} mini (measured here, CPU)", f"measure:{n}") for n in MEASURABLE]
            + [("import a file (graph.txt / CSV / JSON) ...", "file")]
        )
        self.source = controls.dropdown(opts, "given", "profile", "340px")
        self.path = W.Text(placeholder="path to graph.txt, profile CSV or JSON", layout=W.Layout(width="300px"))
        self.load = W.Button(description="load file", icon="folder-open", layout=W.Layout(width="110px"))

    def _topology_controls(self) -> None:
        """One (workers, GB/s) pair of boxes per level of the topology, innermost first."""
        self.levels: list[tuple[W.BoundedIntText, W.BoundedFloatText]] = []
        for k, (count, bw) in enumerate(self.topology.levels):
            name = _LEVEL_NAMES[k] if k < len(_LEVEL_NAMES) else f"level {k + 1}"
            n = controls.int_box(count, 1, 64, f"L{k + 1} count ({name})", "260px")
            b = controls.float_box(bw / 1e9, 1e-3, 1e4, 0.25, "GB/s", width="150px")
            self.levels.append((n, b))

    def _plan_controls(self):
        """Optimizer or manual plan, the manual plan's text boxes, and the plan's buttons."""
        self.optimize = W.Button(
            description="re-run optimizer", icon="refresh", button_style="primary", layout=W.Layout(width="160px")
        )
        self.mode = W.ToggleButtons(
            options=[("optimizer's plan", False), ("manual plan", True)], value=False, style={"button_width": "130px"}
        )
        self.lasts = controls.text_box("last layer of each stage", "420px")
        self.replicas = controls.text_box("replicas per stage", "300px")
        self.copy = W.Button(description="copy optimizer's plan", icon="copy", layout=W.Layout(width="190px"))
        self.export = W.Button(description="export plan", icon="download", layout=W.Layout(width="140px"))
        self.run = W.Button(
            description="run it (real, short)", icon="play", button_style="warning", layout=W.Layout(width="170px")
        )

    def _connect_controls(self):
        for w in [
            self.memory,
            self.straight,
            self.schedule,
            self.microbatches,
            self.per_step,
            self.mode,
            self.lasts,
            self.replicas,
        ] + [x for pair in self.levels for x in pair]:
            w.observe(self._on_change, names="value")
        self.source.observe(self._on_source, names="value")
        self.load.on_click(lambda _: self._load_file())
        self.optimize.on_click(lambda _: self.update(reoptimize=True))
        self.copy.on_click(lambda _: self._copy_best())
        self.export.on_click(lambda _: self.export_plan())
        self.run.on_click(lambda _: self.run_it())

    def _name_given(self):
        """Label the "given" profile entry with the profile's name."""
        self._busy = True
        try:
            value = self.source.value
            self.source.options = [(f"given: {_profile_name(self.profile)}", "given")] + list(self.source.options[1:])
            self.source.value = value
        finally:
            self._busy = False

    def _build_outputs(self):
        self.measured_box = W.VBox([], layout=W.Layout(width="100%"))
        head = W.HTML(
            "<h3 style='margin:4px 0'>PipeDream partition tuner</h3><div style='color:#555'>"
            "Times are <b>modeled</b> from the chosen profile and topology with the one cost model "
            "(partitioner and simulator); the run button adds a <b>measured</b> timeline.</div>"
        )
        row = W.HBox
        self.ui = W.VBox(
            [
                head,
                row([self.source, self.path, self.load]),
                row([W.HTML("<b>topology</b>", layout=W.Layout(width="80px"))] + [W.HBox(p) for p in self.levels]),
                row([self.memory, self.straight, self.cost]),
                row([self.schedule, self.microbatches, self.per_step]),
                row([self.optimize, self.mode, self.copy]),
                row([self.lasts, self.replicas]),
                row([self.progress, self.status]),
                self.cards,
                self.stages_fig,
                self.timeline_fig,
                row([self.export, self.run, self.export_msg]),
                self.measured_box,
            ],
            layout=W.Layout(width="100%"),
        )

    def _ipython_display_(self):
        from IPython.display import display

        display(self.ui)

    def __repr__(self) -> str:
        if self.outcome is None:
            return "PartitionTuner(no valid plan)"
        p = self.outcome.plan
        return f"PartitionTuner(stages={p.num_stages}, workers={p.num_workers}, predicted={p.bottleneck_ms:.4g} ms)"

    # ---- state -> settings ----------------------------------------------------------------
    def settings(self) -> core.Settings:
        levels = tuple((int(n.value), float(b.value) * 1e9) for n, b in self.levels)
        mem = float(self.memory.value) * 1e9 if self.memory.value else None
        return core.Settings(
            levels=levels,
            memory_bytes=mem,
            straight=bool(self.straight.value),
            schedule=self.schedule.value,
            microbatches=int(self.microbatches.value),
            per_step=int(self.per_step.value),
            cost=self.cost.value,
        )

    def _manual(self, st: core.Settings) -> Plan | None:
        if not self.mode.value:
            return None
        return core.parse_manual(self.lasts.value, self.replicas.value, len(self.profile), st.topology.num_workers)

    # ---- callbacks ------------------------------------------------------------------------
    def _on_change(self, change):
        if not self._busy:
            self.update()

    def _on_source(self, change):
        value = change["new"]
        if self._busy:
            return
        if value == "given" or value == "file":
            self.status.value = _status_html(
                "type a path and press 'load file'" if value == "file" else "choose a profile", "info"
            )
            return
        self._guard(lambda: self._set_profile(self._fetch(value)))

    def _fetch(self, value: str) -> Profile:
        kind, name = value.split(":", 1)
        if kind == "shipped":
            self.runnable = None
            return shipped(name)
        return self._measure(name)

    def _measure(self, name: str) -> Profile:
        if name not in MEASURABLE:
            raise ValueError(f"cannot measure {name!r} here; choose one of {', '.join(MEASURABLE)}")
        self.status.value = _status_html(f"profiling mini {name} on this CPU (measured) ...", "busy")
        prof = measure_profile(zoo.build(name, size="mini"), batch_size=64)
        self.runnable = name
        return prof

    def _load_file(self):
        self._guard(lambda: self._set_profile(self._read_file()))

    def _read_file(self) -> Profile:
        path = self.path.value.strip()
        if not path:
            raise ValueError("type the path of a PipeDream graph.txt, a profile CSV or JSON first")
        self.runnable = None
        return Profile.load(path)

    def _set_profile(self, prof: Profile):
        self.profile = prof
        self._best_key = None
        self._reset_manual()
        self.update()

    def _reset_manual(self):
        self._busy = True
        try:
            self.mode.value = False
            self.lasts.value = ""
            self.replicas.value = ""
        finally:
            self._busy = False

    def _copy_best(self):
        if self._best is None:
            self.status.value = _status_html("no optimizer plan yet: fix the settings first", "error")
            return
        self._busy = True
        try:
            self.lasts.value = ", ".join(str(s.last) for s in self._best.stages)
            self.replicas.value = ", ".join(str(s.replicas) for s in self._best.stages)
            self.mode.value = True
        finally:
            self._busy = False
        self.update()

    def _guard(self, fn):
        """Run ``fn``; any error becomes one line in the status bar (no traceback in the notebook)."""
        try:
            return fn()
        except Exception as e:  # noqa: BLE001 - a widget callback must never print a traceback
            lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
            msg = lines[0] if lines else type(e).__name__
            if not isinstance(e, ValueError):
                msg = f"{type(e).__name__}: {msg}"
            self.status.value = _status_html(msg, "error")
            self.progress.bar_style = "danger"
            return None

    # ---- one update -------------------------------------------------------------------------
    def update(self, reoptimize: bool = False) -> core.Outcome | None:
        """Recompute and redraw in place; returns the outcome (None when the settings are invalid)."""
        return self._guard(lambda: self._update(reoptimize))

    def _update(self, reoptimize: bool) -> core.Outcome:
        t0 = time.perf_counter()
        self.progress.bar_style, self.progress.value = "info", 0
        st = self.settings()
        key = (id(self.profile), st.levels, st.memory_bytes, st.straight, st.cost)
        if reoptimize or key != self._best_key:
            self._best, self._best_key = None, None
            self._best = core.optimize(self.profile, st)
            self._best_key = key
        self.progress.value = 1
        manual = self._manual(st)
        out = core.run_settings(self.profile, st, manual=manual, best=self._best)
        self.progress.value = 3
        self._draw(out, st)
        self.outcome = out
        self.progress.value, self.progress.bar_style = 4, "success"
        self.last_update_ms = (time.perf_counter() - t0) * 1e3
        what = "manual plan" if out.manual else "optimizer's plan"
        trust = self.profile.trust_note()  # a measured profile taken on a busy CPU
        self.status.value = _status_html(
            f"{what}: {out.plan.num_stages} stage(s) on {out.plan.num_workers} "
            f"worker(s); updated in {self.last_update_ms:.0f} ms"
            + (f" (note: {out.note})" if out.note else "")
            + (f"; {trust}" if trust else ""),
            "warning" if trust else "ok",
        )
        return out

    def _draw(self, out: core.Outcome, st: core.Settings):
        prof = profile_for(self.profile, out.plan)
        mem = core.worker_memory_bytes(out.sim, prof, out.plan)
        update_stages(
            self.stages_fig, core.stage_table(out.plan, prof), mem, st.memory_bytes, core.predicted_ms(out.plan)
        )
        self.cards.value = self._cards_html(out, st)
        title = (
            f"simulated {st.schedule}: {out.plan.num_stages} stage(s) on {out.plan.num_workers} worker(s), "
            f"{st.microbatches} microbatches (modeled)"
        )
        update_timeline(self.timeline_fig, out.sim.timeline, title)

    def _cards_html(self, out: core.Outcome, st: core.Settings) -> str:
        prof = profile_for(self.profile, out.plan)
        shown = core.summary_rows(out.plan, out.sim, prof, st.memory_bytes)
        cols = {("manual plan" if out.manual else "optimizer's plan"): shown}
        if out.manual and out.best is not None:
            best_sim = core.run_settings(prof, st, best=out.best).sim
            cols["optimizer's best"] = core.summary_rows(out.best, best_sim, prof, st.memory_bytes)
        table = pd.DataFrame(cols)
        left = card(
            f"{'manual' if out.manual else 'optimizer'} plan: {_profile_name(prof)} on {_topology_text(st.topology)}",
            [],
            label=f"stage times per minibatch, modeled ({out.plan.cost} cost model)",
            table=core.stage_table(out.plan, prof).round(4),
        )
        comp = table.map(lambda v: v if isinstance(v, str) else (f"{v:.4g}" if isinstance(v, float) else v))
        right = (
            "<div class='workbench-card'><b>predicted (cost model) vs simulated (schedule)</b>"
            + comp.to_html(border=0)
            + "</div>"
        )
        both = ""
        if self.compare:
            self.comparison = compare_costs(
                self.profile,
                st.topology,
                straight=st.straight,
                memory_bytes=st.memory_bytes,
                use_fewer_workers=st.straight,
            )
            both = f"<div>{self.comparison._repr_html_()}</div>"
        return (
            f"<div style='display:flex;gap:28px;align-items:flex-start;font-size:12px'>"
            f"<div>{left}</div><div>{right}</div>{both}</div>"
        )

    # ---- export and run -----------------------------------------------------------------------
    def export_plan(self) -> Path | None:
        """Write the shown plan as JSON (the format ``workbench train --plan`` / ``simulate --plan``
        read) to a new file under ``out_dir``; never overwrites."""

        def go():
            if self.outcome is None:
                raise ValueError("no valid plan to export: fix the settings first")
            self.out_dir.mkdir(parents=True, exist_ok=True)
            path = fresh_path(self.out_dir / f"{run_id('plan')}.json")
            self.outcome.plan.save(path)
            self.export_msg.value = _status_html(f"wrote {path}", "ok")
            return path

        return self._guard(go)

    def run_it(self, steps: int = 2, timeout_s: float = 120.0) -> dict | None:
        """A short real run (``workbench.runtime.train``) of the shown plan and schedule on this
        machine; draws its measured timeline below the simulated one."""
        return self._guard(lambda: self._run_it(steps, timeout_s))

    def _run_it(self, steps: int, timeout_s: float) -> dict:

        if self.outcome is None:
            raise ValueError("no valid plan to run: fix the settings first")
        if self.runnable is None:
            raise ValueError(
                "'run it' trains a zoo model for real: choose a profile measured here "
                f"({', '.join(MEASURABLE)} mini) so the plan fits the model"
            )
        out = self.outcome
        st = self.settings()
        self.export_msg.value = _status_html(
            f"training {self.runnable} mini with {st.schedule} on {out.plan.num_workers} processes ({steps} steps) ...",
            "busy",
        )
        self.progress.bar_style, self.progress.value = "warning", 2
        dest = fresh_path(self.out_dir / run_id(f"run-{self.runnable}-{st.schedule}"))
        sched = out.schedule
        summary = train(
            self.runnable,
            sched,
            workers=sched.num_workers,
            microbatches=sched.microbatches,
            steps=steps,
            plan=out.plan,
            out=dest,
            model_options={"size": "mini"},
            allow_oversubscribe=True,
            timeout_s=timeout_s,
            progress=False,
            evaluate=False,
        )
        measured = pd.read_csv(Path(summary["out"]) / "timeline.csv")
        title = (
            f"measured: {self.runnable} mini, {st.schedule}, {sched.num_workers} gloo ranks on this CPU, "
            f"{steps} steps ({summary['out']})"
        )
        if self.measured_fig is None:
            fig = timeline_widget("measured timeline", "ms")
            update_timeline(fig, measured, title)
            self.measured_fig = widget(fig)
        else:
            update_timeline(self.measured_fig, measured, title)
        self.measured_box.children = (self.measured_fig,)
        self.progress.value, self.progress.bar_style = 4, "success"
        self.export_msg.value = _status_html(f"measured run written to {summary['out']}", "ok")
        return summary


def _profile_name(prof: Profile) -> str:
    m = prof.meta or {}
    src = m.get("model") or m.get("name") or str(m.get("source", "profile"))
    return f"{src} ({m.get('kind', 'kind not recorded')}, {len(prof)} layers)"


def _topology_text(t: Topology) -> str:
    return " × ".join(f"{c} @ {b / 1e9:g} GB/s" for c, b in t.levels)

"""Notebook 04: every schedule's timeline, modeled and measured side by side, with its bubble, memory
and weight versions, and the papers' closed-form bubbles beside them.

For each schedule name the package exposes (:func:`schedule_names`):

* **measured**: a short real run (:func:`workbench.runtime.train` machinery, gloo CPU ranks) of a
  mini model; its ``timeline.csv`` and per-rank peak stash depth / weight versions;
* **modeled**: the same op lists (``R`` rounds back to back, :func:`workbench.calibrate.repeat_rounds`)
  simulated with the stage costs measured here at the microbatch size
  (:func:`workbench.calibrate.stage_profile`, one profile per stage layout) and communication free;
* **unit**: one round simulated with unit costs ``F = 1, B = 2`` (``BI = BW = 1``) — the setting
  of the closed forms:

  ====================================  ===============================  ==========================
  schedule                              bubble fraction                  source
  ====================================  ===============================  ==========================
  gpipe, pipedream-flush, pipedream,    ``(p-1) / (m+p-1)``              GPipe; PipeDream-Flush;
  pipedream-2bw, pp, lpp, fslpp                                          1F1B fill and drain
  (one round; p = pipeline depth)
  interleaved-1f1b, looped-bfs          ``(p-1) / (v m + p-1)``          Megatron-LM (Narayanan'21)
  (v chunks per worker)
  zb-h1                                 ``(p-1) / (3 m + p-1)``          Zero Bubble (Qi'23), F=B=W
  model-parallel                        ``(p-1) / p``                    one microbatch in flight
  dp-bsp, dp-asp, ddp, fsdp             ``0`` (communication free)       every worker computes
  ====================================  ===============================  ==========================

  with ``p`` pipeline workers and ``m`` microbatches per round (per flush). The other schedules
  (zb-h2, interleaved zero bubble, the V family) have no single-round closed form here: NaN. The bubble of a
  timeline is ``1 - busy_w / L`` averaged over workers, ``L`` its makespan and ``busy_w`` worker
  ``w``'s compute time (F, B, BI, BW, STEP) — the simulator's ``bubble_fraction``. The zero-bubble
  papers' rate (columns ``span_bubble_*``) is ``max_w (1 - work_w / span_w)`` with ``span_w`` from
  worker w's first compute op to its last (:func:`span_bubble_fraction`).

``compute_stretch_measured`` (:func:`compute_stretch`) puts a number on the measured-vs-modeled gap's
first suspect, ranks sharing cores: the measured time of the run's compute ops over the same ops' stage
costs timed alone (the costs the modeled timeline charges), with its spread over workers
(``compute_stretch_worker_min`` / ``_max``). With free communication a uniform stretch leaves the
bubble unchanged; ``bubble_modeled_stretched`` replays the model with each stage's costs stretched as
measured, so ``bubble_modeled_stretched - bubble_modeled`` is what the stretch's unevenness moves and
``bubble_measured - bubble_modeled_stretched`` what the time between ops (Python, gloo, waits) adds.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd

from .. import schedules
from ..simulate import simulate
from .common import check_config, claim, out_folder, save_figure, save_table, write_claims
from .pages import save_page, slim_runs

EXPERIMENT = "04_pipeline_timelines"
BUSY_KINDS = ("F", "B", "BI", "BW", "STEP")


def schedule_names() -> list[str]:
    """Every registered schedule."""
    return list(schedules.REGISTRY)


def build_for(name: str, workers: int, microbatches: int, options: dict | None = None):
    """Schedule ``name`` on ``workers`` workers without a plan (:func:`schedules.build_for_workers`)."""
    return schedules.build_for_workers(name, workers, microbatches, options=options)


@dataclass(frozen=True)
class Config:
    """The notebook's parameters: a mini model trained ``steps`` rounds by each schedule."""

    model: str = "mlp"
    workers: int = 4
    microbatches: int = 8
    batch_size: int = 256
    steps: int = 6
    schedules: tuple[str, ...] = ()
    schedule_options: dict = field(default_factory=lambda: {"interleaved-1f1b": {"chunks": 2}})
    model_options: dict = field(default_factory=lambda: {"width": 1024, "in_features": 1024})
    seed: int = 0
    timeout_s: float = 120.0

    def names(self) -> list[str]:
        known = schedule_names()
        names = list(self.schedules) or known
        bad = sorted(set(names) - set(known))
        if bad:
            raise ValueError(f"unknown schedule(s) {bad}; choose from {known}")
        return names

    def __post_init__(self):
        if self.workers < 2 or self.microbatches < 1 or self.steps < 2:
            raise ValueError(
                f"need workers >= 2, microbatches >= 1 and steps >= 2; got {self.workers}, "
                f"{self.microbatches}, {self.steps}"
            )
        self.names()


QUICK = dict(workers=2, microbatches=4, batch_size=128, steps=4)


def quick_config(**params) -> Config:
    """``params`` with the quick-mode budget (:data:`QUICK`: 2 ranks, 4 rounds) on top."""
    return Config(**(params | QUICK))


# ---- closed forms ----------------------------------------------------------------------------
def closed_form_bubble(schedule) -> tuple[float, str]:
    """(bubble fraction, formula) of a one-round schedule under unit costs (F = 1, B = 2), from the
    form its registration names (:mod:`workbench.schedules.closed_forms`); NaN when no paper gives one."""
    return schedules.closed_form_bubble(schedule, 1.0, 2.0)


def _compute_rows(timeline: pd.DataFrame, kinds=BUSY_KINDS) -> pd.DataFrame:
    comp = timeline[timeline["kind"].isin(kinds)]
    return comp[comp["lane"] == "compute"] if "lane" in comp else comp


def bubble_fraction(timeline: pd.DataFrame) -> float:
    """``mean_w (1 - busy_w / L)`` of a timeline (compute kinds only, ``L`` = its makespan); a worker
    busy the whole makespan counts 0, not the ``-2e-16`` that summing its op times can round to."""
    comp = _compute_rows(timeline)
    span = comp["end"].max() - comp["start"].min()
    busy = (comp["end"] - comp["start"]).groupby(comp["worker"]).sum()
    idle = 1 - busy / span
    return float(idle.where(idle.abs() > 1e-12, 0.0).mean()) if span > 0 else math.nan


def span_bubble_fraction(timeline: pd.DataFrame) -> float:
    """``max_w (1 - work_w / span_w)`` with ``span_w`` from worker w's first F/B/BI/BW start to its
    last end: the zero-bubble papers' bubble rate (the simulator's ``span_bubble_fraction``, worst worker)."""
    comp = _compute_rows(timeline, BUSY_KINDS[:-1])
    by = comp.groupby("worker")
    span = by["end"].max() - by["start"].min()
    work = (comp["end"] - comp["start"]).groupby(comp["worker"]).sum()
    rate = (1 - work / span)[span > 0]
    return float(rate.max()) if len(rate) else math.nan


# ---- measured: one spawn for every schedule ---------------------------------------------------
def _prepare(cfg: Config, name: str, out: Path):
    from ..runtime import prepare

    return prepare(
        cfg.model,
        name,
        workers=cfg.workers,
        microbatches=cfg.microbatches,
        steps=cfg.steps,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        out=out,
        progress=False,
        allow_oversubscribe=True,
        timeout_s=cfg.timeout_s,
        evaluate=False,
        schedule_options=dict(cfg.schedule_options.get(name, {})),
        **cfg.model_options,
    )


def measured_runs(cfg: Config, out_dir) -> tuple[dict, pd.DataFrame]:
    """Run every schedule ``cfg.steps`` rounds into ``out_dir/runs/<name>``. Returns ({name: (job,
    summary)}, skipped) where ``skipped`` lists the schedules the runtime cannot run at this worker
    count, with the reason it gave."""
    from ..runtime import run_job, run_jobs

    jobs, skipped = {}, []
    for name in cfg.names():
        try:
            jobs[name] = _prepare(cfg, name, Path(out_dir) / "runs" / name)
        except ValueError as e:
            skipped.append(dict(schedule=name, reason=str(e)))
    try:
        summaries = dict(zip(jobs, run_jobs(list(jobs.values())))) if jobs else {}
    except RuntimeError:  # one schedule failed at run time: run them one by one and report the failures
        summaries = {}
        for name, _job in jobs.items():
            try:
                summaries[name] = run_job(_prepare(cfg, name, Path(out_dir) / "runs" / f"{name}-alone"))
            except (RuntimeError, ValueError) as e:
                skipped.append(dict(schedule=name, reason=f"failed at run time: {e}"))
    slim_runs(summaries.values())
    return {n: (jobs[n], s) for n, s in summaries.items()}, pd.DataFrame(skipped, columns=["schedule", "reason"])


def measured_timeline(summary: dict) -> pd.DataFrame:
    """The run's ``timeline.csv`` (ms since the barrier-synchronised start)."""
    return pd.read_csv(Path(summary["out"]) / "timeline.csv")


def _measured_peaks(summary: dict) -> tuple[float, float]:
    """Max over ranks of (peak stashed microbatches summed over the rank's stages: an upper bound of
    the rank's simultaneous peak; peak weight versions of one stage). NaN where the executor does not
    count them (Hogwild keeps no stash)."""
    acts, vers = [], []
    for info in summary["ranks"]:
        mem = list(info["memory"].values())
        live = [m.get("peak_live_microbatches") for m in mem]
        acts.append(sum(live) if live and None not in live else math.nan)
        vers.append(max((m.get("peak_versions") or 0 for m in mem), default=math.nan))
    return max(acts, default=math.nan), max(vers, default=math.nan)


# ---- modeled: the same op lists with the stage costs measured here ---------------------------------
def stage_costs(job, cache: dict):
    """Stage-level fwd/bwd/step ms of the job's model at its microbatch size (measured, cached per layout)."""
    from ..calibrate import stage_profile

    key = tuple(map(tuple, job.bounds))
    if key not in cache:
        cache[key] = stage_profile(
            job.model_fn(),
            list(key),
            job.batch_size // job.schedule.microbatches,
            threads=job.threads,
            iterations=5,
            warmup=2,
        )
    return cache[key]


def modeled(job, stages, rounds: int):
    """Simulate ``rounds`` back-to-back rounds of the job's schedule with the measured stage costs
    (microbatch_fraction 1: the costs are at the microbatch size; communication free)."""

    from ..calibrate import repeat_rounds
    from ..plan import Plan

    sched = job.schedule
    plan = Plan.from_boundaries(list(range(sched.num_stages)), [len(ws) for ws in sched.stage_workers])
    return simulate(
        repeat_rounds(sched, rounds),
        profile=stages.as_profile("stage"),
        plan=plan,
        step_ms=list(stages.step_ms),
        step_copy_ms=list(stages.step_copy_ms) or None,
        microbatch_fraction=1.0,
    )


# ---- the table: closed form, unit, modeled, measured ----------------------------------------------
_OP_KEY = ["worker", "stage", "microbatch", "kind"]


def compute_stretch(measured: pd.DataFrame, modeled: pd.DataFrame, by: str = "worker") -> tuple[float, pd.Series]:
    """How much slower the run's compute ops (F, B, BI, BW, STEP) were than the stage costs timed alone:
    ``sum measured durations / sum modeled durations`` over the ops both timelines hold, matched by
    ``(worker, stage, microbatch, kind)`` and, for repeats of a key (a worker's STEPs), by start order.
    Returns (all ops, per ``by``: ``"worker"`` or ``"stage"``); NaN where no op matches. 1 = the
    ranks computed as fast as alone."""

    def ops(t: pd.DataFrame) -> pd.DataFrame:
        c = _compute_rows(t).sort_values("start")
        return c.assign(nth=c.groupby(_OP_KEY).cumcount(), ms=c["end"] - c["start"])[[*_OP_KEY, "nth", "ms"]]

    both = ops(measured).merge(ops(modeled), on=[*_OP_KEY, "nth"], suffixes=("_measured", "_modeled"))
    sums = both.groupby(by)[["ms_measured", "ms_modeled"]].sum()
    total = sums.sum()
    overall = total["ms_measured"] / total["ms_modeled"] if total["ms_modeled"] > 0 else math.nan
    return float(overall), sums["ms_measured"] / sums["ms_modeled"]


def stretched_costs(stages, factor: pd.Series):
    """The stage costs with every timing of stage ``s`` multiplied by ``factor[s]`` (1 where absent):
    what the model charges if each stage computes as slowly as it did in the run."""
    from ..calibrate import STAGE_TIMINGS

    def scaled(values: tuple) -> tuple:
        return tuple(v * float(factor.get(s, 1.0)) for s, v in enumerate(values))

    return replace(stages, **{f: scaled(getattr(stages, f)) for f in STAGE_TIMINGS})


def compare(name: str, job, summary: dict, sim, cfg: Config, costs=None) -> dict:
    """One row: the bubbles (closed form, unit-cost simulation, modeled, measured), the round time
    (modeled, measured), peak stashed microbatches / weight versions (modeled, measured max over
    ranks), the compute stretch (:func:`compute_stretch`) and, given the stage ``costs`` the model
    used, ``bubble_modeled_stretched``: the model replayed with each stage's costs stretched as
    measured (:func:`stretched_costs`), which splits the measured-vs-modeled gap in two."""

    from ..calibrate import measured_step_ms

    unit = simulate(job.schedule, fwd=1.0, bwd=2.0)
    unit_b = float(np.mean(unit.metrics["bubble_fraction"]))
    cf, formula = closed_form_bubble(job.schedule)
    tl = measured_timeline(summary)
    acts, vers = _measured_peaks(summary)
    m = sim.metrics
    meas_round = measured_step_ms(tl, skip=1)
    mod_round = _round_spacing_modeled(sim, job.schedule.microbatches)
    stretch, by_worker = compute_stretch(tl, sim.timeline)
    stretched_b = math.nan
    if costs is not None:
        per_stage = compute_stretch(tl, sim.timeline, "stage")[1]
        stretched_b = bubble_fraction(modeled(job, stretched_costs(costs, per_stage), cfg.steps).timeline)
    bubbles = (cf, unit_b, bubble_fraction(sim.timeline), bubble_fraction(tl))
    why = (stretch, float(by_worker.min()), float(by_worker.max()), stretched_b)
    return dict(
        schedule=name,
        workers=job.schedule.num_workers,
        stages=job.schedule.num_stages,
        microbatches=job.schedule.microbatches,
        closed_form=cf,
        formula=formula,
        bubble_unit_sim=unit_b,
        bubble_modeled=bubble_fraction(sim.timeline),
        bubble_measured=bubble_fraction(tl),
        span_bubble_modeled=span_bubble_fraction(sim.timeline),
        span_bubble_measured=span_bubble_fraction(tl),
        round_ms_modeled=mod_round,
        round_ms_measured=meas_round,
        peak_stash_modeled=int(max(m["peak_activations"])),
        peak_stash_measured=acts,
        weight_versions_modeled=int(max(m["weight_versions"])),
        weight_versions_measured=vers,
        compute_stretch_measured=stretch,
        compute_stretch_worker_min=float(by_worker.min()),
        compute_stretch_worker_max=float(by_worker.max()),
        bubble_modeled_stretched=stretched_b,
        explanation=_explain(*bubbles, why, cfg),
    )


def _round_spacing_modeled(sim, microbatches: int) -> float:
    """Median spacing of the rounds' first compute-op starts in a simulated timeline: the statistic
    :func:`workbench.calibrate.measured_step_ms` takes from a measured one."""
    comp = sim.compute[sim.compute["kind"] != "STEP"]
    firsts = np.sort(comp.groupby(comp["microbatch"] // microbatches)["start"].min().to_numpy())
    return float(np.median(np.diff(firsts))) if len(firsts) > 1 else math.nan


def _explain(
    cf: float, unit_b: float, modeled_b: float, measured_b: float, stretch: tuple[float, ...], cfg: Config
) -> str:
    """Why the four bubbles of a row differ (computed from the row's numbers); ``stretch``: the row's
    (``compute_stretch_measured``, its worker min, its worker max, ``bubble_modeled_stretched``)."""
    parts = []
    if math.isfinite(cf):
        parts.append(
            "unit-cost simulation equals the closed form"
            if abs(unit_b - cf) < 1e-9
            else f"unit-cost simulation differs from the closed form by {unit_b - cf:+.3g}"
        )
        parts.append(
            f"modeled {modeled_b - cf:+.3f} vs the closed form: measured stage costs are unequal "
            "(F:B is not 1:2, stages differ, STEP takes time) and rounds repeat back to back"
        )
    s, lo, hi, sb = stretch
    text = (
        f"measured {measured_b - modeled_b:+.3f} vs modeled: the compute ops took {s:.2f}x their stage costs timed "
        f"alone (compute_stretch_measured; per worker {lo:.2f}-{hi:.2f}x: {cfg.workers} ranks on {os.cpu_count()} "
        "loaded CPU cores)"
    )
    if math.isfinite(sb):
        text += (
            f"; the model replayed with each stage's costs stretched as measured has bubble {sb:.3f} (a uniform "
            f"stretch leaves it unchanged): the stretch's unevenness accounts for {sb - modeled_b:+.3f}, the time "
            f"between ops (per-op Python/dispatch overhead, gloo messages and waits; the model's communication is "
            f"free) for {measured_b - sb:+.3f}"
        )
    parts.append(text)
    return "; ".join(parts)


def timeline_pair(name: str, sim, summary: dict, cfg: Config):
    """Modeled and measured timelines of one schedule, stacked on one time axis (ms)."""
    from ..plot import compare_figure

    return compare_figure(
        {
            "modeled (stage costs measured here, comm free)": sim.timeline,
            f"measured ({cfg.workers} CPU gloo ranks, {cfg.model})": measured_timeline(summary),
        },
        title=f"{name}: {cfg.steps} rounds of {cfg.microbatches} microbatches (ms)",
    )


def panels_figure(table: pd.DataFrame):
    """Three panels across schedules: bubble (closed form, modeled, measured), peak stashed
    microbatches and weight versions (modeled vs measured)."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        subplot_titles=("bubble fraction", "peak stashed microbatches per worker", "peak weight versions per stage"),
    )
    x = table["schedule"]
    for col, name in (
        ("closed_form", "closed form (unit costs)"),
        ("bubble_modeled", "modeled"),
        ("bubble_measured", "measured"),
    ):
        fig.add_trace(go.Bar(x=x, y=table[col], name=name, legendgroup=name), row=1, col=1)
    for row, base in ((2, "peak_stash"), (3, "weight_versions")):
        for suffix in ("modeled", "measured"):
            fig.add_trace(
                go.Bar(x=x, y=table[f"{base}_{suffix}"], name=suffix, legendgroup=suffix, showlegend=False),
                row=row,
                col=1,
            )
    fig.update_layout(barmode="group", height=800, title="Bubble, memory and weight versions per schedule")
    return fig


def bubble_claims(table: pd.DataFrame, cfg: Config) -> list[dict]:
    """One claims row per schedule with a closed form: our measured bubble vs the formula's value."""
    lab = f"measured (this machine: {cfg.workers} CPU gloo ranks, {cfg.model}, {cfg.steps} rounds)"
    rows = []
    for r in table.itertuples():
        if math.isfinite(r.closed_form) and r.closed_form > 0:
            rows.append(
                claim(
                    EXPERIMENT,
                    f"{r.schedule} bubble fraction = {r.formula}",
                    r.closed_form,
                    r.bubble_measured,
                    "fraction",
                    lab,
                    r.explanation,
                )
            )
    return rows


def run(cfg: Config, out_dir) -> dict:
    """Everything the notebook shows, written into ``out_dir`` (a fresh folder)."""
    out = out_folder(out_dir)
    runs, skipped = measured_runs(cfg, out)
    cache: dict = {}
    rows: list = []
    figs: dict = {}
    for name, (job, summary) in runs.items():
        costs = stage_costs(job, cache)
        sim = modeled(job, costs, cfg.steps)
        rows.append(compare(name, job, summary, sim, cfg, costs))
        figs[f"timeline_{name}"] = timeline_pair(name, sim, summary, cfg)
        sim.timeline.to_csv(Path(summary["out"]) / "timeline_modeled.csv", index=False)
    table = pd.DataFrame(rows)
    save_table(table, out, "bubbles")
    save_table(skipped, out, "skipped")
    write_claims(bubble_claims(table, cfg), out)
    save_page(figs, out / "timelines.html", "Every schedule: modeled (top) and measured (bottom)")
    figs["panels"] = panels_figure(table)
    save_figure(figs["panels"], out, "panels")
    (out / "config.json").write_text(pd.Series(asdict(cfg)).to_json(indent=1))
    return dict(out=out, table=table, skipped=skipped, figures=figs)


def validate_params(quick: bool, **params) -> None:
    """``workbench reproduce``'s check of the notebook's parameters before anything runs (one-line
    ``ValueError``): the configuration they make, and the model and its options in the zoo."""
    check_config(Config, quick_config, quick, params)

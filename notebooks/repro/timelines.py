"""Notebook 04: every schedule's timeline, modeled and measured side by side, with its bubble, memory
and weight versions, and the papers' closed-form bubbles measured in the setting they are stated for.

For each schedule name the package exposes (:func:`schedule_names`):

* **measured**: a short real run (:func:`workbench.runtime.train` machinery, CPU ranks) of a
  mini model (``cfg.model``); its ``timeline.csv`` and per-rank peak stash depth / weight versions;
* **modeled**: the same op lists (``R`` rounds back to back, :func:`workbench.runtime.calibration.machine.repeat_rounds`)
  simulated with the stage costs measured here at the microbatch size
  (:func:`workbench.runtime.calibration.machine.stage_profile`, one profile per stage layout) and communication free;
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
  worker w's first compute op to its last (:func:`span_bubble_fraction`);
* **measured on timed stages** (the claims): every schedule with a positive closed form
  (:func:`has_closed_form`) also runs ``cfg.timed_steps`` rounds on the ``timed`` zoo model
  (:mod:`workbench.models.sleep_stages`): one block per stage whose forward, input gradient and weight
  gradient each sleep ``t = cfg.timed_ms`` (a full backward ``2t``), so the stages are equal, F : B
  is 1 : 2 and ranks sharing cores hardly slow each other down. Its bubble
  (``bubble_measured_timed``) is taken over all ``R`` rounds back to back like the model's; with
  equal costs back-to-back rounds add up to one round, so the unit-cost simulation of the same
  ``R`` rounds (``bubble_unit_sim_timed``) equals the one-round closed form (tested), and the claims
  rows compare the measured bubble with the formula (:func:`compare_timed`). What the run adds is
  measured, not assumed: the ops' mean durations (``timed_*_ms``, ``compute_stretch_timed``), the
  simulator replaying the run with them (``bubble_timed_replayed``, communication free), then also
  with the median message latency measured in the run (``message_latency_ms_timed``,
  ``bubble_timed_replayed_latency``), and the executor's own time between ops (``op_gap_ms_timed``).

``compute_stretch_measured`` (:func:`compute_stretch`) puts a number on the model's measured-vs-modeled
gap's first suspect, ranks sharing cores: the measured time of the run's compute ops over the same ops'
stage costs timed alone (the costs the modeled timeline charges), with its spread over workers
(``compute_stretch_worker_min`` / ``_max``). With free communication a uniform stretch leaves the
bubble unchanged; ``bubble_modeled_stretched`` replays the model with each stage's costs stretched as
measured, so ``bubble_modeled_stretched - bubble_modeled`` is what the stretch's unevenness moves and
``bubble_measured - bubble_modeled_stretched`` what the time between ops (Python, gloo, waits) adds.

Every number is computed from the full-precision timelines; what the run folders then keep
(``timeline.csv``, ``timeline_modeled.csv``) and the figures draw has its times to 0.1 µs
(:func:`repro.pages.rounded_times`), so a number recomputed from the files moves by at most what
that rounding allows.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from repro.common import check_config, claim, out_folder, save_figure, save_table, write_claims
from repro.pages import round_run_timelines, rounded_times, save_page, slim_runs
from workbench import Plan, schedules
from workbench.profiling import Profile
from workbench.runtime import (
    STAGE_TIMINGS,
    measured_step_ms,
    prepare,
    repeat_rounds,
    run_job,
    run_jobs,
    stage_profile,
)
from workbench.simulation import simulate
from workbench.viz import compare_figure

EXPERIMENT = "04_pipeline_timelines"
BUSY_KINDS = ("F", "B", "BI", "BW", "STEP")
TIMED_MODEL = "timed"  # workbench.models.sleep_stages: stages whose F, BI and BW each sleep a set time
TIMED_RUNS = "runs_timed"  # the timed model's run folders, beside runs/


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
    timed_ms: float = 30.0
    timed_steps: int = 3

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
        t, r = self.timed_ms, self.timed_steps
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not (math.isfinite(t) and t > 0):
            raise ValueError(f"timed_ms (the timed stages' sleep per op) must be a number of ms > 0, got {t!r}")
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise ValueError(f"timed_steps (rounds of each timed run) must be an integer >= 1, got {r!r}")
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
def has_closed_form(schedule) -> bool:
    """Whether a paper states a positive one-round bubble for ``schedule``: the claims rows (a
    closed form of 0, data parallelism's, has no ratio to compare)."""
    cf, _ = closed_form_bubble(schedule)
    return math.isfinite(cf) and cf > 0


def timed_options(cfg: Config, stages: int) -> dict:
    """Options of the :data:`TIMED_MODEL` for a schedule of ``stages`` stages: one timed block per
    stage (the runtime's even split), forward, input gradient and weight gradient ``cfg.timed_ms`` each."""
    t = float(cfg.timed_ms)
    return dict(depth=int(stages), fwd_ms=t, bwd_input_ms=t, bwd_weight_ms=t)


def _prepare(cfg: Config, name: str, out: Path, timed_stages: int | None = None):
    """The job of schedule ``name``: ``cfg.model`` for ``cfg.steps`` rounds, or (``timed_stages``
    given) the timed model with one block per stage for ``cfg.timed_steps`` rounds."""

    model, steps, options = cfg.model, cfg.steps, dict(cfg.model_options)
    if timed_stages is not None:
        model, steps, options = TIMED_MODEL, cfg.timed_steps, timed_options(cfg, timed_stages)
    return prepare(
        model,
        name,
        workers=cfg.workers,
        microbatches=cfg.microbatches,
        steps=steps,
        batch_size=cfg.batch_size,
        seed=cfg.seed,
        out=out,
        progress=False,
        allow_oversubscribe=True,
        timeout_s=cfg.timeout_s,
        evaluate=False,
        schedule_options=dict(cfg.schedule_options.get(name, {})),
        model_options=options,
    )


@dataclass(frozen=True)
class Runs:
    """The measured runs: ``real[name]`` / ``timed[name]`` = (job, summary) of ``cfg.model`` and of
    the timed model (schedules with a closed form only); ``skipped``: (schedule, reason) of every
    run the runtime could not make."""

    real: dict
    timed: dict
    skipped: pd.DataFrame


def measured_runs(cfg: Config, out_dir) -> Runs:
    """Run every schedule ``cfg.steps`` rounds on ``cfg.model`` into ``out_dir/runs/<name>`` and each
    schedule with a closed form ``cfg.timed_steps`` rounds on the timed model into
    ``out_dir/runs_timed/<name>``, all in one spawn. A schedule the runtime cannot run at this
    worker count is skipped with the reason it gave."""

    out = Path(out_dir)
    folders = {False: out / "runs", True: out / TIMED_RUNS}
    jobs: dict = {}
    skipped = []
    for name in cfg.names():
        try:
            jobs[(name, False)] = _prepare(cfg, name, folders[False] / name)
        except ValueError as e:
            skipped.append(dict(schedule=name, reason=str(e)))
    for (name, _), job in list(jobs.items()):
        if has_closed_form(job.schedule):
            try:
                jobs[(name, True)] = _prepare(cfg, name, folders[True] / name, job.schedule.num_stages)
            except ValueError as e:
                skipped.append(dict(schedule=name, reason=f"timed stages: {e}"))
    try:
        summaries = dict(zip(jobs, run_jobs(list(jobs.values())))) if jobs else {}
    except RuntimeError:  # one run failed at run time: run them one by one and report the failures
        summaries = {}
        for (name, timed), job in jobs.items():
            try:
                stages = job.schedule.num_stages if timed else None
                summaries[(name, timed)] = run_job(_prepare(cfg, name, folders[timed] / f"{name}-alone", stages))
            except (RuntimeError, ValueError) as e:
                what = "timed stages failed" if timed else "failed"
                skipped.append(dict(schedule=name, reason=f"{what} at run time: {e}"))
    slim_runs(summaries.values())
    done = {k: (jobs[k], v) for k, v in summaries.items()}
    return Runs(
        {n: r for (n, timed), r in done.items() if not timed},
        {n: r for (n, timed), r in done.items() if timed},
        pd.DataFrame(skipped, columns=["schedule", "reason"]),
    )


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

    key = tuple(map(tuple, job.bounds))
    if key not in cache:
        cache[key] = stage_profile(
            job.model_fn(),
            list(key),
            job.optim.batch_size // job.schedule.microbatches,
            threads=job.run.threads,
            iterations=5,
            warmup=2,
        )
    return cache[key]


def modeled(job, stages, rounds: int):
    """Simulate ``rounds`` back-to-back rounds of the job's schedule with the measured stage costs
    (microbatch_fraction 1: the costs are at the microbatch size; communication free)."""

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

    def scaled(values: tuple) -> tuple:
        return tuple(v * float(factor.get(s, 1.0)) for s, v in enumerate(values))

    return replace(stages, **{f: scaled(getattr(stages, f)) for f in STAGE_TIMINGS})


def compare(name: str, job, summary: dict, sim, cfg: Config, *, costs=None) -> dict:
    """One row: the bubbles (closed form, unit-cost simulation, modeled, measured), the round time
    (modeled, measured), peak stashed microbatches / weight versions (modeled, measured max over
    ranks), the compute stretch (:func:`compute_stretch`) and, given the stage ``costs`` the model
    used, ``bubble_modeled_stretched``: the model replayed with each stage's costs stretched as
    measured (:func:`stretched_costs`), which splits the measured-vs-modeled gap in two."""

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
        explanation=_explain(*bubbles, why, cfg=cfg),
    )


def _round_spacing_modeled(sim, microbatches: int) -> float:
    """Median spacing of the rounds' first compute-op starts in a simulated timeline: the statistic
    :func:`workbench.runtime.calibration.machine.measured_step_ms` takes from a measured one."""
    comp = sim.compute[sim.compute["kind"] != "STEP"]
    firsts = np.sort(comp.groupby(comp["microbatch"] // microbatches)["start"].min().to_numpy())
    return float(np.median(np.diff(firsts))) if len(firsts) > 1 else math.nan


def _explain(
    cf: float, unit_b: float, modeled_b: float, measured_b: float, stretch: tuple[float, ...], *, cfg: Config
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


# ---- the timed model: the closed forms' setting, measured ------------------------------------------
TIMED_COLUMNS = (
    "bubble_measured_timed",
    "bubble_unit_sim_timed",
    "timed_rounds",
    "timed_fwd_ms",
    "timed_bwd_ms",
    "timed_step_ms",
    "compute_stretch_timed",
    "bubble_timed_replayed",
    "message_latency_ms_timed",
    "bubble_timed_replayed_latency",
    "op_gap_ms_timed",
    "transport_timed",
    "explanation_timed",
)


def op_ms(timeline: pd.DataFrame) -> pd.DataFrame:
    """Mean duration (ms) of each compute kind (F, B, BI, BW, STEP) per stage: rows stages, columns kinds."""
    comp = _compute_rows(timeline)
    return (comp["end"] - comp["start"]).groupby([comp["stage"], comp["kind"]]).mean().unstack()


def message_latency_ms(timeline: pd.DataFrame) -> float:
    """Median ms from a message's send being posted (the producing op's ``send_at``) to the start of
    the op that received it on another rank, over the messages that op was already waiting for
    (``start - wait_ms <= send_at``: the receive was posted before the send, so the interval is the
    message's own latency and not a busy receiver). An activation of ``F(s, b)`` goes to ``F(s+1, b)``,
    the gradient of ``B``/``BI(s, b)`` to the ``B``/``BI`` of ``(s-1, b)``. NaN without such a message."""
    c = timeline[timeline["kind"].isin(["F", "B", "BI"])]
    fwd = c["kind"] == "F"
    keys = ["stage", "microbatch", "grad"]
    cons = c.assign(grad=~fwd)[[*keys, "worker", "start", "wait_ms"]]
    prod = c.assign(stage=c["stage"] + np.where(fwd, 1, -1), grad=~fwd)[[*keys, "worker", "send_at"]]
    m = cons.merge(prod, on=keys, suffixes=("", "_src"))
    m = m[(m["worker"] != m["worker_src"]) & (m["wait_ms"] > 0) & (m["start"] - m["wait_ms"] <= m["send_at"])]
    lat = m["start"] - m["send_at"]
    return float(lat.median()) if len(lat) else math.nan


def op_gap_ms(timeline: pd.DataFrame) -> float:
    """Median ms a rank spends between two consecutive ops outside both and outside the second's
    wait for a message (``start - previous end - wait_ms``): the executor's own per-op time."""
    t = timeline.sort_values(["worker", "start"])
    gap = t["start"] - t.groupby("worker")["end"].shift() - t["wait_ms"].fillna(0.0)
    return float(gap.dropna().median()) if gap.notna().any() else math.nan


def replay_costs(schedule, timeline: pd.DataFrame) -> dict:
    """``simulate`` keywords that charge every op of ``schedule`` its stage's mean measured duration in
    ``timeline`` (:func:`op_ms`: F, B or BI + BW, BI, BW, STEP; communication free)."""

    ms = op_ms(timeline)

    def mean(s: int, kind: str) -> float:
        v = ms[kind].get(s, math.nan) if kind in ms else math.nan
        return float(v) if math.isfinite(v) else math.nan

    rows, step = [], []
    for s in range(schedule.num_stages):
        bi, bw, b = mean(s, "BI"), mean(s, "BW"), mean(s, "B")
        row = dict(name=f"stage{s}", fwd_ms=mean(s, "F"), act_bytes=0.0, param_bytes=0.0)
        row["bwd_ms"] = b if math.isfinite(b) else bi + bw
        if "BI" in ms:
            row.update(bwd_input_ms=bi, bwd_weight_ms=bw)
        rows.append(row)
        st = mean(s, "STEP")
        step.append(st if math.isfinite(st) else 0.0)
    plan = Plan.from_boundaries(list(range(schedule.num_stages)), [len(ws) for ws in schedule.stage_workers])
    prof = Profile(pd.DataFrame(rows), {"kind": "measured (op durations of a run)"})
    return dict(profile=prof, plan=plan, step_ms=step, microbatch_fraction=1.0)


def compare_timed(job, summary: dict, cfg: Config) -> dict:
    """The :data:`TIMED_COLUMNS` of one schedule's timed run (``job``, ``summary``): its measured bubble
    over its ``R`` rounds back to back; the unit-cost simulation of the same ``R`` rounds (``F = t``,
    ``B = 2t``, ``BI = BW = t``, STEP and communication free: the closed form's setting, whose bubble
    over ``R`` equal rounds is one round's); the measured op durations (mean F, backward per stage and
    microbatch, STEP) and their ratio to the set ones (:func:`compute_stretch` against the unit-cost
    timeline); the simulator replaying the run with the measured op durations
    (:func:`replay_costs`), then also with the measured :func:`message_latency_ms` on every message
    between ranks; the measured :func:`op_gap_ms`; and an explanation quoting them."""

    tl = measured_timeline(summary)
    t = float(cfg.timed_ms)
    rounds = int(tl["round"].nunique())
    sched = repeat_rounds(job.schedule, rounds)
    unit = simulate(sched, fwd=t, bwd=2 * t)
    comp = _compute_rows(tl)
    dur = comp["end"] - comp["start"]
    fwd = comp["kind"] == "F"
    bwd = comp["kind"].isin(["B", "BI", "BW"])
    steps = comp["kind"] == "STEP"
    costs = replay_costs(job.schedule, tl)
    latency = message_latency_ms(tl)
    replayed = bubble_fraction(simulate(sched, **costs).timeline)
    with_latency = (
        bubble_fraction(simulate(sched, latency_ms=latency, **costs).timeline) if math.isfinite(latency) else replayed
    )
    row = dict(
        bubble_measured_timed=bubble_fraction(tl),
        bubble_unit_sim_timed=bubble_fraction(unit.timeline),
        timed_rounds=rounds,
        timed_fwd_ms=float(dur[fwd].mean()),
        timed_bwd_ms=float(dur[bwd].sum() / max(1, int(fwd.sum()))),
        timed_step_ms=float(dur[steps].mean()) if steps.any() else math.nan,
        compute_stretch_timed=compute_stretch(tl, unit.timeline)[0],
        bubble_timed_replayed=replayed,
        message_latency_ms_timed=latency,
        bubble_timed_replayed_latency=with_latency,
        op_gap_ms_timed=op_gap_ms(tl),
        transport_timed=str(summary.get("transport", "")),
    )
    row["explanation_timed"] = _explain_timed(row, closed_form_bubble(job.schedule)[0], op_ms(tl), t)
    return row


def _explain_timed(r: dict, cf: float, ms: pd.DataFrame, t: float) -> str:
    """Why a timed run's bubble differs from the closed form ``cf``, from its row ``r``
    (:func:`compare_timed`) and its per-stage op durations ``ms`` (:func:`op_ms`); ``t`` the set ms."""
    m, u = r["bubble_measured_timed"], r["bubble_unit_sim_timed"]
    rep, lat = r["bubble_timed_replayed"], r["bubble_timed_replayed_latency"]
    n = r["timed_rounds"]
    same = "equals" if abs(u - cf) < 1e-9 else f"differs by {u - cf:+.3g} from"
    parts = [
        f"measured {m - cf:+.3f} vs the closed form over {n} rounds back to back (the unit-cost simulation of "
        f"the same {n} rounds {same} the closed form: with equal costs back-to-back rounds add up to one round's bubble)",
        f"the ops took about their set times: F {r['timed_fwd_ms']:.1f} ms, backward {r['timed_bwd_ms']:.1f} ms per "
        f"stage and microbatch (set {t:g} and {2 * t:g}; compute_stretch_timed {r['compute_stretch_timed']:.3f}x), "
        f"STEP {r['timed_step_ms']:.2f} ms",
    ]
    if "BI" in ms and 0 in ms.index and len(ms.index) > 1:
        rest = ms.drop(index=0)
        parts.append(
            f"split backward: BI {rest['BI'].mean():.1f} / BW {rest['BW'].mean():.1f} ms on stages > 0, "
            f"{ms.at[0, 'BI']:.2f} / {ms.at[0, 'BW']:.1f} ms on the first stage, whose input needs no gradient "
            "(the runtime's BW there runs the whole backward)"
        )
    parts.append(
        f"the simulator replaying the run with these measured op durations, communication free: {rep:.3f} "
        f"({rep - cf:+.3f} vs the closed form)"
    )
    if math.isfinite(r["message_latency_ms_timed"]):
        parts.append(
            f"with the measured message latency too ({r['message_latency_ms_timed']:.2f} ms median from a send "
            f"posted to the receiving op's start, {r['transport_timed']}): {lat:.3f} ({lat - rep:+.3f}); the rest, "
            f"{m - lat:+.3f}, is what the replay leaves out (the spread of latencies and op times, "
            f"{r['op_gap_ms_timed']:.2f} ms median between a rank's ops outside them and their waits)"
        )
    return "; ".join(parts)


def timeline_pair(name: str, sim, summary: dict, cfg: Config):
    """Modeled and measured timelines of one schedule, stacked on one time axis (ms); the figure
    carries copies with times to 0.1 µs (:func:`repro.pages.rounded_times`), as the CSVs keep them."""

    return compare_figure(
        {
            "modeled (stage costs measured here, comm free)": rounded_times(sim.timeline),
            f"measured ({cfg.workers} CPU gloo ranks, {cfg.model})": rounded_times(measured_timeline(summary)),
        },
        title=f"{name}: {cfg.steps} rounds of {cfg.microbatches} microbatches (ms)",
    )


def panels_figure(table: pd.DataFrame):
    """Three panels across schedules: bubble (closed form, measured on the timed stages, modeled and
    measured on the model), peak stashed microbatches and weight versions (modeled vs measured)."""

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
        ("bubble_measured_timed", "measured, timed stages (F = BI = BW)"),
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
    """One claims row per schedule with a closed form: the bubble measured on the timed stages (the
    closed form's setting: equal stages, F = BI = BW = ``cfg.timed_ms``) beside the formula's value;
    the explanation names each measured cause of the gap and quotes the bubble of ``cfg.model``."""
    rows = []
    for r in table.itertuples():
        if not (math.isfinite(r.closed_form) and r.closed_form > 0):
            continue
        transport = r.transport_timed if isinstance(r.transport_timed, str) else "no timed run"
        lab = (
            f"measured (this machine: {r.workers} CPU ranks running the real runtime, {transport} "
            f"messages; synthetic stages whose forward, input gradient and weight gradient each sleep t = "
            f"{cfg.timed_ms:g} ms; bubble over {cfg.timed_steps} rounds)"
        )
        why = r.explanation_timed if isinstance(r.explanation_timed, str) else "no timed run (skipped.csv says why)"
        why += (
            f"; the mini {cfg.model} with real compute on the same ranks: bubble {r.bubble_measured:.3f} "
            "(bubbles.csv bubble_measured; its explanation there)"
        )
        rows.append(
            claim(EXPERIMENT, f"{r.schedule} bubble fraction = {r.formula}", r.closed_form, r.bubble_measured_timed,
                  "fraction", label=lab, explanation=why)
        )  # fmt: skip
    return rows


def bubble_summary(table: pd.DataFrame) -> pd.DataFrame:
    """The claims at a glance, one row per schedule with a closed form: the closed form, the
    unit-cost simulation of the timed run, the timed run's measured bubble and its ratio to the
    closed form, its replays, and the bubble measured on the model with real compute."""
    cols = ["schedule", "formula", "closed_form", "bubble_unit_sim_timed", "bubble_measured_timed",
            "bubble_timed_replayed", "bubble_timed_replayed_latency", "bubble_measured"]  # fmt: skip
    known = table[table["closed_form"].map(lambda v: math.isfinite(v) and v > 0)]
    out = known[cols].copy()
    out.insert(5, "ratio_timed", out["bubble_measured_timed"] / out["closed_form"])
    return out.reset_index(drop=True)


def run(cfg: Config, out_dir) -> dict:
    """Everything the notebook shows, written into ``out_dir`` (a fresh folder)."""
    out = out_folder(out_dir)
    runs = measured_runs(cfg, out)
    cache: dict = {}
    rows: list = []
    figs: dict = {}
    for name, (job, summary) in runs.real.items():
        costs = stage_costs(job, cache)
        sim = modeled(job, costs, cfg.steps)
        row = compare(name, job, summary, sim, cfg, costs=costs)
        timed = runs.timed.get(name)
        row.update(compare_timed(timed[0], timed[1], cfg) if timed else dict.fromkeys(TIMED_COLUMNS, math.nan))
        rows.append(row)
        figs[f"timeline_{name}"] = timeline_pair(name, sim, summary, cfg)
        rounded_times(sim.timeline).to_csv(Path(summary["out"]) / "timeline_modeled.csv", index=False)
    # every number above is computed from the full-precision timelines; the run folders keep them to 0.1 µs
    round_run_timelines([s for _, s in (*runs.real.values(), *runs.timed.values())], names=("timeline.csv",))
    table = pd.DataFrame(rows)
    save_table(table, out, "bubbles")
    save_table(runs.skipped, out, "skipped")
    write_claims(bubble_claims(table, cfg), out)
    save_page(figs, out / "timelines.html", "Every schedule: modeled (top) and measured (bottom)")
    figs["panels"] = panels_figure(table)
    save_figure(figs["panels"], out, "panels")
    (out / "config.json").write_text(pd.Series(asdict(cfg)).to_json(indent=1))
    return dict(out=out, table=table, summary=bubble_summary(table), skipped=runs.skipped, figures=figs)


def validate_params(quick: bool, **params) -> None:
    """``workbench reproduce``'s check of the notebook's parameters before anything runs (one-line
    ``ValueError``): the configuration they make, and the model and its options in the zoo."""
    check_config(Config, quick_config, quick, params)

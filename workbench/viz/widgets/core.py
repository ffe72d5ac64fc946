"""What the widgets compute, without any widget: settings -> plan -> schedule -> simulation.

Every figure a widget shows is read from the one cost model (:mod:`workbench.cost.model`) through
the small accessors below (:func:`predicted_ms`, :func:`in_flight`, :func:`simulated_ms_per_minibatch`,
:func:`bubble`, :func:`worker_memory_bytes`, :func:`samples_per_s`); none computes a time of its
own. :func:`modeled_plan` prices a *manual* plan with the same ``CostModel`` the partitioner uses
(stage and cut times, the 1F1B prediction, the in-flight warm-up and the memory it costs), so a
manual plan that equals the optimizer's gets the optimizer's numbers (a test checks it).
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass, replace

import pandas as pd

from workbench import schedules
from workbench.cost.model import CostModel
from workbench.cost.plan import Plan
from workbench.cost.topology import Topology
from workbench.partitioning.pipedream_optimizer import profile_for
from workbench.partitioning.pricing import data_parallel_ms, with_predictions
from workbench.partitioning.search import partition
from workbench.profiling.measure import Profile
from workbench.simulation import SimResult, simulate, steady_microbatches

DEFAULT_SCHEDULE = "pipedream"  # the tuner's schedule until the user picks another
#: schedules that take a (possibly replicated) Plan (``takes_plan``), the default first, then by name;
#: the ones with a flush take ``per_step``
PLAN_SCHEDULES = tuple(
    sorted((n for n, sp in schedules.REGISTRY.items() if sp.takes_plan), key=lambda n: (n != DEFAULT_SCHEDULE, n))
)


@dataclass(frozen=True)
class Settings:
    """One state of the tuner's controls. ``levels`` = ((workers, bytes/s), ...) innermost first;
    ``per_step``: microbatches in flight per flush (schedules registered with ``flushes``) or per
    update (a schedule with the option ``microbatches_per_step``: 2BW)."""

    levels: tuple[tuple[int, float], ...] = ((8, 12e9),)
    memory_bytes: float | None = None
    straight: bool = False
    schedule: str = DEFAULT_SCHEDULE
    microbatches: int = 16
    per_step: int = 4
    cost: str = "workbench"  # or "pipedream": PipeDream's optimizer and formulas

    @property
    def topology(self) -> Topology:
        return Topology(tuple(self.levels))


@dataclass(frozen=True)
class Outcome:
    """The optimizer's plan, the plan shown (manual or the optimizer's) and its simulation."""

    best: Plan | None
    plan: Plan
    schedule: schedules.Schedule
    sim: SimResult
    manual: bool
    note: str = ""  # a warning of the schedule builder, shown in the status line


# ---- accessors: the one cost model's figures ------------------------------------------------
def predicted_ms(plan: Plan) -> float:
    """The plan's predicted time per minibatch under 1F1B (``Plan.predicted_ms``, the cost model's
    closed form; the DP's ``bottleneck_ms`` for a plan built without it)."""
    return float(plan.predicted_ms if math.isfinite(plan.predicted_ms) else plan.bottleneck_ms)


def in_flight(plan: Plan) -> int:
    """Minibatches the input stage admits (``Plan.in_flight_count``: the communication-aware 1F1B
    warm-up; PipeDream's NOAM without communication)."""
    return int(plan.in_flight_count)


def simulated_ms_per_minibatch(res: SimResult) -> float:
    """The simulator's steady-state time per minibatch (``SimResult.time_per_minibatch_ms``); NaN
    (shown as n/a) when the simulated run reached no steady state."""
    ms = res.time_per_minibatch_ms
    return float("nan") if ms is None else float(ms)


def bubble(res: SimResult) -> float:
    """Mean over workers of the simulator's bubble fraction ``1 - busy_w / makespan``."""
    return float(res.metrics["bubble_fraction_mean"])


def stage_param_bytes(profile: Profile, plan: Plan) -> list[float]:
    w = profile.layers["param_bytes"].to_numpy(float)
    return [float(w[s.first : s.last + 1].sum()) for s in plan.stages]


def worker_memory_bytes(res: SimResult, profile: Profile, plan: Plan) -> list[float]:
    """Simulated peak memory per worker: stashed activations (``peak_activation_bytes``) plus the
    weight versions alive at once (``weight_versions``) times the parameter bytes it holds."""
    params = stage_param_bytes(profile, plan)
    held = [0.0] * res.schedule.num_workers
    for s, ws in enumerate(res.schedule.stage_workers):
        for w in ws:
            held[w] += params[s]
    acts = res.metrics["peak_activation_bytes"]
    vers = res.metrics["weight_versions"]
    return [float(a + v * h) for a, v, h in zip(acts, vers, held)]


def samples_per_s(res: SimResult) -> float:
    """Simulated throughput in samples/s (NaN when the profile does not record its batch size or the
    run reached no steady state)."""
    x = res.throughput_samples_per_s
    return float("nan") if x is None else float(x)


# ---- manual plans ---------------------------------------------------------------------------
def _ints(text: str, what: str) -> list[int]:
    parts = [p for p in re.split(r"[,\s]+", str(text).strip()) if p]
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"{what} must be whole numbers separated by commas, e.g. '9, 19, 39'; got {text!r}") from None


def parse_manual(text_lasts: str, text_replicas: str, layers: int, workers: int) -> Plan:
    """A plan from "last layer of each stage" and "replicas per stage" (comma-separated); a clear
    ValueError saying how to fix it otherwise."""
    lasts = _ints(text_lasts, "stage boundaries")
    if not lasts:
        raise ValueError(f"give the last layer of each stage, e.g. '{layers // 2 - 1}, {layers - 1}'")
    if lasts[-1] != layers - 1:
        raise ValueError(
            f"the last stage must end at layer {layers - 1} (the model has {layers} layers, 0-based); got {lasts[-1]}"
        )
    for a, b in zip([-1] + lasts, lasts):
        if b <= a:
            raise ValueError(f"stage boundaries must increase and each stage needs a layer: {b} after {a}")
    reps = _ints(text_replicas, "replicas") if str(text_replicas).strip() else [1] * len(lasts)
    if len(reps) != len(lasts):
        raise ValueError(f"{len(lasts)} stages but {len(reps)} replica counts; give one per stage")
    if any(r < 1 for r in reps):
        raise ValueError(f"every stage needs at least one replica; got {reps}")
    if sum(reps) > workers:
        raise ValueError(
            f"the stages use {sum(reps)} workers but the topology has {workers}; lower the replicas or add workers"
        )
    return Plan.from_boundaries(lasts, reps, method="manual")


def modeled_plan(profile: Profile, plan: Plan, topology: Topology) -> Plan:
    """``plan`` priced by the partitioner's cost model: stage and cut times (``CostModel.plan_times``),
    bottleneck, ``predicted_ms``, ``in_flight`` and ``stage_memory_bytes`` (``with_predictions``)."""
    if plan.num_layers != len(profile):
        raise ValueError(f"the plan covers {plan.num_layers} layers but the profile has {len(profile)}")
    if plan.num_workers > topology.num_workers:
        raise ValueError(f"the plan uses {plan.num_workers} workers but the topology has {topology.num_workers}")
    cm = CostModel.from_profile(profile, topology)
    stage_ms, cut_ms = cm.plan_times(plan)
    stages = tuple(replace(s, time_ms=t) for s, t in zip(plan.stages, stage_ms))
    cuts = [
        [int(a.last), int(topology.level_between(a.workers[-1], b.workers[0])), float(t)]
        for a, b, t in zip(plan.stages, plan.stages[1:], cut_ms)
    ]
    meta = dict(plan.meta) | {
        "topology": topology.to_list(),
        "cuts": cuts,
        "cost_model": "workbench.cost.model applied to a manual plan",
    }
    priced = Plan(
        stages,
        bottleneck_ms=max(stage_ms + cut_ms),
        single_worker_ms=profile.total_ms,
        data_parallel_ms=data_parallel_ms(profile, topology, cm),
        method=plan.method,
        meta=meta,
    )
    return with_predictions(priced, cm)


def stage_table(plan: Plan, profile: Profile) -> pd.DataFrame:
    """Per stage: layers, replicas, compute and all-reduce ms per minibatch per replica (the terms
    of T), the cut after it, modeled stage time; all from the plan's cost model."""
    df = profile.layers
    C = (df["fwd_ms"] + df["bwd_ms"]).to_numpy(float)
    cut_after = {int(a): float(t) for a, _, t in plan.meta.get("cuts", [])}
    rows = []
    for k, s in enumerate(plan.stages):
        compute = float(C[s.first : s.last + 1].sum()) / s.replicas
        rows.append(
            {
                "stage": k,
                "layers": f"{s.first}-{s.last}",
                "replicas": s.replicas,
                "compute_ms": compute,
                "stage_ms": s.time_ms,
                "comm_ms": _excess(s.time_ms, compute),
                "cut_ms": cut_after.get(s.last, 0.0),
            }
        )
    return pd.DataFrame(rows).set_index("stage")


def _excess(stage_ms: float, compute_ms: float) -> float:
    """How much the stage time exceeds its compute (the all-reduce term of T when it dominates);
    rounding noise below 1e-9 relative is 0."""
    if not math.isfinite(stage_ms):
        return math.nan
    d = stage_ms - compute_ms
    return d if d > 1e-9 * max(abs(stage_ms), 1e-300) else 0.0


# ---- one update -------------------------------------------------------------------------------
def optimize(profile: Profile, st: Settings) -> Plan:
    """PipeDream's DP for these settings (all workers; a straight pipeline may use fewer), priced
    by the settings' cost model."""
    return partition(
        profile,
        st.topology,
        straight=st.straight,
        memory_bytes=st.memory_bytes,
        use_fewer_workers=st.straight,
        cost=st.cost,
    )


def build_schedule(plan: Plan, st: Settings) -> schedules.Schedule:
    """The chosen schedule for ``plan``: ``microbatches`` in total; flush schedules run them in
    groups of ``per_step`` (one flush each), 2BW updates every ``per_step`` microbatches."""
    name, M, k = st.schedule, int(st.microbatches), int(st.per_step)
    if name not in PLAN_SCHEDULES:
        raise ValueError(f"schedule {name!r} does not take a plan; choose one of {', '.join(PLAN_SCHEDULES)}")
    if M < 1 or k < 1:
        raise ValueError("microbatches and microbatches per step must be >= 1")
    if schedules.spec(name).flushes:
        if M % k:
            raise ValueError(
                f"{name}: {M} microbatches do not split into flushes of {k}; make microbatches a "
                f"multiple of the per-step count"
            )
        return schedules.build(name, plan, k, steps=M // k)
    steady = steady_microbatches(plan)
    if M < steady:  # fewer are all warm-up and drain: the view would show no steady state (n/a)
        warnings.warn(f"simulated {steady} microbatches: {M} reach no steady state on this plan", stacklevel=2)
        M = steady
    if any(o.name == "microbatches_per_step" for o in schedules.spec(name).options):  # 2BW: an update every k
        return schedules.build(name, plan, M, microbatches_per_step=k)
    return schedules.build(name, plan, M)


def run_settings(profile: Profile, st: Settings, manual: Plan | None = None, best: Plan | None = None) -> Outcome:
    """Re-partition (unless ``best`` is given), price the manual plan if any, build the schedule
    and simulate it on the settings' topology with the profile's costs."""
    topo = st.topology
    if best is None:
        best = optimize(profile, st)
    plan = best if manual is None else modeled_plan(profile, manual, topo)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sched = build_schedule(plan, st)
    sim = simulate(sched, profile=profile_for(profile, plan), plan=plan, topology=topo)
    note = "; ".join(str(w.message).split(";")[0] for w in caught)
    return Outcome(best, plan, sched, sim, manual is not None, note)


def summary_rows(plan: Plan, sim: SimResult, profile: Profile, memory_bytes: float | None) -> dict:
    """The figures shown for one plan (predicted, simulated, throughput, bubble, peak memory)."""
    ms = simulated_ms_per_minibatch(sim)
    mem = worker_memory_bytes(sim, profile, plan)
    return {
        "stages": plan.num_stages,
        "workers": plan.num_workers,
        "in flight (input stage)": in_flight(plan),
        "predicted ms/minibatch": predicted_ms(plan),
        "simulated ms/minibatch": ms,
        "samples/s (simulated)": samples_per_s(sim),
        "bubble (simulated)": bubble(sim),
        "peak memory GB (simulated)": max(mem) / 1e9,
        "fits memory": "n/a" if not memory_bytes else ("yes" if max(mem) <= memory_bytes else "NO"),
    }

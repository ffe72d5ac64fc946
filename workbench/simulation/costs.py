"""Per-op charges of one simulation (ms), from the one :class:`~workbench.cost.model.CostModel` (profile
costs) or from unit constants; see the package docstring, "Costs"."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from enum import StrEnum

import numpy as np

from workbench.cost.model import CostModel, check_ms, ring_allreduce_ms
from workbench.cost.plan import Plan
from workbench.io.timeline import COMMON_COLUMNS
from workbench.schedules.core import Schedule
from workbench.schedules.dataflow import KIND_CODES, KindCode, OpKind
from workbench.simulation.options import SimOptions


class CommKind(StrEnum):
    """The ``kind`` of a communication-lane row of a timeline (a ``str`` enum: the column holds its
    values, the strings of :data:`COMM_KINDS`)."""

    SEND_ACT = "send_act"  # an activation to the next stage's worker
    SEND_GRAD = "send_grad"  # a gradient to the previous stage's worker
    ALLREDUCE = "allreduce"  # a replicated stage's all-reduce
    FETCH_WEIGHTS = "fetch_weights"  # a weight version from its owner (master family)
    SEND_WGRAD = "send_wgrad"  # a weight gradient pushed to the owner's STEP (master family)
    ALLTOALL = "alltoall"  # the exposed part of an op's in-op all-to-all


KIND_NAMES = ("F", "B", "BI", "BW", "STEP", CommKind.ALLREDUCE.value)  # timeline kind of each KindCode
COMM_KINDS = tuple(k.value for k in CommKind)
TIMELINE_COLUMNS = COMMON_COLUMNS + ("lane", "src", "dst", "update", "bytes")  # see workbench.io.timeline
STAT_COLUMNS = ("peak_activations", "activation_transfers", "weight_transfers", "weight_storage", "busy")


# ---------------------------------------------------------------------------------------------
# costs
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SimCosts:
    """Per-op durations (ms) of one simulation, all drawn from one :class:`CostModel`
    (profile costs) or from the unit constants (``model is None``)."""

    compute: dict  # kind code -> list of ms per stage (without the per-op overhead)
    cut_bytes: list  # bytes crossing the cut after stage s (per microbatch)
    param_bytes: list  # parameter bytes of stage s
    act_stash_bytes: list  # activation bytes stashed per (stage, microbatch) in flight
    transfer_ms: float | None  # unit mode: constant transfer time; None: from the cost model
    fetch_ms: float | None
    allreduce_ms: list  # per stage
    topology: object | None
    label: str
    latency_ms: float = 0.0  # unit mode: fixed cost of every message between different workers
    op_overhead_ms: float = 0.0  # fixed cost added to every F/B/BI/BW/STEP op
    model: CostModel | None = None  # profile mode: the cost model every charge comes from
    fraction: float = 1.0  # microbatch size relative to the profile's minibatch
    batch_size: int | None = None
    step_copy: list | None = None  # per stage: a STEP that keeps the old version (None: as step_ms)
    accumulate: list | None = None  # per stage: what a backward into an empty buffer saves (None: nothing)
    alltoall: list | None = None  # per stage: in-op all-to-all of an F, B or BI (None: none)
    overlap_pairs: bool = True  # the schedule's overlapped F/B pairs hide each other's all-to-all
    tied_ms: list | None = None  # per stage: the tied-weight all-reduce its STEP includes (tied_allreduce_ms)

    def message(self, nbytes: float, a: int, b: int, fixed_ms: float | None) -> tuple[float, float]:
        """(ms, bytes) of one message of ``nbytes`` from ``a`` to ``b``: the cost model's
        ``α + n / B``, or in unit mode ``fixed_ms + α`` between different workers."""
        if self.model is not None:
            return self.model.message_ms(nbytes, a, b), nbytes
        fixed = float(fixed_ms or 0.0)
        return (fixed + self.latency_ms if a != b else fixed), 0.0

    def xfer(self, cut: int, a: int, b: int) -> tuple[float, float]:
        """(ms, bytes) of an activation/gradient transfer across ``cut`` from ``a`` to ``b``."""
        return self.message(self.cut_bytes[cut], a, b, self.transfer_ms)

    def fetch(self, stage: int, a: int, b: int) -> tuple[float, float]:
        """(ms, bytes) of fetching ``stage``'s weights from ``a`` to ``b``."""
        return self.message(self.param_bytes[stage], a, b, self.fetch_ms)


def _per_stage(x, S: int, name: str) -> list[float]:
    if isinstance(x, (int, float, np.integer, np.floating)):
        vals = [float(x)] * S
    else:
        vals = [float(v) for v in x]
        if len(vals) != S:
            raise ValueError(
                f"{name} has {len(vals)} values but the schedule has {S} stages; give one per stage or a number"
            )
    for v in vals:
        check_ms(name, v)
    return vals


def unit_costs(
    schedule: Schedule, fwd, bwd, allreduce, transfer, *, weight_fetch, step_ms, latency_ms, op_overhead_ms
) -> SimCosts:
    """Unit costs (package docstring, "Costs"): ``fwd``/``bwd``/``allreduce``/``step_ms`` per stage or
    one number, a split backward ``bwd / 2`` per half, a ring all-reduce's ``2 (r - 1)`` latencies,
    ``transfer`` and ``weight_fetch`` per message between different workers; no bytes."""
    S = schedule.num_stages
    f = _per_stage(fwd, S, "fwd")
    b = _per_stage(bwd, S, "bwd")
    lat = check_ms("latency_ms", latency_ms)
    ar = [
        a + ring_allreduce_ms(0.0, len(schedule.stage_workers[s]), math.inf, lat)
        for s, a in enumerate(_per_stage(0.0 if allreduce is None else allreduce, S, "allreduce"))
    ]
    half = [x / 2 for x in b]
    compute = {
        KindCode.F: f,
        KindCode.B: b,
        KindCode.BI: half,
        KindCode.BW: half,
        KindCode.STEP: _per_stage(step_ms, S, "step_ms"),
    }
    zeros = [0.0] * S
    over = check_ms("op_overhead_ms", op_overhead_ms)
    label = "modeled (unit costs)"
    if lat or over:
        label += f", latency {lat:g} ms/message, overhead {over:g} ms/op"
    return SimCosts(
        compute,
        zeros,
        zeros,
        zeros,
        check_ms("transfer", transfer),
        check_ms("weight_fetch", weight_fetch),
        ar,
        None,
        label,
        latency_ms=lat,
        op_overhead_ms=over,
    )


def op_ms(schedule: Schedule, op, comp: dict) -> float:
    """Compute time of one op (without the per-op overhead): its kind's stage cost times its
    segment's FLOP share (Seq1F1B; 1 otherwise); with ``schedule.recompute`` a B (or BI, which
    starts the backward) also re-runs the forward: ``+ F_s`` times the share (GPipe)."""
    k, s = KIND_CODES[op.kind], op.stage
    ms = comp[k][s]
    if schedule.recompute and k in (KindCode.B, KindCode.BI):
        ms += comp[KindCode.F][s]
    return ms * schedule.segment_share(op) if k < KindCode.STEP else ms


def default_microbatch_fraction(schedule: Schedule, input_workers: int | None = None) -> float:
    """Size of one microbatch relative to the profile's minibatch.

    The profile is per minibatch, and the minibatch is what one worker of the input stage
    processes per optimizer step (PipeDream, data parallelism: one microbatch per step and
    worker, fraction 1). A schedule that pushes ``k`` microbatches per step through one input
    worker (GPipe, PipeDream-Flush, 2BW, interleaved, ZB-H1, PP/LPP: ``k = microbatches_per_step
    / #input workers``) splits the minibatch into ``k`` pieces: fraction ``min(1, 1 / k)``."""
    if input_workers is None:  # workers that run a forward of stage 0
        input_workers = sum(any(op.kind == OpKind.F and op.stage == 0 for op in ops) for ops in schedule.ops)
    inputs = max(1, int(input_workers))
    return min(1.0, inputs / max(1, schedule.microbatches_per_step))


def stage_ranges(schedule: Schedule, profile, plan) -> list[tuple[int, int]]:
    """The (first, last) profile layers of each stage: ``plan``'s stages, or without a plan
    :meth:`Plan.even <workbench.cost.plan.Plan.even>` (the runtime's default split too); a
    ValueError when the plan, the profile and the schedule disagree on stages or layers."""
    S, L = schedule.num_stages, len(profile.layers)
    if plan is not None:
        if plan.num_stages != S:
            raise ValueError(
                f"plan has {plan.num_stages} stages but the schedule has {S}; build the schedule "
                f"from this plan, or pass plan=None to split the profile into {S} stages of equal layer counts"
            )
        if plan.num_layers != L:
            raise ValueError(f"plan covers {plan.num_layers} layers but the profile has {L}")
        return [(st.first, st.last) for st in plan.stages]
    if L < S:
        raise ValueError(f"profile has {L} layers, fewer than the schedule's {S} stages")
    return [(st.first, st.last) for st in Plan.even(L, S).stages]  # the runtime's default too


def profile_costs(schedule: Schedule, profile, plan, topology, options: SimOptions) -> SimCosts:
    """Per-stage charges of ``schedule`` from :meth:`CostModel.from_profile` calibrated by
    ``options.cost`` (package docstring, "Costs")."""
    fraction = options.microbatch_fraction
    S = schedule.num_stages
    ranges = stage_ranges(schedule, profile, plan)
    if fraction is None:
        fraction = default_microbatch_fraction(schedule)
    elif not 0 < fraction <= 1:
        raise ValueError(f"microbatch_fraction must be in (0, 1], got {fraction!r}")
    if topology is not None:
        n = int(getattr(topology, "num_workers", schedule.num_workers))
        if n < schedule.num_workers:
            raise ValueError(f"topology has {n} workers but the schedule needs {schedule.num_workers}")
    cm = CostModel.from_profile(profile, topology, options.cost)
    f = [cm.stage_fwd_ms(a, b, fraction) for a, b in ranges]
    b = [cm.stage_bwd_ms(a, b_, fraction) for a, b_ in ranges]
    split = [cm.stage_split_bwd_ms(a, b_, fraction) for a, b_ in ranges]
    cut = [cm.cut_bytes(b_, fraction) for _, b_ in ranges]
    stash = [float(fraction * cm.range_sum("act_bytes", a, b_)) for a, b_ in ranges]
    params = [float(cm.range_sum("param_bytes", a, b_)) for a, b_ in ranges]
    if options.allreduce is not None:
        ar = _per_stage(options.allreduce, S, "allreduce")
    else:
        ar = [cm.allreduce_ms(params[s], schedule.stage_workers[s]) for s in range(S)]
    tied = tied_allreduce_ms(cm, profile.meta.get("tied", ()), ranges, schedule)
    compute = {
        KindCode.F: f,
        KindCode.B: b,
        KindCode.BI: [x for x, _ in split],
        KindCode.BW: [y for _, y in split],
        KindCode.STEP: [x + t for x, t in zip(_per_stage(options.step_ms, S, "step_ms"), tied)],
    }
    acc = [cm.stage_accumulate_ms(a, b_) for a, b_ in ranges]
    return SimCosts(
        compute,
        cut,
        params,
        stash,
        None,
        None,
        ar,
        topology,
        cm.label,
        op_overhead_ms=cm.op_overhead_ms,
        model=cm,
        fraction=float(fraction),
        batch_size=cm.batch_size,
        accumulate=None if any(x is None for x in acc) else acc,
        tied_ms=tied,
    )


def simulation_costs(schedule: Schedule, fwd, bwd, profile, plan, *, topology, options: SimOptions) -> SimCosts:
    """The per-op charges of one simulation: unit costs (``fwd``, ``bwd`` and ``options``) without a
    profile, else the profile's on ``plan`` and ``topology``; then the options either source takes:
    ``step_copy_ms`` (plus the tied weights' all-reduce the STEP includes) and the in-op
    ``alltoall`` with ``overlap_pairs``."""
    S = schedule.num_stages
    if profile is None:
        _check_unit_options(plan, topology, options)
        o = options
        costs = unit_costs(
            schedule,
            fwd,
            bwd,
            o.allreduce,
            o.transfer,
            weight_fetch=o.weight_fetch,
            step_ms=o.step_ms,
            latency_ms=o.cost.latency_ms,
            op_overhead_ms=o.cost.op_overhead_ms,
        )
    else:
        costs = profile_costs(schedule, profile, plan, topology, options)
    if options.step_copy_ms is not None:
        copy = _per_stage(options.step_copy_ms, S, "step_copy_ms")
        costs = replace(costs, step_copy=[c + t for c, t in zip(copy, costs.tied_ms or [0.0] * len(copy))])
    if options.alltoall is not None:
        costs = replace(
            costs, alltoall=_per_stage(options.alltoall, S, "alltoall"), overlap_pairs=bool(options.overlap_pairs)
        )
    return costs


def _check_unit_options(plan, topology, options: SimOptions) -> None:
    """Refuse, in one line, what only profile costs can use."""
    if plan is not None or topology is not None:
        raise ValueError("plan/topology costs need a profile; pass profile=... (or use unit costs fwd=, bwd=)")
    c = options.cost
    if (
        c.allreduce_bandwidth is not None
        or c.allreduce_latency_ms is not None
        or c.message_cpu_ms
        or c.allreduce_curve is not None
        or c.allreduce_buckets is not None
    ):
        raise ValueError(
            "allreduce_bandwidth/allreduce_latency_ms/message_cpu_ms need profile costs; with unit "
            "costs give allreduce= and transfer="
        )


def tied_allreduce_ms(cm: CostModel, tied, ranges, schedule: Schedule) -> list[float]:
    """Per stage, the ms its STEP spends combining the gradients of weights tied across stages
    (``tied``: ``[(layer indices, bytes)]``, a Profile's ``meta["tied"]``): every owning stage's STEP
    is charged :meth:`CostModel.allreduce_ms` of the weight's bytes over the owners' workers (first
    replica of each; 0 when they share one worker), as :mod:`workbench.runtime.executors.tied` runs it. The
    owners' STEPs are charged, not synchronised with each other."""
    out = [0.0] * len(ranges)
    for layers, nbytes in tied:
        owners = sorted({s for s, (a, z) in enumerate(ranges) for i in layers if a <= i <= z})
        if len(owners) < 2:
            continue
        ms = cm.allreduce_ms(nbytes, sorted({schedule.stage_workers[s][0] for s in owners}))
        for s in owners:
            out[s] += ms
    return out

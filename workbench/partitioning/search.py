"""The partitioner's search: PipeDream's dynamic program (:mod:`workbench.partitioning.candidates`,
pure) or PipeDream's own optimizer (:mod:`workbench.partitioning.pipedream_optimizer`), then the
best candidates refined by simulation (:mod:`workbench.simulation`). This is the only module of
the partitioner that imports the simulator and the schedules: it sits above both.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from workbench.cost.model import CostModel
from workbench.cost.plan import Plan
from workbench.cost.topology import Topology
from workbench.partitioning.candidates import solve
from workbench.partitioning.inputs import check_memory, check_topology
from workbench.partitioning.options import PartitionOptions, options_from
from workbench.partitioning.pipedream_optimizer import Settings as PipeDreamSettings
from workbench.partitioning.pipedream_optimizer import partition_pipedream
from workbench.partitioning.pricing import with_predictions
from workbench.profiling.table import Profile
from workbench.schedules import noam_warmup
from workbench.simulation import simulate_plan, steady_microbatches


def partition(profile: Profile, topology: Topology, options: PartitionOptions | None = None, **keywords: Any) -> Plan:
    """PipeDream's optimal partition of ``profile`` onto ``topology`` (:mod:`~workbench.partitioning.dynamic_program`),
    checked and refined by simulation, with the options of :class:`PartitionOptions`: ``options``,
    or its fields as keywords (``partition(p, topo, straight=True)``), which override ``options``.

    Returns a :class:`Plan` whose stages are flat (first, last, replicas, workers, time_ms): a
    level-k stage replicated over m level-(k-1) components contributes each of its inner stages
    once, with the workers of every replica component (ids ``c * S_{k-1} + w``), and
    ``time_ms = max(inner time, all-reduce_k) / m``. ``bottleneck_ms`` is the DP optimum, equal to
    the max of the stage times and ``meta["cuts"]`` (after_layer, level, time_ms).

    The plan also carries the :class:`~workbench.cost.model.CostModel` figures of its flat stages:
    ``predicted_ms`` (closed form), ``in_flight`` (warm-up per stage, communication included) and
    ``stage_memory_bytes``. With ``refine`` (default) the dynamic program's candidates
    (:func:`~workbench.partitioning.reconstruction.top_candidates`: the all-replicated stage, the
    best split per replica count of the last top-level stage, and with ``use_fewer_workers`` the
    best plan per worker count) are ranked by ``predicted_ms``; the DP optimum and the ``CANDIDATES`` best are simulated in 1F1B at
    PipeDream's NOAM warm-up and at the communication-aware ``in_flight`` (:func:`refine_plan`,
    :func:`refine_candidates`); the fastest that fits ``memory_bytes`` is kept, its steady state is
    ``simulated_ms``, its own DP value ``bottleneck_ms``, and ``meta["candidates"]`` lists them all.
    ``latency_ms`` (per message, one number or one per level) and ``op_overhead_ms`` (per op) are
    the calibrated fixed costs of :mod:`workbench.runtime.calibration.machine`. ``recompute``: the
    memory limit and ``stage_memory_bytes`` assume activation re-materialization
    (:func:`~workbench.cost.model.stage_memory`).

    ``cost="pipedream"``: PipeDream's own optimizer and formulas instead
    (:func:`workbench.partitioning.pipedream_optimizer.partition_pipedream`, options in ``pipedream``; over the
    antichain DAG of a graph.txt profile); the cost model named in ``meta["cost"]``.
    """
    opts = options_from(options, keywords)
    topo = check_topology(topology)
    if opts.cost == "pipedream":
        return partition_by_pipedream(profile, topo, opts)
    found = solve(profile, topo, opts)
    if not opts.refine:
        return found.optimum
    if opts.bucket_cap_bytes is not None or opts.allreduce_ready != "backward-start":
        return ranked_by_price(found.ranked)
    shortlist = list({id(q): q for q in [found.optimum] + found.ranked[:CANDIDATES]}.values())
    return refine_candidates(shortlist, profile, topo, found.cost_model, found.memory_bytes)


def partition_by_pipedream(profile: Profile, topo: Topology, opts: PartitionOptions) -> Plan:
    """``cost="pipedream"``: PipeDream's optimizer, which has no fixed costs or recompute to price."""
    if (
        opts.recompute
        or opts.latency_ms
        or opts.op_overhead_ms
        or opts.allreduce_bandwidth
        or opts.allreduce_latency_ms
        or opts.bucket_cap_bytes is not None
        or opts.allreduce_ready != "backward-start"
    ):
        raise ValueError(
            "cost='pipedream' prices PipeDream's formulas only: drop recompute, latency_ms, op_overhead_ms "
            "and the allreduce_ / bucket_cap_bytes options"
        )
    return partition_pipedream(
        profile,
        topo,
        opts.straight,
        check_memory(opts.memory_bytes),
        opts.use_fewer_workers,
        settings=opts.pipedream or PipeDreamSettings(),
    )


def ranked_by_price(ranked: list[Plan]) -> Plan:
    """The candidate with the lowest closed-form price (``ranked`` is sorted by ``predicted_ms``),
    kept unsimulated: with DDP's layer buckets or all-reduces ready only at a backward's end the
    price is :meth:`CostModel.replicated_stage_ms`'s bucketed round, which the simulator (one
    all-reduce per stage) does not reproduce. ``meta["candidates"]`` lists every candidate."""
    if not ranked:
        raise ValueError("ranked_by_price needs at least one plan")
    rows = [
        {
            "replicas": "-".join(str(st.replicas) for st in q.stages),
            "last_layers": [int(st.last) for st in q.stages],
            "dp_estimate_ms": q.bottleneck_ms,
            "predicted_ms": q.predicted_ms,
            "simulated_ms": None,
        }
        for q in ranked
    ]
    best = ranked[0]
    why = "priced by the bucketed round (bucket_cap_bytes / allreduce_ready), which the simulator does not model"
    return replace(best, meta=best.meta | {"candidates": rows, "not_simulated": why})


CANDIDATES = 3  # the dynamic program's plans with the best closed-form prediction that refinement simulates


def refine_candidates(
    plans: list[Plan], profile: Profile, topology: Topology, cm: CostModel, memory_bytes: float | None = None
) -> Plan:
    """Simulate the candidates (:func:`refine_plan`) in order of their closed-form prediction and
    keep the one with the lowest simulated steady state that fits ``memory_bytes`` (ties within
    0.5%: the earlier). A candidate whose prediction is not below the best simulated figure so far
    is not simulated (the prediction is the closed-form bottleneck, which the steady state does not
    beat). ``meta["candidates"]`` lists every candidate's replicas, last layers, DP estimate,
    prediction and simulated figure (None: not simulated)."""
    best: Plan | None = None
    rows = []
    for q in sorted(plans, key=lambda q: (q.predicted_ms, q.bottleneck_ms)):
        if best is not None and math.isfinite(best.simulated_ms) and q.predicted_ms >= best.simulated_ms * (1 - 0.005):
            done = q
        else:
            done = refine_plan(q, profile, topology, cm, memory_bytes)
            if best is None or (
                math.isfinite(done.simulated_ms)
                and (not math.isfinite(best.simulated_ms) or done.simulated_ms < best.simulated_ms * (1 - 0.005))
            ):
                best = done
        rows.append(
            {
                "replicas": "-".join(str(st.replicas) for st in q.stages),
                "last_layers": [int(st.last) for st in q.stages],
                "dp_estimate_ms": q.bottleneck_ms,
                "predicted_ms": q.predicted_ms,
                "simulated_ms": done.simulated_ms if math.isfinite(done.simulated_ms) else None,
            }
        )
    if best is None:
        raise ValueError("refine_candidates needs at least one plan")
    return replace(best, meta=best.meta | {"candidates": rows})


def refine_plan(
    plan: Plan, profile: Profile, topology: Topology, cm: CostModel, memory_bytes: float | None = None
) -> Plan:
    """Simulate ``plan``'s 1F1B schedule (:func:`workbench.simulation.simulate_plan`) with PipeDream's
    NOAM warm-up and, unless that already reaches the prediction (within 0.5%; the prediction is a
    bottleneck bound the steady state cannot beat), with the communication-aware ``in_flight``;
    keep the faster one whose ``stage_memory_bytes`` fit ``memory_bytes`` (ties within 0.5%: the
    smaller warm-up)."""
    used = sorted(w for s in plan.stages for w in s.workers)
    if used != list(range(len(used))):  # fewer workers, not a prefix of the ids: no schedule layout for it
        return replace(plan, meta=plan.meta | {"not_simulated": "the plan's workers are not 0..W-1"})
    best: tuple[float, Plan] | None = None
    for k in dict.fromkeys([tuple(noam_warmup(tuple(s.workers for s in plan.stages))), plan.in_flight]):
        cand = with_predictions(plan, cm, k)
        if memory_bytes is not None and max(cand.stage_memory_bytes) > memory_bytes:
            continue
        res = simulate_plan(
            cand,
            profile,
            topology,
            latency_ms=list(cm.latency_ms),
            op_overhead_ms=cm.op_overhead_ms,
            allreduce_bandwidth=None if cm.allreduce_bandwidth is None else list(cm.allreduce_bandwidth),
            allreduce_latency_ms=None if cm.allreduce_latency_ms is None else list(cm.allreduce_latency_ms),
        )
        t = math.nan if res.time_per_minibatch_ms is None else res.time_per_minibatch_ms  # nan: no steady state
        if best is None or t < best[0] * (1 - 0.005):
            best = (t, cand)
        if t <= cand.predicted_ms * 1.005:
            break
    if best is None:
        return plan
    t, chosen = best
    return replace(chosen, simulated_ms=t, meta=chosen.meta | {"simulated_minibatches": steady_microbatches(chosen)})

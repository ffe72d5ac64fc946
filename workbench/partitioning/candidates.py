"""The dynamic program's answer as plans: the optimum and the candidates refinement by simulation
ranks, each a flat :class:`Plan` with the cost model's closed-form figures. Pure: it simulates nothing."""

from __future__ import annotations

import math
from dataclasses import dataclass

from workbench.cost.model import CostModel
from workbench.cost.plan import Plan, Stage
from workbench.cost.topology import Topology
from workbench.partitioning.dynamic_program import build_levels
from workbench.partitioning.infeasible import infeasible_message
from workbench.partitioning.inputs import check_memory, check_topology, layer_costs
from workbench.partitioning.level import Level
from workbench.partitioning.options import PartitionOptions
from workbench.partitioning.pricing import data_parallel_ms, device_memory, with_predictions
from workbench.partitioning.reconstruction import Node, best_components, flatten, rebuild, top_candidates
from workbench.profiling.measure import Profile


@dataclass(frozen=True)
class Candidates:
    """What the dynamic program hands to refinement (:mod:`workbench.partitioning.search`):
    ``optimum`` (the plan of the program's optimum), ``ranked`` (every distinct candidate plan by
    ``predicted_ms``), the :class:`CostModel` they were priced with and the memory limit."""

    optimum: Plan
    ranked: list[Plan]
    cost_model: CostModel
    memory_bytes: float | None


def solve(profile: Profile, topology: Topology, opts: PartitionOptions) -> Candidates:
    """PipeDream's dynamic program (:mod:`workbench.partitioning.dynamic_program`) with the workbench
    cost model: the optimum and, when ``opts.refine``, the candidates refinement ranks
    (:func:`~workbench.partitioning.reconstruction.top_candidates`: the all-replicated stage, the
    best split per replica count of the last top-level stage, and with ``use_fewer_workers`` the
    best plan per worker count)."""
    costs = layer_costs(profile)
    topo = check_topology(topology)
    memory_bytes = check_memory(opts.memory_bytes)
    fewer = opts.use_fewer_workers
    cm = CostModel.from_profile(
        profile,
        topo,
        latency_ms=opts.latency_ms,
        op_overhead_ms=opts.op_overhead_ms,
        allreduce_bandwidth=opts.allreduce_bandwidth,
        allreduce_latency_ms=opts.allreduce_latency_ms,
        allreduce_ready=opts.allreduce_ready,
        bucket_cap_bytes=opts.bucket_cap_bytes,
    )
    levels = build_levels(costs, topo, opts.straight, memory_bytes, fewer, cost_model=cm, recompute=opts.recompute)
    top = levels[-1]
    n = costs.num_layers
    m_top = best_components(top, n - 1, 0, fewer)
    if not math.isfinite(float(top.best_ms[m_top, n - 1, 0])):
        raise ValueError(
            infeasible_message(costs, topo, opts.straight, memory_bytes, fewer, cost_model=cm, recompute=opts.recompute)
        )
    if opts.refine:
        pool = top_candidates(levels, m_top, n, fewer)
    else:
        optimum = rebuild(levels, topo.num_levels, (0, n - 1), m_top, fewer=fewer)
        pool = [(float(top.best_ms[m_top, n - 1, 0]), optimum)]
    meta = _workbench_meta(profile, topo, opts, memory_bytes, cm)
    plans = _candidate_plans(pool, levels, topo, cm, meta=meta, dp_ms=data_parallel_ms(profile, topo, cm))
    ranked = sorted(plans, key=lambda q: (q.predicted_ms, q.bottleneck_ms))
    best = min(plans, key=lambda q: q.bottleneck_ms)
    return Candidates(best, ranked, cm, memory_bytes)


def _workbench_meta(profile: Profile, topo: Topology, opts: PartitionOptions, memory_bytes, cm: CostModel) -> dict:
    """``Plan.meta`` of a workbench-priced plan: the search's options and the cost model's calibration."""
    return {
        "topology": topo.to_list(),
        "topology_name": topo.name,
        "straight": opts.straight,
        "memory_bytes": memory_bytes,
        "device_memory_bytes": device_memory(topo, profile),
        "use_fewer_workers": opts.use_fewer_workers,
        "recompute": opts.recompute,
        "latency_ms": list(cm.latency_ms),
        "op_overhead_ms": cm.op_overhead_ms,
        "allreduce_bandwidth": None if cm.allreduce_bandwidth is None else list(cm.allreduce_bandwidth),
        "allreduce_latency_ms": None if cm.allreduce_latency_ms is None else list(cm.allreduce_latency_ms),
        "allreduce_ready": cm.allreduce_ready,
        "bucket_cap_bytes": cm.bucket_cap_bytes,
        "batch_size": cm.batch_size,
        "cost": "workbench",
        "cost_model": "workbench.cost.model: 1F1B round (F + B + 3o + exposed ring AR) / m, "
        "cut = alpha + a/B per direction (full duplex)",
    }


def _candidate_plans(
    pool: list[tuple[float, list[Node]]],
    levels: list[Level],
    topo: Topology,
    cm: CostModel,
    *,
    meta: dict,
    dp_ms: float,
) -> list[Plan]:
    """One flat :class:`Plan` (with the cost model's predictions) per distinct pipeline of ``pool``
    (``(A, pipeline)`` pairs, in order; a repeated stage layout keeps its first)."""
    costs = levels[0].costs
    plans: dict[tuple, Plan] = {}
    for value, pipeline in pool:
        flat, cuts = flatten(levels, topo.num_levels, pipeline, topo)
        stages = tuple(Stage(f, l, len(ws), tuple(ws), float(t)) for f, l, ws, t in flat)
        cand = Plan(
            stages,
            bottleneck_ms=value,
            single_worker_ms=float(costs.compute_prefix[-1]),
            data_parallel_ms=dp_ms,
            method="pipedream",
            meta=meta | {"cuts": [[int(a), int(k), float(t)] for a, k, t in cuts]},
        )
        plans.setdefault(tuple((st.first, st.last, st.workers) for st in stages), with_predictions(cand, cm))
    return list(plans.values())

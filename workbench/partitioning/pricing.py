"""A plan's closed-form figures under the cost model, and the figures every plan is compared with:
data parallelism over all workers and the memory of one device."""

from __future__ import annotations

from dataclasses import replace

from workbench.cost.model import CostModel
from workbench.cost.plan import Plan
from workbench.cost.topology import Topology
from workbench.partitioning.inputs import check_topology
from workbench.profiling.measure import Profile


def with_predictions(plan: Plan, cm: CostModel, in_flight=None) -> Plan:
    """``plan`` with the cost model's closed-form figures: ``predicted_ms``, ``in_flight`` (default
    :meth:`CostModel.in_flight`) and ``stage_memory_bytes``."""
    k = tuple(cm.in_flight(plan) if in_flight is None else in_flight)
    return replace(
        plan,
        predicted_ms=cm.predicted_ms(plan),
        in_flight=k,
        stage_memory_bytes=tuple(cm.stage_memory_bytes(plan, k, recompute=plan.meta.get("recompute", False))),
    )


def data_parallel_ms(profile: Profile, topology: Topology, cost_model: CostModel | None = None) -> float:
    """One stage of all layers replicated on every worker: one ring all-reduce per round over all
    W workers at the slowest link (:meth:`CostModel.stage_ms`), ``(F + B + 3o + exposed AR) / W``.
    That is what the simulator's ``dp-bsp`` and the runtime do, and what the dynamic program gives
    its all-replicated candidate through any hierarchy (:meth:`CostModel.outer_round_ms`)."""
    topo = check_topology(topology)
    cm = cost_model or CostModel.from_profile(profile, topo)
    return cm.stage_ms(0, cm.num_layers - 1, range(topo.num_workers))


def device_memory(topology: Topology | None, profile: Profile) -> float | None:
    """Memory of one worker's device: the topology's (a preset's GPUs), else the GPU a modeled
    profile was projected for (``meta["device_memory_bytes"]``), else None (unknown)."""
    if topology is not None and topology.memory_bytes:
        return topology.memory_bytes
    mem = (profile.meta or {}).get("device_memory_bytes")
    return float(mem) if mem else None

"""Why no partition exists, in one line that says what to change.

Under a memory limit the line names the smallest limit that fits: feasibility only grows with the
limit, so a geometric bisection between the given limit (infeasible) and everything on every worker
(feasible whenever the program without a limit is) finds it to within a factor of
``(hi / lo) ** (1 / 4096)`` in 12 solves.
"""

from __future__ import annotations

import math

import numpy as np

from workbench.cost.model import CostModel
from workbench.cost.topology import Topology
from workbench.partitioning.dynamic_program import build_levels
from workbench.partitioning.inputs import LayerCosts

BISECTION_STEPS = 12


def infeasible_message(
    costs: LayerCosts,
    topology: Topology,
    straight: bool,
    memory_bytes: float | None,
    fewer: bool,
    *,
    cost_model: CostModel,
    recompute: bool = False,
) -> str:
    """The reason the program found no finite plan: a layer over the memory limit alone, a limit too
    small (with the smallest that fits), or a straight pipeline with fewer layers than workers."""
    if memory_bytes is not None:
        alone = costs.param_bytes + costs.act_bytes
        worst = int(np.argmax(alone))
        if alone[worst] > memory_bytes:
            return (
                f"memory_bytes={memory_bytes:.4g} is too small: layer {worst} alone needs "
                f"{alone[worst]:.4g} bytes (weights + stashed activations of one minibatch)"
            )
        unlimited = build_levels(costs, topology, straight, None, fewer, cost_model=cost_model)[-1]
        if math.isfinite(_answer(unlimited.best_ms, topology, fewer)):
            fits = smallest_memory(costs, topology, (straight, memory_bytes, fewer), cost_model, recompute=recompute)
            return (
                f"no partition fits in memory_bytes={memory_bytes:.4g} per worker; the smallest limit "
                f"that fits is about {fits:.4g} bytes (raise memory_bytes, add workers"
                f"{'' if recompute else ', or pass recompute=True'})"
            )
    if straight:
        return (
            f"a straight pipeline needs at least one layer per worker: {costs.num_layers} layers cannot fill "
            f"{topology.num_workers} workers ({topology.counts} per level); use use_fewer_workers=True, "
            f"fewer workers, or allow replication (straight=False)"
        )
    return "no feasible partition for this profile and topology"


def smallest_memory(
    costs: LayerCosts, topology: Topology, search: tuple[bool, float, bool], cost_model: CostModel, *, recompute: bool
) -> float:
    """A memory limit per worker that fits, at most a bisection step above the smallest: ``search``
    is ``(straight, an infeasible limit, fewer)``."""
    straight, lo, fewer = search
    hi = float((costs.param_prefix[-1] + costs.act_prefix[-1]) * topology.num_workers)
    for _ in range(BISECTION_STEPS):  # geometric bisection: infeasible at lo, feasible at hi
        mid = math.sqrt(lo * hi)
        top = build_levels(costs, topology, straight, mid, fewer, cost_model=cost_model, recompute=recompute)[-1]
        lo, hi = (lo, mid) if math.isfinite(_answer(top.best_ms, topology, fewer)) else (mid, hi)
    return hi


def _answer(best_ms: np.ndarray, topology: Topology, fewer: bool):
    """The top level's ``A_L(0->N-1, .)``: on all components, or the best on any count with ``fewer``."""
    return best_ms[1:, -1, 0].min() if fewer else best_ms[topology.counts[-1], -1, 0]

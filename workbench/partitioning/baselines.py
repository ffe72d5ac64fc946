"""Two straight baselines beside PipeDream's partitioner: equal layer counts, and the split that
balances compute (torchgpipe's ``balance_by_time`` goal). Stage k runs on worker k; times and cuts
come from the cost model, under a topology when one is given."""

from __future__ import annotations

import math

import numpy as np

from workbench.cost.model import CostModel
from workbench.cost.plan import Plan, Stage
from workbench.cost.topology import Topology
from workbench.partitioning.inputs import LayerCosts, check_topology, layer_costs
from workbench.partitioning.pricing import data_parallel_ms, device_memory, with_predictions
from workbench.profiling.measure import Profile

INF = math.inf


def partition_equal_layers(profile: Profile, stages: int, topology: Topology | None = None) -> Plan:
    """Straight split into ``stages`` stages of equal layer counts (the first ``N mod S`` stages
    get one more layer); stage k on worker k. Times modeled under ``topology`` when given."""
    costs = layer_costs(profile)
    count = _check_stages(costs, stages)
    lasts = [s.last for s in Plan.even(costs.num_layers, count).stages]
    return straight_plan(profile, lasts, "equal-layers", topology)


def partition_balanced_time(profile: Profile, stages: int, topology: Topology | None = None) -> Plan:
    """Straight split minimising the largest stage compute ``max_k sum_{l in k} (fwd_l + bwd_l)``,
    solved exactly by a program over prefixes (:func:`balanced_step`)::

        D_1(j) = C(0..j),    D_k(j) = min_{s < j} max(D_{k-1}(s), C(s+1..j))

    Communication is not part of the objective; it is modeled in the returned times when
    ``topology`` is given. Time ``O(S N log N)``, memory ``O(S N)`` (the split points)."""
    costs = layer_costs(profile)
    count = _check_stages(costs, stages)
    n = costs.num_layers
    best = costs.compute_prefix[1:].copy()  # D_1(j) = C(0..j)
    split = np.zeros((count + 1, n), dtype=np.int64)
    for k in range(2, count + 1):
        best, split[k] = balanced_step(best, costs.compute_prefix, k)
    lasts, j = [n - 1], n - 1
    for k in range(count, 1, -1):
        j = int(split[k, j])
        lasts.append(j)
    return straight_plan(profile, lasts[::-1], "balanced-time", topology)


def balanced_step(best: np.ndarray, compute_prefix: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``D_k(j) = min_{k-2 <= s < j} max(D_{k-1}(s), C(s+1..j))`` and its argmin for every ``j``
    (``inf`` for ``j < k - 1``: fewer layers than stages), from ``best = D_{k-1}``.

    With costs >= 0, ``D_{k-1}(s)`` does not decrease and ``C(s+1..j)`` does not increase in
    ``s``, so the minimum lies where they cross: at the first ``s`` with
    ``D_{k-1}(s) + C(0..s) >= C(0..j)`` (a sorted search) or just before it."""
    n = len(best)
    lo = k - 2
    j = np.arange(k - 1, n)
    rising = best[lo:] + compute_prefix[lo + 1 : n + 1]  # non-decreasing in s
    at = np.minimum(lo + np.searchsorted(rising, compute_prefix[j + 1], side="left"), j - 1)
    before = np.maximum(at - 1, lo)

    def bottleneck(s):
        return np.maximum(best[s], compute_prefix[j + 1] - compute_prefix[s + 1])

    at_ms, before_ms = bottleneck(at), bottleneck(before)
    s = np.where(before_ms <= at_ms, before, at)
    new_best = np.full(n, INF)
    new_best[k - 1 :] = np.minimum(before_ms, at_ms)
    split = np.zeros(n, dtype=np.int64)
    split[k - 1 :] = s
    return new_best, split


def straight_plan(profile: Profile, lasts: list[int], method: str, topology: Topology | None) -> Plan:
    """Stage k (layers up to ``lasts[k]``) on worker k, with the cost model's stage and cut times."""
    count = len(lasts)
    firsts = [0] + [l + 1 for l in lasts[:-1]]
    topo = check_topology(topology) if topology is not None else None
    if topo is not None and count > topo.num_workers:
        raise ValueError(f"{count} stages need {count} workers but the topology has {topo.num_workers}")
    cm = CostModel.from_profile(profile, topo)
    times = [cm.stage_ms(f, l, (k,)) for k, (f, l) in enumerate(zip(firsts, lasts))]
    cuts = []
    if topo is not None:
        cuts = [(lasts[k], topo.level_between(k, k + 1), cm.cut_ms(lasts[k], (k,), (k + 1,))) for k in range(count - 1)]
    stages = tuple(Stage(f, l, 1, (k,), t) for k, (f, l, t) in enumerate(zip(firsts, lasts, times)))
    dp = data_parallel_ms(profile, topo, cm) if topo is not None else math.nan
    meta = {
        "topology": topo.to_list() if topo is not None else None,
        "device_memory_bytes": device_memory(topo, profile),
        "cuts": [[int(a), int(k), t] for a, k, t in cuts],
        "note": "stage k on worker k" if topo is not None else "no topology: communication not modeled",
    }
    plan = Plan(
        stages,
        bottleneck_ms=max(times + [c[2] for c in cuts]),
        single_worker_ms=float(cm.fwd_ms.sum() + cm.bwd_ms.sum()),
        data_parallel_ms=dp,
        method=method,
        meta=meta,
    )
    return with_predictions(plan, cm)


def _check_stages(costs: LayerCosts, stages) -> int:
    if isinstance(stages, bool) or not isinstance(stages, (int, np.integer)) or stages < 1:
        raise ValueError(f"stages must be a positive integer, got {stages!r}")
    if stages > costs.num_layers:
        raise ValueError(
            f"cannot split {costs.num_layers} layers into {stages} non-empty stages; use at most {costs.num_layers}"
        )
    return int(stages)

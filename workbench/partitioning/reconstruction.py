"""From the dynamic program's tables back to pipelines: the stages that attain ``A_k``, the
candidates refinement ranks, and the flat stages (worker ids, times) a :class:`Plan` holds.

A level-k pipeline is a list of :class:`Node` (a stage of layers first..last on m level-(k-1)
components); each node of an outer level holds the level-(k-1) pipeline that runs inside one of its
components. Flattening gives every inner stage the workers of all m replica components
(ids ``c * S_{k-1} + w``) and the time ``(inner time + exposed all-reduce_k) / m``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from workbench.cost.topology import Topology
from workbench.partitioning.inputs import LayerCosts
from workbench.partitioning.level import Level


@dataclass
class Node:
    """A stage of a level's pipeline: layers ``first..last`` on ``m`` components of this level,
    its time ``T_k(first->last, m)`` and the pipeline inside one component (None at level 1)."""

    first: int
    last: int
    m: int
    time: float
    child: list[Node] | None


def best_components(level: Level, j: int, r: int, fewer: bool) -> int:
    """The component count of the level's answer for range start(r)..j: all of them, or with
    ``fewer`` the count with the smallest ``A_k``."""
    if not fewer:
        return level.components
    return int(np.argmin(level.best_ms[1:, j, r])) + 1


def rebuild(levels: list[Level], k: int, span: tuple[int, int], m: int, *, fewer: bool) -> list[Node]:
    """The level-k pipeline on the layers ``span = (i, j)`` with exactly m components that attains
    ``A_k(i->j, m)``: the single stage if it does, else the first split (p, m', s) in the
    program's order whose ``max(A_k(i->s, p), c_k(s), T_k(s+1->j, m'))`` equals it."""
    i, j = span
    level = levels[k - 1]
    r = i if level.every_start else 0
    target = level.best_ms[m, j, r]
    single = float(level.stage_ms(i, j, m, level.in_flight(m)))
    if single == target:
        return [make_node(levels, k, (i, j), m, time=single, fewer=fewer)]
    best = None
    for p in range(1, m):
        last = m - p
        if level.straight and last > 1:
            continue
        s = np.arange(i, j)
        g = np.maximum(level.best_ms[p, i:j, r], level.cut_ms[i:j])
        h = level.stage_ms(s + 1, j, last, level.in_flight(last, p))
        val = np.maximum(g, h)
        hit = np.flatnonzero(val == target)
        if hit.size:
            best = (int(s[hit[0]]), p, last, float(h[hit[0]]))
            break
    if best is None:
        raise AssertionError("partition DP: could not reconstruct the optimum (please report)")
    split, p, last, time = best
    head = rebuild(levels, k, (i, split), p, fewer=fewer)
    return head + [make_node(levels, k, (split + 1, j), last, time=time, fewer=fewer)]


def make_node(levels: list[Level], k: int, span: tuple[int, int], m: int, *, time: float, fewer: bool) -> Node:
    """The level-k stage on ``span = (i, j)`` over m components, with its inner pipeline rebuilt
    (on the inner level's best component count)."""
    i, j = span
    child = None
    if k > 1:
        below = levels[k - 2]
        child = rebuild(levels, k - 1, span, best_components(below, j, i, fewer), fewer=fewer)
    return Node(i, j, m, time, child)


def top_candidates(levels: list[Level], m_top: int, n: int, fewer: bool) -> list[tuple[float, list[Node]]]:
    """The dynamic program's best distinct top-level pipelines, cheaply from its tables:
    ``(A, pipeline)`` for the all-replicated stage and, per split "prefix on p components, last
    stage on m - p", the best split point (O(N) each; the prefix rebuilt as the program's optimum);
    with ``fewer`` also the best plan on each other number of top-level components. Infinite ones
    are left out; the optimum is among them."""
    top = len(levels)
    level = levels[-1]
    j = n - 1
    out = []
    for m in [m_top] + [x for x in range(1, level.components + 1) if x != m_top] if fewer else [m_top]:
        if m != m_top:
            if math.isfinite(float(level.best_ms[m, j, 0])):
                out.append((float(level.best_ms[m, j, 0]), rebuild(levels, top, (0, j), m, fewer=fewer)))
            continue
        single = float(level.stage_ms(0, j, m, level.in_flight(m)))
        if math.isfinite(single):
            out.append((single, [make_node(levels, top, (0, j), m, time=single, fewer=fewer)]))
        out += _best_splits(levels, m, j, fewer)
    return out


def _best_splits(levels: list[Level], m: int, j: int, fewer: bool) -> list[tuple[float, list[Node]]]:
    """Per split "prefix on p, last stage on m - p" of the top level, its best split point's pipeline."""
    top = len(levels)
    level = levels[-1]
    s = np.arange(0, j)
    out = []
    for p in range(1, m):
        last = m - p
        if (level.straight and last > 1) or not s.size:
            continue
        v = level.in_flight(last, p)
        val = np.maximum(np.maximum(level.best_ms[p, :j, 0], level.cut_ms[:j]), level.stage_ms(s + 1, j, last, v))
        b = int(np.argmin(val))
        if math.isfinite(val[b]):
            time = float(level.stage_ms(b + 1, j, last, v))
            head = rebuild(levels, top, (0, b), p, fewer=fewer)
            out.append((float(val[b]), head + [make_node(levels, top, (b + 1, j), last, time=time, fewer=fewer)]))
    return out


def flatten(levels: list[Level], k: int, pipeline: list[Node], topology: Topology):
    """Flat stages ``(first, last, workers, time_ms)`` and cuts ``(after_layer, level, time_ms)``
    of a level-k pipeline inside one level-k component (worker ids from 0)."""
    size = topology.component_size(k - 1)
    level = levels[k - 1]
    costs: LayerCosts = level.costs
    stages, cuts, comp = [], [], 0
    for t, node in enumerate(pipeline):
        comps = range(comp, comp + node.m)
        if node.child is None:
            stages.append((node.first, node.last, [c * size for c in comps], node.time))
        else:
            inner_stages, inner_cuts = flatten(levels, k - 1, node.child, topology)
            weights = costs.weights(node.first, node.last)
            allreduce = level.cost_model.outer_allreduce_ms(weights, k, node.m, size)
            inner = max([tm for *_, tm in inner_stages] + [tm for *_, tm in inner_cuts])
            # the node's exposed all-reduce per minibatch (CostModel.outer_round_ms), added to each inner stage
            fwd = costs.fwd_ms(node.first, node.last)
            extra = float(level.cost_model.outer_round_ms(inner, fwd, allreduce, size)) - inner
            for f, l, ws, tm in inner_stages:
                stages.append((f, l, [c * size + w for c in comps for w in ws], (tm + extra) / node.m))
            cuts += [(a, lev, tm / node.m) for a, lev, tm in inner_cuts]
        if t + 1 < len(pipeline):
            cuts.append((node.last, k, float(level.cut_ms[node.last])))
        comp += node.m
    return stages, cuts

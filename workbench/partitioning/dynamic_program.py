"""PipeDream's dynamic program (Narayanan et al., SOSP 2019, §3.1) with the workbench cost model.

It minimises the bottleneck (the largest stage or cut time) using exactly all workers
(``use_fewer_workers=True``: at most all), level by level over the topology, innermost first::

    A_k(i->j, m) = min( T_k(i->j, m),
                        min_{i <= s < j, 1 <= m' < m} max( A_k(i->s, m-m'), c_k(s), T_k(s+1->j, m') ) )

with ``T_k`` a stage of layers i..j replicated on m level-(k-1) components and ``c_k(s)`` the cut
after layer s (:mod:`workbench.partitioning.level`). Inner levels need ``A_k`` for every sub-range
i..j; the top level only for the prefix 0..j. The answer is ``A_L(0->N-1, M_L)``. Level 1 takes the
minimum over s by a crossing search (:mod:`workbench.partitioning.crossing`); outer levels, whose
``A_{k-1}`` need not be monotone, evaluate it directly (:func:`direct_minimum`). Pure: it neither
simulates nor schedules.
"""

from __future__ import annotations

import math

import numpy as np

from workbench.cost.model import CostModel
from workbench.cost.topology import Topology
from workbench.partitioning.crossing import CrossingSearch
from workbench.partitioning.inputs import LayerCosts
from workbench.partitioning.level import Level

INF = math.inf


def build_levels(
    costs: LayerCosts,
    topology: Topology,
    straight,
    memory_bytes,
    fewer,
    *,
    cost_model: CostModel,
    fast=True,
    recompute=False,
) -> list[Level]:
    """Every level of the program, innermost first, each with its table ``best_ms`` filled; an inner
    level hands the next one ``A_k(i->j)`` on one component (on its best component count with
    ``fewer``). ``fast=False`` uses :func:`direct_minimum` at level 1 too (the tests' reference)."""
    levels: list[Level] = []
    inner = None
    top = topology.num_levels
    for k, (components, bandwidth) in enumerate(topology.levels, start=1):
        level = Level(
            k,
            components,
            bandwidth,
            costs,
            cost_model,
            inner,
            straight,
            memory_bytes,
            every_start=k < top,
            inner_workers=topology.component_size(k - 1),
            recompute=recompute,
        )
        level.best_ms = solve_level(level, fast=fast and inner is None)
        if k < top:
            inner = level.best_ms[1:].min(axis=0) if fewer else level.best_ms[components]  # inner[j, i]
        levels.append(level)
    return levels


def solve_level(level: Level, fast: bool) -> np.ndarray:
    """The table ``best[m, j, r] = A_k(start(r)->j, m)`` of one level (:class:`Level`), column by
    column: each end j first takes the single stage ``T_k(start->j, m)``, then the best split
    "prefix on p, last stage on m' = m - p" over every split point s."""
    n, components = level.costs.num_layers, level.components
    rows = n if level.every_start else 1
    starts = np.arange(rows) if level.every_start else np.zeros(1, dtype=np.int64)
    best = np.full((components + 1, n, rows), INF)
    splits = level.splits()
    prefix, last, in_flight = splits
    replicas = np.arange(1, components + 1)
    single_v = level.single_in_flight()
    cut = level.cut_ms
    if prefix.size:
        total = prefix + last  # splits are sorted by m = p + m': one group per m
        group_start = np.flatnonzero(np.r_[True, total[1:] != total[:-1]])
        group_m = total[group_start]
    crossing = CrossingSearch(level, rows, splits) if fast and prefix.size else None
    shapes = level.distinct_shapes(last, in_flight) if crossing is None and prefix.size else None
    # prefix_term[p, s, r] = max(best[p, s, r], c(s)) (only the direct path keeps all of it)
    prefix_term = np.full((components, n, rows), INF) if crossing is None and prefix.size else None
    for j in range(n):
        live_rows = j + 1 if level.every_start else 1
        i_r = starts[:live_rows]
        best[1:, j, :live_rows] = level.stage_ms(i_r[None, :], j, replicas[:, None], single_v[:, None])
        split_rows = j if level.every_start else int(j >= 1)  # rows with a split point s < j
        if split_rows and prefix.size:
            if crossing is not None:
                vals = crossing.step(j, split_rows)  # (rows, splits)
                if prefix.size <= 32:  # a few splits: fold each into its row of best
                    for c, m in enumerate(total):
                        row = best[m, j, :split_rows]
                        np.minimum(row, vals[:, c], out=row)
                else:
                    red = np.minimum.reduceat(vals, group_start, axis=1).T
                    best[group_m, j, :split_rows] = np.minimum(best[group_m, j, :split_rows], red)
            else:
                vals = direct_minimum(level, prefix_term, j, split_rows, prefix, shapes=shapes)
                red = np.minimum.reduceat(vals, group_start, axis=0)
                best[group_m, j, :split_rows] = np.minimum(best[group_m, j, :split_rows], red)
        if j < n - 1 and prefix.size:
            column = np.maximum(best[1:components, j, :live_rows], cut[j])
            if crossing is not None:
                crossing.add_column(column, j, live_rows)
            else:
                assert prefix_term is not None
                prefix_term[1:, j, :live_rows] = column
    return best


def direct_minimum(level: Level, prefix_term, j, split_rows, prefix, *, shapes) -> np.ndarray:
    """``min_{s < j} max(prefix_term[p, s, r], T_k(s+1->j, m'))`` for every split (p, m') and row
    r < ``split_rows``, evaluated in full: (splits, rows). ``shapes``:
    :meth:`Level.distinct_shapes` of the splits."""
    s = np.arange(j)
    shape_m, shape_v, shape_of = shapes
    last_stage = level.stage_ms(s[None, :] + 1, j, shape_m, shape_v)  # (distinct (m', v), s)
    out = np.empty((prefix.size, split_rows))
    chunk = max(1, int(4e6 // max(1, j * split_rows)))
    for a in range(0, prefix.size, chunk):
        b = min(prefix.size, a + chunk)
        h = last_stage[shape_of[a:b]]  # (splits, s)
        g = prefix_term[prefix[a:b], :j, :split_rows]  # (splits, s, rows)
        out[a:b] = np.maximum(g, h[:, :, None]).min(axis=1)
    return out

"""The level-1 accelerator of the dynamic program: the minimum over split points as a valley's floor.

At level 1 the last stage's time ``h(s) = T_1(s+1->j, m')`` does not grow with the split point s
and does not shrink with j, while the prefix term ``g(s) = max(A_1(r->s, p), c_1(s))`` is
arbitrary. With the suffix minimum ``Gmin(q) = min_{q <= s < j} g(s)`` (non-decreasing in q)::

    min_{r <= s < j} max(g(s), h(s)) = min(Gmin(q*), h(q* - 1)),   q* = min{q >= r : Gmin(q) >= h(q)}

(each term only where it exists; ``q* = j`` when ``Gmin`` never reaches ``h``). The crossing q*
never moves left as j grows (h grows, Gmin shrinks), so each (start r, split (p, m')) keeps its
pointer, which moves ``O(N)`` times in all: ``O(N^2 M^2)`` element work with ``O(N)`` numpy calls
instead of the direct ``O(N^3 M^2)`` (:func:`workbench.partitioning.dynamic_program.direct_minimum`,
the reference the tests compare this with bit for bit). benchmarks/bench_partition.py times it.
"""

from __future__ import annotations

import math

import numpy as np

from workbench.partitioning.level import Level, allreduce_ms_per_byte

INF = math.inf


class CrossingSearch:
    """Two-pointer crossing search for level 1, one pointer per (start row, split).

    Element ``e = r * n_splits + split`` (rows major, so the live rows 0..j-1 are a prefix of every
    per-element array). Each keeps its pointer ``crossing[e] = q*`` and ``prefix_min[e] =
    Gmin(q*)``, which a new column of g updates in O(1): ``prefix_min = min(prefix_min, g(j-1))``.
    Most pointers that move go one place (tested for all of them at once); the rest take an
    exponential and then a binary search (:meth:`advance`).

    ``Gmin`` at an arbitrary q comes from a two-level block decomposition of the columns (blocks of
    ``b = 2**SHIFT``): ``to_block_end[p, q, r]`` is the minimum from q to the end of q's block (to
    j-1 in the partial block), ``block_suffix[p, k, r]`` the minimum over the completed blocks
    k, k+1, ..., and the partial block's minimum is ``to_block_end[p, b * (j // b), r]``::

        Gmin(q) = min(to_block_end[q], block_suffix[q // b + 1], to_block_end[b * (j // b)])   completed block
        Gmin(q) = to_block_end[q]                                                               partial block

    (the second case reads ``block_suffix`` of a block not yet completed and an all-``inf`` row N of
    ``to_block_end``, so one formula serves both). ``h`` is one small table per step over the
    distinct (m', v). Adding a column costs ``O(P b R)``, completing a block ``O(P (N / b) R)``.
    """

    SHIFT = 4  # blocks of 16 columns

    def __init__(self, level: Level, rows: int, splits: tuple[np.ndarray, np.ndarray, np.ndarray]):
        prefix, last, in_flight = splits
        n = level.costs.num_layers
        self.n_layers, self.rows, self.level = n, rows, level
        self.block = 1 << self.SHIFT
        n_blocks = -(-n // self.block)
        depth = level.components - 1  # prefix component counts p = 1..M-1
        # rows 0..N-1: to_block_end; row N: all inf (sentinel); rows N+1+k: block_suffix[k] (k = 0..n_blocks)
        self.to_block_end = np.full((depth, n + 2 + n_blocks, rows), INF)
        self.block_suffix = self.to_block_end[:, n + 1 :, :]
        self.n_splits, self.prefix = prefix.size, prefix
        elem_split = np.tile(np.arange(self.n_splits), rows)
        self.row = np.repeat(np.arange(rows, dtype=np.int64), self.n_splits)
        # flat index of (p, 0, r) in to_block_end
        self.table_base = (prefix[elem_split] - 1) * ((n + 2 + n_blocks) * rows) + self.row
        self.shape_m, self.shape_v, shape_of = level.distinct_shapes(last, in_flight)
        self.shape_alpha = allreduce_ms_per_byte(self.shape_m, level.collective[1])
        self.last_stage_table = np.full((len(self.shape_m), n), INF)
        self.table_offset = shape_of[elem_split] * n  # flat index of (the element's shape, q=0)
        # per element (m', v, alpha), for steps where a table of h would cost more than probes
        self.elem_m, self.elem_v = self.shape_m[shape_of, 0][elem_split], self.shape_v[shape_of, 0][elem_split]
        self.elem_alpha = self.shape_alpha[shape_of, 0][elem_split]
        self.crossing = self.row.copy()
        self.prefix_min = np.full(rows * self.n_splits, INF)

    def add_column(self, column, j, live_rows):
        """Append the prefix term ``g(j) = max(A_1[1:, j, :live_rows], c_1(j))`` (shape (P, live_rows))."""
        b, to_end, suffix = self.block, self.to_block_end, self.block_suffix
        k = j >> self.SHIFT
        blk = to_end[:, k * b : j + 1, :live_rows]
        np.minimum(blk, column[:, None, :], out=blk)
        if j == k * b + b - 1:  # block k complete
            block_min = to_end[:, k * b, :live_rows]
            suffix[:, k, :live_rows] = block_min
            if k:
                np.minimum(suffix[:, :k, :live_rows], block_min[:, None, :], out=suffix[:, :k, :live_rows])
        live = live_rows * self.n_splits
        np.minimum(self.prefix_min[:live], column.T[:, self.prefix - 1].reshape(-1), out=self.prefix_min[:live])

    def step(self, j, live_rows) -> np.ndarray:
        """``min_s max(g(s), T_1(s+1->j, m'))`` for every row r < live_rows and split: (live_rows, n_splits)."""
        live = live_rows * self.n_splits
        last_stage = self._last_stage_reader(j, live)
        elems = slice(0, live)
        crossing, prefix_min = self.crossing[:live], self.prefix_min[:live]  # views: updated in place
        behind = np.flatnonzero(prefix_min < last_stage(elems, crossing))
        if behind.size:
            self.advance(behind, crossing[behind], j, last_stage)
        before = last_stage(elems, crossing - 1)
        before[crossing == self.row[:live]] = INF  # s = r - 1: no prefix
        np.minimum(before, prefix_min, out=before)
        return before.reshape(live_rows, self.n_splits)

    def _last_stage_reader(self, j, live):
        """``h(elements, q) = T_1(q+1->j, m')`` of each element's split: from one table over the
        distinct shapes when there are many rows (level 1 of a hierarchy), else only where probed."""
        level = self.level
        if len(self.shape_m) * j <= 4 * live:
            table = self.last_stage_table
            q_all = np.arange(1, j + 1)[None, :]
            table[:, :j] = level.stage_ms(q_all, j, self.shape_m, self.shape_v, alpha=self.shape_alpha)
            flat, offset = table.reshape(-1), self.table_offset

            def last_stage(idx, q):
                return flat[offset[idx] + q]

            return last_stage
        m, v, alpha = self.elem_m, self.elem_v, self.elem_alpha

        def probe(idx, q):
            return level.stage_ms(q + 1, j, m[idx], v[idx], alpha=alpha[idx])

        return probe

    def _prefix_min_reader(self, j):
        """``Gmin(elements, q)`` from the two-level block decomposition at step j."""
        rows, shift = self.rows, self.SHIFT
        partial_start = (j >> shift) << shift  # start of the partial block (columns partial_start..j-1)
        flat = self.to_block_end.reshape(-1)
        base = self.table_base
        partial, sentinel, suffix_1 = partial_start * rows, self.n_layers * rows, (self.n_layers + 2) * rows

        def prefix_min(idx, q):
            tb = base[idx]
            x = flat[tb + q * rows]
            np.minimum(x, flat[tb + ((q >> shift) * rows + suffix_1)], out=x)  # block_suffix[q // b + 1]
            np.minimum(x, flat[tb + np.where(q < partial_start, partial, sentinel)], out=x)
            return x

        return prefix_min

    def advance(self, active, lo, j, last_stage):
        """Move the pointers of elements ``active`` (crossing not reached at ``lo``) to the first q in
        (lo, j-1] where ``Gmin(q) >= h(q)``, or to j; set ``prefix_min`` to ``Gmin`` there."""
        prefix_min = self._prefix_min_reader(j)
        crossing, at_crossing = self.crossing, self.prefix_min

        def no_crossing(active, lo):  # not reached at lo = j-1: q* = j, Gmin(j) = inf
            end = lo == j - 1
            if end.any():
                crossing[active[end]] = j
                at_crossing[active[end]] = INF
                active, lo = active[~end], lo[~end]
            return active, lo

        active, lo = no_crossing(active, lo)
        # one place to the right, for all at once; a pointer is final unless searched further
        probe = lo + 1
        g = prefix_min(active, probe)
        crossing[active] = probe
        at_crossing[active] = g
        miss = ~(g >= last_stage(active, probe))
        active, lo = no_crossing(active[miss], probe[miss])
        found = self._gallop(active, lo, j, (prefix_min, last_stage))
        if found is not None:
            idx, q = self._bisect(*found, (prefix_min, last_stage))
            crossing[idx] = q
            at_crossing[idx] = prefix_min(idx, q)

    def _gallop(self, active, lo, j, readers):
        """Exponential search right of ``lo`` for a q where the crossing is reached; elements that
        reach j-1 without one get ``q* = j``. Returns ``(elements, lo, hi)`` of the brackets found
        (not reached at lo, reached at hi), or None."""
        prefix_min, last_stage = readers
        step = 2
        found_idx, found_lo, found_hi = [], [], []
        while active.size:
            probe = np.minimum(lo + step, j - 1)
            reached = prefix_min(active, probe) >= last_stage(active, probe)
            found_idx.append(active[reached]), found_lo.append(lo[reached]), found_hi.append(probe[reached])
            end = ~reached & (probe >= j - 1)
            self.crossing[active[end]] = j
            self.prefix_min[active[end]] = INF
            keep = ~reached & ~end
            active, lo, step = active[keep], probe[keep], step * 2
        if not found_idx:
            return None
        return np.concatenate(found_idx), np.concatenate(found_lo), np.concatenate(found_hi)

    @staticmethod
    def _bisect(idx, lo, hi, readers):
        """Binary search in (lo, hi] (not reached at lo, reached at hi): each element's first q
        where ``Gmin(q) >= h(q)``; returns ``(elements, q)``."""
        prefix_min, last_stage = readers
        done_idx, done_q = [idx[:0]], [idx[:0]]
        while idx.size:
            done = hi - lo <= 1
            done_idx.append(idx[done]), done_q.append(hi[done])
            keep = ~done
            idx, lo, hi = idx[keep], lo[keep], hi[keep]
            if idx.size:
                mid = (lo + hi) // 2
                reached = prefix_min(idx, mid) >= last_stage(idx, mid)
                hi, lo = np.where(reached, mid, hi), np.where(reached, lo, mid)
        return np.concatenate(done_idx), np.concatenate(done_q)

"""PipeDream's partitioner (Narayanan et al., SOSP 2019, §3.1) and two straight baselines.

The costs are the cost model's and only there (:mod:`workbench.cost.model`, explained in
docs/cost-model.md): a stage's time per round (:meth:`CostModel.round_ms`, and for outer topology
levels :meth:`CostModel.outer_round_ms` with :meth:`CostModel.outer_allreduce_ms`), a cut's
transfer, and a stage's memory per worker (:func:`~workbench.cost.model.stage_memory`, with
PipeDream's NOAM minibatches in flight; the ``memory_bytes`` limit is checked at level 1). The
dynamic program minimises the bottleneck (the largest stage or cut time) using exactly all workers
(``use_fewer_workers=True``: at most all), level by level over the topology, innermost first::

      A_k(i->j, m) = min( T_k(i->j, m),
                          min_{i <= s < j, 1 <= m' < m} max( A_k(i->s, m-m'), c_k(s), T_k(s+1->j, m') ) )

with ``T_k`` a stage of layers i..j replicated on m level-(k-1) components and ``c_k(s)`` the cut
after layer s. Inner levels need ``A_k`` for every sub-range i..j; the top level only for the
prefix 0..j. The answer is ``A_L(0->N-1, M_L)``.

Speed. At level 1 ``T_1(s+1->j, m')`` does not grow with the split point s and does not shrink
with j, so ``min_s max(g(s), T_1(s+1->j, m'))`` (g = prefix term) is the minimum of a valley:
with ``G(q) = min_{q<=s<j} g(s)`` (non-decreasing in q) it is reached where ``G`` crosses
``T_1``, and the crossing only moves right as j grows. Each (start i, pair (m-m', m')) keeps its
crossing pointer and ``G`` there (a new column updates it in O(1)); the pointers that move are
advanced together, the rest by an exponential and a binary search over a two-level block suffix
minimum (``_CrossingState``): ``O(N^2 M^2)`` element work with ``O(N)`` numpy calls. Levels k >= 2
(whose ``A_{k-1}`` need not be monotone) evaluate the minimum over s directly (``_direct``, also
the reference the tests compare the fast path with). benchmarks/bench_partition.py times it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from workbench.cost.model import CostModel, ring_allreduce_ms, stage_memory
from workbench.cost.plan import Plan, Stage
from workbench.cost.topology import Topology
from workbench.partitioning.pipedream_optimizer import Settings as PipeDreamSettings
from workbench.partitioning.pipedream_optimizer import partition_pipedream
from workbench.profiling.measure import Profile

INF = math.inf


# ---- inputs -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Layers:
    compute: np.ndarray  # T_l = fwd + bwd, ms
    act: np.ndarray  # a_l, bytes crossing the cut after layer l
    param: np.ndarray  # w_l, bytes
    Cp: np.ndarray  # prefix sums, length N + 1
    Wp: np.ndarray
    Ap: np.ndarray
    Fp: np.ndarray  # prefix sums of fwd_ms and bwd_ms
    Bp: np.ndarray

    @property
    def n(self) -> int:
        return len(self.compute)


def _layers(profile) -> _Layers:
    if not isinstance(profile, Profile):
        raise ValueError(
            f"partition needs a workbench Profile, got {type(profile).__name__}; build one with Profile.from_frame(df)"
        )
    df = profile.layers
    if len(df) == 0:
        raise ValueError("profile has no layers; nothing to partition")
    cols = {}
    for c in ("fwd_ms", "bwd_ms", "act_bytes", "param_bytes"):
        x = df[c].to_numpy(dtype=float)
        if not np.all(np.isfinite(x)) or np.any(x < 0):
            raise ValueError(f"profile column {c!r} must be finite and >= 0 for every layer")
        cols[c] = x
    compute = cols["fwd_ms"] + cols["bwd_ms"]
    act, param = cols["act_bytes"], cols["param_bytes"]
    z = np.zeros(1)
    return _Layers(
        compute,
        act,
        param,
        np.concatenate([z, np.cumsum(compute)]),
        np.concatenate([z, np.cumsum(param)]),
        np.concatenate([z, np.cumsum(act)]),
        np.concatenate([z, np.cumsum(cols["fwd_ms"])]),
        np.concatenate([z, np.cumsum(cols["bwd_ms"])]),
    )


MAX_WORKERS = 1024  # more are refused: the dynamic program's tables and the refinement's simulations grow with them


def _check_topology(topology) -> Topology:
    if not isinstance(topology, Topology):
        raise ValueError(f"topology must be a workbench Topology, e.g. Topology.flat(4, 12e9); got {topology!r}")
    if topology.num_workers > MAX_WORKERS:
        raise ValueError(
            f"the topology has {topology.num_workers} workers; the partitioner takes at most {MAX_WORKERS} "
            "(its tables and simulations grow with the worker count)"
        )
    for k, (count, bw) in enumerate(topology.levels, start=1):
        if count < 1:
            raise ValueError(f"topology level {k} has {count} components; need at least 1 worker")
        if not bw > 0:
            raise ValueError(f"topology level {k} bandwidth must be > 0 bytes/s, got {bw}")
    return topology


def _allreduce_ms_per_byte(m, bandwidth: float):
    """ms per parameter byte of the ring all-reduce among m replicas (CostModel's formula, no latency)."""
    return ring_allreduce_ms(1.0, m, bandwidth, 0.0)


# ---- one level of the dynamic program ---------------------------------------------------------
@dataclass
class _Level:
    """Level k of the DP: ``M`` components at bandwidth ``B``; ``prev[j, i]`` is the time of the
    range i..j on one level-(k-1) component (None at level 1: the compute sum)."""

    k: int
    M: int
    B: float
    L: _Layers
    cm: CostModel
    prev: np.ndarray | None
    straight: bool
    memory: float | None
    rows_all: bool  # every start i (inner level) or only start 0 (top level)
    inner_workers: int = 1  # workers in one level-(k-1) component
    # A[m, j, r]: range start(r)..j on exactly m components (filled by _solve)
    A: np.ndarray = field(default_factory=lambda: np.empty((0, 0, 0)))
    recompute: bool = False  # activation re-materialization (module docstring, Memory)

    @property
    def collective(self) -> tuple[float, float]:
        """``(latency_ms, bandwidth)`` of the ring all-reduce among level-k components
        (:meth:`CostModel.level_collective`: the calibrated all-reduce where there is one, else the
        level's link ``B``), as the cost model and the simulator price it."""
        return self.cm.level_collective(self.k)

    @property
    def cut(self) -> np.ndarray:
        """``c_k(s) = α_k + a_s / B_k``: one direction of a full-duplex link (CostModel)."""
        if "cut" not in self.__dict__:
            self.__dict__["cut"] = self.cm.level_cut_ms(self.k)
        return self.__dict__["cut"]

    def T(self, first, last, m, v, alpha=None):
        """``T_k(first->last, m)`` (numpy broadcasting), ``inf`` where not allowed; ``alpha`` is
        ``_allreduce_ms_per_byte(m, collective bandwidth)`` when the caller has it already. Level 1: the 1F1B round
        of a replica over m (:meth:`CostModel.round_ms`); outer levels: the inner pipeline's time
        ``A_{k-1}`` plus the exposed all-reduce, over m (:meth:`CostModel.outer_round_ms`)."""
        L = self.L
        par = L.Wp[last + 1] - L.Wp[first]
        m = np.asarray(m)
        if self.prev is None:
            lat, bw = self.collective
            if alpha is None:
                alpha = _allreduce_ms_per_byte(m, bw)
            ar = alpha * par + 2.0 * (m - 1.0) * lat
            t = self.cm.round_ms(L.Fp[last + 1] - L.Fp[first], L.Bp[last + 1] - L.Bp[first], ar) / m
        else:
            ar = self.cm.outer_allreduce_ms(par, self.k, m, self.inner_workers)
            t = self.cm.outer_round_ms(self.prev[last, first], L.Fp[last + 1] - L.Fp[first], ar, self.inner_workers) / m
        if self.straight:
            t = np.where(m > 1, INF, t)
        if self.memory is not None and self.prev is None:
            mem = _stage_memory(L, first, last, v, par, recompute=self.recompute)
            t = np.where(mem > self.memory, INF, t)
        return t

    def pairs(self):
        """(p, m', v) for every split "prefix on p, last stage on m'", sorted by m = p + m'."""
        out = [
            (p, mp, -(-(self.M - p) // mp))
            for m in range(2, self.M + 1)
            for p in range(1, m)
            for mp in [m - p]
            if not (self.straight and mp > 1)
        ]
        pp, mp, vv = (np.array([o[i] for o in out], dtype=np.int64) for i in range(3))
        return pp, mp, vv

    def v_single(self) -> np.ndarray:
        m = np.arange(1, self.M + 1)
        return -(-self.M // m)


def _stage_memory(L: _Layers, first, last, v, par, *, recompute: bool):
    """:func:`~workbench.cost.model.stage_memory` of the candidate stages ``first..last`` with ``v``
    minibatches in flight and ``par`` bytes of weights (arrays): their activations from the prefix
    sums, and with ``recompute`` their input (0 for the first stage, whose input is the data)."""
    acts = L.Ap[np.asarray(last) + 1] - L.Ap[first]
    if not recompute:
        return stage_memory(par, acts, 0.0, v)
    first = np.asarray(first)
    a_in = np.where(first > 0, L.act[np.maximum(first - 1, 0)], 0.0)
    return stage_memory(par, acts, a_in, v, recompute=True)


def _solve(lv: _Level, fast: bool) -> np.ndarray:
    N, M = lv.L.n, lv.M
    R = N if lv.rows_all else 1
    starts = np.arange(R) if lv.rows_all else np.zeros(1, dtype=np.int64)
    A = np.full((M + 1, N, R), INF)
    pp, mp, vv = lv.pairs()
    ms = np.arange(1, M + 1)
    vs = lv.v_single()
    cut = lv.cut
    if pp.size:
        m_of = pp + mp
        gstart = np.flatnonzero(np.r_[True, m_of[1:] != m_of[:-1]])
        gm = m_of[gstart]
    P = M - 1
    state = _CrossingState(lv, P, R, pp, mp, vv=vv) if fast and pp.size else None
    distinct = _distinct_mv(lv, mp, vv) if state is None and pp.size else None
    # G[p, s, r] = max(A[p, s, r], c(s)): the prefix term (only the direct path keeps all of it)
    G = np.full((P + 1, N, R), INF) if state is None and pp.size else None
    for j in range(N):
        nr = j + 1 if lv.rows_all else 1
        i_r = starts[:nr]
        A[1:, j, :nr] = lv.T(i_r[None, :], j, ms[:, None], vs[:, None])
        nv = j if lv.rows_all else int(j >= 1)
        if nv and pp.size:
            if state is not None:
                vals = state.step(j, nv)  # (rows, pairs)
                if pp.size <= 32:  # a few pairs: fold each into its row of A
                    for c, m in enumerate(m_of):
                        row = A[m, j, :nv]
                        np.minimum(row, vals[:, c], out=row)
                else:
                    red = np.minimum.reduceat(vals, gstart, axis=1).T
                    A[gm, j, :nv] = np.minimum(A[gm, j, :nv], red)
            else:
                red = np.minimum.reduceat(_direct(lv, G, j, nv, pp, distinct=distinct), gstart, axis=0)
                A[gm, j, :nv] = np.minimum(A[gm, j, :nv], red)
        if j < N - 1 and pp.size:
            gcol = np.maximum(A[1:M, j, :nr], cut[j])
            if state is not None:
                state.add_column(gcol, j, nr)
            else:
                assert G is not None
                G[1:, j, :nr] = gcol
    return A


def _distinct_mv(lv: _Level, mp, vv):
    """Distinct (m', v) of the pairs (v only matters under a memory limit at level 1) as column
    vectors ``m, v`` and each pair's index among them: ``T(.., m', v)`` is computed once each."""
    key = np.stack([mp, vv if lv.memory is not None and lv.prev is None else 0 * vv], axis=1)
    uk, inv = np.unique(key, axis=0, return_inverse=True)
    return uk[:, :1], uk[:, 1:], inv.reshape(-1)


def _direct(lv: _Level, G, j, nv, pp, *, distinct) -> np.ndarray:
    """``min_{s} max(G[p, s, r], T(s+1->j, m'))`` for every pair and row, evaluated in full."""
    s = np.arange(j)
    hm, hv, inv = distinct
    hu = lv.T(s[None, :] + 1, j, hm, hv)  # (distinct (m', v), s)
    out = np.empty((pp.size, nv))
    step = max(1, int(4e6 // max(1, j * nv)))
    for a in range(0, pp.size, step):
        b = min(pp.size, a + step)
        h = hu[inv[a:b]]  # (pairs, s)
        g = G[pp[a:b], :j, :nv]  # (pairs, s, rows)
        out[a:b] = np.maximum(g, h[:, :, None]).min(axis=1)
    return out


class _CrossingState:
    """Two-pointer crossing search for level 1, one pointer per (pair, row).

    Element ``e = r * npairs + pair`` (rows major, so the live rows 0..j-1 are a prefix of every
    state array). For pair (p, m') and row r at step j the search needs::

        Gmin(q) = min_{q <= s <= j-1} G[p, s, r]      (non-decreasing in q)
        h(q)    = T_1(q+1 -> j, m')                    (non-increasing in q, the same for all r)

    and the crossing ``q* = min{q >= r : Gmin(q) >= h(q)}`` (``j`` if none); the minimum over s is
    then ``min(Gmin(q*), h(q*-1))`` (each term only where it exists). ``q*`` never moves left as
    j grows (h grows, Gmin shrinks), so each element keeps its pointer ``qptr`` and
    ``Gp = Gmin(qptr)``, which a new column updates in O(1): ``Gp = min(Gp, G[p, j-1, r])``.
    Most pointers that move go one place (tested for all of them at once); the rest take an
    exponential and then a binary search. ``Gmin`` at an arbitrary q comes from a two-level block
    decomposition of the columns (blocks of ``b = 2**SHIFT``): ``TIB[p, q, r]`` is the minimum from
    q to the end of q's block (to j-1 in the partial block), ``BSC[p, k, r]`` the minimum over the
    completed blocks k, k+1, ..., and the partial block's minimum is ``TIB[p, b * (j // b), r]``::

        Gmin(q) = min(TIB[q], BSC[q // b + 1], TIB[b * (j // b)])   q in a completed block
        Gmin(q) = TIB[q]                                            q in the partial block

    (the second case reads ``BSC`` of a block not yet completed and an all-``inf`` row ``N`` of
    ``TIB``, so one formula serves both). ``h`` is one small table per step over the distinct
    (m', v). Adding a column costs ``O(P b R)``, completing a block ``O(P (N / b) R)``.
    """

    SHIFT = 4  # blocks of 16 columns

    def __init__(self, lv: _Level, P, R, pp, mp, *, vv):
        N = lv.L.n
        self.N, self.R, self.lv = N, R, lv
        self.b = b = 1 << self.SHIFT
        nblk = -(-N // b)
        # rows 0..N-1: TIB; row N: all inf (sentinel); rows N+1+k: BSC[k] (k = 0..nblk)
        self.TIB = np.full((P, N + 2 + nblk, R), INF)
        self.BSC = self.TIB[:, N + 1 :, :]
        npairs = pp.size
        self.npairs, self.pp = npairs, pp
        e_pair = np.tile(np.arange(npairs), R)
        self.row = np.repeat(np.arange(R, dtype=np.int64), npairs)
        self.tbase = (pp[e_pair] - 1) * ((N + 2 + nblk) * R) + self.row  # flat index of (p, 0, r)
        self.hm, self.hv, inv = _distinct_mv(lv, mp, vv)
        self.halpha = _allreduce_ms_per_byte(self.hm, lv.collective[1])
        self.H = np.full((len(self.hm), N), INF)
        self.hoff = inv[e_pair] * N  # flat H index of (pair's row, q=0)
        # per element (m', v, alpha), for steps where a table of h would cost more than probes
        self.em, self.ev = self.hm[inv, 0][e_pair], self.hv[inv, 0][e_pair]
        self.ealpha = self.halpha[inv, 0][e_pair]
        self.qptr = self.row.copy()
        self.Gp = np.full(R * npairs, INF)

    def add_column(self, gcol, j, nr):
        """Append ``G[1:, j, :nr]`` (shape (P, nr))."""
        b, TIB, BSC = self.b, self.TIB, self.BSC
        k = j >> self.SHIFT
        blk = TIB[:, k * b : j + 1, :nr]
        np.minimum(blk, gcol[:, None, :], out=blk)
        if j == k * b + b - 1:  # block k complete
            bm = TIB[:, k * b, :nr]
            BSC[:, k, :nr] = bm
            if k:
                np.minimum(BSC[:, :k, :nr], bm[:, None, :], out=BSC[:, :k, :nr])
        En = nr * self.npairs
        np.minimum(self.Gp[:En], gcol.T[:, self.pp - 1].reshape(-1), out=self.Gp[:En])

    def step(self, j, nv) -> np.ndarray:
        """``min_s max(G[p, s, r], T(s+1->j, m'))`` for every row r < nv and pair: (nv, npairs)."""
        E = nv * self.npairs
        if len(self.hm) * j <= 4 * E:  # many rows (level 1 of a hierarchy): one table of h
            H = self.H
            H[:, :j] = self.lv.T(np.arange(1, j + 1)[None, :], j, self.hm, self.hv, alpha=self.halpha)
            Hf, hoff = H.reshape(-1), self.hoff

            def h(idx, q):
                return Hf[hoff[idx] + q]
        else:  # few elements (one row, many pairs): h only where probed
            lv, em, ev, ea = self.lv, self.em, self.ev, self.ealpha

            def h(idx, q):
                return lv.T(q + 1, j, em[idx], ev[idx], alpha=ea[idx])

        live = slice(0, E)
        qptr, Gp = self.qptr[:E], self.Gp[:E]  # views: updated in place
        bad = np.flatnonzero(Gp < h(live, qptr))
        if bad.size:
            self._search(bad, qptr[bad], j, h)
        c2 = h(live, qptr - 1)
        c2[qptr == self.row[:E]] = INF  # s = r - 1: no prefix
        np.minimum(c2, Gp, out=c2)
        return c2.reshape(nv, self.npairs)

    def _search(self, act, lo, j, h):
        """Move the pointers of elements ``act`` (predicate false at ``lo``) to the first q in
        (lo, j-1] where ``Gmin(q) >= h(q)``, or to j; set ``Gp`` to ``Gmin`` there."""
        R, S, N = self.R, self.SHIFT, self.N
        nb0 = (j >> S) << S  # start of the partial block (columns nb0..j-1)
        tib = self.TIB.reshape(-1)
        tbase, qptr, Gp = self.tbase, self.qptr, self.Gp
        part, sentinel, bsc1 = nb0 * R, N * R, (N + 2) * R

        def gmin(idx, q):
            tb = tbase[idx]
            x = tib[tb + q * R]
            np.minimum(x, tib[tb + ((q >> S) * R + bsc1)], out=x)  # BSC[q // b + 1]
            np.minimum(x, tib[tb + np.where(q < nb0, part, sentinel)], out=x)
            return x

        def pred(idx, q, g):
            return g >= h(idx, q)

        def no_crossing(act, lo):  # the predicate is false at lo = j-1: q* = j, Gmin(j) = inf
            end = lo == j - 1
            if end.any():
                qptr[act[end]] = j
                Gp[act[end]] = INF
                act, lo = act[~end], lo[~end]
            return act, lo

        act, lo = no_crossing(act, lo)
        # one place to the right, for all at once; a pointer is final unless searched further
        probe = lo + 1
        g = gmin(act, probe)
        qptr[act] = probe
        Gp[act] = g
        miss = ~pred(act, probe, g)
        act, lo = no_crossing(act[miss], probe[miss])
        step = 2
        bi, blo, bhi = [], [], []
        while act.size:  # exponential search for a true predicate right of lo
            probe = np.minimum(lo + step, j - 1)
            t = pred(act, probe, gmin(act, probe))
            bi.append(act[t]), blo.append(lo[t]), bhi.append(probe[t])
            last = ~t & (probe >= j - 1)
            qptr[act[last]] = j
            Gp[act[last]] = INF
            keep = ~t & ~last
            act, lo, step = act[keep], probe[keep], step * 2
        if not bi:
            return
        idx, lo_b, hi_b = np.concatenate(bi), np.concatenate(blo), np.concatenate(bhi)
        done_i, done_q = [idx[:0]], [idx[:0]]
        while idx.size:  # binary search in (lo, hi]: false at lo, true at hi
            done = hi_b - lo_b <= 1
            done_i.append(idx[done]), done_q.append(hi_b[done])
            keep = ~done
            idx, lo_b, hi_b = idx[keep], lo_b[keep], hi_b[keep]
            if idx.size:
                mid = (lo_b + hi_b) // 2
                t = pred(idx, mid, gmin(idx, mid))
                hi_b, lo_b = np.where(t, mid, hi_b), np.where(t, lo_b, mid)
        idx, q = np.concatenate(done_i), np.concatenate(done_q)
        qptr[idx] = q
        Gp[idx] = gmin(idx, q)


# ---- all levels, reconstruction -------------------------------------------------------------
@dataclass
class _Node:
    first: int
    last: int
    m: int  # components of this level
    time: float  # T_k(first->last, m)
    child: list | None  # pipeline of the level below inside one component (None at level 1)


def _build_levels(
    L: _Layers, topo: Topology, straight, memory, fewer, *, cm: CostModel, fast=True, recompute=False
) -> list[_Level]:
    levels, prev = [], None
    nlev = topo.num_levels
    for k, (M, B) in enumerate(topo.levels, start=1):
        lv = _Level(
            k,
            M,
            B,
            L,
            cm,
            prev,
            straight,
            memory,
            rows_all=k < nlev,
            inner_workers=topo.component_size(k - 1),
            recompute=recompute,
        )
        lv.A = _solve(lv, fast=fast and prev is None)
        if k < nlev:
            full = lv.A[1:].min(axis=0) if fewer else lv.A[M]
            prev = full  # prev[j, i]: range i..j on one level-k component
        levels.append(lv)
    return levels


def _best_m(lv: _Level, j: int, r: int, fewer: bool) -> int:
    if not fewer:
        return lv.M
    col = lv.A[1:, j, r]
    return int(np.argmin(col)) + 1


def _rebuild(levels, k, i, j, m, *, fewer) -> list[_Node]:
    """The level-k pipeline on range i..j with exactly m components that attains ``A_k``."""
    lv = levels[k - 1]
    r = i if lv.rows_all else 0
    target = lv.A[m, j, r]
    single = float(lv.T(i, j, m, -(-lv.M // m)))
    if single == target:
        return [_node(levels, k, i, j, m, t=single, fewer=fewer)]
    best = None
    for p in range(1, m):
        mp = m - p
        if lv.straight and mp > 1:
            continue
        s = np.arange(i, j)
        g = np.maximum(lv.A[p, i:j, r], lv.cut[i:j])
        h = lv.T(s + 1, j, mp, -(-(lv.M - p) // mp))
        val = np.maximum(g, h)
        hit = np.flatnonzero(val == target)
        if hit.size:
            best = (int(s[hit[0]]), p, mp, float(h[hit[0]]))
            break
    if best is None:
        raise AssertionError("partition DP: could not reconstruct the optimum (please report)")
    split, p, mp, tlast = best
    return _rebuild(levels, k, i, split, p, fewer=fewer) + [_node(levels, k, split + 1, j, mp, t=tlast, fewer=fewer)]


def _candidates(levels, m_top: int, n: int, fewer: bool) -> list[tuple[float, list[_Node]]]:
    """The dynamic program's best distinct top-level pipelines, cheaply from its tables:
    ``(A, pipeline)`` for the all-replicated stage and, per split "prefix on p components, last
    stage on m - p", the best split point (O(N) each; the prefix rebuilt as the DP's optimum);
    with ``fewer`` also the best plan on each other number of top-level components. Infinite
    ones are left out; the DP optimum is among them."""
    top = len(levels)
    lv = levels[-1]
    j = n - 1
    out = []
    for m in [m_top] + [x for x in range(1, lv.M + 1) if x != m_top] if fewer else [m_top]:
        if m != m_top:
            if math.isfinite(float(lv.A[m, j, 0])):
                out.append((float(lv.A[m, j, 0]), _rebuild(levels, top, 0, j, m, fewer=fewer)))
            continue
        single = float(lv.T(0, j, m, -(-lv.M // m)))
        if math.isfinite(single):
            out.append((single, [_node(levels, top, 0, j, m, t=single, fewer=fewer)]))
        s = np.arange(0, j)
        for p in range(1, m):
            mp = m - p
            if (lv.straight and mp > 1) or not s.size:
                continue
            val = np.maximum(np.maximum(lv.A[p, :j, 0], lv.cut[:j]), lv.T(s + 1, j, mp, -(-(lv.M - p) // mp)))
            b = int(np.argmin(val))
            if math.isfinite(val[b]):
                tl = float(lv.T(b + 1, j, mp, -(-(lv.M - p) // mp)))
                out.append(
                    (
                        float(val[b]),
                        _rebuild(levels, top, 0, b, p, fewer=fewer)
                        + [_node(levels, top, b + 1, j, mp, t=tl, fewer=fewer)],
                    )
                )
    return out


def _node(levels, k, i, j, m, *, t, fewer) -> _Node:
    child = None
    if k > 1:
        below = levels[k - 2]
        child = _rebuild(levels, k - 1, i, j, _best_m(below, j, i, fewer), fewer=fewer)
    return _Node(i, j, m, t, child)


def _flatten(levels, k, pipeline, L: _Layers, topo: Topology):
    """Flat stages ``(first, last, workers, time_ms)`` and cuts ``(after_layer, level, time_ms)``
    of a level-k pipeline inside one level-k component (worker ids from 0)."""
    size = topo.component_size(k - 1)
    lv = levels[k - 1]
    stages, cuts, comp = [], [], 0
    for t, nd in enumerate(pipeline):
        comps = range(comp, comp + nd.m)
        if nd.child is None:
            stages.append((nd.first, nd.last, [c * size for c in comps], nd.time))
        else:
            cst, ccuts = _flatten(levels, k - 1, nd.child, L, topo)
            par = L.Wp[nd.last + 1] - L.Wp[nd.first]
            ar = lv.cm.outer_allreduce_ms(par, k, nd.m, size)
            inner = max([tm for *_, tm in cst] + [tm for *_, tm in ccuts])
            # the node's exposed all-reduce per minibatch (CostModel.outer_round_ms), added to each inner stage
            extra = float(lv.cm.outer_round_ms(inner, L.Fp[nd.last + 1] - L.Fp[nd.first], ar, size)) - inner
            for f, l, ws, tm in cst:
                stages.append((f, l, [c * size + w for c in comps for w in ws], (tm + extra) / nd.m))
            cuts += [(a, lev, tm / nd.m) for a, lev, tm in ccuts]
        if t + 1 < len(pipeline):
            cuts.append((nd.last, k, float(lv.cut[nd.last])))
        comp += nd.m
    return stages, cuts


def data_parallel_ms(profile: Profile, topology: Topology, cost_model: CostModel | None = None) -> float:
    """One stage of all layers replicated on every worker: one ring all-reduce per round over all
    W workers at the slowest link (:meth:`CostModel.stage_ms`), ``(F + B + 3o + exposed AR) / W``.
    That is what the simulator's ``dp-bsp`` and the runtime do, and what the partitioner's dynamic
    program gives its all-replicated candidate through any hierarchy (:meth:`CostModel.outer_round_ms`)."""
    topo = _check_topology(topology)
    cm = cost_model or CostModel.from_profile(profile, topo)
    return cm.stage_ms(0, cm.num_layers - 1, range(topo.num_workers))


@dataclass(frozen=True)
class PartitionOptions:
    """What :func:`partition` searches and how it prices (each field is also a keyword of it).

    * ``straight``: no stage replication; ``memory_bytes``: limit per worker (None: none);
      ``use_fewer_workers``: the best plan on any number of workers up to the topology's;
    * ``latency_ms`` (per message, one number or one per level) and ``op_overhead_ms`` (per op):
      the calibrated fixed costs of :mod:`workbench.runtime.machine`; ``allreduce_bandwidth`` and
      ``allreduce_latency_ms`` (one number or one per level): the ring all-reduce's own bus bandwidth
      and per-step latency where data parallelism's collective is slower than the links (None: the
      links'; :class:`~workbench.cost.model.CostModel`);
    * ``refine``: simulate the best candidates (:func:`refine_candidates`); ``recompute``:
      activation re-materialization in the memory figures (module docstring, Memory);
    * ``cost``: ``"workbench"`` (the cost model) or ``"pipedream"`` (PipeDream's optimizer and
      formulas, with the options in ``pipedream``).
    """

    straight: bool = False
    memory_bytes: float | None = None
    use_fewer_workers: bool = False
    latency_ms: float | Sequence[float] = 0.0
    op_overhead_ms: float = 0.0
    allreduce_bandwidth: float | Sequence[float] | None = None
    allreduce_latency_ms: float | Sequence[float] | None = None
    refine: bool = True
    recompute: bool = False
    cost: str = "workbench"
    pipedream: PipeDreamSettings | None = None


@dataclass(frozen=True)
class Candidates:
    """What the dynamic program hands to refinement (:mod:`workbench.partitioning.search`):
    ``optimum`` (the plan of the DP optimum), ``ranked`` (every distinct candidate plan by
    ``predicted_ms``), the :class:`CostModel` they were priced with and the memory limit."""

    optimum: Plan
    ranked: list[Plan]
    cost_model: CostModel
    memory_bytes: float | None


def solve(profile: Profile, topology: Topology, o: PartitionOptions) -> Candidates:
    """PipeDream's dynamic program (the module docstring) with the workbench cost model: the
    optimum and, when ``o.refine``, the candidates refinement by simulation ranks (:func:`_candidates`:
    the all-replicated stage, the best split per replica count of the last top-level stage, and with
    ``use_fewer_workers`` the best plan per worker count). Pure: it simulates nothing."""
    L = _layers(profile)
    topo = _check_topology(topology)
    memory_bytes = _memory(o.memory_bytes)
    fewer = o.use_fewer_workers
    cm = CostModel.from_profile(
        profile,
        topo,
        latency_ms=o.latency_ms,
        op_overhead_ms=o.op_overhead_ms,
        allreduce_bandwidth=o.allreduce_bandwidth,
        allreduce_latency_ms=o.allreduce_latency_ms,
    )
    levels = _build_levels(L, topo, o.straight, memory_bytes, fewer, cm=cm, recompute=o.recompute)
    top = levels[-1]
    m_top = _best_m(top, L.n - 1, 0, fewer)
    if not math.isfinite(float(top.A[m_top, L.n - 1, 0])):
        raise ValueError(_infeasible_message(L, topo, o.straight, memory_bytes, fewer, cm=cm, recompute=o.recompute))
    if o.refine:
        pool = _candidates(levels, m_top, L.n, fewer)
    else:
        pool = [(float(top.A[m_top, L.n - 1, 0]), _rebuild(levels, topo.num_levels, 0, L.n - 1, m_top, fewer=fewer))]
    meta = _workbench_meta(profile, topo, o, memory_bytes, cm)
    plans = _candidate_plans(pool, levels, L, topo, cm, meta=meta, dp_ms=data_parallel_ms(profile, topo, cm))
    ranked = sorted(plans, key=lambda q: (q.predicted_ms, q.bottleneck_ms))
    optimum = min(plans, key=lambda q: q.bottleneck_ms)
    return Candidates(optimum, ranked, cm, memory_bytes)


def partition_by_pipedream(profile: Profile, topo: Topology, o: PartitionOptions) -> Plan:
    """``cost="pipedream"``: PipeDream's optimizer, which has no fixed costs or recompute to price."""
    if o.recompute or o.latency_ms or o.op_overhead_ms or o.allreduce_bandwidth or o.allreduce_latency_ms:
        raise ValueError(
            "cost='pipedream' prices PipeDream's formulas only: drop recompute, latency_ms, op_overhead_ms "
            "and the allreduce_ options"
        )
    return partition_pipedream(
        profile,
        topo,
        o.straight,
        _memory(o.memory_bytes),
        o.use_fewer_workers,
        settings=o.pipedream or PipeDreamSettings(),
    )


def _workbench_meta(profile: Profile, topo: Topology, o: PartitionOptions, memory_bytes, cm: CostModel) -> dict:
    """``Plan.meta`` of a workbench-priced plan: the search's options and the cost model's calibration."""
    return {
        "topology": topo.to_list(),
        "topology_name": topo.name,
        "straight": o.straight,
        "memory_bytes": memory_bytes,
        "device_memory_bytes": _device_memory(topo, profile),
        "use_fewer_workers": o.use_fewer_workers,
        "recompute": o.recompute,
        "latency_ms": list(cm.latency_ms),
        "op_overhead_ms": cm.op_overhead_ms,
        "allreduce_bandwidth": None if cm.allreduce_bandwidth is None else list(cm.allreduce_bandwidth),
        "allreduce_latency_ms": None if cm.allreduce_latency_ms is None else list(cm.allreduce_latency_ms),
        "batch_size": cm.batch_size,
        "cost": "workbench",
        "cost_model": "workbench.cost.model: 1F1B round (F + B + 3o + exposed ring AR) / m, "
        "cut = alpha + a/B per direction (full duplex)",
    }


def _candidate_plans(
    pool, levels, L: _Layers, topo: Topology, cm: CostModel, *, meta: dict, dp_ms: float
) -> list[Plan]:
    """One flat :class:`Plan` (with the cost model's predictions) per distinct pipeline of ``pool``
    (``(A, pipeline)`` pairs, in order; a repeated stage layout keeps its first)."""
    plans: dict[tuple, Plan] = {}
    for value, pipeline in pool:
        flat, cuts = _flatten(levels, topo.num_levels, pipeline, L, topo)
        stages = tuple(Stage(f, l, len(ws), tuple(ws), float(t)) for f, l, ws, t in flat)
        cand = Plan(
            stages,
            bottleneck_ms=value,
            single_worker_ms=float(L.Cp[-1]),
            data_parallel_ms=dp_ms,
            method="pipedream",
            meta=meta | {"cuts": [[int(a), int(k), float(t)] for a, k, t in cuts]},
        )
        plans.setdefault(tuple((st.first, st.last, st.workers) for st in stages), with_predictions(cand, cm))
    return list(plans.values())


COSTS = ("workbench", "pipedream")  # the cost models partition() can price with


def _memory(memory_bytes) -> float | None:
    if memory_bytes is None:
        return None
    mb = float(memory_bytes)
    if not (math.isfinite(mb) and mb > 0):
        raise ValueError(f"memory_bytes must be a positive number of bytes per worker, got {memory_bytes!r}")
    return mb


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


def _infeasible_message(L: _Layers, topo, straight, memory, fewer, *, cm, recompute=False) -> str:
    if memory is not None:
        alone = L.param + L.act
        worst = int(np.argmax(alone))
        if alone[worst] > memory:
            return (
                f"memory_bytes={memory:.4g} is too small: layer {worst} alone needs "
                f"{alone[worst]:.4g} bytes (weights + stashed activations of one minibatch)"
            )
        free = _build_levels(L, topo, straight, None, fewer, cm=cm)[-1]
        if math.isfinite(free.A[1:, -1, 0].min() if fewer else free.A[topo.counts[-1], -1, 0]):
            lo, hi = memory, float((L.Wp[-1] + L.Ap[-1]) * topo.num_workers)
            for _ in range(12):  # geometric bisection: infeasible at lo, feasible at hi
                mid = math.sqrt(lo * hi)
                top = _build_levels(L, topo, straight, mid, fewer, cm=cm, recompute=recompute)[-1]
                val = top.A[1:, -1, 0].min() if fewer else top.A[topo.counts[-1], -1, 0]
                lo, hi = (lo, mid) if math.isfinite(val) else (mid, hi)
            return (
                f"no partition fits in memory_bytes={memory:.4g} per worker; the smallest limit "
                f"that fits is about {hi:.4g} bytes (raise memory_bytes, add workers"
                f"{'' if recompute else ', or pass recompute=True'})"
            )
    if straight:
        return (
            f"a straight pipeline needs at least one layer per worker: {L.n} layers cannot fill "
            f"{topo.num_workers} workers ({topo.counts} per level); use use_fewer_workers=True, "
            f"fewer workers, or allow replication (straight=False)"
        )
    return "no feasible partition for this profile and topology"


# ---- baselines ------------------------------------------------------------------------------
def _straight_plan(profile: Profile, lasts: list[int], method: str, topology: Topology | None) -> Plan:
    """Stage k (layers up to ``lasts[k]``) on worker k, with the cost model's stage and cut times."""
    S = len(lasts)
    firsts = [0] + [l + 1 for l in lasts[:-1]]
    topo = _check_topology(topology) if topology is not None else None
    if topo is not None and S > topo.num_workers:
        raise ValueError(f"{S} stages need {S} workers but the topology has {topo.num_workers}")
    cm = CostModel.from_profile(profile, topo)
    times = [cm.stage_ms(f, l, (k,)) for k, (f, l) in enumerate(zip(firsts, lasts))]
    cuts = []
    if topo is not None:
        cuts = [(lasts[k], topo.level_between(k, k + 1), cm.cut_ms(lasts[k], (k,), (k + 1,))) for k in range(S - 1)]
    stages = tuple(Stage(f, l, 1, (k,), t) for k, (f, l, t) in enumerate(zip(firsts, lasts, times)))
    dp = data_parallel_ms(profile, topo, cm) if topo is not None else math.nan
    meta = {
        "topology": topo.to_list() if topo is not None else None,
        "device_memory_bytes": _device_memory(topo, profile),
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


def _device_memory(topology: Topology | None, profile: Profile) -> float | None:
    """Memory of one worker's device: the topology's (a preset's GPUs), else the GPU a modeled
    profile was projected for (``meta["device_memory_bytes"]``), else None (unknown)."""
    if topology is not None and topology.memory_bytes:
        return topology.memory_bytes
    mem = (profile.meta or {}).get("device_memory_bytes")
    return float(mem) if mem else None


def _check_stages(L: _Layers, stages) -> int:
    if isinstance(stages, bool) or not isinstance(stages, (int, np.integer)) or stages < 1:
        raise ValueError(f"stages must be a positive integer, got {stages!r}")
    if stages > L.n:
        raise ValueError(f"cannot split {L.n} layers into {stages} non-empty stages; use at most {L.n}")
    return int(stages)


def partition_equal_layers(profile: Profile, stages: int, topology: Topology | None = None) -> Plan:
    """Straight split into ``stages`` stages of equal layer counts (the first ``N mod S`` stages
    get one more layer); stage k on worker k. Times modeled under ``topology`` when given."""
    L = _layers(profile)
    S = _check_stages(L, stages)
    return _straight_plan(profile, [s.last for s in Plan.even(L.n, S).stages], "equal-layers", topology)


def partition_balanced_time(profile: Profile, stages: int, topology: Topology | None = None) -> Plan:
    """Straight split minimising the largest stage compute ``max_k sum_{l in k} (fwd_l + bwd_l)``
    (the goal of torchgpipe's ``balance_by_time``; solved exactly by a DP over prefixes:
    ``D_k(j) = min_s max(D_{k-1}(s), C(s+1..j))``). Communication is not part of the objective;
    it is modeled in the returned times when ``topology`` is given.

    With costs >= 0, ``D_{k-1}(s)`` does not decrease and ``C(s+1..j)`` does not increase in
    ``s``, so the minimum lies where they cross: at the first ``s`` with
    ``D_{k-1}(s) + C(0..s) >= C(0..j)`` (a sorted search) or just before it. Time
    ``O(S N log N)``, memory ``O(S N)`` (the split points)."""
    L = _layers(profile)
    S = _check_stages(L, stages)
    N = L.n
    D = L.Cp[1:].copy()  # D_1(j) = C(0..j)
    arg = np.zeros((S + 1, N), dtype=np.int64)
    for k in range(2, S + 1):
        D, arg[k] = _balanced_step(D, L.Cp, k)
    lasts, j = [N - 1], N - 1
    for k in range(S, 1, -1):
        j = int(arg[k, j])
        lasts.append(j)
    return _straight_plan(profile, lasts[::-1], "balanced-time", topology)


def _balanced_step(D: np.ndarray, Cp: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``D_k(j) = min_{k-2 <= s < j} max(D_{k-1}(s), Cp[j+1] - Cp[s+1])`` and its argmin for every
    ``j`` (INF for ``j < k - 1``: fewer layers than stages), by the crossing search of
    :func:`partition_balanced_time`."""
    N = len(D)
    lo = k - 2
    j = np.arange(k - 1, N)
    G = D[lo:] + Cp[lo + 1 : N + 1]  # non-decreasing in s
    c = np.minimum(lo + np.searchsorted(G, Cp[j + 1], side="left"), j - 1)
    b = np.maximum(c - 1, lo)

    def f(s):
        return np.maximum(D[s], Cp[j + 1] - Cp[s + 1])

    fc, fb = f(c), f(b)
    s = np.where(fb <= fc, b, c)
    newD = np.full(N, INF)
    newD[k - 1 :] = np.minimum(fb, fc)
    arg = np.zeros(N, dtype=np.int64)
    arg[k - 1 :] = s
    return newD, arg

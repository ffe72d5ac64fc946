"""PipeDream's own cost model and dynamic program (``cost="pipedream"``), as its public optimizer
(``optimizer/optimizer_graph_hierarchical.py`` of msr-fiddle/pipedream) prices and solves it.

States are antichains (:mod:`workbench.partitioning.antichain`); ``C(i, j)``, ``a(i, j)``, ``w(i, j)`` are the
compute (s), activation and parameter bytes of the states after state ``i-1`` up to state ``j``
(row ``i = 0``: from the start), i.e. differences of the cumulative sums. A level has ``M``
machines joined at bandwidth ``B``, each holding ``n_in`` workers of the level inside (1 at the
innermost level). Machine counts ``m`` below are 1-based; ``m <= M``.

*One stage replicated on m machines* (data parallelism added to compute, not overlapped)::

    T(i, j, m) = ( C(i, j) + 4 (m-1) w(i, j) / (B m) / n_in ) / m

allowed when ``ceil((M - m) / m) (a(i, j) + w(i, j)) <= memory`` (with a memory limit).

*Split* after state ``k`` (an ancestor of ``j`` in the antichain DAG, and for ``i > 0`` not an
ancestor of state ``i-1``), the last stage on ``m'`` machines::

    L(k, j, m') = ( C(k+1, j) + 4 (m'-1) w(k+1, j) / (B m') ) / m'
    A(i, j, m)  = min( T(i, j, m),  min_{k, m'} max( A(i, k, m-m'), L(k, j, m'),
                                                     2 out(k) / (B m' r),  2 out(j) / (B m' r) ) )

``out(s)``: bytes leaving state ``s`` (its augmented antichain's outputs), ``r`` the activation
compression ratio (``None``: cuts are free), the last term absent for the final state; a split
needs ``ceil((M - m) / m') (a(k+1, j) + w(k+1, j)) <= memory``. ``straight``: ``m = 1`` per stage
(``m' = 1``); ``use_fewer_machines``: ``A(i, j, m)`` may take ``A(i, j, m-1)`` when that is lower.
Ties keep the earlier candidate: the one-stage entry (or the ``m-1`` entry it took), then ``k`` in
the candidate order (default: topological, ascending; PipeDream's own is the iteration order of a
Python set of objects, which a recording can replay), then ``m'`` ascending.

*Levels, inside out.* The innermost level is solved for every row ``i``; the next level's
``C(i, j)`` is the inner ``A(i, j, M_in)`` (a machine of the next level runs the inner optimum on
all its workers), and ``n_in = M_in``; the outermost level needs row 0 only. Its
``A(0, N-1, M)`` is PipeDream's "time per stage in pipeline". The plan is read back outside in:
each outer stage (states ``s..e``) is split again with the inner level's ``A(s, e-1, M_in)``.

*Data parallelism* (PipeDream's DP estimate): ``t = C_total``; for each level inside out
``t = (t + 4 (M-1) W / (B M) / n_in) / M``.

Quirks kept for parity: in ``L`` the all-reduce is not divided by ``n_in`` (it is in ``T``); for
``i > 0`` the rows are differences of cumulative sums even where state ``i-1`` is not an ancestor
of ``j`` (PipeDream prices such pairs too).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np

from workbench.cost.plan import Plan, Stage
from workbench.cost.topology import Topology
from workbench.partitioning.antichain import States, antichain_states
from workbench.profiling.graph import LayerGraph
from workbench.profiling.measure import Profile
from workbench.profiling.pipedream import in_order

INF = math.inf


@dataclass(frozen=True)
class Options:
    """PipeDream's optimizer flags (``--straight_pipeline``, ``--use_fewer_machines``,
    ``--use_memory_constraint --memory_size``, ``--activation_compression_ratio``)."""

    straight: bool = False
    use_fewer_machines: bool = False
    memory_bytes: float | None = None
    activation_compression_ratio: float | None = 1.0


@dataclass
class _Level:
    """One solved level, column-major: ``T[m-1, j, i] = A(i, j, m)`` and how it was reached
    (``split_k = -1``: one stage); rows padded to blocks of ``S`` (:class:`_Prefixes`)."""

    T: np.ndarray
    split_k: np.ndarray
    split_m: np.ndarray  # machines (0-based index) left for the prefix
    used: np.ndarray  # machines of the last stage
    machines: int
    rows: int


@dataclass(frozen=True)
class Result:
    """PipeDream's decision: ``stages`` (first state, end state exclusive, replicas across all
    levels), their nodes, the levels' stage lists, and its times in seconds."""

    states: States
    stages: tuple[tuple[int, int, int], ...]
    stage_nodes: tuple[tuple[str, ...], ...]
    levels: tuple[tuple[tuple[int, int, int], ...], ...]  # outermost first, as PipeDream prints them
    stage_times_s: tuple[float, ...]
    workers: tuple[tuple[int, ...], ...]
    pipeline_s: float
    data_parallel_s: float
    single_s: float
    unused_machines: int


def _segments(states: States) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``C, a, w`` column-major, shape (N, N+1): ``[j, 0]`` the cumulative sums, ``[j, i]`` the
    sums after state i-1; ``inf`` where PipeDream has no entry (j < i)."""
    n = len(states)
    below = np.arange(n)[:, None] < np.arange(n + 1)[None, :]  # j < i
    out = []
    for cum in (states.compute_s, states.activation, states.parameters):
        cum = np.asarray(cum, dtype=float)
        M = np.where(below, INF, cum[:, None] - np.r_[0.0, cum][None, :])
        M[:, 0] = cum
        out.append(M)
    return out[0], out[1], out[2]


def _init(C, act, par, rows, M, *, within, B, opt: Options, lv: _Level):
    """The one-stage entries ``T(i, j, m)`` (module docstring)."""
    n = C.shape[0]
    jge = np.arange(n)[:, None] >= np.arange(rows)[None, :]
    a, w, c = act[:, :rows], par[:, :rows], C[:, :rows]
    for m0 in range(1 if opt.straight else M):
        ok = jge & np.isfinite(c)
        with np.errstate(invalid="ignore"):  # inf entries (no segment) give nan here, masked by ok
            if opt.memory_bytes is not None:
                ok &= ~(math.ceil((M - (m0 + 1)) / (m0 + 1)) * (a + w) > opt.memory_bytes)
            dp = (4 * m0 * w) / (B * (m0 + 1)) / within
            t = (c + dp) / (m0 + 1)
        lv.T[m0, :, :rows] = np.where(ok, t, INF)
        lv.used[m0, :, :rows] = np.where(ok, m0 + 1, 0)


@dataclass(frozen=True)
class _Tables:
    """What one level's DP reads: segment sums ``[j, i]`` (i: after state i-1), state outputs, flags."""

    C: np.ndarray
    act: np.ndarray
    par: np.ndarray
    out: np.ndarray
    M: int
    B: float
    opt: Options


def _solve(t: _Tables, within: int, final: bool, order) -> _Level:
    """One level of the dynamic program over every row (``final``: row 0 only); ``order[j]``: the
    split states of state j in the order they are tried. Row i is solved for states j > i only
    (PipeDream's loop). ``A(i, j, .)`` reads only columns ``k < j``, so the best split of every
    row and machine count of column j is found at once (:func:`_splits`); the machine counts are
    then filled in ascending order (``use_fewer_machines`` reads ``A(i, j, m-1)``)."""
    n = t.C.shape[0]
    rows = 1 if final else n + 1
    S = min(BLOCK, rows)
    shape = (t.M, n, -(-rows // S) * S)
    mach = np.min_scalar_type(-t.M)  # the smallest integer types that hold the entries
    lv = _Level(
        np.full(shape, INF),
        np.full(shape, -1, dtype=np.min_scalar_type(-n)),
        np.full(shape, -1, dtype=mach),
        np.zeros(shape, dtype=mach),
        t.M,
        rows,
    )
    _init(t.C, t.act, t.par, rows, t.M, within=within, B=t.B, opt=t.opt, lv=lv)
    if t.M == 1:
        return lv
    done = _Prefixes(lv, S)
    done.add(0)
    for j in range(1, n):
        ks = order[j]
        R = min(rows, j)
        best = _splits(lv, t, done, j, ks, R=R) if ks.size else None
        for m in range(1, t.M):
            cur = _fewer(lv, t.opt, j, m, R)
            if best is not None:
                least, fk, fq = (x[m - 1] for x in best)
                _take(lv, j, m, ks, cur, least=least, fk=fk, fq=fq)
        done.add(j)
    return lv


BLOCK = 64  # rows per block of the pruning bound in _splits
FINITE = np.finfo(float).max


class _Prefixes:
    """The finished columns ``A(., k, p)`` (``p < M-1``, 0-based: the machine counts a prefix can
    have) as :func:`_splits` reads them: ``TT[p, k, b, r] = A(b S + r, k, p)`` (a view of the
    level's table, rows in blocks of ``S``) and per block its least entry and an id of its
    bytes, ``lo[b, p, k]`` and ``ids[b, p, k]`` (0: all inf)."""

    def __init__(self, lv: _Level, S: int):
        M, n, W = lv.T.shape
        self.S, self.nb = S, W // S
        self.TT = lv.T.reshape(M, n, self.nb, S)[: M - 1]
        self.lo = np.full((self.nb, M - 1, n), INF)
        self.ids = np.zeros((self.nb, M - 1, n), dtype=np.int64)
        self.known: dict = {}  # block bytes -> id

    def add(self, k: int) -> None:
        """Column ``k`` is final (every row, every machine count)."""
        blk = self.TT[:, k]  # (M-1, blocks, S)
        lo = blk.min(axis=2)
        self.lo[:, :, k] = lo.T
        some = lo < INF
        raw = np.ascontiguousarray(blk[some]).view(np.dtype((np.void, 8 * self.S))).ravel()
        known = self.known
        ids = np.zeros(lo.shape, dtype=np.int64)
        ids[some] = [known.setdefault(b, len(known) + 1) for b in raw.tolist()]
        self.ids[:, :, k] = ids.T


def _splits(lv: _Level, t: _Tables, done: _Prefixes, j: int, ks: np.ndarray, *, R: int):
    """The best split of column j for rows ``i < R`` and every 0-based machine count ``m >= 1``:
    per (m, i) the least ``max(A(i, k, m-m'), last(k, m'))`` over (k, m') and the first (k in
    ``ks``'s order, then m' ascending) reaching it, as arrays ``least, k position, m'-1`` of
    shape (M-1, R).

    Exact pruning: a split is taken in row i only below ``cur = A(i, j, m)`` before the split
    search, which is at most the one-stage entry where that is finite (inf: no bound); so per
    block of ``S`` rows a (k, m') is tried only if its ``last`` and the block's least
    ``A(., k, m-m')`` are at most the block's largest one-stage entry. Every candidate that
    reaches a row's least value below its ``cur`` survives, and so does every candidate equal to
    it in each row of the block unless an earlier survivor is (:func:`_distinct`); the survivors
    keep their order, so the first least one is the one a full search finds. ``A(i, k) = inf``
    for ``k < i`` (no segment): no row takes a split state before its own start."""
    S, M = done.S, t.M
    nbj = -(-R // S)
    last = _last_stage(t, j, ks)  # (M-1, K, Q)
    pk = np.maximum(np.arange(M - 1)[:, None] - np.arange(last.shape[2])[None, :], 0)  # prefix's m
    at = (slice(0, nbj), pk[:, None, :], ks[None, :, None])
    lo = done.lo[at]  # (blocks, M-1, K, Q)
    cur = np.full((M - 1, nbj * S), -INF)  # padding rows are never updated
    cur[:, :R] = lv.T[1:, j, :R]
    thr = np.minimum(cur.reshape(M - 1, nbj, S).max(axis=2).T, FINITE)[:, :, None, None]
    bb, mm, kk, qq = np.nonzero((lo <= thr) & (last <= thr))  # by block, m, then k, then m'
    least = np.full((M - 1, nbj * S), INF)  # (FINITE above: an inf term is never taken)
    fk = np.zeros((M - 1, nbj * S), dtype=np.int64)
    fq = np.zeros((M - 1, nbj * S), dtype=np.int64)
    if bb.size:
        if S > 1 and bb.size * S > DEDUP:
            bb, mm, kk, qq = _distinct(done, ks, pk, last, bb, mm=mm, kk=kk, qq=qq)
        cand = np.maximum(done.TT[pk[mm, qq], ks[kk], bb], last[mm, kk, qq][:, None])  # (survivors, S)
        key = bb * (M - 1) + mm
        starts = np.flatnonzero(np.r_[True, key[1:] != key[:-1]])
        low = np.minimum.reduceat(cand, starts, axis=0)  # (segments, S)
        seg = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, bb.size]))
        pos = np.where(cand == low[seg], np.arange(bb.size)[:, None], bb.size)
        first = np.minimum.reduceat(pos, starts, axis=0)  # the first survivor reaching the least
        to = (mm[starts][:, None], bb[starts][:, None] * S + np.arange(S)[None, :])
        least[to], fk[to], fq[to] = low, kk[first], qq[first]
    return least[:, :R], fk[:, :R], fq[:, :R]


DEDUP = 4096  # survivor entries above which equal survivors are dropped first (_distinct; S > 1)


def _distinct(done: _Prefixes, ks, pk, last, bb, *, mm, kk, qq):
    """The survivors less those equal to an earlier one of their (block, m) in every row: the
    same block of ``A(., k, m-m')`` (equal bytes) and the same ``last``; such a one is never the
    first least one."""
    ids = done.ids[bb, pk[mm, qq], ks[kk]]
    rank = np.unique(last, return_inverse=True)[1].reshape(last.shape)[mm, kk, qq]
    ni, nl = len(done.known) + 1, last.size
    key = ((bb * last.shape[0] + mm) * ni + ids) * nl + rank  # < 2**63 (BLOCK keeps blocks few)
    first = np.sort(np.unique(key, return_index=True)[1])
    return bb[first], mm[first], kk[first], qq[first]


def _take(lv: _Level, j, m, ks, cur, *, least, fk, fq) -> None:
    """``A(i, j, m+1)`` takes the best split where it is below ``cur`` (ties keep ``cur``)."""
    i = np.flatnonzero(least < cur)
    used = fq[i] + 1
    lv.T[m, j, i] = least[i]
    lv.split_k[m, j, i] = ks[fk[i]]
    lv.split_m[m, j, i] = m - used
    lv.used[m, j, i] = used


def _last_stage(t: _Tables, j: int, ks: np.ndarray) -> np.ndarray:
    """Per (m, k, m'-1) the last stage's time with its cut terms (inf: not allowed, or ``m' > m``;
    ``m`` 0-based from 1, ``m'`` machines from 1; ``straight``: ``m' = 1`` only)."""
    opt = t.opt
    ms = np.arange(1, t.M)[:, None, None]
    mps = np.arange(1, 2 if opt.straight else t.M)[None, None, :]
    c_last, w_last = t.C[j, ks + 1][None, :, None], t.par[j, ks + 1][None, :, None]
    ok = np.isfinite(c_last) & (mps <= ms)
    if opt.memory_bytes is not None:
        stash = (t.act[j, ks + 1][None, :, None] + w_last) * np.ceil((t.M - (ms + 1)) / mps)
        ok &= ~(stash > opt.memory_bytes)
    with np.errstate(invalid="ignore"):
        last = (c_last + (4 * (mps - 1) * w_last) / (t.B * mps)) / mps
    r = opt.activation_compression_ratio
    if r is not None:
        last = np.maximum(last, (2.0 * t.out[ks][None, :, None]) / (t.B * mps) / r)
        if j < len(t.out) - 1:
            last = np.maximum(last, (2.0 * t.out[j]) / (t.B * mps) / r)
    return np.where(ok, last, INF)


def _fewer(lv: _Level, opt: Options, j: int, m: int, R: int) -> np.ndarray:
    """``use_fewer_machines``: ``A(i, j, m+1)`` takes ``A(i, j, m)`` where lower (or where it has no
    value yet); returns the current ``A(i, j, m+1)`` of rows ``i < R``."""
    T = lv.T
    if opt.use_fewer_machines:
        cur = T[m, j, :R]
        take = np.isinf(cur) | (T[m - 1, j, :R] < cur)
        for arr in (lv.T, lv.split_k, lv.split_m, lv.used):
            arr[m, j, :R] = np.where(take, arr[m - 1, j, :R], arr[m, j, :R])
    return T[m, j, :R].copy()


def _read_back(lv: _Level, start: int, end: int) -> list[tuple[int, int, int]]:
    """Stages (first state, end state, machines) of the optimum for states start..end-1 on all
    of the level's machines."""
    m = lv.machines - 1
    j, out = end - 1, []
    row = start if lv.rows > 1 else 0
    while True:
        used, k = int(lv.used[m, j, row]), int(lv.split_k[m, j, row])
        if used == 0:
            raise ValueError(f"no feasible configuration for states {start}..{end - 1} on {lv.machines} machines")
        if k < 0:
            out.append((start, j + 1, used))
            return out[::-1]
        out.append((k + 1, j + 1, used))
        m = int(lv.split_m[m, j, row])
        j = k


def optimize_states(
    states: States, machines: list[int], bandwidths: list[float], opt: Options = Options(), *, candidate_order=None
) -> Result:
    """PipeDream's optimizer on ``states`` with ``machines[k]`` machines at ``bandwidths[k]`` per
    level, innermost first (module docstring).

    ``candidate_order[j]``: the ancestors of state j in the order the DP tries them (default
    ascending). It only decides between configurations of equal time: PipeDream's own optimizer
    tries them in the iteration order of a Python set of objects (memory-address order), which
    tests replay from a recording to compare configurations bit for bit."""
    if len(machines) != len(bandwidths) or not machines:
        raise ValueError("give one machine count and one bandwidth per level")
    order = states.ancestors if candidate_order is None else _check_order(states, candidate_order)
    C, act, par = _segments(states)
    levels, within = [], 1
    for lvl, (M, B) in enumerate(zip(machines, bandwidths)):
        final = lvl == len(machines) - 1
        lv = _solve(_Tables(C, act, par, states.output_activation, int(M), float(B), opt), within, final, order)
        levels.append(lv)
        if not final:  # the next level's compute: this level's optimum on all its machines
            C = lv.T[-1, :, : lv.rows]
        within = int(M)
    return _assemble(states, levels, machines, bandwidths)


def _check_order(states: States, order) -> list[np.ndarray]:
    if len(order) != len(states):
        raise ValueError(f"candidate_order needs one list per state ({len(states)}), got {len(order)}")
    out = []
    for j, ks in enumerate(order):
        ks = np.asarray(ks, dtype=np.int64)
        if sorted(ks.tolist()) != states.ancestors[j].tolist():
            raise ValueError(f"candidate_order[{j}] must be a permutation of the ancestors of state {j}")
        out.append(ks)
    return out


def _assemble(states: States, levels: list[_Level], machines, bandwidths) -> Result:
    """Read the plan back outside in: each outer stage is split again on its inner machines."""
    n = len(states)
    pipeline_s = float(levels[-1].T[-1, n - 1, 0])
    if not math.isfinite(pipeline_s):
        raise ValueError(
            "PipeDream's optimizer finds no configuration: raise the memory limit, allow "
            "replication (straight=False) or use more machines"
        )
    # a span: (first state, end state, replication so far, groups = worker ids of each machine above)
    spans = [(0, n, 1, [list(range(int(np.prod(machines))))])]
    printed = []
    for k in range(len(levels) - 1, -1, -1):
        unit = int(np.prod(machines[:k]))  # workers per machine of level k
        nxt, lev_stages = [], []
        for first, end, rep, groups in spans:
            comp = 0
            for s, e, used in _read_back(levels[k], first, end):
                lev_stages.append((s, e, used))
                sub = [g[c * unit : (c + 1) * unit] for g in groups for c in range(comp, comp + used)]
                nxt.append((s, e, rep * used, sub))
                comp += used
        printed.append(tuple(lev_stages))
        spans = nxt
    C, par = _segment(states.compute_s), _segment(states.parameters)
    B0 = float(bandwidths[0])
    stages, workers, times = [], [], []
    for (s, e, rep, groups), (_, _, u) in zip(spans, printed[-1]):
        c, w = C(s, e - 1), par(s, e - 1)
        times.append((c + (4 * (u - 1) * w) / (B0 * u)) / u / (rep // u))
        stages.append((s, e, rep))
        workers.append(tuple(x for g in groups for x in g))
    nodes = states.stage_nodes([e for _, e, _ in stages])
    return Result(
        states,
        tuple(stages),
        tuple(tuple(x) for x in nodes),
        tuple(printed),
        tuple(times),
        tuple(workers),
        pipeline_s,
        data_parallel_s(states, machines, bandwidths),
        float(states.compute_s[-1]),
        int(np.prod(machines)) - sum(len(ws) for ws in workers),
    )


def _segment(cum: np.ndarray):
    """``(i, j) -> cum[j] - cum[i-1]`` (row i = after state i-1; row 0 = cum[j])."""
    return lambda i, j: float(cum[j] - cum[i - 1]) if i > 0 else float(cum[j])


def data_parallel_s(states: States, machines, bandwidths) -> float:
    """PipeDream's data-parallel estimate (module docstring), seconds per minibatch."""
    t, W, within = float(states.compute_s[-1]), float(states.parameters[-1]), 1
    for M, B in zip(machines, bandwidths):
        t = sum([t, (4 * (M - 1) * W) / (B * M) / within]) / M
        within = M
    return t


# ---- the workbench's entry: a Plan priced by PipeDream's model --------------------------------
@dataclass(frozen=True)
class Settings:
    """``cost="pipedream"`` options of :func:`workbench.partition`: the activation compression
    ratio ``r`` of the cut terms (``None``: cuts are free, PipeDream's default) and the states the
    DP runs over: ``"antichains"`` (the node DAG in ``profile.meta["graph"]``, where a profile has
    one) or ``"layers"`` (the profile's execution-order rows as a chain)."""

    activation_compression_ratio: float | None = 1.0
    over: str = "antichains"

    def __post_init__(self):
        if self.over not in ("antichains", "layers"):
            raise ValueError(f"over must be 'antichains' or 'layers', got {self.over!r}")
        r = self.activation_compression_ratio
        if r is not None and not (isinstance(r, (int, float)) and r > 0 and math.isfinite(r)):
            raise ValueError(f"activation_compression_ratio must be a number > 0 or None, got {r!r}")


def profile_states(profile: Profile, over: str = "antichains") -> States:
    """PipeDream's states of ``profile``: the antichain DAG of ``meta["graph"]`` (a graph.txt
    profile, or a traced model with a layer graph), else the chain of its rows (prefix states)."""
    if over == "antichains" and "graph" in profile.meta:
        return antichain_states(LayerGraph.from_dict(profile.meta["graph"]))
    df = profile.layers
    return antichain_states(
        LayerGraph.chain(df["name"], df["fwd_ms"], df["bwd_ms"], df["act_bytes"], df["param_bytes"]), prune=False
    )


def partition_pipedream(
    profile: Profile,
    topology: Topology,
    straight: bool = False,
    memory_bytes: float | None = None,
    use_fewer_workers: bool = False,
    *,
    settings: Settings = Settings(),
) -> Plan:
    """A :class:`Plan` chosen and priced by PipeDream's optimizer (module docstring).

    ``bottleneck_ms`` = ``predicted_ms`` = its "time per stage in pipeline" (x 1000),
    ``data_parallel_ms`` its DP estimate, ``single_worker_ms`` the total compute; each stage's
    ``time_ms`` is its innermost-level term ``(C + 4 (m-1) w / (B_1 m)) / m`` divided by the
    replication of the outer stages around it. ``meta["pipedream"]`` has the stage node sets,
    the per-level stage lists (state indices) and the settings. Where the stages are not contiguous
    in the profile's layer order, ``meta["layer_order"]`` lists the layer nodes in an order where
    they are (:func:`workbench.profiling.pipedream.in_order` gives that profile) and the stage ranges
    refer to it."""
    st = profile_states(profile, settings.over)
    opt = Options(straight, use_fewer_workers, memory_bytes, settings.activation_compression_ratio)
    res = optimize_states(st, list(topology.counts), list(topology.bandwidths), opt)
    graph = settings.over == "antichains" and "graph" in profile.meta
    lasts, order = _layer_ranges(profile, res, graph)
    stages = []
    first = 0
    for last, (_, _, rep), ws, t in zip(lasts, res.stages, res.workers, res.stage_times_s):
        stages.append(Stage(first, last, rep, tuple(ws), t * 1e3))
        first = last + 1
    meta = {
        "topology": topology.to_list(),
        "topology_name": topology.name,
        "straight": straight,
        "memory_bytes": memory_bytes,
        "use_fewer_workers": use_fewer_workers,
        "cost": "pipedream",
        "batch_size": profile.meta.get("batch_size"),
        "cost_model": COST_MODEL,
        "pipedream": {
            "over": "antichains" if graph else "layers",
            "states": len(st),
            "activation_compression_ratio": settings.activation_compression_ratio,
            "pipeline_s": res.pipeline_s,
            "data_parallel_s": res.data_parallel_s,
            "dp_speedup": res.single_s / res.data_parallel_s,
            "unused_machines": res.unused_machines,
            "levels": [[list(x) for x in lv] for lv in res.levels],
            "stage_nodes": [list(x) for x in res.stage_nodes],
        },
    }
    if order is not None:
        meta["layer_order"] = order
    return Plan(
        tuple(stages),
        bottleneck_ms=res.pipeline_s * 1e3,
        single_worker_ms=res.single_s * 1e3,
        data_parallel_ms=res.data_parallel_s * 1e3,
        method="pipedream",
        meta=meta,
        predicted_ms=res.pipeline_s * 1e3,
    )


COST_MODEL = (
    "PipeDream optimizer_graph_hierarchical: stage (C + 4(m-1)w/(B m)/n_in)/m, data parallelism "
    "added to compute; cut 2a/(B m')/r; levels inside out"
)


def _layer_ranges(profile: Profile, res: Result, graph: bool) -> tuple[list[int], list[str] | None]:
    """Last profile row of each stage, and a new layer order where the stages are not contiguous."""
    df = profile.layers
    if not graph:  # chain: state i = row i
        return [e - 1 for _, e, _ in res.stages], None
    stage = {v: s for s, ns in enumerate(res.stage_nodes) for v in ns}
    g = LayerGraph.from_dict(profile.meta["graph"])
    rows = list(df["node"]) if "node" in df else [v for v, d in zip(g.ids, g.desc) if not d.startswith("Input")]
    pred: dict = {}
    for a, b in g.edges:
        pred.setdefault(b, []).append(a)
    seq = []
    for v in rows:  # a row PipeDream pruned (a __getitem__ sink) follows its producers
        stage.setdefault(v, max((stage.get(a, 0) for a in pred.get(v, [])), default=0))
        seq.append(stage[v])
    order = None
    if any(b < a for a, b in itertools.pairwise(seq)):
        rows_sorted = sorted(range(len(seq)), key=lambda i: (seq[i], i))
        order = [str(rows[i]) for i in rows_sorted]
        seq = [seq[i] for i in rows_sorted]
    lasts = [max(i for i, s in enumerate(seq) if s == k) for k in range(len(res.stages))]
    return lasts, order


def price_plan(profile: Profile, topology: Topology, plan: Plan, settings: Settings = Settings()) -> float:
    """PipeDream's time per minibatch (ms) for the flat stages of ``plan`` over the profile's rows
    on a one-level topology (bandwidth ``B``), as its dynamic program would price that configuration::

        max( max_s (C_s + 4 (r_s-1) w_s / (B r_s)) / r_s,
             max_{cut after stage s} 2 a / (B r_{s+1}) / r,  2 a / (B r_s) / r  for s >= 1 )

    (``a``: the profile's ``act_bytes`` at the cut; the first stage, priced in one piece, has no
    output term). One stage on every worker: its data-parallel estimate on any topology. NaN for
    other plans on several levels: PipeDream prices only the nested configurations its own levels
    produce."""
    df = profile.layers
    if plan.num_stages == 1 and plan.num_workers == topology.num_workers:
        t, W, within = float(((df["fwd_ms"] + df["bwd_ms"]) / 1e3).sum()), float(df["param_bytes"].sum()), 1
        for M, Bk in topology.levels:
            t = (t + (4 * (M - 1) * W) / (Bk * M) / within) / M
            within = M
        return t * 1e3
    if topology.num_levels != 1:
        return math.nan
    B = float(topology.bandwidths[0])
    comp = (df["fwd_ms"] + df["bwd_ms"]).to_numpy(dtype=float) / 1e3
    par, act = df["param_bytes"].to_numpy(dtype=float), df["act_bytes"].to_numpy(dtype=float)
    r = settings.activation_compression_ratio
    worst = 0.0
    for s, st in enumerate(plan.stages):
        m = st.replicas
        c, w = comp[st.first : st.last + 1].sum(), par[st.first : st.last + 1].sum()
        worst = max(worst, (c + (4 * (m - 1) * w) / (B * m)) / m)
        if r is not None and s + 1 < len(plan.stages):
            a = act[st.last]
            worst = max(worst, (2.0 * a) / (B * plan.stages[s + 1].replicas) / r)
            if s >= 1:
                worst = max(worst, (2.0 * a) / (B * m) / r)
    return worst * 1e3


def profile_for(profile: Profile, plan: Plan) -> Profile:
    """The profile whose layer order ``plan``'s stage ranges refer to (``meta["layer_order"]``)."""
    order = plan.meta.get("layer_order")
    return in_order(profile, order) if order else profile

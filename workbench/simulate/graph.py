"""The op graph of a schedule: flat per-op arrays, dependency edges and the cost of each edge.

Ops are numbered worker by worker in program order (``wbeg[w] .. wend[w] - 1``). An edge
``producer -> consumer`` says the consumer may not start before the producer ended; its type says
what travels: 0 nothing (same worker, or an all-reduce to its STEP), 1 an activation or gradient
between workers (a message), 2 a weight version that exists on its owner (fetch ops), 3 a weight
gradient pushed to the owner's STEP (a message), 4 a message that costs nothing. Compute-op edges
are :meth:`Schedule.dependencies <workbench.schedules.core.Schedule.dependencies>` (F(s-1) -> F(s);
F(s) and B/BI(s+1) -> B/BI(s); BI(s) -> BW(s); segment neighbours), evaluated here on integer
arrays because the dict costs as much as the whole sweep on large schedules;
tests/test_simulate.py checks that both give the same edges.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..schedules.core import Schedule
from .costs import _AR, _B, _BI, _BW, _F, _STEP, KIND_CODES, _Costs, op_ms


@dataclass
class OpGraph:
    """Everything the sweep reads, as flat Python lists indexed by op id (see the module docstring)."""

    flat: list
    kc: list  # kind codes (costs.KIND_CODES)
    st: list
    mb: list
    ver: list
    stp: list
    wof: list  # worker of each op
    wbeg: list
    wend: list
    dur: list  # compute-stream duration of each op (ms), AR: 0
    cons_idx: list  # consumers of op g: cons_idx[cons_ptr[g]:cons_ptr[g + 1]]
    cons_ptr: list
    etype: list  # per edge (aligned with cons_idx)
    ems: list  # per edge: message ms
    ebytes: list  # per edge: message bytes
    pending: list  # producers not yet finished, per op
    ar_group: dict  # (stage, step) -> op ids of the all-reduce's replicas
    ar_size: dict
    is_fetch: list  # op reads weights held by another worker
    wws: list  # weights_worker per op
    xfer_count: list  # activation/gradient messages received per worker
    arrays: tuple  # (kc, st, mb, ver, stp, worker) as numpy arrays, for the result
    exposed: list = field(default_factory=list)  # per op: all-to-all ms its compute stream waits for (in dur)

    @property
    def N(self) -> int:
        return len(self.flat)


def _edge_messages(costs: _Costs, senders, receivers, item, item_bytes, fixed_ms, W: int):
    """(ms, bytes) arrays of messages ``senders[i] -> receivers[i]`` of ``item_bytes[item[i]]`` bytes,
    priced by :meth:`_Costs.message` once per distinct (sender, receiver, item)."""
    if len(senders) == 0:
        return np.zeros(0), np.zeros(0)
    n_items = len(item_bytes)
    keys, inv = np.unique((senders * W + receivers) * n_items + item, return_inverse=True)
    priced = np.array(
        [
            costs.message(item_bytes[k % n_items], int(k // n_items) // W, int(k // n_items) % W, fixed_ms)
            for k in keys.tolist()
        ],
        dtype=float,
    ).reshape(-1, 2)
    return priced[inv, 0], priced[inv, 1]


def build_graph(schedule: Schedule, costs: _Costs) -> OpGraph:
    """The :class:`OpGraph` of ``schedule`` with the edge costs of ``costs``."""
    S, W = schedule.num_stages, schedule.num_workers
    M = schedule.microbatches * schedule.num_segments  # dataflow keys: (microbatch, segment) units
    flat = [op for ops in schedule.ops for op in ops]
    N = len(flat)
    kc = [KIND_CODES[o.kind] for o in flat]
    st = [o.stage for o in flat]
    mb = [o.microbatch for o in flat]
    ver = [o.version for o in flat]
    stp = [o.step for o in flat]
    wof = [w for w, ops in enumerate(schedule.ops) for _ in ops]
    wbeg, wend, n = [], [], 0
    for ops in schedule.ops:
        wbeg.append(n)
        n += len(ops)
        wend.append(n)

    # ---- index compute ops; dataflow edges (vectorised) --------------------------------------
    kc_a = np.asarray(kc, dtype=np.int64)
    st_a = np.asarray(st, dtype=np.int64)
    mb_a = np.asarray(mb, dtype=np.int64)
    un_a = (
        mb_a
        if not schedule.segment_tokens
        else np.asarray(  # Schedule.unit of compute ops
            [schedule.unit(o) if k < 4 else o.microbatch for o, k in zip(flat, kc)], dtype=np.int64
        )
    )
    gids = np.arange(N, dtype=np.int64)
    is_comp = kc_a < 4
    if ((st_a < 0) | (st_a >= S)).any() or (is_comp & ((un_a < 0) | (un_a >= M))).any():
        g = int(np.flatnonzero((st_a < 0) | (st_a >= S) | (is_comp & ((un_a < 0) | (un_a >= M))))[0])
        raise ValueError(f"worker {wof[g]}: {flat[g]} is outside {S} stages x {M} microbatches")
    cg = gids[is_comp]
    keys = (kc_a[cg] * S + st_a[cg]) * M + un_a[cg]
    loc = np.full(4 * S * M, -1, dtype=np.int64)
    loc[keys] = cg
    counts = np.bincount(keys, minlength=4 * S * M)
    if len(keys) and counts.max() > 1:
        dup = int(cg[np.flatnonzero(counts[keys] > 1)[0]])
        raise ValueError(f"{flat[dup]} appears twice; validate() the schedule")
    ck, cs, cb = kc_a[cg], st_a[cg], un_a[cg]
    # first producer: F(s-1) for F (s > 0), BI(s) for BW, F(s) for B/BI
    need1 = (ck != _F) | (cs > 0)
    k1 = np.where(ck == _F, (_F * S + cs - 1) * M + cb, np.where(ck == _BW, (_BI * S + cs) * M + cb, cs * M + cb))
    # second producer of B/BI below the last stage: BI(s+1) if it exists, else B(s+1)
    need2 = ((ck == _B) | (ck == _BI)) & (cs < S - 1)
    nxt = np.minimum(cs + 1, S - 1)
    p_bi = loc[(_BI * S + nxt) * M + cb]
    p_b = loc[(_B * S + nxt) * M + cb]
    p2 = np.where(p_bi >= 0, p_bi, p_b)
    p1 = loc[np.where(need1, k1, 0)]
    for need, p, what in ((need1, p1, "its producer"), (need2, p2, "the gradient of the next stage")):
        bad = need & (p < 0)
        if bad.any():
            g = int(cg[np.flatnonzero(bad)[0]])
            raise ValueError(f"{flat[g]} on worker {wof[g]} needs {what}, which no worker runs")
    src = np.concatenate([p1[need1], p2[need2]])
    dst = np.concatenate([cg[need1], cg[need2]])
    k = schedule.num_segments
    if k > 1:  # causal attention inside a stage: F(u) <- F(u-1), B/BI(u) <- B/BI(u+1) within a sequence
        fseg = (ck == _F) & (cb % k > 0)
        bseg = ((ck == _B) | (ck == _BI)) & (cb % k < k - 1)
        pf = loc[np.where(fseg, (ck * S + cs) * M + cb - 1, 0)]
        pb = loc[np.where(bseg, (ck * S + cs) * M + np.minimum(cb + 1, M - 1), 0)]
        for need, p in ((fseg, pf), (bseg, pb)):
            if (need & (p < 0)).any():
                g = int(cg[np.flatnonzero(need & (p < 0))[0]])
                raise ValueError(f"{flat[g]} on worker {wof[g]} needs its neighbouring segment, which no worker runs")
        src = np.concatenate([src, pf[fseg], pb[bseg]])
        dst = np.concatenate([dst, cg[fseg], cg[bseg]])
    extra_src: list[int] = []
    extra_dst: list[int] = []

    # ---- STEP / AR ops, remote weight versions ----------------------------------------------
    step_at: dict[tuple[int, int, int], int] = {}
    ar_group: dict[tuple[int, int], list[int]] = {}
    for g in np.flatnonzero(~is_comp).tolist():
        if kc[g] == _STEP:
            step_at[(wof[g], st[g], stp[g])] = g
        else:
            ar_group.setdefault((st[g], stp[g]), []).append(g)
    wws = [o.weights_worker for o in flat]
    is_fetch = [False] * N
    check_versions = schedule.update != "async"
    for g, ww in enumerate(wws):
        if ww is not None and ww != wof[g] and kc[g] < 4:
            is_fetch[g] = True
            if check_versions and ver[g] > 0:  # the version must exist on the owner
                q = step_at.get((ww, st[g], ver[g] - 1), -1)
                if q >= 0:
                    extra_src.append(q)
                    extra_dst.append(g)
            if kc[g] == _B or kc[g] == _BW:  # the weight gradient goes to the owner's step op.version
                q = step_at.get((ww, st[g], ver[g]), -1)
                if q >= 0:
                    extra_src.append(g)
                    extra_dst.append(q)
    ar_size = {}
    for key, members in ar_group.items():
        expect = set(schedule.stage_workers[key[0]])
        got = [wof[g] for g in members]
        if set(got) != expect or len(got) != len(expect):
            raise ValueError(
                f"AR of stage {key[0]} step {key[1]} is on workers {sorted(got)}, expected the stage's "
                f"replicas {sorted(expect)}"
            )
        ar_size[key] = len(members)
        for g in members:
            q = step_at.get((wof[g], key[0], key[1]), -1)
            if q >= 0:
                extra_src.append(g)
                extra_dst.append(q)
    if extra_src:
        src = np.concatenate([src, np.asarray(extra_src, dtype=np.int64)])
        dst = np.concatenate([dst, np.asarray(extra_dst, dtype=np.int64)])
    pending = np.bincount(dst, minlength=N).tolist()
    order = np.argsort(src, kind="stable")
    src, dst = src[order], dst[order]
    cons_idx = dst.tolist()
    cons_ptr = np.searchsorted(src, np.arange(N + 1)).tolist()
    # edge types: 0 same worker; 1 activation/gradient transfer; 2 weight version ready on its
    # owner; 3 weight gradient pushed to the owner's STEP; 4 cross-worker but free
    w_a = np.asarray(wof, dtype=np.int64)
    ws_, wd_ = w_a[src], w_a[dst]
    ks, kd = kc_a[src], kc_a[dst]
    etype = np.where(ws_ == wd_, 0, np.where(ks == _STEP, 2, np.where(kd == _STEP, 3, 1)))
    etype[ks == _AR] = 0
    ems = np.zeros(len(src))
    ebytes = np.zeros(len(src))
    xfer = etype == 1
    ems[xfer], ebytes[xfer] = _edge_messages(
        costs, ws_[xfer], wd_[xfer], np.minimum(st_a[src], st_a[dst])[xfer], costs.cut_bytes, costs.transfer_ms, W
    )
    push = etype == 3  # a weight gradient pushed to the owner's STEP: the stage's parameter bytes
    ems[push], ebytes[push] = _edge_messages(
        costs, ws_[push], wd_[push], st_a[src][push], costs.param_bytes, costs.fetch_ms, W
    )
    etype[(etype == 1) & (ems == 0) & (ebytes == 0)] = 4
    xfer_count = np.bincount(wd_[xfer], minlength=W).tolist()
    etype_list, ems_list, ebytes_list = etype.tolist(), ems.tolist(), ebytes.tolist()

    # ---- durations ----------------------------------------------------------------------
    comp = costs.compute
    over = costs.op_overhead_ms
    if schedule.segment_tokens or schedule.recompute:
        dur = [op_ms(schedule, op, comp) + over if k < 5 else 0.0 for op, k in zip(flat, kc)]
    else:
        dur = [comp[k][s] + over if k < 5 else 0.0 for k, s in zip(kc, st)]
    if costs.step_copy is not None:  # STEPs that keep the replaced version write new tensors
        for w in range(W):
            for i in schedule.stashing_steps(w):
                g = wbeg[w] + i
                dur[g] = costs.step_copy[st[g]] + over
    if costs.accumulate is not None:  # the first backward of an update writes the empty buffer: no addition
        for w in range(W):
            for i in schedule.fresh_backwards(w):
                g = wbeg[w] + i
                dur[g] = max(over, dur[g] - costs.accumulate[st[g]])
    exposed = [0.0] * N
    if costs.alltoall is not None:
        exposed = exposed_alltoall(schedule, costs, kc, st, wbeg, dur)
        dur = [d + x for d, x in zip(dur, exposed)]
    arrays = (kc_a, st_a, mb_a, np.fromiter(ver, np.int64, N), np.fromiter(stp, np.int64, N), w_a)
    return OpGraph(
        flat,
        kc,
        st,
        mb,
        ver,
        stp,
        wof,
        wbeg,
        wend,
        dur,
        cons_idx,
        cons_ptr,
        etype_list,
        ems_list,
        ebytes_list,
        pending,
        ar_group,
        ar_size,
        is_fetch,
        wws,
        xfer_count,
        arrays,
        exposed,
    )


def exposed_alltoall(schedule: Schedule, costs: _Costs, kc: list, st: list, wbeg: list, dur: list) -> list[float]:
    """Per op, the in-op all-to-all time (expert parallelism's dispatch and combine, ``a[s]`` for an
    F, B or BI of stage s) that its compute stream waits for. An op alone waits for all of it.
    In an overlapped pair (:meth:`Schedule.overlapped_pairs`; DeepSeek-V3's DualPipe) the
    communication of each op runs while the other op computes, so with ``c`` the compute times
    ``exposed(F) = max(0, a_F - c_B)`` and ``exposed(B) = max(0, a_B - c_F)``; the pair takes
    ``c_F + c_B + exposed(F) + exposed(B)`` (``c_F + c_B`` when each op's all-to-all fits in the
    other's compute) where back to back it takes ``c_F + a_F + c_B + a_B``.
    ``costs.overlap_pairs=False`` charges the same order back to back."""
    a = costs.alltoall
    if a is None:
        return [0.0] * len(kc)
    out = [a[s] if k in (_F, _B, _BI) else 0.0 for k, s in zip(kc, st)]
    if costs.overlap_pairs:
        for w, i, j in schedule.overlapped_pairs():
            f, b = wbeg[w] + i, wbeg[w] + j
            out[f], out[b] = max(0.0, out[f] - dur[b]), max(0.0, out[b] - dur[f])
    return out

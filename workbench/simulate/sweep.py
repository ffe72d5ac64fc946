"""The event sweep: run every worker's op list in order, each op at max(worker free, inputs ready).

Workers are swept in topological order (one pass over the :class:`~workbench.simulate.graph.OpGraph`):
a worker runs ops until one waits for a producer that has not ended; the producer's end puts the
consumer's worker back on the stack. Ops only wait on ops that end earlier, so the result equals a
time-ordered event simulation. Channels (package docstring): one FIFO per directed link for
messages, one per link for weight fetches, one collective channel per worker for all-reduces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..costmodel import link_level
from .costs import _AR, _F, _Costs
from .graph import OpGraph


@dataclass
class Sweep:
    """Times of every op and what the channels carried."""

    start: list
    end: list
    stall: list  # per worker: time waiting although the producers had ended (communication)
    comm_rows: list  # (worker, stage, mb, kind, start, end, version, src, dst, update, bytes)
    level_bytes: dict  # topology level -> bytes sent
    fetch_count: list  # weight fetches per worker


def _left_over(items: list, idle_from: float, t: float) -> float:
    """CPU work items ``(ready at, ms)`` of a worker's communication threads, run in the idle time
    ``[idle_from, t]`` before its next op in order of readiness; returns the ms left over, which the
    op starting at ``t`` shares its core with (its duration grows by it)."""
    left, cur = 0.0, idle_from
    for ready, ms in sorted(items):
        s = cur if cur > ready else ready
        if s < t:
            done = ms if ms < t - s else t - s
            cur = s + done
            left += ms - done
        else:
            left += ms
    return left


def sweep(graph: OpGraph, costs: _Costs, overlap_comm: bool, name: str = "schedule") -> Sweep:
    """Run the sweep; a :class:`ValueError` names the stuck ops if the schedule deadlocks."""
    gr = graph  # unpacked into locals: the loop below is the simulator's hot path
    kc, st, mb, ver, stp, wof = gr.kc, gr.st, gr.mb, gr.ver, gr.stp, gr.wof
    wbeg, wend, dur, cons_idx, cons_ptr = gr.wbeg, gr.wend, gr.dur, gr.cons_idx, gr.cons_ptr
    etype, ems, ebytes, pending = gr.etype, gr.ems, gr.ebytes, list(gr.pending)
    ar_group, ar_size, is_fetch, wws = gr.ar_group, gr.ar_size, gr.is_fetch, gr.wws
    N, W = gr.N, len(wbeg)
    INF = math.inf
    start = [INF] * N
    end = [INF] * N
    arrive = [0.0] * N  # inputs ready, including transfers
    nodep = [0.0] * N  # inputs ready if communication were free
    ver_ready = [0.0] * N  # the weight version read exists on its owner (fetch ops)
    free = [0.0] * W
    prev_start = [0.0] * W
    stall = [0.0] * W
    ptr = list(wbeg)
    link_free: dict[int, float] = {}
    fetch_free: dict[int, float] = {}
    coll_free = [0.0] * W
    ar_reached: dict[tuple[int, int], int] = {}  # (stage, step) -> replicas arrived
    ar_reach_t: dict[tuple[int, int], float] = {}  # (stage, step) -> latest arrival time
    ar_ready_t: dict[tuple[int, int], float] = {}  # (stage, step) -> earliest start of the all-reduce
    arrived = [False] * N
    comm_rows: list[tuple] = []  # (worker, stage, mb, kind, start, end, version, src, dst, update, bytes)
    level_bytes: dict[int, float] = {}
    fetch_count = [0] * W
    topo = costs.topology
    ar_ms = costs.allreduce_ms
    # CPU time of each message at both ends (CostModel.message_cpu_ms): the sender's share is ready
    # when its op ends, the receiver's when the message arrives; each runs in its worker's idle time
    # or else stretches the worker's next compute op (processor sharing with the compute)
    msg_cpu = costs.model.message_cpu_ms if costs.model is not None else 0.0
    send_work: list[list] = [[] for _ in range(W)]
    recv_work: dict[int, list] = {}
    level_cache: dict[int, int] = {}

    def level(a: int, b: int) -> int:
        key = a * W + b
        lv = level_cache.get(key)
        if lv is None:
            lv = level_cache[key] = link_level(topo, a, b)
        return lv

    def finish_ar(key, stack):
        members = ar_group[key]
        s = key[0]
        # overlap: the all-reduce may start with the backward before it (DDP buckets) but cannot
        # end before every replica finished that backward (CostModel.exposed_allreduce_ms)
        t0 = max(ar_ready_t[key], max(coll_free[wof[g]] for g in members))
        t1 = max(t0 + ar_ms[s], ar_reach_t[key])
        sync = ar_reach_t[key]
        ws = [wof[g] for g in members]
        r = len(ws)
        pbytes = 2 * (r - 1) / r * costs.param_bytes[s] if r > 1 else 0.0
        for i, g in enumerate(members):
            w = wof[g]
            coll_free[w] = t1
            start[g], end[g] = t0, t1
            if t1 > t0 or pbytes:
                comm_rows.append((w, s, -1, "allreduce", t0, t1, -1, w, ws[(i + 1) % r], key[1], pbytes))
            if pbytes and topo is not None:
                lv = level(w, ws[(i + 1) % r])
                level_bytes[lv] = level_bytes.get(lv, 0.0) + pbytes
            for c in cons_idx[cons_ptr[g] : cons_ptr[g + 1]]:
                if t1 > arrive[c]:
                    arrive[c] = t1
                if sync > nodep[c]:
                    nodep[c] = sync
                pending[c] -= 1
                if pending[c] == 0 and ptr[wof[c]] == c:
                    stack.append(wof[c])
            if not overlap_comm and ptr[w] == g:
                stack.append(w)

    stack = list(range(W - 1, -1, -1))
    while stack:
        w = stack.pop()
        i, stop = ptr[w], wend[w]
        fw = free[w]
        ps = prev_start[w]
        stl = 0.0
        while i < stop:
            k = kc[i]
            if k == _AR:
                key = (st[i], stp[i])
                if not arrived[i]:  # first arrival of this worker at the all-reduce
                    arrived[i] = True
                    ar_reach_t[key] = max(ar_reach_t.get(key, 0.0), fw)
                    ar_ready_t[key] = max(ar_ready_t.get(key, 0.0), ps if overlap_comm else fw)
                    ar_reached[key] = ar_reached.get(key, 0) + 1
                    if ar_reached[key] == ar_size[key]:
                        ptr[w] = i
                        free[w] = fw
                        finish_ar(key, stack)
                if overlap_comm:
                    i += 1
                    continue
                if end[i] == INF:
                    break
                if end[i] > fw:
                    stl += end[i] - fw
                    fw = end[i]
                i += 1
                continue
            if pending[i]:
                break
            ready = arrive[i]
            if is_fetch[i]:
                src_w = wws[i]
                ms, nbytes = costs.fetch(st[i], src_w, w)
                lk = src_w * W + w
                t0 = max(ver_ready[i], fetch_free.get(lk, 0.0), ps)
                t1 = t0 + ms
                fetch_free[lk] = t1
                fetch_count[w] += 1
                if t1 > t0 or nbytes:
                    comm_rows.append((w, st[i], mb[i], "fetch_weights", t0, t1, ver[i], src_w, w, -1, nbytes))
                    if nbytes and topo is not None:
                        lv = level(src_w, w)
                        level_bytes[lv] = level_bytes.get(lv, 0.0) + nbytes
                if t1 > ready:
                    ready = t1
            t = fw if fw > ready else ready
            nd = nodep[i]
            base = fw if fw > nd else nd
            if t > base:
                stl += t - base
            e = t + dur[i]
            if msg_cpu:
                items = send_work[w] + recv_work.pop(i, [])
                if items:
                    send_work[w] = []
                    e += _left_over(items, fw, t)
            sent = 0
            start[i] = t
            end[i] = e
            ps = t
            fw = e
            for j in range(cons_ptr[i], cons_ptr[i + 1]):
                c = cons_idx[j]
                typ = etype[j]
                if typ == 0 or typ == 4:
                    a = e
                elif typ == 2:  # a weight version now exists for a remote reader to fetch
                    a = e
                    ver_ready[c] = e
                else:  # 1: activation / gradient, 3: weight gradient to the owner
                    wc = wof[c]
                    ms = ems[j]
                    nbytes = ebytes[j]
                    lk = w * W + wc
                    lf = link_free.get(lk, 0.0)
                    t0 = e if e > lf else lf
                    a = t0 + ms
                    link_free[lk] = a
                    if msg_cpu:
                        sent += 1
                        recv_work.setdefault(c, []).append((a, msg_cpu))
                    if ms > 0 or nbytes:
                        name = "send_wgrad" if typ == 3 else "send_act" if k == _F else "send_grad"
                        comm_rows.append((w, st[i], mb[i], name, t0, a, ver[i], w, wc, -1, nbytes))
                        if nbytes and topo is not None:
                            lv = level(w, wc)
                            level_bytes[lv] = level_bytes.get(lv, 0.0) + nbytes
                if a > arrive[c]:
                    arrive[c] = a
                if e > nodep[c]:
                    nodep[c] = e
                pc = pending[c] - 1
                pending[c] = pc
                if pc == 0 and typ and ptr[wof[c]] == c:
                    stack.append(wof[c])
            if sent:
                send_work[w].append((e, msg_cpu * sent))
            i += 1
        ptr[w] = i
        free[w] = fw
        prev_start[w] = ps
        stall[w] += stl

    _check_progress(graph, ptr, name)
    return Sweep(start, end, stall, comm_rows, level_bytes, fetch_count)


def _check_progress(graph: OpGraph, ptr: list, name: str) -> None:
    """Raise a ValueError naming the first stuck op of each worker when some op never ran."""
    flat, kc, st, stp, wbeg, wend = graph.flat, graph.kc, graph.st, graph.stp, graph.wbeg, graph.wend
    N, W = graph.N, len(wbeg)
    stuck = [w for w in range(W) if ptr[w] < wend[w]]
    if stuck:
        desc = []
        for w in stuck[:6]:
            g = ptr[w]
            op = flat[g]
            if kc[g] == _AR:
                key = (st[g], stp[g])
                waits = f"waits for the other replicas of stage {key[0]} to reach the all-reduce"
            else:
                waits = "waits for inputs that never arrive"
            desc.append(f"worker {w}: {op} ({waits})")
        raise ValueError(
            f"schedule {name!r} deadlocks: no worker can make progress after "
            f"{sum(ptr[w] - wbeg[w] for w in range(W))} of {N} ops; stuck: " + "; ".join(desc)
        )

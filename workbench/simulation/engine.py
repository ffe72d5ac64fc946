"""The event sweep: run every worker's op list in order, each op at max(worker free, inputs ready).

Workers are swept in topological order (one pass over the :class:`~workbench.simulation.edges.OpGraph`):
a worker runs ops until one waits for a producer that has not ended; the producer's end puts the
consumer's worker back on the stack. Ops only wait on ops that end earlier, so the result equals a
time-ordered event simulation. Channels (package docstring): one FIFO per directed link for
messages, one per link for weight fetches, one collective channel per worker for all-reduces.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

from workbench.cost.model import link_level
from workbench.schedules.dataflow import KindCode
from workbench.simulation.costs import CommKind, SimCosts
from workbench.simulation.edges import EdgeKind, OpGraph


class CommRow(NamedTuple):
    """One communication-lane row of the timeline (:mod:`workbench.io.timeline` columns): what
    ``kind`` of transfer (a :class:`~workbench.simulation.costs.CommKind` value) ran on a channel of
    ``worker`` from ``start`` to ``end``, sending ``bytes`` from worker ``src`` to ``dst``, for
    ``stage``, ``microbatch`` (-1: none) and weight ``version`` (-1: none); ``update``: the step of
    an all-reduce (-1 otherwise)."""

    worker: int
    stage: int
    microbatch: int
    kind: str
    start: float
    end: float
    version: int
    src: int
    dst: int
    update: int
    bytes: float


@dataclass
class Sweep:
    """Times of every op and what the channels carried."""

    start: list[float]
    end: list[float]
    stall: list[float]  # per worker: time waiting although the producers had ended (communication)
    comm_rows: list[CommRow]
    level_bytes: dict[int, float]  # topology level -> bytes sent
    fetch_count: list[int]  # weight fetches per worker


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


def sweep(graph: OpGraph, costs: SimCosts, overlap_comm: bool, name: str = "schedule") -> Sweep:
    """Run the sweep; a :class:`ValueError` names the stuck ops if the schedule deadlocks."""
    run = _Sweeper(graph, costs, overlap_comm)
    run.run()
    _check_progress(graph, run.ptr, name)
    return Sweep(
        start=run.start,
        end=run.end,
        stall=run.stall,
        comm_rows=run.channels.rows,
        level_bytes=run.channels.level_bytes,
        fetch_count=run.fetch_count,
    )


_comm_row = partial(tuple.__new__, CommRow)  # a CommRow from one tuple of its fields (no keyword parsing: hot path)
# the kind column's strings (plain str: the timeline holds the values of CommKind)
_SEND_ACT, _SEND_GRAD, _SEND_WGRAD = CommKind.SEND_ACT.value, CommKind.SEND_GRAD.value, CommKind.SEND_WGRAD.value
_ALLREDUCE, _FETCH_WEIGHTS = CommKind.ALLREDUCE.value, CommKind.FETCH_WEIGHTS.value


class _Channels:
    """What the channels carried: the comm-lane rows and the bytes sent over each topology level."""

    def __init__(self, topology, W: int):
        self.rows: list[CommRow] = []
        self.level_bytes: dict[int, float] = {}
        self._topology = topology
        self._W = W
        self._levels: dict[int, int] = {}  # src * W + dst -> level of the link

    def record(self, row: CommRow) -> None:
        """One comm-lane row; its bytes count for the level of its link ``src -> dst``."""
        self.rows.append(row)
        nbytes = row.bytes
        if nbytes and self._topology is not None:
            src, dst = row.src, row.dst
            key = src * self._W + dst
            lv = self._levels.get(key)
            if lv is None:
                lv = self._levels[key] = link_level(self._topology, src, dst)
            self.level_bytes[lv] = self.level_bytes.get(lv, 0.0) + nbytes


class _Sweeper:
    """The state of one sweep: per op its start, end and input arrival (``arrive``; ``nodep``: the
    arrival if communication were free, for the stall), per worker its next op (``ptr``), clock
    (``free``) and last start, per channel when it is free, per all-reduce its replicas' arrivals."""

    def __init__(self, graph: OpGraph, costs: SimCosts, overlap_comm: bool):
        self.graph, self.costs, self.overlap_comm = graph, costs, overlap_comm
        # an overlapped all-reduce may start with the backward before it, or (DDP buckets) after it
        model = costs.model
        self.ready_at_start = overlap_comm and (model is None or model.allreduce_ready == "backward-start")
        N, W = graph.N, len(graph.wbeg)
        self.W = W
        self.pending = list(graph.pending)
        self.start = [math.inf] * N
        self.end = [math.inf] * N
        self.arrive = [0.0] * N  # inputs ready, including transfers
        self.nodep = [0.0] * N  # inputs ready if communication were free
        self.ver_ready = [0.0] * N  # the weight version read exists on its owner (fetch ops)
        self.arrived = [False] * N  # the worker reached this all-reduce op
        self.free = [0.0] * W
        self.prev_start = [0.0] * W
        self.stall = [0.0] * W
        self.ptr = list(graph.wbeg)
        self.link_free: dict[int, float] = {}
        self.fetch_free: dict[int, float] = {}
        self.coll_free = [0.0] * W
        self.ar_reached: dict[tuple[int, int], int] = {}  # (stage, step) -> replicas arrived
        self.ar_reach_t: dict[tuple[int, int], float] = {}  # (stage, step) -> latest arrival time
        self.ar_ready_t: dict[tuple[int, int], float] = {}  # (stage, step) -> earliest start of the all-reduce
        self.channels = _Channels(costs.topology, W)
        self.fetch_count = [0] * W
        # CPU time of each message at both ends (CostModel.message_cpu_ms): the sender's share is ready
        # when its op ends, the receiver's when the message arrives; each runs in its worker's idle time
        # or else stretches the worker's next compute op (processor sharing with the compute)
        self.msg_cpu = costs.model.message_cpu_ms if costs.model is not None else 0.0
        self.send_work: list[list] = [[] for _ in range(W)]
        self.recv_work: dict[int, list] = {}
        self.stack = list(range(W - 1, -1, -1))  # workers that may make progress

    def run(self) -> None:
        """Sweep until no worker can progress: a worker runs its ops until one waits for a producer."""
        gr = self.graph  # unpacked into locals: the loop below is the simulator's hot path
        kc, st, mb, ver, wof, wend, dur = gr.kc, gr.st, gr.mb, gr.ver, gr.wof, gr.wend, gr.dur
        cons_idx, cons_ptr, etype, ems, ebytes = gr.cons_idx, gr.cons_ptr, gr.etype, gr.ems, gr.ebytes
        pending, start, end, arrive, nodep = self.pending, self.start, self.end, self.arrive, self.nodep
        free, prev_start, stall, ptr, stack = self.free, self.prev_start, self.stall, self.ptr, self.stack
        link_free, is_fetch, arrived, msg_cpu = self.link_free, gr.is_fetch, self.arrived, self.msg_cpu
        send_work, recv_work, record = self.send_work, self.recv_work, self.channels.record
        overlap_comm, W, ver_ready = self.overlap_comm, self.W, self.ver_ready
        AR, F = int(KindCode.AR), int(KindCode.F)  # exact ints: the interpreter's fast int compare
        LOCAL, ACT, VERSION, WGRAD = map(int, (EdgeKind.LOCAL, EdgeKind.ACT, EdgeKind.VERSION, EdgeKind.WGRAD))
        while stack:
            w = stack.pop()
            i, stop, fw, ps, stl = ptr[w], wend[w], free[w], prev_start[w], 0.0
            while i < stop:
                k = kc[i]
                if k == AR:
                    if not arrived[i]:
                        self._reach_allreduce(w, i, fw, ps)
                    if not overlap_comm:  # the worker waits for the all-reduce to end
                        if end[i] == math.inf:
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
                    fetched = self._fetch(i, w, ps)
                    if fetched > ready:
                        ready = fetched
                t = fw if fw > ready else ready
                nd = nodep[i]
                base = fw if fw > nd else nd
                if t > base:  # waited for a transfer, an all-reduce or a fetch
                    stl += t - base
                e = t + dur[i]
                if msg_cpu:  # the messages' CPU work that did not fit in the idle time before t
                    items = send_work[w] + recv_work.pop(i, [])
                    if items:
                        send_work[w] = []
                        e += _left_over(items, fw, t)
                start[i], end[i], sent = t, e, 0
                ps, fw = t, e
                for j in range(cons_ptr[i], cons_ptr[i + 1]):
                    c = cons_idx[j]
                    typ = etype[j]
                    a = e
                    if typ == ACT or typ == WGRAD:  # activation / gradient, weight gradient to the owner
                        wc = wof[c]
                        ms = ems[j]
                        lk = w * W + wc
                        lf = link_free.get(lk, 0.0)
                        t0 = e if e > lf else lf
                        a = t0 + ms
                        link_free[lk] = a
                        if msg_cpu:
                            sent += 1
                            recv_work.setdefault(c, []).append((a, msg_cpu))
                        if ms > 0 or ebytes[j]:
                            name = _SEND_WGRAD if typ == WGRAD else _SEND_ACT if k == F else _SEND_GRAD
                            record(_comm_row((w, st[i], mb[i], name, t0, a, ver[i], w, wc, -1, ebytes[j])))
                    elif typ == VERSION:  # a weight version now exists for a remote reader to fetch
                        ver_ready[c] = e
                    if a > arrive[c]:
                        arrive[c] = a
                    if e > nodep[c]:
                        nodep[c] = e
                    pending[c] = pc = pending[c] - 1
                    if pc == 0 and typ != LOCAL and ptr[wof[c]] == c:
                        stack.append(wof[c])
                if sent:
                    send_work[w].append((e, msg_cpu * sent))
                i += 1
            ptr[w], free[w], prev_start[w] = i, fw, ps
            stall[w] += stl

    def _reach_allreduce(self, w: int, g: int, fw: float, ps: float) -> None:
        """Worker ``w`` reaches all-reduce op ``g`` at ``fw`` (its backward before started at ``ps``);
        the last replica of the stage to arrive times the all-reduce (:meth:`_finish_allreduce`)."""
        key = (self.graph.st[g], self.graph.stp[g])
        self.arrived[g] = True
        self.ar_reach_t[key] = max(self.ar_reach_t.get(key, 0.0), fw)
        self.ar_ready_t[key] = max(self.ar_ready_t.get(key, 0.0), ps if self.ready_at_start else fw)
        n = self.ar_reached[key] = self.ar_reached.get(key, 0) + 1
        if n == self.graph.ar_size[key]:
            self.ptr[w], self.free[w] = g, fw
            self._finish_allreduce(key)

    def _finish_allreduce(self, key: tuple[int, int]) -> None:
        """Time the all-reduce ``key = (stage, step)`` over its replicas and release its consumers.

        With overlap it may start with the backward before it (DDP buckets) but cannot end before
        every replica finished that backward (:meth:`CostModel.exposed_allreduce_ms`)."""
        gr, coll_free, wof = self.graph, self.coll_free, self.graph.wof
        members = gr.ar_group[key]
        s, step = key
        t0 = max(self.ar_ready_t[key], max(coll_free[wof[g]] for g in members))
        t1 = max(t0 + self.costs.allreduce_ms[s], self.ar_reach_t[key])
        sync = self.ar_reach_t[key]
        ws = [wof[g] for g in members]
        r = len(ws)
        pbytes = 2 * (r - 1) / r * self.costs.param_bytes[s] if r > 1 else 0.0
        arrive, nodep, pending, ptr, stack = self.arrive, self.nodep, self.pending, self.ptr, self.stack
        for i, g in enumerate(members):
            w = wof[g]
            coll_free[w] = t1
            self.start[g], self.end[g] = t0, t1
            if t1 > t0 or pbytes:
                self.channels.record(CommRow(w, s, -1, _ALLREDUCE, t0, t1, -1, w, ws[(i + 1) % r], step, pbytes))
            for c in gr.cons_idx[gr.cons_ptr[g] : gr.cons_ptr[g + 1]]:
                if t1 > arrive[c]:
                    arrive[c] = t1
                if sync > nodep[c]:
                    nodep[c] = sync
                pending[c] -= 1
                if pending[c] == 0 and ptr[wof[c]] == c:
                    stack.append(wof[c])
            if not self.overlap_comm and ptr[w] == g:
                stack.append(w)

    def _fetch(self, g: int, w: int, ps: float) -> float:
        """Fetch the weights op ``g`` on worker ``w`` reads from their owner: on the link's fetch
        channel, once the version exists and the op before it on ``w`` started (one op of
        prefetch, ``ps``); returns when the weights have arrived."""
        gr = self.graph
        src_w, s = gr.wws[g], gr.st[g]
        ms, nbytes = self.costs.fetch(s, src_w, w)
        lk = src_w * self.W + w
        t0 = max(self.ver_ready[g], self.fetch_free.get(lk, 0.0), ps)
        t1 = t0 + ms
        self.fetch_free[lk] = t1
        self.fetch_count[w] += 1
        if t1 > t0 or nbytes:
            self.channels.record(CommRow(w, s, gr.mb[g], _FETCH_WEIGHTS, t0, t1, gr.ver[g], src_w, w, -1, nbytes))
        return t1


def _check_progress(graph: OpGraph, ptr: list, name: str) -> None:
    """Raise a ValueError naming the first stuck op of each worker when some op never ran."""
    flat, kc, st, wbeg, wend = graph.flat, graph.kc, graph.st, graph.wbeg, graph.wend
    N, W = graph.N, len(wbeg)
    stuck = [w for w in range(W) if ptr[w] < wend[w]]
    if stuck:
        desc = []
        for w in stuck[:6]:
            g = ptr[w]
            op = flat[g]
            if kc[g] == KindCode.AR:
                waits = f"waits for the other replicas of stage {st[g]} to reach the all-reduce"
            else:
                waits = "waits for inputs that never arrive"
            desc.append(f"worker {w}: {op} ({waits})")
        raise ValueError(
            f"schedule {name!r} deadlocks: no worker can make progress after "
            f"{sum(ptr[w] - wbeg[w] for w in range(W))} of {N} ops; stuck: " + "; ".join(desc)
        )

"""The op graph of a schedule: flat per-op arrays, dependency edges and the cost of each edge.

Ops are numbered worker by worker in program order (``wbeg[w] .. wend[w] - 1``). An edge
``producer -> consumer`` says the consumer may not start before the producer ended; its
:class:`EdgeKind` says what travels: nothing (``LOCAL``: same worker, or an all-reduce to its
STEP), an activation or gradient between workers (``ACT``, a message), a weight version that
exists on its owner (``VERSION``, fetch ops), a weight gradient pushed to the owner's STEP
(``WGRAD``, a message), or a message that costs nothing (``FREE``). The edges are those of
:attr:`Schedule.dataflow <workbench.schedules.core.Schedule.dataflow>` (derived in
:mod:`workbench.schedules.dataflow` on integer arrays, the ones the validator's deadlock check
runs); tests/test_simulate.py checks their compute-op edges against ``Schedule.dependencies()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import numpy as np

from workbench.schedules.core import Schedule, check_dataflow
from workbench.schedules.dataflow import KindCode, OpArrays
from workbench.simulation.costs import SimCosts, op_ms


class EdgeKind(IntEnum):
    """What an edge of the :class:`OpGraph` carries (module docstring). An ``int`` enum: the graph's
    per-edge list holds the plain integers, which compare equal to the members."""

    LOCAL = 0  # nothing: the same worker, or an all-reduce to its STEP
    ACT = 1  # an activation or a gradient to another worker (a message on the link)
    VERSION = 2  # a weight version that now exists on its owner, for a remote reader to fetch
    WGRAD = 3  # a weight gradient pushed to the owner's STEP (a message on the link)
    FREE = 4  # an activation or gradient message that costs nothing (no time, no bytes)


@dataclass
class OpGraph:
    """Everything the sweep reads, as flat Python lists indexed by op id (see the module docstring)."""

    flat: list
    kc: list  # kind codes (dataflow.KindCode values)
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
    etype: list  # per edge (aligned with cons_idx): its EdgeKind value
    ems: list  # per edge: message ms
    ebytes: list  # per edge: message bytes
    pending: list  # producers not yet finished, per op
    ar_group: dict  # (stage, step) -> op ids of the all-reduce's replicas
    ar_size: dict
    is_fetch: list  # op reads weights held by another worker
    wws: list  # weights_worker per op
    xfer_count: list  # activation/gradient messages received per worker
    arrays: OpArrays  # the ops as numpy arrays (kind, stage, microbatch, version, step, worker), for the result
    exposed: list = field(default_factory=list)  # per op: all-to-all ms its compute stream waits for (in dur)

    @property
    def N(self) -> int:
        return len(self.flat)


def _edge_messages(costs: SimCosts, senders, receivers, item, item_bytes, *, fixed_ms, W: int):
    """(ms, bytes) arrays of messages ``senders[i] -> receivers[i]`` of ``item_bytes[item[i]]`` bytes,
    priced by :meth:`SimCosts.message` once per distinct (sender, receiver, item)."""
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


def build_graph(schedule: Schedule, costs: SimCosts) -> OpGraph:
    """The :class:`OpGraph` of ``schedule`` with the edge costs of ``costs``: the ops and edges of
    :attr:`Schedule.dataflow <workbench.schedules.core.Schedule.dataflow>` (checked by
    :func:`~workbench.schedules.core.check_dataflow`), each edge priced (:func:`_edge_costs`), each
    op's duration from ``costs`` (:func:`_durations`)."""
    df = schedule.dataflow
    check_dataflow(schedule, df)
    a, W = df.ops, schedule.num_workers
    flat = list(a.flat)
    kc, st = a.kind.tolist(), a.stage.tolist()
    wbeg, wend = a.begin[:-1].tolist(), a.begin[1:].tolist()
    order = np.argsort(df.src, kind="stable")
    src, dst = df.src[order], df.dst[order]
    etype, ems, ebytes = _edge_costs(a, src, dst, costs, W)
    dur = _durations(schedule, costs, flat, kc, st, wbeg=wbeg)
    exposed = [0.0] * len(flat)
    if costs.alltoall is not None:
        exposed = exposed_alltoall(schedule, costs, kc, st, wbeg, dur=dur)
        dur = [d + x for d, x in zip(dur, exposed)]
    ww = a.weights_worker
    return OpGraph(
        flat=flat,
        kc=kc,
        st=st,
        mb=a.microbatch.tolist(),
        ver=a.version.tolist(),
        stp=a.step.tolist(),
        wof=a.worker.tolist(),
        wbeg=wbeg,
        wend=wend,
        dur=dur,
        cons_idx=dst.tolist(),
        cons_ptr=np.searchsorted(src, np.arange(len(flat) + 1)).tolist(),
        etype=etype.tolist(),
        ems=ems.tolist(),
        ebytes=ebytes.tolist(),
        pending=np.bincount(dst, minlength=len(flat)).tolist(),
        ar_group=df.ar_groups,
        ar_size={key: len(members) for key, members in df.ar_groups.items()},
        is_fetch=(a.compute & (ww >= 0) & (ww != a.worker)).tolist(),
        wws=[o.weights_worker for o in flat],
        xfer_count=np.bincount(a.worker[dst][etype == EdgeKind.ACT], minlength=W).tolist(),
        arrays=a,
        exposed=exposed,
    )


def _edge_costs(a: OpArrays, src: np.ndarray, dst: np.ndarray, costs: SimCosts, W: int):
    """(:class:`EdgeKind`, ms, bytes) per edge ``src -> dst`` (module docstring): LOCAL on one
    worker (or AR -> STEP); ACT an activation/gradient transfer across the cut ``min(stage)``;
    VERSION a weight version ready on its owner; WGRAD a weight gradient pushed to the owner's STEP
    (the stage's parameter bytes); FREE an ACT transfer that costs nothing."""
    ws_, wd_ = a.worker[src], a.worker[dst]
    ks, kd = a.kind[src], a.kind[dst]
    etype = np.where(
        ws_ == wd_,
        EdgeKind.LOCAL,
        np.where(ks == KindCode.STEP, EdgeKind.VERSION, np.where(kd == KindCode.STEP, EdgeKind.WGRAD, EdgeKind.ACT)),
    )
    etype[ks == KindCode.AR] = EdgeKind.LOCAL
    ems = np.zeros(len(src))
    ebytes = np.zeros(len(src))
    xfer = etype == EdgeKind.ACT
    cut = np.minimum(a.stage[src], a.stage[dst])[xfer]
    ems[xfer], ebytes[xfer] = _edge_messages(
        costs, ws_[xfer], wd_[xfer], cut, costs.cut_bytes, fixed_ms=costs.transfer_ms, W=W
    )
    push = etype == EdgeKind.WGRAD
    ems[push], ebytes[push] = _edge_messages(
        costs, ws_[push], wd_[push], a.stage[src][push], costs.param_bytes, fixed_ms=costs.fetch_ms, W=W
    )
    etype[xfer & (ems == 0) & (ebytes == 0)] = EdgeKind.FREE
    return etype, ems, ebytes


def _durations(schedule: Schedule, costs: SimCosts, flat: list, kc: list, st: list, *, wbeg: list) -> list[float]:
    """Compute-stream ms per op: the kind's stage cost plus the per-op overhead (:func:`op_ms` with
    segments or recompute), AR 0; a STEP that keeps the replaced version costs ``step_copy``; the
    first backward of an update into an empty buffer saves ``accumulate`` (down to the overhead)."""
    comp = costs.compute
    over = costs.op_overhead_ms
    AR = int(KindCode.AR)
    if schedule.segment_tokens or schedule.recompute:
        dur = [op_ms(schedule, op, comp) + over if k < AR else 0.0 for op, k in zip(flat, kc)]
    else:
        dur = [comp[k][s] + over if k < AR else 0.0 for k, s in zip(kc, st)]
    if costs.step_copy is not None:  # STEPs that keep the replaced version write new tensors
        for w in range(schedule.num_workers):
            for i in schedule.stashing_steps(w):
                g = wbeg[w] + i
                dur[g] = costs.step_copy[st[g]] + over
    if costs.accumulate is not None:  # the first backward of an update writes the empty buffer: no addition
        for w in range(schedule.num_workers):
            for i in schedule.fresh_backwards(w):
                g = wbeg[w] + i
                dur[g] = max(over, dur[g] - costs.accumulate[st[g]])
    return dur


def exposed_alltoall(schedule: Schedule, costs: SimCosts, kc: list, st: list, wbeg: list, *, dur: list) -> list[float]:
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
    with_alltoall = (KindCode.F, KindCode.B, KindCode.BI)
    out = [a[s] if k in with_alltoall else 0.0 for k, s in zip(kc, st)]
    if costs.overlap_pairs:
        for w, i, j in schedule.overlapped_pairs():
            f, b = wbeg[w] + i, wbeg[w] + j
            out[f], out[b] = max(0.0, out[f] - dur[b]), max(0.0, out[b] - dur[f])
    return out

"""The op graph of a schedule: flat per-op arrays, dependency edges and the cost of each edge.

Ops are numbered worker by worker in program order (``wbeg[w] .. wend[w] - 1``). An edge
``producer -> consumer`` says the consumer may not start before the producer ended; its type says
what travels: 0 nothing (same worker, or an all-reduce to its STEP), 1 an activation or gradient
between workers (a message), 2 a weight version that exists on its owner (fetch ops), 3 a weight
gradient pushed to the owner's STEP (a message), 4 a message that costs nothing. The edges are
those of :attr:`Schedule.dataflow <workbench.schedules.core.Schedule.dataflow>` (derived in
:mod:`workbench.schedules.dataflow` on integer arrays, the ones the validator's deadlock check
runs); tests/test_simulate.py checks their compute-op edges against ``Schedule.dependencies()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from workbench.schedules.core import Schedule, check_dataflow
from workbench.schedules.dataflow import OpArrays
from workbench.simulation.costs import _AR, _B, _BI, _F, _STEP, _Costs, op_ms


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


def _edge_messages(costs: _Costs, senders, receivers, item, item_bytes, *, fixed_ms, W: int):
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
        flat,
        kc,
        st,
        a.microbatch.tolist(),
        a.version.tolist(),
        a.step.tolist(),
        a.worker.tolist(),
        wbeg,
        wend,
        dur,
        dst.tolist(),
        np.searchsorted(src, np.arange(len(flat) + 1)).tolist(),
        etype.tolist(),
        ems.tolist(),
        ebytes.tolist(),
        np.bincount(dst, minlength=len(flat)).tolist(),
        df.ar_groups,
        {key: len(members) for key, members in df.ar_groups.items()},
        (a.compute & (ww >= 0) & (ww != a.worker)).tolist(),
        [o.weights_worker for o in flat],
        np.bincount(a.worker[dst][etype == 1], minlength=W).tolist(),
        (a.kind, a.stage, a.microbatch, a.version, a.step, a.worker),
        exposed,
    )


def _edge_costs(a: OpArrays, src: np.ndarray, dst: np.ndarray, costs: _Costs, W: int):
    """(type, ms, bytes) per edge ``src -> dst`` (module docstring): 0 same worker (or AR -> STEP);
    1 activation/gradient transfer across the cut ``min(stage)``; 2 weight version ready on its
    owner; 3 weight gradient pushed to the owner's STEP (the stage's parameter bytes); 4 a
    transfer that costs nothing."""
    ws_, wd_ = a.worker[src], a.worker[dst]
    ks, kd = a.kind[src], a.kind[dst]
    etype = np.where(ws_ == wd_, 0, np.where(ks == _STEP, 2, np.where(kd == _STEP, 3, 1)))
    etype[ks == _AR] = 0
    ems = np.zeros(len(src))
    ebytes = np.zeros(len(src))
    xfer = etype == 1
    cut = np.minimum(a.stage[src], a.stage[dst])[xfer]
    ems[xfer], ebytes[xfer] = _edge_messages(
        costs, ws_[xfer], wd_[xfer], cut, costs.cut_bytes, fixed_ms=costs.transfer_ms, W=W
    )
    push = etype == 3
    ems[push], ebytes[push] = _edge_messages(
        costs, ws_[push], wd_[push], a.stage[src][push], costs.param_bytes, fixed_ms=costs.fetch_ms, W=W
    )
    etype[(etype == 1) & (ems == 0) & (ebytes == 0)] = 4
    return etype, ems, ebytes


def _durations(schedule: Schedule, costs: _Costs, flat: list, kc: list, st: list, *, wbeg: list) -> list[float]:
    """Compute-stream ms per op: the kind's stage cost plus the per-op overhead (:func:`op_ms` with
    segments or recompute), AR 0; a STEP that keeps the replaced version costs ``step_copy``; the
    first backward of an update into an empty buffer saves ``accumulate`` (down to the overhead)."""
    comp = costs.compute
    over = costs.op_overhead_ms
    if schedule.segment_tokens or schedule.recompute:
        dur = [op_ms(schedule, op, comp) + over if k < _AR else 0.0 for op, k in zip(flat, kc)]
    else:
        dur = [comp[k][s] + over if k < _AR else 0.0 for k, s in zip(kc, st)]
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


def exposed_alltoall(schedule: Schedule, costs: _Costs, kc: list, st: list, wbeg: list, *, dur: list) -> list[float]:
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

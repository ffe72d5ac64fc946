"""The dataflow of a schedule's ops, in one place: op kinds and their codes, the op key, the
dependency edges and the in-flight count. The validator (its deadlock check), the simulator's op
graph and the generators all read them from here; this module imports nothing of the workbench.

Kind codes (:class:`KindCode`, an ``IntEnum``): F 0, B 1, BI 2, BW 3 (the compute kinds), STEP 4,
AR 5; :data:`KIND_CODES` maps each :class:`OpKind` to its code's integer.

Op key. A compute op (kind k, stage s, unit u) of a schedule with S stages and U units
(microbatches x segments; a unit is ``microbatch * k_seg + segment``) is the integer
``(k S + s) U + u`` (:func:`op_key`), an index into flat arrays of size ``4 S U``.

Ops are numbered worker by worker in program order (:class:`OpArrays`); an edge ``p -> c`` between
op ids says that c may not start before p ended. The edges (:func:`dataflow_edges`):

* dataflow between compute ops (:func:`producer_keys`): ``F(s, u) <- F(s-1, u)``;
  ``B/BI(s, u) <- F(s, u)`` and ``<- BI(s+1, u)`` if stage s+1 splits its backward of u, else
  ``B(s+1, u)`` (s < S-1); ``BW(s, u) <- BI(s, u)``; with k_seg > 1 segments also
  ``F(s, u) <- F(s, u-1)`` (u mod k_seg > 0) and ``B/BI(s, u) <- B/BI(s, u+1)`` (u mod k_seg < k_seg-1);
* remote weights (master family: ``weights_worker`` o differs from the op's worker): a compute op
  reading version v >= 1 of stage s waits for o's STEP of step v-1 (not under the ``async``
  rule); a B/BW pushes its weight gradient to o's STEP of step v;
* an all-reduce (AR) of (stage, step) precedes the same worker's STEP of (stage, step); the ARs of
  one (stage, step) on the stage's replicas meet (a rendezvous, :attr:`Dataflow.ar_groups`).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum, StrEnum
from typing import Any

import numpy as np


class OpKind(StrEnum):
    """Op kinds; a ``str`` enum, so ``op.kind == "F"`` and ``str(op.kind) == "F"`` hold."""

    F = "F"
    B = "B"
    BI = "BI"
    BW = "BW"
    AR = "AR"
    STEP = "STEP"


class KindCode(IntEnum):
    """The integer code of an op kind in the flat arrays (:attr:`OpArrays.kind`): the compute kinds
    first, so ``code < STEP`` is a compute op and ``code < AR`` an op of the compute stream. An
    ``int`` enum: arrays hold the plain integers, which compare equal to the members."""

    F = 0
    B = 1
    BI = 2
    BW = 3
    STEP = 4
    AR = 5


COMPUTE = (OpKind.F, OpKind.B, OpKind.BI, OpKind.BW)
KINDS = COMPUTE + (OpKind.AR, OpKind.STEP)
F, B, BI, BW, STEP, AR = KindCode
KIND_CODES: dict[str, int] = {OpKind(k.name): int(k) for k in KindCode}  # plain ints: cheap to put in arrays


def op_key(kind, stage, unit, S: int, U: int):
    """``(k S + s) U + u``: the compute op (kind code k, stage s, unit u) as one integer (ints or arrays)."""
    return (kind * S + stage) * U + unit


def split_key(code: int, S: int, U: int) -> tuple[int, int, int]:
    """(kind code, stage, unit) of an op key (the inverse of :func:`op_key`)."""
    k, rest = divmod(int(code), S * U)
    s, u = divmod(rest, U)
    return k, s, u


@dataclass(frozen=True)
class OpArrays:
    """The ops of a schedule as flat integer arrays, numbered worker by worker in program order;
    worker w's ops are ``begin[w] .. begin[w+1] - 1``. ``segment`` and ``weights_worker`` are -1
    where the op has none; ``S``, ``M``, ``k`` are stages, microbatches and segments per sequence;
    ``flat[g]`` is op g itself."""

    flat: list
    kind: np.ndarray
    stage: np.ndarray
    microbatch: np.ndarray
    segment: np.ndarray
    version: np.ndarray
    step: np.ndarray
    weights_worker: np.ndarray
    worker: np.ndarray
    begin: np.ndarray
    S: int
    M: int
    k: int

    @classmethod
    def from_ops(cls, op_lists: Sequence[Sequence[Any]], S: int, M: int, k: int = 1) -> OpArrays:
        flat = [op for ops in op_lists for op in ops]
        codes = KIND_CODES
        lengths = np.fromiter((len(ops) for ops in op_lists), np.int64, len(op_lists))

        def col(values: list) -> np.ndarray:
            return np.array(values, dtype=np.int64).reshape(len(flat))

        return cls(
            flat=flat,
            kind=col([codes[o.kind] for o in flat]),
            stage=col([o.stage for o in flat]),
            microbatch=col([o.microbatch for o in flat]),
            segment=col([-1 if o.segment is None else o.segment for o in flat]),
            version=col([o.version for o in flat]),
            step=col([o.step for o in flat]),
            weights_worker=col([-1 if o.weights_worker is None else o.weights_worker for o in flat]),
            worker=np.repeat(np.arange(len(op_lists), dtype=np.int64), lengths),
            begin=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
            S=int(S),
            M=int(M),
            k=max(1, int(k)),
        )

    @property
    def U(self) -> int:
        """Units: microbatches x segments."""
        return self.M * self.k

    @property
    def compute(self) -> np.ndarray:
        return self.kind < STEP

    @property
    def unit(self) -> np.ndarray:
        """``microbatch * k + segment`` of compute ops (the microbatch where unsegmented); other ops: microbatch."""
        if self.k == 1:
            return self.microbatch
        return np.where(self.compute, self.microbatch * self.k + np.maximum(self.segment, 0), self.microbatch)

    def out_of_range(self) -> np.ndarray:
        """Ops whose stage is outside 0..S-1, or compute ops whose unit is outside 0..U-1."""
        unit = self.unit
        return (self.stage < 0) | (self.stage >= self.S) | (self.compute & ((unit < 0) | (unit >= self.U)))

    def keys(self) -> np.ndarray:
        """:func:`op_key` of every compute op, -1 for AR/STEP (stages and units must be in range)."""
        return np.where(self.compute, op_key(self.kind, self.stage, self.unit, self.S, self.U), -1)


def producer_keys(key: np.ndarray, S: int, U: int, k: int, present: np.ndarray) -> np.ndarray:
    """The one derivation of the dataflow rules (module docstring), on op keys: row i holds the
    keys of the ops that op key ``key[i]`` consumes, -1 where none (F: F(s-1), previous segment;
    B/BI: F(s), next stage's gradient, next segment; BW: BI). ``present[c]``: some op has key c
    (it decides BI(s+1) or B(s+1))."""
    SU = S * U
    kind, rest = np.divmod(key, SU)
    s, u = np.divmod(rest, U)
    is_f, is_bw = kind == F, kind == BW
    is_b = (kind == B) | (kind == BI)
    out = np.full((len(key), 3), -1, dtype=np.int64)
    out[:, 0] = np.where(is_f, np.where(s > 0, key - U, -1), np.where(is_bw, key - SU, rest))  # BW - SU: BI; rest: F
    has_next = is_b & (s < S - 1)
    nxt = np.where(has_next, BI * SU + rest + U, 0)  # BI(s+1, u); minus SU: B(s+1, u)
    out[:, 1] = np.where(has_next, np.where(present[nxt], nxt, nxt - SU), -1)
    if k > 1:
        out[:, 1] = np.where(is_f & (u % k > 0), key - 1, out[:, 1])
        out[:, 2] = np.where(is_b & (u % k < k - 1), key + 1, -1)
    return out


@dataclass(frozen=True)
class Dataflow:
    """The edges of a schedule's ops (module docstring) as op-id arrays ``src -> dst``, ordered:
    the dataflow edges (column by column of :func:`producer_keys`, consumers in op order), then the
    remote-weight edges in op order, then AR -> STEP. ``loc[c]``: the op with key c (-1: none).
    ``missing``: rows (consumer op, key) of producers no worker runs; ``unreadable``: remote reads of
    a version whose STEP the owner does not run; ``ar_groups``: (stage, step) -> its AR op ids;
    ``ar_steps``: how many edges at the end are AR -> STEP (the simulator's; the deadlock check runs
    the program order, where a STEP listed before its stage's AR does not wait for it)."""

    ops: OpArrays
    key: np.ndarray
    loc: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    missing: np.ndarray
    unreadable: list[int]
    ar_groups: dict[tuple[int, int], list[int]]
    ar_steps: int


def locate(key: np.ndarray, size: int) -> tuple[np.ndarray, int]:
    """``loc`` (key -> op id, -1 for none) of the compute ops (``key >= 0``), and the first op in
    op order whose key an earlier op has (-1: keys are unique)."""
    g = np.flatnonzero(key >= 0)
    loc = np.full(size, -1, dtype=np.int64)
    loc[key[g][::-1]] = g[::-1]
    again = g[loc[key[g]] != g]
    return loc, int(again[0]) if again.size else -1


def dataflow_edges(ops: OpArrays, key: np.ndarray, loc: np.ndarray, versions_wait: bool = True) -> Dataflow:
    """All edges of the ops (module docstring); ``versions_wait=False`` (the ``async`` rule) drops
    the waits of remote reads for their version. Keys must be unique (:func:`locate`)."""
    S, U = ops.S, ops.U
    g = np.flatnonzero(key >= 0)
    prod = producer_keys(key[g], S, U, ops.k, loc >= 0)
    src, dst, miss = [], [], []
    for col in prod.T:
        need = col >= 0
        p, c = loc[col[need]], g[need]
        src.append(p[p >= 0])
        dst.append(c[p >= 0])
        miss.append(np.stack([c[p < 0], col[need][p < 0]], axis=1))
    wsrc, wdst, unreadable, groups, ar_steps = _weight_edges(ops, versions_wait)
    return Dataflow(
        ops,
        key,
        loc,
        np.concatenate(src + [np.asarray(wsrc, dtype=np.int64)]),
        np.concatenate(dst + [np.asarray(wdst, dtype=np.int64)]),
        np.concatenate(miss),
        unreadable,
        groups,
        ar_steps,
    )


def _weight_edges(ops: OpArrays, versions_wait: bool) -> tuple[list[int], list[int], list[int], dict, int]:
    """Remote-weight edges (a read waits for the owner's STEP of its version, a B/BW's gradient
    goes to the owner's STEP op.version) in op order, then AR -> STEP of the same worker."""
    kind, stage, step, wof, ww = ops.kind, ops.stage, ops.step, ops.worker, ops.weights_worker
    groups: dict[tuple[int, int], list[int]] = {}
    ars = np.flatnonzero(kind == AR)
    for g, s, t in zip(ars.tolist(), stage[ars].tolist(), step[ars].tolist()):
        groups.setdefault((s, t), []).append(g)
    remote = np.flatnonzero(ops.compute & (ww >= 0) & (ww != wof))
    step_at: dict[tuple[int, int, int], int] = {}
    if groups or remote.size:  # (worker, stage, step) -> its STEP op
        steps = np.flatnonzero(kind == STEP)
        keys = zip(wof[steps].tolist(), stage[steps].tolist(), step[steps].tolist())
        step_at = dict(zip(keys, steps.tolist()))
    src: list[int] = []
    dst: list[int] = []
    unreadable: list[int] = []
    for g, o, s, v, kc in zip(
        remote.tolist(),
        ww[remote].tolist(),
        stage[remote].tolist(),
        ops.version[remote].tolist(),
        kind[remote].tolist(),
    ):
        if versions_wait and v > 0:  # the version must exist on the owner
            q = step_at.get((o, s, v - 1), -1)
            if q < 0:
                unreadable.append(g)
            else:
                src.append(q)
                dst.append(g)
        if kc == B or kc == BW:
            q = step_at.get((o, s, v), -1)
            if q >= 0:
                src.append(g)
                dst.append(q)
    n = len(src)
    for (s, t), members in groups.items():
        for g in members:
            q = step_at.get((int(wof[g]), s, t), -1)
            if q >= 0:
                src.append(g)
                dst.append(q)
    return src, dst, unreadable, groups, len(src) - n


def in_flight_peaks(kind: np.ndarray, item: np.ndarray, begin: np.ndarray) -> np.ndarray:
    """The one in-flight counter. For each op sequence ``[begin[i], begin[i+1])``: the most items
    live at once, an item becoming live at an F and dead at a B or BW (the backward that frees its
    activations); other kinds are ignored. Vectorised: sorting the events by (sequence, item), the
    live count changes by ``after - before`` at each event, where after = [event is F] and before
    = after of the item's previous event; the peak is the running sum's maximum."""
    n, nseq = len(kind), len(begin) - 1
    ev = np.flatnonzero((kind == F) | (kind == B) | (kind == BW))
    if nseq <= 0 or ev.size == 0:
        return np.zeros(max(nseq, 0), dtype=np.int64)
    seq = np.repeat(np.arange(nseq), np.diff(begin))[ev]
    it = seq * (int(item[ev].max()) - int(item[ev].min()) + 1) + (item[ev] - item[ev].min())
    order = np.argsort(it, kind="stable")
    after = (kind[ev][order] == F).astype(np.int64)
    before = np.zeros_like(after)
    same = it[order][1:] == it[order][:-1]
    before[1:] = np.where(same, after[:-1], 0)
    delta = np.zeros(n, dtype=np.int64)
    delta[ev[order]] = after - before
    live = np.cumsum(delta)
    base = np.concatenate([[0], live])[begin[:-1]]
    return np.array(
        [max(0, int(live[b:e].max()) - int(z)) if e > b else 0 for b, e, z in zip(begin[:-1], begin[1:], base)],
        dtype=np.int64,
    )


def peak_in_flight(order: Iterable[tuple[str, int, Hashable]]) -> int:
    """:func:`in_flight_peaks` of one sequence of ``(kind, stage, unit)`` triples (a generator's
    per-worker order, or ops as triples): the most (stage, unit) pairs forwarded and not yet
    backwarded (B, or BW of a split backward)."""
    ids: dict = {}
    kinds, items = [], []
    for kind, s, u in order:
        kinds.append(KIND_CODES.get(kind, -1))
        items.append(ids.setdefault((s, u), len(ids)))
    if not kinds:
        return 0
    return int(in_flight_peaks(np.array(kinds), np.array(items), np.array([0, len(kinds)]))[0])


__all__ = [
    "AR",
    "B",
    "BI",
    "BW",
    "COMPUTE",
    "F",
    "KINDS",
    "KIND_CODES",
    "STEP",
    "KindCode",
    "Dataflow",
    "OpArrays",
    "OpKind",
    "dataflow_edges",
    "in_flight_peaks",
    "locate",
    "op_key",
    "peak_in_flight",
    "producer_keys",
    "split_key",
]

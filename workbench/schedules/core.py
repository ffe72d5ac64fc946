"""The one schedule representation that the simulator and the runtime both execute.

A :class:`Schedule` is, for every worker, an ordered tuple of :class:`Op`. Op kinds:

* ``F``  forward of ``stage`` on ``microbatch``
* ``B``  full backward (input gradient and weight gradient) of ``stage`` on ``microbatch``
* ``BI`` input-gradient half of a split backward (zero bubble); ``BW`` its weight-gradient half
* ``AR`` all-reduce of ``stage``'s gradients among ``schedule.stage_workers[stage]`` for ``step``
* ``STEP`` optimizer step of ``stage`` on this worker (the ``step``-th update of that stage)

Weight versions. Every F/B/BI/BW op carries ``version``: the number of optimizer steps that have
been applied to its stage's weights *in the version it reads*. This makes the update rule of a
schedule explicit data instead of executor behaviour:

* sync (model parallel, GPipe, Flush, DP-BSP): every op of step t reads version t;
* PipeDream weight stashing: B reads the same version as its F; F reads the newest local version;
* vertical sync: every stage of microbatch b reads the version the input stage used for b;
* 2BW: F/B read the version two-buffered from the previous batch (delay of one update);
* no stashing: B reads the newest version (differs from its F: the failure mode).

The gradient of optimizer step t of stage s is the *mean* over ``schedule.step_microbatches(s, t)``
(the microbatches whose backward precedes that STEP on the stage's workers, all replicas together)
of the per-microbatch gradients. For a stage on one worker that is the sum divided by
``microbatches_per_step``; for a replicated stage an executor scales each local microbatch gradient
by ``1 / len(step_microbatches(s, t))`` and the AR op sums across the replicas (a replica may hold
fewer microbatches of a step than another, e.g. round robin with M not a multiple of r).
Master-family schedules (``weights_worker`` set): a B/BW op computed on a worker that does not hold
the stage pushes its gradient to ``weights_worker``; it belongs to the owner's step ``op.version``.

Segments (Seq1F1B). A schedule with ``segment_tokens = (n_1, ..., n_k)`` cuts every sequence into
k segments; its compute ops carry ``segment`` j in 0..k-1 and the unit of work is the pair
(microbatch, segment), keyed ``unit = microbatch * k + segment`` (:meth:`Schedule.unit`) in the
dataflow keys (:meth:`Schedule.where`, :meth:`Schedule.dependencies`). Causal attention adds two
rules on a stage: F(s, b, j) needs F(s, b, j-1) (its keys and values), and the backward of
(s, b, j) needs the backward of (s, b, j+1) (the gradients of those keys and values).
``segment_flops[j]`` is segment j's share of a sequence's FLOPs (they sum to 1), the weight
executors charge it by. ``recompute`` (GPipe re-materialization): a worker keeps only the stage's
input per (microbatch, segment) in flight and re-runs the forward at the start of its backward.

Sends and receives are implicit: F(s, b) needs the output of F(s-1, b), B(s, b) the gradient from
B(s+1, b) (or BI(s+1, b)); when the two ops run on different workers a transfer follows.
``weights_worker`` (master-schedule family) names the worker that owns the weights an op uses; a
transfer of weights follows when it differs from the worker running the op.

Overlapped pairs (DeepSeek-V3's DualPipe). ``options["overlap_f_b"]`` lists ``(worker, (F stage,
microbatch), (B stage, microbatch))``: a forward and a full backward of other microbatches that
``worker`` runs as one overlapped unit, two consecutive ops F then B (torch's OVERLAP_F_B). The
generator that builds the order records the pairs; :meth:`Schedule.overlapped_pairs` reads them as
op indices, and an executor that models overlap (the simulator's all-to-all, see
:mod:`workbench.simulation`) charges them from there.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict, deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import NamedTuple

import numpy as np
import pandas as pd

from workbench.io.cards import card, one_line
from workbench.schedules.dataflow import (
    AR,
    COMPUTE,
    KINDS,
    Dataflow,
    KindCode,
    OpArrays,
    OpKind,
    dataflow_edges,
    in_flight_peaks,
    locate,
    peak_in_flight,
    producer_keys,
    split_key,
)

_COMPUTE_SET = frozenset(COMPUTE)
_F, _B, _BI, _BW = COMPUTE  # keys built from the members hit dict entries by identity (no str compare)
Key = tuple  # (kind, stage, microbatch) of a compute op
UPDATE_RULES = ("sync", "stash", "vertical-sync", "no-stash", "2bw", "async")


class RemoteInput(NamedTuple):
    """An activation or gradient a worker receives (:meth:`Schedule.remote_inputs`): ``op``, the
    index in the worker's op list of the op that consumes it; ``producer``, the (kind, stage,
    unit) key of the op that made it; ``src``, the worker that ran the producer."""

    op: int
    producer: Key
    src: int


_KIND_OF: dict[str, OpKind] = {**{str(k): k for k in OpKind}, **{k: k for k in OpKind}}


@dataclass(frozen=True)
class Op:
    kind: str
    stage: int
    microbatch: int = -1  # -1 for AR / STEP
    version: int = 0  # weight version read (F/B/BI/BW)
    step: int = -1  # AR / STEP: index of the update of this stage
    weights_worker: int | None = None  # None: the weights live on the worker running the op
    segment: int | None = None  # Seq1F1B: segment of the sequence (None: the whole sequence)

    def __post_init__(self):
        if type(self.kind) is not OpKind:  # a plain "F": the enum member (generators pass members)
            kind = _KIND_OF.get(self.kind)
            if kind is None:
                raise ValueError(f"unknown op kind {self.kind!r}; expected one of {[str(k) for k in KINDS]}")
            object.__setattr__(self, "kind", kind)

    def __str__(self) -> str:
        if self.kind in COMPUTE:
            seg = "" if self.segment is None else f"/{self.segment}"
            return f"{self.kind}{self.stage}.{self.microbatch}{seg}@v{self.version}"
        return f"{self.kind}{self.stage}#{self.step}"


@dataclass(frozen=True)
class Schedule:
    """Per-worker op lists plus what an executor needs to know to run them.

    ``stage_workers[s]``: the workers that hold (a replica of) stage s's weights.
    ``microbatches``: number of distinct microbatch ids (0..microbatches-1) in the schedule.
    ``microbatches_per_step``: how many microbatches' gradients make one update (per replica group).
    ``update``: the weight rule (see module docstring), one of ``UPDATE_RULES``.
    ``max_in_flight[w]``: bound on microbatches forwarded but not yet backwarded on worker w.
    ``segment_tokens`` / ``segment_flops``: Seq1F1B segment lengths and FLOP shares (module
    docstring; empty: unsegmented). ``recompute``: re-materialize activations in the backward.
    """

    name: str
    num_stages: int
    num_workers: int
    microbatches: int
    ops: tuple[tuple[Op, ...], ...]
    stage_workers: tuple[tuple[int, ...], ...]
    update: str = "sync"
    microbatches_per_step: int = 1
    max_in_flight: tuple[int, ...] | None = None
    options: dict = field(default_factory=dict)
    segment_tokens: tuple[int, ...] = ()
    segment_flops: tuple[float, ...] = ()
    recompute: bool = False

    def __post_init__(self):
        object.__setattr__(self, "ops", tuple(tuple(o) for o in self.ops))
        if len(self.ops) != self.num_workers:
            raise ValueError(f"{len(self.ops)} op lists for {self.num_workers} workers")
        if self.update not in UPDATE_RULES:
            raise ValueError(f"unknown update rule {self.update!r}; expected one of {UPDATE_RULES}")

        # ---- lookups ---------------------------------------------------------------------
        object.__setattr__(self, "segment_tokens", tuple(int(n) for n in self.segment_tokens))
        object.__setattr__(self, "segment_flops", tuple(float(f) for f in self.segment_flops))
        if self.segment_flops and len(self.segment_flops) != len(self.segment_tokens):
            raise ValueError(f"{len(self.segment_flops)} segment FLOP shares for {len(self.segment_tokens)} segments")

    # ---- segments --------------------------------------------------------------------
    @property
    def num_segments(self) -> int:
        """k: segments per sequence (1 when unsegmented)."""
        return max(1, len(self.segment_tokens))

    def unit(self, op: Op) -> int:
        """The (microbatch, segment) unit of a compute op as one id: ``microbatch * k + segment``
        (the microbatch itself when unsegmented); the third element of dataflow keys."""
        return op.microbatch * self.num_segments + (op.segment or 0)

    def segment_share(self, op: Op, weight: str = "flops") -> float:
        """Fraction of the whole sequence's cost an op carries: ``segment_flops[j]`` (compute) or
        ``n_j / sum n`` (``weight="tokens"``: activation bytes); 1 when unsegmented."""
        if op.segment is None or not self.segment_tokens:
            return 1.0
        if weight == "tokens" or not self.segment_flops:
            return self.segment_tokens[op.segment] / sum(self.segment_tokens)
        return self.segment_flops[op.segment]

    def __iter__(self) -> Iterator[tuple[int, Op]]:
        for w, ops in enumerate(self.ops):
            for op in ops:
                yield w, op

    @property
    def num_ops(self) -> int:
        return sum(len(o) for o in self.ops)

    def where(self) -> dict[Key, int]:
        """(kind, stage, microbatch) -> worker for every compute op (cached; do not mutate)."""
        return self._where

    @cached_property
    def _where(self) -> dict[Key, int]:
        return {
            (op.kind, op.stage, self.unit(op)): w
            for w, ops in enumerate(self.ops)
            for op in ops
            if op.kind in _COMPUTE_SET
        }

    def dependencies(self) -> dict[Key, tuple[Key, ...]]:
        """The dataflow edges between compute ops as keys, derived once (cached) and read by the
        runtime's receive plan and :func:`~workbench.schedules.stats.worker_stats`: compute-op key ->
        the keys of the compute ops it consumes (a key may name an op no worker runs; the
        validator reports it). The rules are :func:`~workbench.schedules.dataflow.producer_keys`,
        the ones :attr:`dataflow` (the validator's deadlock check, the simulator) evaluates on op ids:

        * ``F(s, b)`` <- ``F(s-1, b)`` (the activation; none for s = 0);
        * ``B(s, b)`` / ``BI(s, b)`` <- ``F(s, b)`` (its own stashed activations) and, for
          s < S-1, the gradient from ``BI(s+1, b)`` when stage s+1 splits its backward, else
          ``B(s+1, b)``;
        * ``BW(s, b)`` <- ``BI(s, b)``;
        * segments (``b`` is then the unit b·k + j): ``F(s, b)`` also <- ``F(s, b-1)`` for j > 0 and
          ``B/BI(s, b)`` also <- ``B/BI(s, b+1)`` for j < k-1 (keys/values and their gradients).

        Remote-weight and all-reduce edges (an op waits for the owner's STEP; AR before STEP) are
        not dataflow between compute ops; :attr:`dataflow` holds them."""
        return self._dependencies

    @cached_property
    def _dependencies(self) -> dict[Key, tuple[Key, ...]]:
        df, S, U = self.dataflow, self.num_stages, self.microbatches * self.num_segments
        g = np.flatnonzero(df.key >= 0)
        prod = producer_keys(df.key[g], S, U, self.num_segments, df.loc >= 0).tolist()
        return {
            _key_of(c, S, U): tuple(_key_of(p, S, U) for p in row if p >= 0) for c, row in zip(df.key[g].tolist(), prod)
        }

    @cached_property
    def arrays(self) -> OpArrays:
        """The ops as flat integer arrays (:class:`~workbench.schedules.dataflow.OpArrays`; cached)."""
        return OpArrays.from_ops(self.ops, self.num_stages, self.microbatches, self.num_segments)

    @cached_property
    def dataflow(self) -> Dataflow:
        """Every edge between the ops (:func:`~workbench.schedules.dataflow.dataflow_edges`; cached):
        what the validator's deadlock check and the simulator's op graph both read. Raises
        :class:`ScheduleError` for an op outside the stages and units or a compute op listed twice."""
        a = self.arrays
        bad = np.flatnonzero(a.out_of_range())
        if bad.size:
            w, op = self._op_at(int(bad[0]))
            raise ScheduleError(f"worker {w}: {op} is outside {a.S} stages x {a.U} microbatch units")
        key = a.keys()
        loc, again = locate(key, len(COMPUTE) * a.S * a.U)
        if again >= 0:
            (w0, op), (w, _) = self._op_at(int(loc[key[again]])), self._op_at(again)
            raise ScheduleError(f"{op} appears twice (workers {w0} and {w})")
        return dataflow_edges(a, key, loc, versions_wait=self.update != "async")

    def _op_at(self, g: int) -> tuple[int, Op]:
        """(worker, op) of flat op id ``g`` (ops numbered worker by worker)."""
        w = int(np.searchsorted(self.arrays.begin, g, side="right")) - 1
        return w, self.ops[w][g - int(self.arrays.begin[w])]

    def remote_inputs(self, worker: int) -> list[RemoteInput]:
        """A :class:`RemoteInput` ``(op index on worker, producer key, producer worker)`` for every
        activation or gradient that ``worker`` receives from another worker, in its op order (the
        runtime's receive plan). From :meth:`dependencies`; a producer of the op's own stage (its
        forward, BI before BW) never crosses workers in a valid schedule."""
        where, deps, out = self._where, self._dependencies, []
        for i, op in enumerate(self.ops[worker]):
            if op.kind not in _COMPUTE_SET:
                continue
            for dep in deps[(op.kind, op.stage, self.unit(op))]:
                src = where.get(dep, worker)
                _, dep_stage, _ = dep
                if dep_stage != op.stage and src != worker:
                    out.append(RemoteInput(i, dep, src))
        return out

    @cached_property
    def remote_weights(self) -> bool:
        """Some compute op reads weights held by another worker (``weights_worker``: master family)."""
        return any(
            op.kind in _COMPUTE_SET and op.weights_worker is not None and op.weights_worker != w for w, op in self
        )

    def stashing_steps(self, worker: int) -> frozenset[int]:
        """Indices of ``worker``'s STEP ops that must write the new weights into new tensors,
        because the version they replace is still read afterwards on that worker (weight stashing:
        a later F/B/BI/BW of the stage reads it); every other STEP may update in place. With
        remote weights (master family: copies may still be in flight to other workers) every STEP
        writes new tensors. Read by the runtime (which update it runs) and the simulator (which
        step cost it charges); versions count the worker's STEPs of the stage, as both do."""
        ops = self.ops[worker]
        steps = [i for i, op in enumerate(ops) if op.kind == OpKind.STEP]
        if self.remote_weights:
            return frozenset(steps)
        last = {(op.stage, op.version): i for i, op in enumerate(ops) if op.kind in _COMPUTE_SET}
        count: dict[int, int] = defaultdict(int)
        out = set()
        for i in steps:
            s = ops[i].stage
            if last.get((s, count[s]), -1) > i:
                out.add(i)
            count[s] += 1
        return frozenset(out)

    def flat_buffers(self, worker: int) -> frozenset[int]:
        """Stages whose update buffer on ``worker`` is one flat vector, zeroed after each STEP: the
        stages it all-reduces (an AR op) and, with remote weights (master family), every stage
        (pushed gradients join it). Every other stage's buffer starts each update empty and the
        first weight gradient becomes it. Read by the runtime (which buffer it keeps) and by
        :meth:`fresh_backwards`."""
        if self.remote_weights:
            return frozenset(op.stage for op in self.ops[worker])
        return frozenset(op.stage for op in self.ops[worker] if op.kind == OpKind.AR)

    def fresh_backwards(self, worker: int) -> frozenset[int]:
        """Indices of ``worker``'s B/BW ops that write the first weight gradient of their update
        into an empty (non-flat) buffer: the first B or BW of the stage on the worker and the first
        after each of its STEPs. Their gradient becomes the buffer (no addition pass over the
        stage's parameters), the others add into it. Read by the simulator, which charges the
        difference (``CostModel.stage_accumulate_ms``) only to the others."""
        flat, fresh, out = self.flat_buffers(worker), set(), set()
        for i, op in enumerate(self.ops[worker]):
            if op.stage in flat:
                continue
            if op.kind == OpKind.STEP:
                fresh.discard(op.stage)
            elif op.kind in (OpKind.B, OpKind.BW) and op.stage not in fresh:
                fresh.add(op.stage)
                out.add(i)
        return frozenset(out)

    def overlapped_pairs(self) -> tuple[tuple[int, int, int], ...]:
        """``(worker, i, i + 1)`` for every overlapped pair of ``options["overlap_f_b"]`` (module
        docstring): op ``i`` of ``worker`` is the pair's F, op ``i + 1`` its B. A pair whose two ops
        are not consecutive F, B on that worker raises :class:`ScheduleError`."""
        pairs = self.options.get("overlap_f_b", ())
        if not pairs:
            return ()
        index = [{(op.kind, op.stage, op.microbatch): i for i, op in enumerate(ops)} for ops in self.ops]
        out = []
        for w, (fs, fb), (bs, bb) in pairs:
            i = index[w].get(("F", fs, fb)) if 0 <= w < self.num_workers else None
            if i is None or index[w].get(("B", bs, bb)) != i + 1:
                raise ScheduleError(
                    f"overlapped pair F{fs}.{fb} + B{bs}.{bb} is not two consecutive ops F, B "
                    f"on worker {w}; list pairs that the op order runs back to back"
                )
            out.append((w, i, i + 1))
        return tuple(out)

    @property
    def split_backward(self) -> bool:
        return any(op.kind == OpKind.BI for _, op in self)

    @cached_property
    def updates_per_round(self) -> tuple[int, ...]:
        """Per stage, the optimizer steps one pass of the op lists applies (the STEPs of the stage on
        its first replica; cached). A run repeats the schedule in rounds, so version ``v`` of stage
        ``s`` in round ``R`` is ``R * updates_per_round[s] + v``."""
        return tuple(
            sum(1 for op in self.ops[self.stage_workers[s][0]] if op.kind == OpKind.STEP and op.stage == s)
            for s in range(self.num_stages)
        )

    def step_microbatches(self, stage: int, step: int, worker: int | None = None) -> list[int]:
        """Microbatches whose gradients the ``step``-th update of ``stage`` applies: those whose
        backward (B or BW) of ``stage`` runs on the stage's workers after the previous STEP and
        before this one (on ``worker`` only, if given; else on every replica)."""
        out = []
        workers = [worker] if worker is not None else self.stage_workers[stage]
        for w in workers:
            k = 0
            for op in self.ops[w]:
                if op.stage != stage:
                    continue
                if op.kind == OpKind.STEP:
                    if k == step:
                        break
                    k += 1
                elif op.kind in (OpKind.B, OpKind.BW) and k == step and not op.segment:  # a sequence once
                    out.append(op.microbatch)
        holders = set(self.stage_workers[stage])
        for w, ops in enumerate(self.ops):  # gradients pushed to the owners (master family)
            if w in holders:
                continue
            for op in ops:
                if (
                    op.stage == stage
                    and op.kind in (OpKind.B, OpKind.BW)
                    and op.version == step
                    and op.weights_worker in workers
                    and not op.segment
                ):
                    out.append(op.microbatch)
        return sorted(out)

    # ---- display ----------------------------------------------------------------------
    def _rows(self) -> list[tuple[str, object, str]]:
        steps = max((op.step + 1 for _, op in self if op.kind == OpKind.STEP), default=0)
        return [
            ("workers", self.num_workers, ""),
            ("stages", self.num_stages, ""),
            ("microbatches", self.microbatches, ""),
            ("ops", self.num_ops, ""),
            ("update", self.update, ""),
            ("updates per stage", steps, ""),
            ("peak in flight", max((in_flight_peak(o) for o in self.ops), default=0), "microbatches"),
        ]

    def __repr__(self) -> str:

        return one_line(f"Schedule[{self.name}]", self._rows())

    def _repr_html_(self) -> str:

        table = pd.DataFrame(
            {
                "ops": [len(o) for o in self.ops],
                "peak in flight": [in_flight_peak(o) for o in self.ops],
                "first ops": [" ".join(str(op) for op in o[:8]) + (" …" if len(o) > 8 else "") for o in self.ops],
            },
            index=pd.RangeIndex(self.num_workers, name="worker"),
        )
        return card(
            f"Schedule {self.name}",
            self._rows(),
            label="per-worker op lists (no costs: simulate() gives times); counts from the ops",
            table=table,
        )

    def describe(self, width: int = 12) -> str:
        """Compact text rendering, one line per worker."""
        lines = [
            f"{self.name}: {self.num_workers} workers, {self.num_stages} stages, "
            f"{self.microbatches} microbatches, update={self.update}"
        ]
        for w, ops in enumerate(self.ops):
            lines.append(
                f"w{w}: " + " ".join(str(o) for o in ops[: width * 4]) + (" ..." if len(ops) > width * 4 else "")
            )
        return "\n".join(lines)


_new = object.__new__


def _key_of(code: int, S: int, U: int) -> Key:
    """The (kind, stage, unit) key of an op key code (:func:`~workbench.schedules.dataflow.op_key`)."""
    k, st, u = split_key(code, S, U)
    return (COMPUTE[k], st, u)


def make_op(
    kind: OpKind,
    stage: int,
    microbatch: int = -1,
    version: int = 0,
    step: int = -1,
    *,
    weights_worker: int | None = None,
    segment: int | None = None,
) -> Op:
    """``Op(kind, ...)`` without the checks, about 3x faster: for generators that pass an
    :class:`OpKind` member (the result is an ordinary, equal and equally hashed Op)."""
    op = _new(Op)
    d = op.__dict__
    d["kind"], d["stage"], d["microbatch"], d["version"], d["step"], d["weights_worker"], d["segment"] = (
        kind,
        stage,
        microbatch,
        version,
        step,
        weights_worker,
        segment,
    )
    return op


def with_recompute(schedule: Schedule, recompute: bool = True) -> Schedule:
    """``schedule`` with GPipe re-materialization on (or off): the same op lists; executors keep only
    each stage's input per (microbatch, segment) in flight and re-run its forward in the backward."""
    return dataclasses.replace(schedule, recompute=bool(recompute))


def producers(schedule: Schedule, w: int, op: Op, index: dict | None = None) -> list[Key]:
    """Compute-op keys (kind, stage, microbatch) that ``op`` (a compute op) must wait for: a thin
    wrapper over :meth:`Schedule.dependencies` (``w`` and ``index`` are ignored; kept for callers)."""
    return list(schedule.dependencies()[(op.kind, op.stage, schedule.unit(op))])


class ScheduleError(ValueError):
    pass


def validate(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` unless the schedule is executable.

    Checks: every op well-formed; every F has exactly one backward (B, or BI and BW) on the
    worker that ran the F (it holds the stashed activations); every dependency exists; the
    per-worker orders admit an execution without deadlock (a topological order of the union of
    per-worker order edges and the edges of :attr:`Schedule.dataflow` exists); per-worker in-flight
    limits hold; stash rules: B reads its F's version under ``stash`` and ``vertical-sync``; a STEP of
    a replicated stage follows its worker's AR of that step; listed
    overlapped pairs (:meth:`Schedule.overlapped_pairs`) are consecutive F, B ops.

    Compute ops are numbered by their op key (:func:`~workbench.schedules.dataflow.op_key`), so
    the checks index flat arrays instead of hashing tuples.
    """
    _check_ops(schedule)
    df = schedule.dataflow
    _check_in_flight(schedule, df.ops)
    g = np.flatnonzero(df.key >= 0)
    worker_of = np.full(len(df.loc), -1, dtype=np.int64)
    version_of = np.zeros(len(df.loc), dtype=np.int64)
    worker_of[df.key[g]], version_of[df.key[g]] = df.ops.worker[g], df.ops.version[g]
    _check_backwards(schedule, worker_of.reshape(len(COMPUTE), -1), version_of.reshape(len(COMPUTE), -1))
    check_dataflow(schedule, df)
    if df.unreadable:
        w, op = schedule._op_at(df.unreadable[0])
        raise ScheduleError(
            f"worker {w}: {op} reads version {op.version} of stage {op.stage} from worker "
            f"{op.weights_worker}, which runs no STEP {op.version - 1} of that stage"
        )
    _check_deadlock(schedule, df)
    _check_ar_before_step(schedule, df)
    schedule.overlapped_pairs()  # listed overlapped pairs are consecutive F, B ops


def _check_ops(schedule: Schedule) -> None:
    """Every op well-formed: stage in 0..S-1; a compute op's microbatch in 0..M-1 and, exactly when
    the schedule has segments, a segment in 0..k-1; ``weights_worker`` a worker. Reports the first
    offending op in op order."""
    a, S, M, W = schedule.arrays, schedule.num_stages, schedule.microbatches, schedule.num_workers
    nseg = len(schedule.segment_tokens)
    comp = a.compute
    checks = [
        ((a.stage < 0) | (a.stage >= S), lambda op: f"has stage outside 0..{S - 1}"),
        (comp & ((a.microbatch < 0) | (a.microbatch >= M)), lambda op: f"has microbatch outside 0..{M - 1}"),
        (
            comp & ((nseg > 0) | (a.segment >= 0)) & ((a.segment < 0) | (a.segment >= nseg)),
            lambda op: (
                f"has segment outside 0..{nseg - 1}; every compute op of a schedule with "
                f"segment_tokens needs a segment, and only those"
            ),
        ),
        (
            (a.weights_worker < -1) | (a.weights_worker >= W),
            lambda op: f"reads weights from unknown worker {op.weights_worker}",
        ),
    ]
    bad = np.flatnonzero(np.logical_or.reduce([m for m, _ in checks]))
    if bad.size:
        g = int(bad[0])
        w, op = schedule._op_at(g)
        why = next(say for m, say in checks if m[g])
        raise ScheduleError(f"worker {w}: {op} {why(op)}")


def _check_in_flight(schedule: Schedule, a: OpArrays) -> None:
    """Per worker, the (stage, unit) pairs forwarded and not yet backwarded stay within
    ``max_in_flight`` (:func:`~workbench.schedules.dataflow.in_flight_peaks`)."""
    limit = schedule.max_in_flight
    if limit is None:
        return
    peaks = in_flight_peaks(a.kind, a.stage * a.U + a.unit, a.begin).tolist()
    for w, peak in enumerate(peaks):
        if peak > limit[w]:
            raise ScheduleError(f"worker {w} holds {peak} microbatches in flight; limit is {limit[w]}")


def check_dataflow(schedule: Schedule, df: Dataflow) -> None:
    """Raise :class:`ScheduleError` when an all-reduce's ops are not on the stage's replicas, one
    each, or a compute op consumes one that no worker runs (validator and simulator alike)."""
    for (s, step), members in df.ar_groups.items():
        got, expect = sorted(df.ops.worker[members].tolist()), sorted(schedule.stage_workers[s])
        if got != expect:
            raise ScheduleError(f"AR of stage {s} step {step} has workers {got}, expected {expect}")
    if len(df.missing):
        g, code = df.missing[int(np.argmin(df.missing[:, 0]))].tolist()
        w, op = schedule._op_at(g)
        kind, st, u = _key_of(code, df.ops.S, df.ops.U)
        raise ScheduleError(f"{op} on worker {w} depends on {kind}{st}.{u}, which no worker runs")


def _check_backwards(schedule: Schedule, wk: np.ndarray, ver: np.ndarray) -> None:
    """Row k of ``wk``/``ver`` (k a compute :class:`~workbench.schedules.dataflow.KindCode`) holds
    worker and version per (stage, unit), -1 for the worker where no op of that kind runs."""
    U = schedule.microbatches * schedule.num_segments
    has = wk >= 0
    f, b, bi, bw = has[KindCode.F], has[KindCode.B], has[KindCode.BI], has[KindCode.BW]
    where = lambda i: divmod(int(i), U)  # noqa: E731  (stage, unit) of flat index i
    orphan = np.flatnonzero((b | bi | bw) & ~f)
    if orphan.size:
        s, u = where(orphan[0])
        orphan_kind = next(n for n, row in zip(("B", "BI", "BW"), (b, bi, bw)) if row[orphan[0]])
        raise ScheduleError(f"{orphan_kind}{s}.{u} has no forward")
    split = bi & bw
    bad = np.flatnonzero(f & (b == split))
    if bad.size:
        s, u = where(bad[0])
        raise ScheduleError(
            f"F{s}.{u} needs exactly one backward (B, or BI+BW); found {'both' if b[bad[0]] else 'none'}"
        )
    half = np.flatnonzero(f & ~b & (bi != bw))
    if half.size:
        s, u = where(half[0])
        raise ScheduleError(
            f"F{s}.{u} needs exactly one backward (B, or BI+BW); found only {'BI' if bi[half[0]] else 'BW'}"
        )
    same_version = schedule.update in ("stash", "vertical-sync", "sync")
    fw, fv = wk[KindCode.F], ver[KindCode.F]
    for k in (KindCode.B, KindCode.BI, KindCode.BW):
        rows = has[k]
        off = np.flatnonzero(rows & (wk[k] != fw))
        if off.size:
            s, u = where(off[0])
            raise ScheduleError(
                f"{k.name}{s}.{u} runs on worker {wk[k][off[0]]} but its forward (and "
                f"stashed activations) is on worker {fw[off[0]]}"
            )
        off = np.flatnonzero(rows & (ver[k] != fv)) if same_version else np.zeros(0, dtype=int)
        if len(off):
            s, u = where(off[0])
            raise ScheduleError(
                f"{k.name}{s}.{u} reads weight version {ver[k][off[0]]} but its "
                f"forward read {fv[off[0]]} (rule {schedule.update!r})"
            )
    missing = np.flatnonzero(~f)
    if missing.size:  # every microbatch goes through every stage
        s, u = where(missing[0])
        raise ScheduleError(f"microbatch {u} never runs the forward of stage {s}")


def _check_ar_before_step(schedule: Schedule, df: Dataflow) -> None:
    """A worker's STEP of a replicated stage comes after its AR of the same step in its order: the
    step applies the all-reduced gradients (the AR -> STEP edges, the last ``df.ar_steps`` of the
    dataflow, join ops of one worker, whose op ids follow its program order). The deadlock check
    runs the program order without these edges, so this is where a STEP listed first is caught."""
    n = len(df.src) - df.ar_steps
    bad = np.flatnonzero(df.dst[n:] < df.src[n:])
    if bad.size:
        w, op = schedule._op_at(int(df.dst[n:][bad[0]]))
        raise ScheduleError(
            f"worker {w}: {op} comes before AR{op.stage}#{op.step}, the all-reduce of the gradients it applies; "
            "list the STEP after it"
        )


def _check_deadlock(schedule: Schedule, df: Dataflow) -> None:
    """The per-worker orders admit an execution iff every worker reaches its end when each op runs
    once its producers (the edges of ``df`` but AR -> STEP) are done and, for an AR, once every
    replica of the stage has reached it: Kahn's algorithm over per-worker order edges, the edges and
    the AR rendezvous, in O(ops + edges) (:func:`_run_orders`)."""
    ptr, begin = _run_orders(df), df.ops.begin.tolist()
    stuck = [(w, schedule.ops[w][ptr[w] - begin[w]]) for w in range(schedule.num_workers) if ptr[w] < begin[w + 1]]
    if stuck:
        raise ScheduleError(
            "schedule deadlocks; first ops that can never start: "
            + ", ".join(f"worker {w}: {op}" for w, op in stuck[:4])
        )


def _run_orders(df: Dataflow) -> list[int]:
    """Execute the per-worker orders symbolically: a worker advances while its next op's producers
    are done (an AR waits until all its group's ops are reached, then they all complete). Returns,
    per worker, the id of the first op it could not run (its end when it finished)."""
    N, begin, n = len(df.ops.kind), df.ops.begin.tolist(), len(df.src) - df.ar_steps
    order = np.argsort(df.dst[:n], kind="stable")
    pidx = df.src[:n][order].tolist()
    pptr = np.searchsorted(df.dst[:n][order], np.arange(N + 1)).tolist()
    is_ar = (df.ops.kind == AR).tolist()
    group = {g: members for members in df.ar_groups.values() for g in members}
    done = bytearray(N)
    ptr, end = begin[:-1], begin[1:]
    waiting: dict[int, list[int]] = defaultdict(list)  # op id -> workers waiting for it
    parked: dict[int, list[int]] = defaultdict(list)  # first op of an AR group -> workers at it
    work = deque(range(len(ptr)))
    while work:
        w = work.popleft()
        i, n = ptr[w], end[w]
        while i < n:
            lo, hi = pptr[i], pptr[i + 1]
            while lo < hi and done[pidx[lo]]:
                lo += 1
            if lo < hi:
                waiting[pidx[lo]].append(w)
                break
            if is_ar[i]:
                members = group[i]
                at = parked[members[0]]
                at.append(w)
                if len(at) < len(members):
                    break
                for g in members:
                    done[g] = 1
                for v in parked.pop(members[0]):
                    if v != w:
                        ptr[v] += 1
                        work.append(v)
            done[i] = 1
            if i in waiting:
                work.extend(waiting.pop(i))
            i += 1
        ptr[w] = i
    return ptr


def in_flight_peak(ops: Iterable[Op]) -> int:
    """Most (stage, microbatch, segment) forwarded (F) and not yet backwarded (B, or BW of a split
    backward) along the op order (:func:`~workbench.schedules.dataflow.peak_in_flight`)."""
    return peak_in_flight((op.kind, op.stage, (op.microbatch, op.segment)) for op in ops)

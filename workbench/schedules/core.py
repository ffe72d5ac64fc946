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

Sends and receives are implicit: F(s, b) needs the output of F(s-1, b), B(s, b) the gradient from
B(s+1, b) (or BI(s+1, b)); when the two ops run on different workers a transfer follows.
``weights_worker`` (master-schedule family) names the worker that owns the weights an op uses; a
transfer of weights follows when it differs from the worker running the op.
"""
from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Iterable, Iterator


class OpKind(StrEnum):
    """Op kinds; a ``str`` enum, so ``op.kind == "F"`` and ``str(op.kind) == "F"`` hold."""

    F = "F"
    B = "B"
    BI = "BI"
    BW = "BW"
    AR = "AR"
    STEP = "STEP"


COMPUTE = (OpKind.F, OpKind.B, OpKind.BI, OpKind.BW)
KINDS = COMPUTE + (OpKind.AR, OpKind.STEP)
_COMPUTE_SET = frozenset(COMPUTE)
_F, _B, _BI, _BW = COMPUTE  # keys built from the members hit dict entries by identity (no str compare)
Key = tuple  # (kind, stage, microbatch) of a compute op
UPDATE_RULES = ("sync", "stash", "vertical-sync", "no-stash", "2bw", "async")


_KIND_OF = {**{str(k): k for k in OpKind}, **{k: k for k in OpKind}}


@dataclass(frozen=True)
class Op:
    kind: str
    stage: int
    microbatch: int = -1  # -1 for AR / STEP
    version: int = 0  # weight version read (F/B/BI/BW)
    step: int = -1  # AR / STEP: index of the update of this stage
    weights_worker: int | None = None  # None: the weights live on the worker running the op

    def __post_init__(self):
        if type(self.kind) is not OpKind:  # a plain "F": the enum member (generators pass members)
            kind = _KIND_OF.get(self.kind)
            if kind is None:
                raise ValueError(f"unknown op kind {self.kind!r}; expected one of {[str(k) for k in KINDS]}")
            object.__setattr__(self, "kind", kind)

    def __str__(self) -> str:
        if self.kind in COMPUTE:
            return f"{self.kind}{self.stage}.{self.microbatch}@v{self.version}"
        return f"{self.kind}{self.stage}#{self.step}"


@dataclass(frozen=True)
class Schedule:
    """Per-worker op lists plus what an executor needs to know to run them.

    ``stage_workers[s]``: the workers that hold (a replica of) stage s's weights.
    ``microbatches``: number of distinct microbatch ids (0..microbatches-1) in the schedule.
    ``microbatches_per_step``: how many microbatches' gradients make one update (per replica group).
    ``update``: the weight rule (see module docstring), one of ``UPDATE_RULES``.
    ``max_in_flight[w]``: bound on microbatches forwarded but not yet backwarded on worker w.
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

    def __post_init__(self):
        object.__setattr__(self, "ops", tuple(tuple(o) for o in self.ops))
        if len(self.ops) != self.num_workers:
            raise ValueError(f"{len(self.ops)} op lists for {self.num_workers} workers")
        if self.update not in UPDATE_RULES:
            raise ValueError(f"unknown update rule {self.update!r}; expected one of {UPDATE_RULES}")

    # ---- lookups ---------------------------------------------------------------------
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
        return {(op.kind, op.stage, op.microbatch): w for w, ops in enumerate(self.ops) for op in ops
                if op.kind in _COMPUTE_SET}

    def dependencies(self) -> dict[Key, tuple[Key, ...]]:
        """The dataflow edges of the schedule, derived once (cached) and read by the validator's
        deadlock check, the simulator and the runtime's receive plan: compute-op key ->
        the keys of the compute ops it consumes (a key may name an op no worker runs; the
        validator reports it):

        * ``F(s, b)`` <- ``F(s-1, b)`` (the activation; none for s = 0);
        * ``B(s, b)`` / ``BI(s, b)`` <- ``F(s, b)`` (its own stashed activations) and, for
          s < S-1, the gradient from ``BI(s+1, b)`` when stage s+1 splits its backward, else
          ``B(s+1, b)``;
        * ``BW(s, b)`` <- ``BI(s, b)``.

        Remote-weight edges of the master family (an op waits for the owner's STEP) are not
        dataflow between compute ops and are derived by the deadlock check and the simulator."""
        return self._dependencies

    @cached_property
    def _dependencies(self) -> dict[Key, tuple[Key, ...]]:
        where = self._where
        last = self.num_stages - 1
        deps: dict[Key, tuple[Key, ...]] = {}
        for key in where:
            kind, s, b = key
            if kind is _F:
                deps[key] = ((_F, s - 1, b),) if s > 0 else ()
            elif kind is _BW:
                deps[key] = ((_BI, s, b),)
            elif s < last:
                nxt = (_BI, s + 1, b) if (_BI, s + 1, b) in where else (_B, s + 1, b)
                deps[key] = ((_F, s, b), nxt)
            else:
                deps[key] = ((_F, s, b),)
        return deps

    def remote_inputs(self, worker: int) -> list[tuple[int, Key, int]]:
        """``(op index on worker, producer key, producer worker)`` for every activation or
        gradient that ``worker`` receives from another worker, in its op order (the runtime's
        receive plan). From :meth:`dependencies`; a producer of the op's own stage (its forward,
        BI before BW) never crosses workers in a valid schedule."""
        where, deps, out = self._where, self._dependencies, []
        for i, op in enumerate(self.ops[worker]):
            if op.kind not in _COMPUTE_SET:
                continue
            for dep in deps[(op.kind, op.stage, op.microbatch)]:
                src = where.get(dep, worker)
                if dep[1] != op.stage and src != worker:
                    out.append((i, dep, src))
        return out

    def op_at(self, kind: str, stage: int, microbatch: int) -> tuple[int, Op]:
        for w, op in self:
            if (op.kind, op.stage, op.microbatch) == (kind, stage, microbatch):
                return w, op
        raise KeyError((kind, stage, microbatch))

    @property
    def split_backward(self) -> bool:
        return any(op.kind == "BI" for _, op in self)

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
                if op.kind == "STEP":
                    if k == step:
                        break
                    k += 1
                elif op.kind in ("B", "BW") and k == step:
                    out.append(op.microbatch)
        holders = set(self.stage_workers[stage])
        for w, ops in enumerate(self.ops):  # gradients pushed to the owners (master family)
            if w in holders:
                continue
            for op in ops:
                if (op.stage == stage and op.kind in ("B", "BW") and op.version == step
                        and op.weights_worker in workers):
                    out.append(op.microbatch)
        return sorted(out)

    # ---- display ----------------------------------------------------------------------
    def _rows(self) -> list[tuple[str, object, str]]:
        steps = max((op.step + 1 for _, op in self if op.kind == "STEP"), default=0)
        return [("workers", self.num_workers, ""), ("stages", self.num_stages, ""),
                ("microbatches", self.microbatches, ""), ("ops", self.num_ops, ""), ("update", self.update, ""),
                ("updates per stage", steps, ""),
                ("peak in flight", max((in_flight_peak(o) for o in self.ops), default=0), "microbatches")]

    def __repr__(self) -> str:
        from ..display import one_line
        return one_line(f"Schedule[{self.name}]", self._rows())

    def _repr_html_(self) -> str:
        import pandas as pd

        from ..display import card
        table = pd.DataFrame({"ops": [len(o) for o in self.ops],
                              "peak in flight": [in_flight_peak(o) for o in self.ops],
                              "first ops": [" ".join(str(op) for op in o[:8]) + (" …" if len(o) > 8 else "")
                                            for o in self.ops]},
                             index=pd.RangeIndex(self.num_workers, name="worker"))
        return card(f"Schedule {self.name}", self._rows(),
                    label="per-worker op lists (no costs: simulate() gives times); counts from the ops", table=table)

    def describe(self, width: int = 12) -> str:
        """Compact text rendering, one line per worker."""
        lines = [f"{self.name}: {self.num_workers} workers, {self.num_stages} stages, "
                 f"{self.microbatches} microbatches, update={self.update}"]
        for w, ops in enumerate(self.ops):
            lines.append(f"w{w}: " + " ".join(str(o) for o in ops[: width * 4]) + (" ..." if len(ops) > width * 4 else ""))
        return "\n".join(lines)


_new = object.__new__


def make_op(kind: OpKind, stage: int, microbatch: int = -1, version: int = 0, step: int = -1,
            weights_worker: int | None = None) -> Op:
    """``Op(kind, ...)`` without the checks, about 3x faster: for generators that pass an
    :class:`OpKind` member (the result is an ordinary, equal and equally hashed Op)."""
    op = _new(Op)
    d = op.__dict__
    d["kind"], d["stage"], d["microbatch"], d["version"], d["step"], d["weights_worker"] = \
        kind, stage, microbatch, version, step, weights_worker
    return op


def producers(schedule: Schedule, w: int, op: Op, index: dict | None = None) -> list[Key]:
    """Compute-op keys (kind, stage, microbatch) that ``op`` (a compute op) must wait for: a thin
    wrapper over :meth:`Schedule.dependencies` (``w`` and ``index`` are ignored; kept for callers)."""
    return list(schedule.dependencies()[(op.kind, op.stage, op.microbatch)])


class ScheduleError(ValueError):
    pass


def validate(schedule: Schedule) -> None:
    """Raise :class:`ScheduleError` unless the schedule is executable.

    Checks: every op well-formed; every F has exactly one backward (B, or BI and BW) on the
    worker that ran the F (it holds the stashed activations); every dependency exists; the
    per-worker orders admit an execution without deadlock (a topological order of the union of
    per-worker order edges and dataflow edges exists); per-worker in-flight limits hold; stash
    rules: B reads its F's version under ``stash`` and ``vertical-sync``.
    """
    S, W, M = schedule.num_stages, schedule.num_workers, schedule.microbatches
    index: dict[Key, int] = {}  # compute key -> worker
    version: dict[Key, int] = {}
    ids: list[list[int]] = []  # per worker, per op: the compute op's number (its place in index), or -1
    compute, limit = _COMPUTE_SET, schedule.max_in_flight
    for w, ops in enumerate(schedule.ops):
        kw, live, peak = [], set(), 0
        for op in ops:
            s, kind = op.stage, op.kind
            if not 0 <= s < S:
                raise ScheduleError(f"worker {w}: {op} has stage outside 0..{S - 1}")
            if kind in compute:
                b = op.microbatch
                if not 0 <= b < M:
                    raise ScheduleError(f"worker {w}: {op} has microbatch outside 0..{M - 1}")
                key = (kind, s, b)
                if key in index:
                    raise ScheduleError(f"{op} appears twice (workers {index[key]} and {w})")
                kw.append(len(index))
                index[key] = w
                version[key] = op.version
                if kind is _F:
                    live.add((s, b))
                    if len(live) > peak:
                        peak = len(live)
                elif kind is _B or kind is _BW:
                    live.discard((s, b))
            else:
                kw.append(-1)
            if op.weights_worker is not None and not 0 <= op.weights_worker < W:
                raise ScheduleError(f"worker {w}: {op} reads weights from unknown worker {op.weights_worker}")
        if limit is not None and peak > limit[w]:
            raise ScheduleError(f"worker {w} holds {peak} microbatches in flight; limit is {limit[w]}")
        ids.append(kw)
    schedule.__dict__.setdefault("_where", index)  # the cached where(): the same mapping
    same_version = schedule.update in ("stash", "vertical-sync", "sync")
    n_forward = 0
    for key, w in index.items():
        kind, s, b = key
        if kind is not _F:
            if (_F, s, b) not in index:
                raise ScheduleError(f"{kind}{s}.{b} has no forward")
            continue
        n_forward += 1
        has_b = (_B, s, b) in index
        has_split = (_BI, s, b) in index and (_BW, s, b) in index
        if has_b == has_split:
            raise ScheduleError(f"F{s}.{b} needs exactly one backward (B, or BI+BW); found "
                                f"{'both' if has_b else 'none'}")
        for k in ((_B,) if has_b else (_BI, _BW)):
            if index[(k, s, b)] != w:
                raise ScheduleError(f"{k}{s}.{b} runs on worker {index[(k, s, b)]} but its forward (and "
                                    f"stashed activations) is on worker {w}")
            if same_version and version[(k, s, b)] != version[key]:
                raise ScheduleError(f"{k}{s}.{b} reads weight version {version[(k, s, b)]} but its "
                                    f"forward read {version[key]} (rule {schedule.update!r})")
    if n_forward != S * M:  # every microbatch goes through every stage
        for s in range(S):
            for b in range(M):
                if (_F, s, b) not in index:
                    raise ScheduleError(f"microbatch {b} never runs the forward of stage {s}")
    _check_deadlock(schedule, index, ids)


def _check_deadlock(schedule: Schedule, index: dict, ids: list[list[int]]) -> None:
    """Execute the per-worker orders symbolically: a worker advances while its next op is ready
    (a compute op once its producers are done, STEP at once, AR once every holder of the stage has
    reached it). The orders admit an execution iff every worker reaches its end; this is Kahn's
    algorithm over per-worker order edges + dataflow edges + AR rendezvous, in O(ops). Compute ops
    are numbered (ids into flat arrays) so the inner loop does no tuple hashing.

    Remote weights (``weights_worker`` o != the op's worker): an op reading version v >= 1 of stage
    s waits for o's STEP that creates v (its ``step`` v-1); o's AR/STEP of step t waits for every
    backward that pushes a version-t gradient of s to o (B/BW on a worker not holding s)."""
    ops = schedule.ops
    edges = schedule.dependencies()
    kid = dict(zip(index, range(len(index))))  # compute key -> id (its place in index, as in ids)
    deps = []
    for key in index:
        try:
            deps.append([kid[dep] for dep in edges[key]])
        except KeyError as e:
            dep = e.args[0]
            raise ScheduleError(f"{key[0]}{key[1]}.{key[2]} on worker {index[key]} depends on "
                                f"{dep[0]}{dep[1]}.{dep[2]}, which no worker runs") from None
    ar_count: dict[tuple[int, int], list[int]] = defaultdict(list)
    holders = [set(ws) for ws in schedule.stage_workers]
    extra: dict[tuple[int, int], tuple] = {}  # (worker, op index) -> remote-weight waits of a compute op
    pushes: dict[tuple[int, int, int], list] = defaultdict(list)  # (stage, step, owner) -> pushing op ids
    for w, wops in enumerate(ops):
        for i, op in enumerate(wops):
            if op.kind == "AR":
                ar_count[(op.stage, op.step)].append(w)
            o = op.weights_worker
            if o is not None and o != w and ids[w][i] >= 0:
                if op.version >= 1:
                    extra[(w, i)] = (("STEP", op.stage, op.version - 1, o),)
                if op.kind in ("B", "BW") and w not in holders[op.stage]:
                    pushes[(op.stage, op.version, o)].append(ids[w][i])
    for (s, step), members in ar_count.items():
        expect = sorted(schedule.stage_workers[s])
        if sorted(members) != expect:
            raise ScheduleError(f"AR of stage {s} step {step} has workers {sorted(members)}, expected {expect}")
    done = bytearray(len(kid))
    steps_done: set = set()
    ptr = [0] * len(ops)
    waiting: dict = defaultdict(list)  # compute id or STEP key -> workers waiting for it
    parked: dict = defaultdict(list)
    work = deque(range(len(ops)))
    while work:
        w = work.popleft()
        wops, kw, i, n = ops[w], ids[w], ptr[w], len(ops[w])
        while i < n:
            k = kw[i]
            if k >= 0:
                blocked = -1
                for d in deps[k]:
                    if not done[d]:
                        blocked = d
                        break
                if blocked < 0 and extra:
                    blocked = next((t for t in extra.get((w, i), ()) if t not in steps_done), -1)
                if blocked != -1:
                    waiting[blocked].append(w)
                    break
                done[k] = 1
                if k in waiting:
                    work.extend(waiting.pop(k))
                i += 1
                continue
            op = wops[i]
            if pushes and (blocked := next((d for d in pushes.get((op.stage, op.step, w), ()) if not done[d]), -1)) >= 0:
                waiting[blocked].append(w)
                break
            if op.kind == "STEP":
                key = ("STEP", op.stage, op.step, w)
                steps_done.add(key)
                work.extend(waiting.pop(key, ()))
            elif op.kind == "AR":
                g = (op.stage, op.step)
                parked[g].append(w)
                if len(parked[g]) < len(schedule.stage_workers[op.stage]):
                    break
                for v in parked.pop(g):
                    if v != w:
                        ptr[v] += 1
                        work.append(v)
            i += 1
        ptr[w] = i
    stuck = [(w, ops[w][ptr[w]]) for w in range(len(ops)) if ptr[w] < len(ops[w])]
    if stuck:
        raise ScheduleError("schedule deadlocks; first ops that can never start: "
                            + ", ".join(f"worker {w}: {op}" for w, op in stuck[:4]))


def in_flight_peak(ops: Iterable[Op]) -> int:
    """Most (stage, microbatch) pairs forwarded (F) and not yet backwarded (B, or BW of a split
    backward) along the op order."""
    live, peak = set(), 0
    for op in ops:
        kind = op.kind
        if kind == "F":
            live.add((op.stage, op.microbatch))
            if len(live) > peak:
                peak = len(live)
        elif kind == "B" or kind == "BW":
            live.discard((op.stage, op.microbatch))
    return peak

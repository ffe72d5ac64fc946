"""The runtime's communication plan: every message that crosses ranks, and the communicators.

**The plan** (:func:`messages`, :class:`RankComm`, :func:`p2p_channel`). Every activation or
gradient that crosses ranks is one :class:`Message`, derived once from the schedule's dataflow
(:meth:`~workbench.schedules.core.Schedule.remote_inputs`: the receiver's op, the producer's op and
worker): the receiver posts it for its op ``recv_op``, the sender sends it after its op ``send_op``,
on the communicator :func:`p2p_channel` names. The executors read their receive plans and the
destination of every send from :class:`RankComm` (:mod:`~workbench.runtime.executors.pipeline`,
:mod:`~workbench.runtime.executors.segment_executor`).

**The communicators** (:func:`channels`: the process groups; :func:`communicators`: every
point-to-point pair and collective group in one order for all ranks, the order the warm-up creates
them in, :func:`~workbench.runtime.transport.comm.warm_up`). Whether the executors' real calls
respect NCCL's rules is checked on their recorded calls (:mod:`~workbench.runtime.transport.dry_run`,
:mod:`~workbench.runtime.transport.nccl_model`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

from workbench.runtime.executors.fetch import has_remote, is_remote, remote_channel, remote_channels
from workbench.schedules.core import Schedule

ACT, GRAD = 0, 1
_COMPUTE = ("F", "B", "BI", "BW")


@dataclass(frozen=True)
class Message:
    """One activation (``kind`` 0, out of stage ``boundary``) or gradient (``kind`` 1, into stage
    ``boundary`` from the backward of ``boundary + 1``) of ``unit`` (microbatch, or microbatch x
    segments + segment), sent by ``src`` after its op ``send_op`` and received by ``dst`` for its op
    ``recv_op`` (op indices in the workers' op lists)."""

    kind: int
    boundary: int
    unit: int
    src: int
    dst: int
    send_op: int
    recv_op: int

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.kind, self.boundary, self.unit)


def messages(schedule: Schedule) -> list[Message]:
    """Every message of one pass of ``schedule`` that crosses workers, receiver by receiver in the
    receiver's op order (the one derivation the runtime and the check share)."""
    index = {
        (op.kind, op.stage, schedule.unit(op)): i
        for ops in schedule.ops
        for i, op in enumerate(ops)
        if op.kind in _COMPUTE
    }
    out = []
    for w, ops in enumerate(schedule.ops):
        for i, dep, src in schedule.remote_inputs(w):
            s = ops[i].stage
            kind, boundary = (ACT, dep[1]) if dep[1] < s else (GRAD, s)
            out.append(Message(kind, boundary, dep[2], src, w, index[dep], i))
    return out


def p2p_channel(kind: int, src: int, dst: int) -> str:
    """The communicator of a message: one per kind (activation, gradient) and ordered pair of ranks,
    a process group of the two (``"act:0>1"``). On each, messages go one way, in the sender's op
    order, whatever stream layout NCCL gives a communicator's peers: interleaved, V-shaped and
    bidirectional schedules send both ways between a pair, and a rank in the middle of a pipeline
    receives from one neighbour what it sends to the other."""
    return f"{'act' if kind == ACT else 'grad'}:{src}>{dst}"


def channels(schedules: Sequence[Schedule]) -> list[tuple[str, tuple[int, ...]]]:
    """The communicators of a run of ``schedules`` (the job's, and its stream's) as ``(name, ranks)``,
    in one order for all ranks (each creates every group): :func:`p2p_channel` of every pair that
    exchanges a message, and with remote weights two per stage and direction over all ranks
    (:func:`~workbench.runtime.executors.fetch.remote_channel`)."""
    pairs = sorted({(m.kind, m.src, m.dst) for sched in schedules for m in messages(sched)})
    out: list[tuple[str, tuple[int, ...]]] = [(p2p_channel(k, a, b), (min(a, b), max(a, b))) for k, a, b in pairs]
    for sched in schedules[:1]:
        if has_remote(sched):
            out += [(name, tuple(range(sched.num_workers))) for name in remote_channels(sched)]
    return out


@dataclass(frozen=True)
class Communicator:
    """One communicator the runtime uses: ``key`` names its process group in the runtime's groups
    (:func:`channels`' names, a stage's replica set, ``("tied", i, rank)``); ``ranks``: the pair
    ``(sender, receiver)`` of a point-to-point one (``p2p``), the members of a collective one."""

    key: Hashable
    ranks: tuple[int, ...]
    p2p: bool


def _remote_pairs(schedule: Schedule) -> set[tuple[str, int, int]]:
    """(communicator, sender, receiver) of every weight fetch and gradient push of ``schedule``."""
    holders = [set(ws) for ws in schedule.stage_workers]
    out = set()
    for w, ops in enumerate(schedule.ops):
        for op in ops:
            if not is_remote(op, w):
                continue
            owner = op.weights_worker
            assert owner is not None  # is_remote: the op reads another worker's weights
            out.add((remote_channel("fetch", op.stage, owner, w), owner, w))
            if op.kind in ("B", "BW") and w not in holders[op.stage]:
                out.add((remote_channel("push", op.stage, w, owner), w, owner))
    return out


def communicators(schedules: Sequence[Schedule]) -> list[Communicator]:
    """Every communicator a run of ``schedules`` uses, in one order for all ranks: the pairs of
    :func:`p2p_channel`, the pairs of the master family's fetches and pushes (each pair of a process
    group has a communicator of its own under NCCL), then the stages' replica sets (their all-reduce).

    torch creates a pair's NCCL communicator lazily at the pair's first point-to-point operation and
    a group's at its first collective, blocking the host until every member gets there: ranks that
    meet their communicators in different orders wait for each other forever. Created in this one
    order (the warm-up, :func:`~workbench.runtime.transport.comm.warm_up`), every creation's members
    reach it: the first creation not yet done has all its members waiting at it."""
    pairs = sorted({(m.kind, m.src, m.dst) for sched in schedules for m in messages(sched)})
    out = [Communicator(p2p_channel(k, a, b), (a, b), True) for k, a, b in pairs]
    for sched in schedules[:1]:
        if has_remote(sched):
            out += [Communicator(name, (a, b), True) for name, a, b in sorted(_remote_pairs(sched))]
        sets = sorted({tuple(ws) for ws in sched.stage_workers if len(ws) > 1})
        out += [Communicator(ws, ws, False) for ws in sets]
    return out


def group_of(groups: dict, name: Hashable):
    """The process group of communicator ``name``; None (the default group) when ``groups`` is
    empty (a transport used without the runtime's groups, as in unit tests). A missing name is an
    error: its messages would share the default group with others."""
    if not groups:
        return None
    try:
        return groups[name]
    except KeyError:
        raise RuntimeError(f"no process group for communicator {name!r} (comm_plan.channels did not list it)") from None


class RankComm:
    """One rank's part of :func:`messages`: ``recvs`` in consumption order (the receive plan) and
    ``sends[i]``, the messages its op ``i`` sends, each with the destination and communicator."""

    def __init__(self, schedule: Schedule, rank: int, msgs: Sequence[Message] | None = None):
        msgs = messages(schedule) if msgs is None else msgs
        self.rank = rank
        self.recvs = sorted((m for m in msgs if m.dst == rank), key=lambda m: m.recv_op)
        self.sends: dict[int, list[Message]] = defaultdict(list)
        for m in sorted((m for m in msgs if m.src == rank), key=lambda m: (m.send_op, m.dst, m.recv_op)):
            self.sends[m.send_op].append(m)

    def dst(self, i: int, kind: int) -> int:
        """Where op ``i``'s message of ``kind`` goes (this rank: the local mailbox)."""
        for m in self.sends.get(i, ()):
            if m.kind == kind:
                return m.dst
        return self.rank


def ddp_order_problems(schedule: Schedule) -> list[str]:
    """DistributedDataParallel all-reduces a stage's gradient inside the backward of the update's last
    microbatch of the stage: every rank must run those backwards in the same order (the ``dp-bsp``
    executor, :mod:`~workbench.runtime.executors.ddp`)."""
    orders = []
    for ops in schedule.ops:
        seq = [(op.kind, op.stage) for op in ops if op.kind in ("B", "STEP")]
        orders.append(seq)
    return [
        f"rank {r} runs its backwards and updates in another order than rank 0"
        for r, seq in enumerate(orders)
        if seq != orders[0]
    ]


__all__ = [
    "ACT",
    "GRAD",
    "Communicator",
    "Message",
    "RankComm",
    "channels",
    "communicators",
    "ddp_order_problems",
    "group_of",
    "messages",
    "p2p_channel",
]

"""The runtime's communication plan, and NCCL's rules checked against it on CPU.

**The plan** (:func:`messages`, :class:`RankComm`, :func:`p2p_channel`). Every activation or
gradient that crosses ranks is one :class:`Message`, derived once from the schedule's dataflow
(:meth:`~workbench.schedules.core.Schedule.remote_inputs`: the receiver's op, the producer's op and
worker): the receiver posts it for its op ``recv_op``, the sender sends it after its op ``send_op``,
on the communicator :func:`p2p_channel` names. The executors read their receive plans and the
destination of every send from :class:`RankComm` (:mod:`~workbench.runtime.executors.pipeline`, :mod:`~workbench.runtime.executors.segment_executor`), and
:func:`rank_program` lays out the same plan, plus the collectives (replicas' all-reduce, tied
weights' all-reduce, the master family's weight fetches and gradient pushes of :mod:`~workbench.runtime.executors.fetch`,
the epoch-end gather), in the order a rank issues them.

**NCCL's rules** (:func:`check_nccl`). On GPUs, point-to-point operations between two ranks on one
communicator are matched by the order in which they are issued (tags are ignored); each
communicator runs its operations on one stream, in issue order; a send does not complete until the
peer's matching receive runs (true of any message larger than NCCL's internal buffer, so assumed of
every message); a collective completes once every rank of its group has reached it; an operation
enqueued after an op's computation waits for it (the communicator's stream waits on the compute
stream), and a computation that waits on a receive or a collective waits for it to complete.
:func:`check_nccl` simulates these semantics on the ranks' programs and reports every receive that
would be matched with another message than the one it expects (its role or its bytes differ),
every collective whose members disagree on what it is, and every rank that would wait forever.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from workbench.runtime.executors.fetch import (
    FETCH_AHEAD,
    RemotePlan,
    has_remote,
    is_remote,
    remote_channel,
    remote_channels,
)
from workbench.runtime.semantics.reference import updates_per_round
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


def group_of(groups: dict, name: str):
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


# ---- the ranks' programs ------------------------------------------------------------------------
@dataclass
class Event:
    """One thing a rank issues. ``what``: ``"compute"`` (op ``op``), ``"send"`` / ``"recv"``
    (point-to-point on ``channel`` with ``peer``), ``"coll"`` (a collective of ``group``). ``label``:
    what the operation carries (compared between the two ends, or across a collective's members);
    ``nbytes`` its size. ``waits``: events a compute event waits for (receives, collectives)."""

    what: str
    rank: int
    channel: Hashable = None
    peer: int = -1
    label: Hashable = None
    nbytes: int = 0
    op: int = -1
    waits: list[int] = field(default_factory=list)
    after: int = 0  # compute events issued before this one (a stream waits for them)
    id: int = -1


def _spec_bytes(spec) -> int:
    return sum(int(b) for b in spec)


def default_specs(schedule: Schedule) -> list[list[int]]:
    """Made-up stage outputs for the check: stage ``s`` sends one tensor of ``1000 + s`` bytes, so a
    message matched with another boundary's shows in its size as well as its label."""
    return [[1000 + s] for s in range(schedule.num_stages)]


def rank_program(
    schedule: Schedule,
    rank: int,
    *,
    msgs: Sequence[Message] | None = None,
    specs: Sequence[Sequence[int]] | None = None,
    ties: Sequence[tuple[Sequence[int], Sequence[tuple[int, ...]]]] = (),
    epoch_end: bool = True,
) -> list[Event]:
    """The operations ``rank`` issues in one pass of ``schedule``, in the runtime's order (receives
    posted when their op needs them, as the runtime does with NCCL; sends after the op's
    computation): point-to-point messages of :class:`RankComm`, the AR ops' all-reduce among the
    stage's replicas, the tied weights' all-reduce at the first local owner's STEP (``ties[i]``:
    the owning stages and the combine's rank sets, :func:`workbench.runtime.executors.tied.combine_ranks`),
    the master family's fetches and pushes (:class:`~workbench.runtime.executors.fetch.RemotePlan`), and
    the epoch end's gather.
    ``specs[s]``: the byte sizes of stage ``s``'s output tensors (the gradient a backward sends has
    its input's). ``epoch_end``: the pass ends the epoch (its gather follows)."""
    comm = RankComm(schedule, rank, msgs)
    recvs_at: dict[int, list[Message]] = defaultdict(list)
    for m in comm.recvs:
        recvs_at[m.recv_op].append(m)
    specs = default_specs(schedule) if specs is None else specs
    ops = schedule.ops[rank]
    ev: list[Event] = []
    computes = 0

    def add(e: Event) -> int:
        e.after, e.id = computes, len(ev)
        ev.append(e)
        return e.id

    def p2p(m: Message, send: bool) -> int:
        # the sender's view of the bytes: what its op produced; the receiver's: what it posted
        if send:
            s = schedule.ops[m.src][m.send_op].stage
            spec = specs[s] if m.kind == ACT else specs[s - 1]
        else:
            spec = specs[m.boundary]
        return add(
            Event(
                "send" if send else "recv",
                rank,
                p2p_channel(m.kind, m.src, m.dst),
                m.dst if send else m.src,
                m.key,
                _spec_bytes(spec),
            )
        )

    remote = RemotePlan(schedule, rank) if has_remote(schedule) else None
    per_round = updates_per_round(schedule)
    fetch_recv: dict[tuple[int, int], int] = {}
    push_recv: dict[tuple[int, int], list[int]] = {}
    collected: set = set()
    next_fetch = 0

    def weights_bytes(s: int) -> int:
        return 4000 + s  # made up, one per stage: a fetch matched with another stage's shows

    def fetch_sends(s: int, v: int) -> None:
        assert remote is not None
        for c, b in remote.sends.get((s, v), ()):
            add(Event("send", rank, remote_channel("fetch", s, rank, c), c, ("weights", s, b), weights_bytes(s)))

    def post_fetch() -> None:
        nonlocal next_fetch
        assert remote is not None
        s, b, _, owner = remote.fetches[next_fetch]
        assert owner is not None, "a remote op names its weights' owner"
        fetch_recv[(s, b)] = add(
            Event("recv", rank, remote_channel("fetch", s, owner, rank), owner, ("weights", s, b), weights_bytes(s))
        )
        next_fetch += 1

    def prefetch() -> None:  # RemoteWeights._prefetch: FETCH_AHEAD receives kept posted
        while remote is not None and next_fetch < len(remote.fetches) and len(fetch_recv) < FETCH_AHEAD:
            post_fetch()

    if remote is not None:  # begin_round: push receives, version 0 of the held stages, the first fetches
        for (s, t), consumers in remote.pushes_in.items():
            push_recv[(s, t)] = [
                add(Event("recv", rank, remote_channel("push", s, c, rank), c, ("push", s, t), weights_bytes(s)))
                for c in consumers
            ]
        for s in sorted({op.stage for op in ops}):
            if rank in schedule.stage_workers[s]:
                fetch_sends(s, 0)
        prefetch()
    tie_of = {s: t for t, (stages, _) in enumerate(ties) for s in stages}
    tie_members = {t: ranks for t, (_, sets) in enumerate(ties) for ranks in sets if rank in ranks}
    tie_done: set = set()
    push_at = {i: key for key, i in remote.push_last.items()} if remote is not None else {}
    for i, op in enumerate(ops):
        waits: list[int] = []
        if op.kind in _COMPUTE:
            waits += [p2p(m, False) for m in recvs_at.get(i, ())]
            if remote is not None and op.kind == "F" and is_remote(op, rank):  # RemoteWeights.fetch
                while (op.stage, op.microbatch) not in fetch_recv and next_fetch < len(remote.fetches):
                    post_fetch()
                waits.append(fetch_recv.pop((op.stage, op.microbatch)))
                prefetch()
        else:
            if remote is not None and (op.stage, op.step) not in collected:
                collected.add((op.stage, op.step))
                waits += push_recv.pop((op.stage, op.step), [])
            if op.kind == "STEP" and op.stage in tie_of:
                t = tie_of[op.stage]
                if (t, op.step) not in tie_done:
                    tie_done.add((t, op.step))
                    members = tie_members.get(t, (rank,))
                    if len(members) > 1:
                        waits.append(add(Event("coll", rank, ("tied", members), label=("tied", t, op.step))))
            if op.kind == "AR" and len(schedule.stage_workers[op.stage]) > 1:
                group = tuple(schedule.stage_workers[op.stage])
                waits.append(add(Event("coll", rank, ("stage", group), label=("AR", op.stage, op.step))))
        add(Event("compute", rank, op=i, waits=waits))
        computes += 1
        if i in push_at:
            s, t, owner = push_at[i]
            assert owner is not None, "a remote op names its weights' owner"
            add(Event("send", rank, remote_channel("push", s, rank, owner), owner, ("push", s, t), weights_bytes(s)))
        for m in comm.sends.get(i, ()):
            p2p(m, True)
        if op.kind == "STEP" and remote is not None and op.step + 1 < per_round[op.stage]:
            fetch_sends(op.stage, op.step + 1)
    if epoch_end:
        add(Event("coll", rank, ("world",), label=("gather",)))
    return ev


def _passes(schedule: Schedule, rank: int, rounds: int, **kw) -> list[Event]:
    """``rounds`` passes of ``rank``'s program one after the other (an epoch of ``rounds``
    minibatches); labels carry the pass."""
    out: list[Event] = []
    computes = 0
    for k in range(rounds):
        prog = rank_program(schedule, rank, epoch_end=k == rounds - 1, **kw)
        base = len(out)
        for e in prog:
            out.append(
                dataclasses.replace(
                    e,
                    label=(k, e.label),
                    id=e.id + base,
                    after=e.after + computes,
                    waits=[w + base for w in e.waits],
                )
            )
        computes += sum(1 for e in prog if e.what == "compute")
    return out


# ---- NCCL's semantics ---------------------------------------------------------------------------
def simulate(programs: Sequence[Sequence[Event]], *, per_pair: bool = True) -> list[str]:
    """Run the ranks' programs under NCCL's rules (module docstring); the problems found, each one
    line: a receive matched with a different message, a collective whose members disagree, ranks
    waiting forever (then the first operation each stuck rank waits on). ``per_pair``: a
    communicator's point-to-point operations with each peer run on their own stream (torch creates
    a communicator per pair of ranks for them); ``False``: on one stream per communicator, all
    peers together (stricter: also the order across peers must agree)."""
    problems: list[str] = []
    streams: dict[tuple, list[Event]] = defaultdict(list)  # (rank, channel[, pair]) -> its operations
    compute: list[list[Event]] = []
    for r, prog in enumerate(programs):
        compute.append([x for x in prog if x.what == "compute"])
        for x in prog:
            if x.what in ("send", "recv"):
                pair = (min(r, x.peer), max(r, x.peer)) if per_pair else (-1, -1)
                streams[(r, x.channel, *pair)].append(x)
            elif x.what == "coll":
                streams[(r, x.channel)].append(x)
    members: dict[Hashable, list[int]] = {}
    for key in streams:
        if len(key) == 2:
            members.setdefault(key[1], []).append(key[0])
    head = dict.fromkeys(streams, 0)
    done_compute = [0] * len(programs)
    done: dict[tuple[int, int], bool] = {}

    def is_done(r: int, eid: int) -> bool:
        return done.get((r, eid), False)

    def ready(key) -> Event | None:
        q, h = streams[key], head[key]
        if h >= len(q):
            return None
        e = q[h]
        return e if done_compute[e.rank] >= e.after else None

    progress = True
    while progress:
        progress = False
        for r, cs in enumerate(compute):
            while done_compute[r] < len(cs) and all(is_done(r, w) for w in cs[done_compute[r]].waits):
                done_compute[r] += 1
                progress = True
        for key in list(streams):
            e = ready(key)
            if e is None:
                continue
            if len(key) == 4:
                r, ch, _, _ = key
                peer_key = (e.peer, ch, key[2], key[3])
                f = ready(peer_key) if peer_key in streams else None
                if f is None or f.peer != r or {e.what, f.what} != {"send", "recv"}:
                    continue
                if e.label != f.label or e.nbytes != f.nbytes:
                    snd, rcv = (e, f) if e.what == "send" else (f, e)
                    problems.append(
                        f"on {ch}, rank {rcv.rank}'s receive of {rcv.label} ({rcv.nbytes} B) from rank {snd.rank} "
                        f"is matched with its send of {snd.label} ({snd.nbytes} B)"
                    )
                done[(e.rank, e.id)] = done[(f.rank, f.id)] = True
                head[key] += 1
                head[peer_key] += 1
                progress = True
            else:
                ch = key[1]
                group = members[ch]
                heads = [ready((m, ch)) for m in group]
                if any(h is None for h in heads):
                    continue
                labels = {h.label for h in heads if h is not None}
                if len(labels) > 1:
                    problems.append(
                        f"collective on {ch}: ranks {group} issue different ones: {sorted(map(str, labels))}"
                    )
                for m, h in zip(group, heads):
                    assert h is not None
                    done[(m, h.id)] = True
                    head[(m, ch)] += 1
                progress = True
    stuck = []
    for r, cs in enumerate(compute):
        pending = [q[head[k]] for k, q in streams.items() if k[0] == r and head[k] < len(q)]
        if done_compute[r] < len(cs) or pending:
            what = f"op {cs[done_compute[r]].op}" if done_compute[r] < len(cs) else "the end of the epoch (its sends)"
            first = [
                f"{e.what} {e.label} {'with rank ' + str(e.peer) if e.peer >= 0 else 'on ' + str(e.channel)}"
                for e in pending[:2]
            ]
            stuck.append(f"rank {r} at {what}, its streams waiting on {'; '.join(first) or 'nothing'}")
    if stuck:
        problems.append("deadlock: " + " | ".join(stuck))
    return problems


def check_nccl(
    schedule: Schedule,
    *,
    specs: Sequence[Sequence[int]] | None = None,
    ties: Sequence[tuple[tuple[int, ...], list[tuple[int, ...]]]] = (),
    programs: Sequence[Sequence[Event]] | None = None,
    per_pair: bool = True,
    rounds: int = 2,
) -> list[str]:
    """The problems NCCL would meet in an epoch of ``rounds`` passes of ``schedule`` on the runtime
    (module docstring): ``[]`` when every receive matches the message it expects, every collective
    is issued in one order by its group, and no rank waits forever. ``ties``: weights tied across
    stages as ``(owning stages, combine rank sets)``; ``programs``: the ranks' programs (default:
    :func:`rank_program`, ``rounds`` times over; a test passes altered ones); ``per_pair``: see
    :func:`simulate`."""
    if rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    if programs is None:
        msgs = messages(schedule)
        programs = [
            _passes(schedule, r, rounds, msgs=msgs, specs=specs, ties=ties) for r in range(schedule.num_workers)
        ]
    return simulate(programs, per_pair=per_pair)


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
    "Event",
    "Message",
    "RankComm",
    "check_nccl",
    "ddp_order_problems",
    "default_specs",
    "group_of",
    "messages",
    "channels",
    "p2p_channel",
    "remote_channel",
    "rank_program",
    "simulate",
]

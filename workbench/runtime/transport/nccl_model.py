"""NCCL's rules, and torch's host-side ones, run on the ranks' recorded calls.

The input is what every rank issued (:class:`~workbench.runtime.transport.trace.Call` lists, in
order: :mod:`~workbench.runtime.transport.dry_run` records them from the real executors). The model:

* **Streams.** A communicator runs its operations on one stream, in issue order. Point-to-point
  operations of two ranks on one communicator are matched by that order (tags are ignored): the
  heads of both ranks' streams must be a send and a receive naming each other. A send does not
  complete before its receive runs (true of any message larger than NCCL's internal buffer, so
  assumed of every message). A collective completes once every member's stream has it at its head.
  torch gives a process group's point-to-point operations one communicator per pair of ranks
  (``per_pair``; ``False``: one stream for all peers of a group, stricter).
* **Lazy, blocking creation** (torch's ``ProcessGroupNCCL``). A pair's communicator is created at
  the first point-to-point operation between the two in that group, a group's collective
  communicator at its first collective; creation blocks the host until every member reaches the
  creation of the same communicator. Two ranks that create two communicators in opposite orders
  wait for each other forever.
* **Host-blocking waits.** ``Work.wait(timeout)`` blocks the host thread until the work completes
  (torch polls it when a timeout is given; the runtime passes one to every wait). A wait without
  timeout is modeled the same way: stricter than a stream wait, so no deadlock is missed.
* **Group creation.** ``new_group`` is entered by every rank in one order; the members must agree.

:func:`check_nccl` reports every receive matched with another message than the one posted (tag or
bytes differ; the dry run gives every message its own tag), every collective whose members disagree
on what it is, every creation whose members disagree, and, when nothing can move, every rank that
waits forever with what it waits on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from workbench.runtime.transport.trace import Call

P2P = ("send", "recv")


class NcclModel:
    """The state of one run of the model over the ranks' ``traces`` (module docstring)."""

    def __init__(self, traces: Sequence[Sequence[Call]], *, per_pair: bool = True):
        self.traces, self.per_pair = traces, per_pair
        self.pc = [0] * len(traces)
        self.created: set[tuple] = set()
        self.streams: dict[tuple, deque[Call]] = {}
        self.done: set[tuple[int, int]] = set()
        self.problems: list[str] = []
        self.issued = [{c.work: c for c in t if c.what != "wait"} for t in traces]

    def key(self, r: int, c: Call) -> tuple:
        """The communicator torch creates for call ``c`` of rank ``r``: (group, pair) for a
        point-to-point call, (group, "coll") for a collective."""
        return (c.group, *sorted((r, c.peer))) if c.what in P2P else (c.group, "coll")

    def stream(self, r: int, c: Call) -> tuple:
        """The stream call ``c`` of rank ``r`` joins: its communicator's, or with ``per_pair=False``
        one for all point-to-point calls of its group."""
        return (c.group, "p2p") if c.what in P2P and not self.per_pair else self.key(r, c)

    @staticmethod
    def members(key: tuple, c: Call) -> tuple[int, ...]:
        return c.ranks if key[1] == "coll" else key[1:]

    def current(self, r: int) -> Call | None:
        return self.traces[r][self.pc[r]] if self.pc[r] < len(self.traces[r]) else None

    def wants(self, r: int) -> tuple | None:
        """The communicator rank ``r``'s host is creating (None: it is not at a creation)."""
        c = self.current(r)
        if c is None or c.what not in (*P2P, "coll"):
            return None
        k = self.key(r, c)
        return None if k in self.created else k

    def step_host(self, r: int) -> bool:
        """Issue rank ``r``'s calls until its host blocks; whether it moved."""
        moved = False
        while (c := self.current(r)) is not None:
            if c.what == "wait":
                if (r, c.work) not in self.done:
                    return moved
            elif c.what in (*P2P, "coll"):
                k = self.key(r, c)
                if k not in self.created:
                    group = self.members(k, c)
                    if not all(self.wants(m) == k for m in group):
                        return moved
                    self.created.add(k)
                self.streams.setdefault((r, self.stream(r, c)), deque()).append(c)
            else:  # a group creation: every rank at once
                return moved
            self.pc[r] += 1
            moved = True
        return moved

    def step_groups(self) -> bool:
        """Every rank at a ``new_group``: the next group is created (members compared)."""
        calls = [self.current(r) for r in range(len(self.traces))]
        if not calls or any(c is None or c.what != "group" for c in calls):
            return False
        if len({c.op for c in calls if c is not None}) > 1:
            self.problems.append(f"new_group: the ranks create different groups: {[c.op for c in calls if c]}")
        self.pc = [p + 1 for p in self.pc]
        return True

    def step_p2p(self, r: int, k: tuple, e: Call) -> bool:
        f_queue = self.streams.get((e.peer, k))
        f = f_queue[0] if f_queue else None
        if f is None or f.what not in P2P or f.peer != r or f.what == e.what:
            return False
        snd, rcv = (e, f) if e.what == "send" else (f, e)
        receiver, sender = (e.peer, r) if e.what == "send" else (r, e.peer)
        if (snd.tag, snd.nbytes) != (rcv.tag, rcv.nbytes):
            self.problems.append(
                f"on {e.group}, rank {receiver}'s receive of tag {rcv.tag} ({rcv.nbytes} B) from rank {sender} "
                f"is matched with its send of tag {snd.tag} ({snd.nbytes} B)"
            )
        for rank, call in ((r, e), (e.peer, f)):
            self.streams[(rank, k)].popleft()
            self.done.add((rank, call.work))
        return True

    def step_coll(self, k: tuple, e: Call) -> bool:
        heads = []
        for m in e.ranks:
            q = self.streams.get((m, k))
            if not q or q[0].what != "coll":
                return False
            heads.append(q[0])
        if len({(h.op, h.nbytes) for h in heads}) > 1:
            self.problems.append(
                f"collective on {e.group}: ranks {list(e.ranks)} issue different ones: "
                f"{sorted({f'{h.op} of {h.nbytes} B' for h in heads})}"
            )
        for m, h in zip(e.ranks, heads):
            self.streams[(m, k)].popleft()
            self.done.add((m, h.work))
        return True

    def step_streams(self) -> bool:
        moved = False
        for (r, k), q in list(self.streams.items()):
            if q and (self.step_p2p(r, k, q[0]) if q[0].what in P2P else self.step_coll(k, q[0])):
                moved = True
        return moved

    def run(self) -> list[str]:
        moved = True
        while moved:
            moved = self.step_groups()
            for r in range(len(self.traces)):
                moved |= self.step_host(r)
            moved |= self.step_streams()
        stuck = [s for r in range(len(self.traces)) if (s := self.stuck(r))]
        if stuck:
            self.problems.append("deadlock: " + " | ".join(stuck))
        return self.problems

    def describe(self, r: int, c: Call) -> str:
        if c.what in P2P:
            way = "to" if c.what == "send" else "from"
            return f"{c.what} of tag {c.tag} ({c.nbytes} B) {way} rank {c.peer} on {c.group}"
        if c.what == "coll":
            return f"{c.op} on {c.group}"
        if c.what == "wait":
            return f"wait for its {self.describe(r, self.issued[r][c.work])}"
        return f"new_group({c.op})"

    def stuck(self, r: int) -> str:
        """What rank ``r`` waits on forever ('' when it finished)."""
        c = self.current(r)
        pending = [q[0] for (m, _), q in self.streams.items() if m == r and q]
        if c is None and not pending:
            return ""
        if c is None:
            where = "the end of its calls"
        elif (k := self.wants(r)) is not None:
            where = f"call {self.pc[r]}, creating the communicator of {k[0]} ({self.describe(r, c)})"
        else:
            where = f"call {self.pc[r]} ({self.describe(r, c)})"
        heads = "; ".join(self.describe(r, e) for e in pending[:2]) or "nothing"
        return f"rank {r} at {where}, its streams waiting on {heads}"


def check_nccl(traces: Sequence[Sequence[Call]], *, per_pair: bool = True) -> list[str]:
    """The problems NCCL and torch's host-side rules would meet running the ranks' recorded
    ``traces`` (module docstring): ``[]`` when every receive matches the message it expects, every
    collective and creation agrees, and no rank waits forever. ``per_pair``: a pair's point-to-point
    operations in a group have a communicator (a stream) of their own, as torch creates them;
    ``False``: one for all peers of the group."""
    return NcclModel(traces, per_pair=per_pair).run()


__all__ = ["NcclModel", "check_nccl"]

"""Point-to-point transfers of activations and gradients with pre-posted non-blocking receives.

Message ``(kind, boundary, g)``: ``kind`` a :class:`~workbench.runtime.transport.messages.MessageKind`,
``ACT`` (0) = activation leaving stage ``boundary`` (input of stage ``boundary + 1``), ``GRAD`` (1) =
gradient arriving at stage ``boundary`` (sent by the backward of stage ``boundary + 1``); ``g`` the
microbatch id within the epoch. Each tensor ``i`` of a message has the tag
``((g * S + boundary) * 2 + kind) * 8 + i`` so receives can be posted in any order, well before
the op that consumes them (see :class:`P2P` for how many), so communication overlaps compute. Transfers between two ops of the same rank use a local mailbox.
Every wait has a timeout. Each message travels on the communicator
:func:`~workbench.runtime.transport.comm_plan.p2p_channel` names (a process group per kind and ordered pair
of ranks), so on each of them messages go one way only. ``one_tag``: every message carries tag 0, so
gloo matches by order alone, as NCCL does (which ignores tags); the order is the plan's
(:mod:`workbench.runtime.transport.comm_plan`, whose check proves it consistent for every schedule).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import torch
import torch.distributed as dist

from workbench.runtime.semantics.stages import spec_bytes
from workbench.runtime.transport.comm_plan import Communicator, group_of, p2p_channel
from workbench.runtime.transport.messages import MessageKind

MAX_TENSORS = 8


def tag(kind: int, boundary: int, g: int, i: int, num_stages: int) -> int:
    return ((g * num_stages + boundary) * 2 + kind) * MAX_TENSORS + i


def uses_send_thread(backend: str) -> bool:
    """The default of :class:`P2P`'s ``send_thread``: on with gloo unless ``WORKBENCH_SEND_THREAD=0``."""
    return backend == "gloo" and os.environ.get("WORKBENCH_SEND_THREAD", "1") == "1"


def warm_up(rank: int, order: list[Communicator], groups: dict, *, device, timeout_s: float) -> None:
    """One small operation on every communicator of ``order`` that ``rank`` uses, in that order (one
    order for all ranks: :func:`~workbench.runtime.transport.comm_plan.communicators`), then a wait
    for all of them. With NCCL this creates every communicator before the first step, in an order no
    two ranks can disagree on; with gloo it opens the connections (about a second) outside the first
    step. A point-to-point pair sends the way its messages go; a collective group (``key`` in
    ``groups``: this rank is a member) all-reduces one element."""
    works = []
    for c in order:
        buf = torch.ones(1, device=device)
        if c.p2p and rank in c.ranks:
            src, dst = c.ranks
            f, peer = (dist.isend, dst) if rank == src else (dist.irecv, src)
            works.append(f(buf, peer, tag=0, group=group_of(groups, c.key)))
        elif not c.p2p and c.key in groups:
            works.append(dist.all_reduce(buf, group=groups[c.key], async_op=True))
    for w in works:
        if w is not None:
            w.wait(timedelta(seconds=timeout_s))


class P2P:
    """Sends (``isend``), receives (``irecv`` posted ahead) and a local mailbox for one rank.

    ``lookahead``: receives kept posted ahead of consumption. ``None`` (default) = automatic: with
    gloo, every receive of the epoch is posted when the epoch starts, as long as their buffers fit in
    ``buffer_budget`` bytes (else as many as fit, at least 4). Posting is front-loaded on purpose: on
    a machine with few cores an ``irecv`` issued mid-step can block for a scheduler slice (~4 ms)
    while gloo's I/O thread is busy; posting them all before the first op measured 14% more
    throughput on the 2-core benchmark. With NCCL (a receive blocks its communicator's stream),
    ``0``: each receive is posted only when its op needs it, which keeps the in-order semantics
    deadlock free.

    ``groups``: communicator name (:func:`~workbench.runtime.transport.comm_plan.p2p_channel`) -> process group
    (a missing name: the default group). ``one_tag``: every message with tag 0 (module docstring).

    ``send_thread``: hand the ``isend``s to a sender thread (:class:`Sender`) instead of posting
    them on the op's thread. ``None`` (default) = on with gloo, off with NCCL (its sends are already
    asynchronous on a stream); the environment variable ``WORKBENCH_SEND_THREAD=0`` turns the default
    off (the switch of the A/B measurement in docs/readme-speed.md).
    """

    def __init__(
        self,
        rank: int,
        num_stages: int,
        device,
        timeout_s: float,
        lookahead: int | None = None,
        *,
        groups: dict | None = None,
        backend: str = "gloo",
        buffer_budget: int = 256 << 20,
        send_thread: bool | None = None,
        one_tag: bool = False,
    ):
        self.rank, self.S, self.device = rank, num_stages, device
        # one communicator per kind and ordered pair (comm_plan.p2p_channel): with NCCL, where a send
        # blocks its stream until the peer receives, a pair of ranks sending both ways on one
        # communicator would deadlock (each one's send waiting for the other's receive)
        self.groups = groups or {}
        self.one_tag = one_tag
        self.timeout = timedelta(seconds=timeout_s)
        self.requested = lookahead
        self.lookahead = 4
        self.backend, self.buffer_budget = backend, buffer_budget
        self.sends: list = []
        self.posted: dict = {}
        self.local: dict = {}
        self.plan: list = []  # [(key, src, specs)] remote receives in consumption order
        self.next_post = 0
        self.bytes_sent = 0
        self.post_ms = 0.0  # time spent posting receives (CPU overhead of the prefetching)
        self.send_ms = 0.0  # time the op spends handing its sends over (the isend calls, or the queue put)
        # perf_counter of the current op's first send (the executor resets it per op)
        self.op_send_start: float | None = None
        self.on_first_send: Callable[[], None] | None = (
            None  # called at the op's first send (the executor's device clock marks it)
        )
        if send_thread is None:
            send_thread = uses_send_thread(backend)
        self.sender = Sender(self._isend) if send_thread else None

    # ---- sends ------------------------------------------------------------------------
    def send(self, key: tuple[MessageKind, int, int], tensors: list[torch.Tensor], dst: int) -> None:
        if dst == self.rank:
            self.local[key] = [t.detach() for t in tensors]
            return
        if len(tensors) > MAX_TENSORS:
            raise ValueError(f"a stage boundary carries {len(tensors)} tensors; at most {MAX_TENSORS} are supported")
        t0 = time.perf_counter()
        if self.op_send_start is None:
            self.op_send_start = t0
            if self.on_first_send is not None:
                self.on_first_send()
        tensors = [t.detach().contiguous() for t in tensors]
        self.bytes_sent += sum(t.numel() * t.element_size() for t in tensors)
        if self.sender is None:
            self._isend(key, tensors, dst)
        else:
            self.sender.put(key, tensors, dst)
        self.send_ms += (time.perf_counter() - t0) * 1e3

    def _isend(self, key, tensors, dst) -> None:
        # drop the completed sends. gloo's send works report completion only once waited on (flush
        # waits them at the epoch end; a gloo send completes only when the peer has posted its
        # receive, so they cannot be waited on here), so polling them found none and cost 0.49 us per
        # listed send on every send: O(n^2) over an epoch, 245 ms of the rank's core per 1000 sends
        if self.backend != "gloo":
            self.sends = [(w, t) for w, t in self.sends if not w.is_completed()]
        kind, boundary, g = key
        group = group_of(self.groups, p2p_channel(kind, self.rank, dst))
        for i, t in enumerate(tensors):
            self.sends.append((dist.isend(t, dst, tag=self._tag(kind, boundary, g, i), group=group), t))

    def _tag(self, kind: int, boundary: int, g: int, i: int) -> int:
        return 0 if self.one_tag else tag(kind, boundary, g, i, self.S)

    def flush(self) -> None:
        if self.sender is not None:
            self.sender.drain(self.timeout.total_seconds())
        for w, _ in self.sends:
            w.wait(self.timeout)
        self.sends = []

    # ---- receives ---------------------------------------------------------------------
    def set_plan(self, plan: list) -> None:
        """``plan``: remote receives ``(key, src, [(shape, dtype)])`` in the order they are consumed;
        posts the first ``lookahead`` of them right away."""
        if self.posted:
            raise RuntimeError("receives still outstanding at the end of an epoch")
        self.plan, self.next_post = plan, 0
        if self.requested is not None:
            self.lookahead = self.requested
        elif self.backend == "nccl":
            self.lookahead = 0
        else:
            per = max(1, max((spec_bytes(specs) for _, _, specs in plan), default=1))
            self.lookahead = max(4, min(len(plan), self.buffer_budget // per))
        self.prefetch()

    def prefetch(self) -> None:
        t = time.perf_counter()
        while self.next_post < len(self.plan) and len(self.posted) < self.lookahead:
            self._post_next()
        self.post_ms += (time.perf_counter() - t) * 1e3

    def _post_next(self) -> None:
        key, src, specs = self.plan[self.next_post]
        bufs = [torch.empty(shape, dtype=dtype, device=self.device) for shape, dtype in specs]
        kind, boundary, g = key
        group = group_of(self.groups, p2p_channel(kind, src, self.rank))
        works = [dist.irecv(b, src, tag=self._tag(kind, boundary, g, i), group=group) for i, b in enumerate(bufs)]
        self.posted[key] = (works, bufs, src)
        self.next_post += 1

    def recv(self, key: tuple[MessageKind, int, int]) -> tuple[list[torch.Tensor], float]:
        """The tensors of message ``key`` and the ms spent waiting for them."""
        if key in self.local:
            return self.local.pop(key), 0.0
        t = time.perf_counter()
        while key not in self.posted and self.next_post < len(self.plan):  # just in time (lookahead 0)
            self._post_next()
        self.post_ms += (time.perf_counter() - t) * 1e3
        if key not in self.posted:
            raise RuntimeError(f"rank {self.rank}: message {key} was not expected (receive plan out of order)")
        works, bufs, src = self.posted.pop(key)
        t = time.perf_counter()
        for w in works:
            try:
                w.wait(self.timeout)
            except Exception as e:  # noqa: BLE001 - re-raise with context
                if "timed out" in str(e).lower() or "timeout" in str(e).lower():
                    raise TimeoutError(
                        f"rank {self.rank}: no message {key} from rank {src} within "
                        f"{self.timeout.total_seconds():.0f} s ({e})"
                    ) from None
                raise ConnectionError(
                    f"rank {self.rank}: lost rank {src} while waiting for message {key} "
                    f"({str(e).splitlines()[0][:200]})"
                ) from None
        waited = (time.perf_counter() - t) * 1e3
        self.prefetch()
        return bufs, waited


class Sender:
    """A thread that posts this rank's ``isend``s in the order the ops hand them over.

    Posting a gloo send takes the pair's lock, which gloo's I/O thread holds while it reads the
    peer's messages: on a busy machine the op that sends blocked for milliseconds (measured: the
    ``send_ms`` column of the breakdown). Handed to this thread, the op goes on to its next
    computation at once; ``drain`` (end of an epoch) waits until every handed-over send is posted.
    The tensors are the op's own outputs (not modified afterwards), so no copy is needed.
    """

    def __init__(self, isend):
        self.isend, self.q, self.error = isend, queue.SimpleQueue(), None
        threading.Thread(target=self._loop, name="workbench-sender", daemon=True).start()

    def put(self, key, tensors, dst) -> None:
        if self.error is not None:
            raise RuntimeError(f"a send failed: {self.error}") from self.error
        self.q.put((key, tensors, dst))

    def drain(self, timeout_s: float) -> None:
        done = threading.Event()
        self.q.put(done)
        if not done.wait(timeout_s):
            raise TimeoutError(f"sends not posted within {timeout_s:.0f} s")
        if self.error is not None:
            raise RuntimeError(f"a send failed: {self.error}") from self.error

    def close(self) -> None:
        """End the thread once the sends handed over so far are posted."""
        self.q.put(None)

    def _loop(self) -> None:
        while True:
            item = self.q.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            try:
                self.isend(*item)
            except Exception as e:  # noqa: BLE001 - reported to the rank's thread by put / drain
                self.error = e


class ShmP2P(P2P):
    """:class:`P2P` over :mod:`workbench.runtime.transport.shm` channels instead of gloo (same interface; the
    local mailbox is P2P's; no sender thread: a send copies into the peer's slot, or, while that
    slot still holds an unread message, is held back and written at this rank's next send, while it
    waits for a receive, or at the epoch end's :meth:`flush`); a receive polls its slot. Message
    numbers come from the receive plans: :meth:`set_plan` (this rank's, per epoch) and
    :meth:`set_send_plan` (its peers')."""

    def __init__(self, rank: int, num_stages: int, device, timeout_s: float, inbound: dict, *, outbound: dict):
        super().__init__(rank, num_stages, device, timeout_s, send_thread=False)
        self.inbound, self.outbound = inbound, outbound  # src -> Channel, dst -> Channel
        self.recv_base = dict.fromkeys(inbound, 0)
        self.send_base = dict.fromkeys(outbound, 0)
        self.recv_index: dict = {}
        self.send_index: dict = {}
        # messages whose slot was not free yet, in order per peer
        self.held: dict[int, list] = {dst: [] for dst in outbound}

    def set_plan(self, plan: list) -> None:
        if self.recv_index:
            raise RuntimeError(f"rank {self.rank}: messages {sorted(self.recv_index)[:3]} were never consumed")
        count = dict.fromkeys(self.inbound, 0)
        for key, src, specs in plan:
            self.recv_index[key] = (src, self.recv_base[src] + count[src], specs)
            count[src] += 1
        for src, n in count.items():
            self.recv_base[src] += n

    def set_send_plan(self, peer_plans: dict[int, list]) -> None:
        """``peer_plans[dst]``: dst's receive plan for this epoch (the messages this rank sends it)."""
        if self.send_index:
            raise RuntimeError(f"rank {self.rank}: messages {sorted(self.send_index)[:3]} were never sent")
        for dst, plan in peer_plans.items():
            j = 0
            for key, src, _ in plan:
                if src == self.rank:
                    self.send_index[key] = self.send_base[dst] + j
                    j += 1
            self.send_base[dst] += j

    def _isend(self, key, tensors, dst) -> None:
        try:
            q = self.send_index.pop(key)
        except KeyError:
            raise RuntimeError(
                f"rank {self.rank}: message {key} to rank {dst} is not in rank {dst}'s receive plan"
            ) from None
        self.held[dst].append((q, tensors, f"rank {self.rank}: message {key} to rank {dst}"))
        self._write_held()

    def _write_held(self) -> None:
        """Write the held-back messages whose slots are free, in order per peer."""
        for dst, msgs in self.held.items():
            ch, k = self.outbound[dst], 0
            while k < len(msgs) and ch.free(msgs[k][0]):
                ch.put(*msgs[k])
                k += 1
            if k:
                del msgs[:k]

    def flush(self) -> None:
        """Write every held-back message (its receiver consumes the earlier ones meanwhile)."""
        deadline = time.perf_counter() + self.timeout.total_seconds()
        while any(self.held.values()):
            self._write_held()
            if time.perf_counter() > deadline:
                dst = next(d for d, m in self.held.items() if m)
                raise TimeoutError(
                    f"rank {self.rank}: rank {dst} read none of its messages within "
                    f"{self.timeout.total_seconds():.0f} s"
                )
            time.sleep(20e-6)
        super().flush()

    def recv(self, key: tuple[MessageKind, int, int]) -> tuple[list[torch.Tensor], float]:
        if key in self.local:
            return self.local.pop(key), 0.0
        try:
            src, q, specs = self.recv_index.pop(key)
        except KeyError:
            raise RuntimeError(
                f"rank {self.rank}: message {key} was not expected (receive plan out of order)"
            ) from None
        idle = self._write_held if any(self.held.values()) else None
        return self.inbound[src].get(q, specs, f"rank {self.rank}: message {key} from rank {src}", idle)

    def unlink(self) -> None:
        """Remove the files of this rank's inbound channels; call once every peer has mapped them
        (the mappings stay valid: :mod:`workbench.runtime.transport.shm`)."""
        for ch in self.inbound.values():
            ch.path.unlink(missing_ok=True)

    def close(self) -> None:
        for ch in list(self.inbound.values()) + list(self.outbound.values()):
            ch.close()

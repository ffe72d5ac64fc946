"""The measured timeline's clock on a GPU: CUDA events on the compute stream, not the host's clock.

On a CPU rank an op runs on the thread that calls it, so ``time.perf_counter`` before and after it
brackets its work. On a GPU the host only *enqueues* an op's kernels and goes on: the host's clock
around an op measures its launch, not its work, and the time the GPU spends waiting for a message
lands on whichever op the host is launching when it blocks, if it blocks at all (an NCCL receive's
``wait()`` makes the compute stream wait; whether the host waits too depends on the timeout and
``TORCH_NCCL_BLOCKING_WAIT``). A breakdown of such a timeline says little about the GPU.

:class:`EventClock` records events on the rank's current (compute) stream instead, three per op:

* ``pre`` where the op begins, before its receive's stream wait;
* ``start`` where its computation begins (after that wait; ``pre`` when it receives nothing);
* ``end`` after its last kernel;

and a fourth at its first send (``P2P.on_first_send``), after the kernels that computed what it sends.

At the end of a pass of the schedule (a round, or an epoch's stream) :meth:`EventClock.resolve`
synchronizes once and rewrites that pass's timeline rows with the GPU's times: ``start`` / ``end``
from the elapsed time since a *base* event, recorded once with the GPU idle (after a
synchronize), so GPU time maps onto the rank's time axis (``ctx.t0``) at the host time of that
record; ``wait_ms`` = the time from ``pre`` to ``start``, the compute stream idle before the op
could compute (its receive, a weight fetch, or the host not having enqueued it yet);
``send_ms`` = ``data_ms`` = 0 (NCCL sends run on NCCL's own stream, not the compute stream; the
microbatch's host-to-device copy is one of the op's kernels, so it is in its compute time), and
``send_at`` = the time of the send event (NCCL's stream starts the send once the compute stream
has passed it, so a receive never completes before it). One synchronization per
pass, where a flush schedule drains anyway; a stream synchronizes at the epoch end only.

The pipeline executor (:mod:`~workbench.runtime.executors.pipeline`) and DDP's (:mod:`~workbench.runtime.executors.ddp`: an op there receives nothing, and
DistributedDataParallel's all-reduces run on NCCL's stream beside the backward) time their ops this
way on a GPU; the Hogwild executor runs on CPU processes only.

``WORKBENCH_EVENT_CLOCK=host`` gives a CPU rank an :class:`EventClock` on :class:`HostEvent`\\ s (the
host's clock behind the event interface), so the bookkeeping above runs, and is tested, on machines
without a GPU.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch

from workbench.runtime.executors.record import OpRecord


class HostEvent:
    """The host clock behind ``torch.cuda.Event``'s interface (``record``, ``synchronize``,
    ``elapsed_time`` in ms)."""

    __slots__ = ("t",)

    def __init__(self):
        self.t = None

    def record(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: HostEvent) -> float:
        return (end.t - self.t) * 1e3


class EventClock:
    """Per-op events on the compute stream, resolved into timeline rows once per pass (module
    docstring). ``new_event()`` -> an unrecorded event; ``sync()`` waits for the device to be idle."""

    def __init__(self, new_event: Callable, sync: Callable[[], None] = lambda: None, name: str = "events"):
        self.new_event, self.sync, self.name = new_event, sync, name  # name: the summary's timeline_clock
        self.base: Any = None  # torch.cuda.Event (or the host stand-in) once recorded
        self.base_ms = 0.0
        self.pending: list[tuple] = []  # (timeline index, pre, start, end, send) of the current pass
        self.send_event = None  # the current op's first send (on_send)

    def begin(self, t0: float) -> None:
        """Record the base event once, with the device idle, at host time ``t0 + base_ms``."""
        if self.base is None:
            self.sync()
            self.base = self.new_event()
            self.base_ms = (time.perf_counter() - t0) * 1e3
            self.base.record()
            self.base.synchronize()

    def mark(self):
        e = self.new_event()
        e.record()
        return e

    def on_send(self) -> None:
        """The current op's first send (``P2P.on_first_send``)."""
        self.send_event = self.mark()

    def add(self, index: int, pre, start, end) -> None:
        """Timeline row ``index`` (appended by the executor) is the op of these events."""
        self.pending.append((index, pre, start, end, self.send_event))
        self.send_event = None

    def resolve(self, timeline: list, R: int, ends: list | None = None) -> None:
        """Rewrite the pending rows of ``timeline`` with the device's times (module docstring); with
        ``ends``, ``ends[round - R]`` becomes the end of the round's last op on this rank."""
        if not self.pending:
            return
        self.pending[-1][3].synchronize()
        base, b = self.base, self.base_ms
        for i, pre, start, end, send in self.pending:
            row = OpRecord(*timeline[i])
            row = row._replace(
                start=b + base.elapsed_time(start),
                end=b + base.elapsed_time(end),
                wait_ms=max(0.0, pre.elapsed_time(start)) if start is not pre else 0.0,
            )
            if row.send_ms is not None:  # DDP's and Hogwild's rows record no send / data time
                row = row._replace(
                    send_ms=0.0,
                    data_ms=0.0,
                    send_at=b + base.elapsed_time(send) if send is not None else float("nan"),
                )
            timeline[i] = row
            if ends is not None:
                ends[row.round - R] = row.end
        self.pending = []


def for_device(device) -> EventClock | None:
    """The clock of a rank computing on ``device``: CUDA events on a GPU; on a CPU ``None`` (the
    host's clock, timed around each op), or host events with ``WORKBENCH_EVENT_CLOCK=host``."""

    dev = torch.device(device)
    if dev.type == "cuda":
        return EventClock(
            lambda: torch.cuda.Event(enable_timing=True), lambda: torch.cuda.synchronize(dev), "cuda-events"
        )
    if os.environ.get("WORKBENCH_EVENT_CLOCK") == "host":
        return EventClock(HostEvent, name="host-events")
    return None

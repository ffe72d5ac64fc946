"""Shared-memory point-to-point transport between the ranks of one machine (CPU; opt-in,
``train(..., transport="shm")``).

Why: with gloo, every activation and gradient crosses the kernel's TCP loopback (a copy into the
socket, another out of it, gloo's I/O thread and the runtime's sender thread on the rank's own core);
on the 2-core benchmark machine a message took 0.04 to 0.17 ms of the receiving and the sending core
and 0.3 to 0.7 ms one way while both cores compute (``workbench.runtime.calibration.machine.measure_link(busy=True)``).
Here a message is one ``memcpy`` into a slot of a file in ``/dev/shm`` that both ranks map, and a
flag store; the receiver polls the flag and copies the slot out.

One :class:`Channel` per direction ``src -> dst``, a ring of ``slots`` slots (one per message of
an epoch, at most :data:`CHANNEL_BYTES` of them beyond :data:`MIN_SLOTS`: :func:`channel_sizes`).
Message ``q`` (the channel's running count, in the *receiver's* consumption order, which both ranks
derive from the schedule) goes to slot ``q mod slots``, which is free once message ``q - slots``
has been consumed (``acks[slot] >= q - slots + 1``); the sender writes the payload, then
``flags[slot] = q + 1``; the receiver waits for ``flags[slot] == q + 1``, copies the payload out
and sets ``acks[slot] = q + 1``. A sender never waits for a slot:
:class:`~workbench.runtime.transport.comm.ShmP2P` holds a message back until its slot is free and writes it
at its next send, or while it waits for a receive, or at the epoch end. That cannot deadlock:
a rank waiting for message ``q`` has consumed every earlier message of that channel, so ``q``'s
slot is free and its sender, waiting or computing, writes it at its next chance; its sender only
blocks in a shm receive (which writes held messages) or at the epoch end. Schedules whose ranks
also block in gloo within an epoch (all-reduces of replicated stages, weight fetches) get a slot
per message of the epoch instead, as before, so nothing is held. The flag is stored after the payload and read before it:
ordered on x86-64 (total store order), which :func:`available` requires. Waiting spins briefly,
then sleeps 20 µs at a time (ranks may share cores), and gives up after the run's timeout.

The files are named after the job's token, which holds the launcher's pid namespace and pid. Once every
rank has mapped its channels (the start barrier), each rank unlinks the files of its inbound channels:
the mappings live on and the kernel frees the memory when the last rank ends, however it ends. Before
that point the launcher removes the job's files when the job ends, and a new shared-memory job first
removes the files of launchers that no longer run (killed with SIGKILL: :func:`remove_stale_channels`).
"""

from __future__ import annotations

import mmap
import os
import platform
import time
import uuid
from pathlib import Path

import numpy as np
import torch

from workbench.runtime.launch.jobspec import TRANSPORTS
from workbench.runtime.semantics.stages import spec_bytes

SHM_DIR = Path("/dev/shm")
ALIGN = 64
SPIN = 200  # polls before the waiting side starts sleeping


def check_transport(transport: str, choices: tuple = TRANSPORTS) -> None:
    """ValueError (one line) unless ``transport`` names a transport this machine can use."""
    if transport not in choices:
        raise ValueError(f"transport must be {' or '.join(map(repr, choices))}, got {transport!r}")
    why = available() if transport == "shm" else None
    if why:
        raise ValueError(why)


def auto_transport(workers: int, cores: int, *, spawned: bool, device: str, backend: str, messages: bool) -> str:
    """``"shm"`` where it runs and pays, else ``"gloo"``: CPU ranks spawned on this machine, each on
    a core of its own (a waiting rank polls its slot: sharing a core, the poll would take the
    computing rank's time), a schedule whose ranks exchange pipeline messages and block on nothing
    else within an epoch (``messages``: the channels are then bounded rings), and room in
    ``/dev/shm`` for the channels (one ring of at most :data:`CHANNEL_BYTES` per direction and pair
    of ranks)."""
    if not (spawned and device == "cpu" and backend == "gloo" and messages and 1 < workers <= cores) or available():
        return "gloo"
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return "gloo"
    need = 2 * workers * (workers - 1) * CHANNEL_BYTES
    return "shm" if st.f_bavail * st.f_frsize >= need else "gloo"


def ring_channels(schedule) -> bool:
    """The schedule's shm channels can be bounded rings with held-back messages: its ranks block on
    nothing but their pipeline messages within an epoch (no all-reduce of a replicated stage, no
    weight fetch over gloo, where a held message would not be written meanwhile)."""
    return not schedule.remote_weights and not any(op.kind == "AR" for _, op in schedule)


def available() -> str | None:
    """None if this machine can use the transport, else why not (one line)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return f"transport='shm' relies on x86-64 store ordering; this machine is {platform.machine()}: use gloo"
    if not SHM_DIR.is_dir():
        return f"transport='shm' needs {SHM_DIR}: use gloo"
    return None


def pid_namespace() -> str:
    """This process's pid namespace (the number in ``/proc/self/ns/pid``), "0" if unknown: a pid
    means a process only within its namespace (containers may share ``/dev/shm``)."""
    try:
        return "".join(c for c in os.readlink("/proc/self/ns/pid") if c.isdigit()) or "0"
    except OSError:
        return "0"


def new_token() -> str:
    """A job's channel-file token: the launcher's pid namespace and pid, then a random part
    (``<namespace>.<pid>.<hex>``)."""
    return f"{pid_namespace()}.{os.getpid()}.{uuid.uuid4().hex[:12]}"


def channel_path(token: str, src: int, dst: int) -> Path:
    return SHM_DIR / f"workbench-{token}-{src}-{dst}"


def remove_stale_channels() -> list[Path]:
    """Delete the channel files left by launchers that no longer run (a launcher killed with
    SIGKILL cannot remove its own): those whose token names this pid namespace and a pid that is
    no live process. Files of live processes, of other namespaces (another container sharing
    ``/dev/shm``: its pids mean other processes) or of other names stay. Returns what was removed."""
    gone = []
    for p in SHM_DIR.glob(f"workbench-{pid_namespace()}.*.*-*-*"):
        pid = p.name.split("-")[1].split(".")[1]
        if not pid.isdigit():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:  # no such process: its job is over
            p.unlink(missing_ok=True)
            gone.append(p)
        except (PermissionError, OverflowError):  # another user's live process, or not a pid
            pass
    return gone


def remove_channels(token: str) -> None:
    """Delete every channel file of a job (the launcher calls it when the job ends, however it ends)."""
    for p in SHM_DIR.glob(f"workbench-{token}-*"):
        p.unlink(missing_ok=True)


def _padded(n: int) -> int:
    """``n`` bytes rounded up to :data:`ALIGN`: each tensor of a message starts at a multiple of
    ``ALIGN`` within its slot (slots and the data area are ``ALIGN``-aligned), so a slot's bytes
    can be viewed as any dtype (a float64 tensor after a float32 one of odd length would
    otherwise start at an offset not divisible by 8)."""
    return -(-int(n) // ALIGN) * ALIGN


def message_bytes(specs) -> int:
    """Bytes a message of tensors ``[(shape, dtype)]`` takes in a slot: each tensor padded to
    :data:`ALIGN` (:func:`_padded`)."""
    return sum(_padded(spec_bytes([s])) for s in specs)


class Channel:
    """One direction ``src -> dst`` (module docstring); both ranks open the same file."""

    def __init__(self, path: Path, slots: int, slot_bytes: int, timeout_s: float):
        self.path, self.slots, self.timeout_s = Path(path), int(slots), float(timeout_s)
        self.slot_bytes = max(ALIGN, -(-int(slot_bytes) // ALIGN) * ALIGN)
        head = -(-16 * self.slots // ALIGN) * ALIGN
        size = head + self.slots * self.slot_bytes
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            os.ftruncate(fd, size)  # both ends, same size: the file is zero-filled once
            # pages mapped now, not at each slot's first message (a first write into a slot page-faulted
            # on every 4 KiB: 26 us per 64 KiB message instead of 6 us)
            self.mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        finally:
            os.close(fd)
        words = np.frombuffer(self.mm, dtype=np.int64, count=2 * self.slots)
        self.flags, self.acks = words[: self.slots], words[self.slots :]
        self.data = torch.frombuffer(self.mm, dtype=torch.uint8, offset=head, count=self.slots * self.slot_bytes)

    def _wait(self, ready, what: str, idle=None) -> float:
        """Wait until ``ready()``, calling ``idle()`` (if given) between polls; returns the ms waited."""
        if ready():
            return 0.0
        t0 = time.perf_counter()
        for _ in range(SPIN):
            if idle is not None:
                idle()
            if ready():
                return (time.perf_counter() - t0) * 1e3
        deadline = t0 + self.timeout_s
        while not ready():
            if time.perf_counter() > deadline:
                raise TimeoutError(f"{what} did not happen within {self.timeout_s:.0f} s")
            time.sleep(20e-6)
            if idle is not None:
                idle()
        return (time.perf_counter() - t0) * 1e3

    def free(self, q: int) -> bool:
        """Message ``q``'s slot is free: the message ``slots`` earlier has been read."""
        return self.acks[q % self.slots] >= q - self.slots + 1

    def put(self, q: int, tensors: list[torch.Tensor], what: str) -> None:
        """Write message ``q`` (waiting for its slot: see :meth:`free`)."""
        slot = q % self.slots
        self._wait(lambda: self.free(q), f"the slot of {what} (message {q - self.slots} still unread)")
        off = slot * self.slot_bytes
        for t in tensors:
            flat = t.detach().reshape(-1).view(torch.uint8)
            n = flat.numel()
            if off + n > (slot + 1) * self.slot_bytes:
                raise ValueError(f"{what}: {n} bytes exceed the channel's slot of {self.slot_bytes} bytes")
            self.data[off : off + n].copy_(flat)
            off += _padded(n)
        self.flags[slot] = q + 1

    def get(self, q: int, specs, what: str, idle=None) -> tuple[list[torch.Tensor], float]:
        """Message ``q`` as new tensors of ``specs`` [(shape, dtype)], and the ms waited for it
        (``idle()`` called while waiting: the transport writes its held-back messages)."""
        slot = q % self.slots
        waited = self._wait(lambda: self.flags[slot] == q + 1, what, idle)
        off, out = slot * self.slot_bytes, []
        for shape, dt in specs:
            n = spec_bytes([(shape, dt)])
            out.append(self.data[off : off + n].view(dt).reshape(shape).clone())
            off += _padded(n)
        self.acks[slot] = q + 1
        return out, waited

    def close(self) -> None:
        for view in ("flags", "acks", "data"):  # the mapping closes once no view of it is left
            vars(self).pop(view, None)
        try:
            self.mm.close()
        except BufferError:  # a tensor view still exported: the mapping goes with the process
            pass


CHANNEL_BYTES = 8 << 20  # slots of a channel beyond its first MIN_SLOTS: at most this many bytes
MIN_SLOTS = 8


def channel_sizes(plans: dict[int, list], budget: int | None = CHANNEL_BYTES) -> dict[tuple[int, int], tuple[int, int]]:
    """``plans[dst]``: dst's receive plan for one full epoch ``[(key, src, specs)]`` -> per
    channel ``(src, dst)``: (slots, largest message in bytes). Slots: one per message of the epoch,
    at most ``max(MIN_SLOTS, budget // largest message)`` (or the environment's ``WORKBENCH_SHM_SLOTS``):
    a ring, reused within the epoch (a sender never waits for a slot:
    :class:`~workbench.runtime.transport.comm.ShmP2P` holds the message back). ``budget=None``: one slot per
    message, nothing is ever held back (for schedules whose ranks also block in gloo within an
    epoch, all-reduces or weight fetches, where no held message would be written meanwhile)."""
    out: dict[tuple[int, int], tuple[int, int]] = {}
    for dst, plan in plans.items():
        for _, src, specs in plan:
            n, b = out.get((src, dst), (0, 0))
            out[(src, dst)] = (n + 1, max(b, message_bytes(specs)))
    if budget is None:
        return out
    cap = os.environ.get("WORKBENCH_SHM_SLOTS")  # a fixed ring size (the tests wrap rings with it)
    return {k: (min(n, int(cap) if cap else max(MIN_SLOTS, budget // max(b, 1))), b) for k, (n, b) in out.items()}

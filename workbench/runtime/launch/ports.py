"""The rendezvous of a job: its port (one the caller names, checked, or a free one) and, for warm
ranks, the store the launcher serves on it."""

from __future__ import annotations

import random
import socket
from datetime import timedelta

import torch.distributed as dist


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's ephemeral ports ``(low, high)``, which it hands to every ``bind(0)`` and outgoing
    connection (Linux's default 32768-60999 where the file cannot be read)."""
    try:
        with open(path) as f:
            low, high = (int(x) for x in f.read().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_port(port: int | None = None, host: str = "127.0.0.1", tries: int = 64) -> int:
    """``port`` if it can be bound (ValueError if in use), else a free port below the kernel's
    ephemeral range. A port is chosen, released, then bound again by the job's store or launcher;
    an ephemeral one can be handed meanwhile to any process's ``bind(0)`` or outgoing connection
    (gloo's, another job's), which torchrun reports as EADDRINUSE. The kernel never hands out a port
    below that range, so only a process naming the same number can take it. Where none of ``tries``
    random ones is free, an ephemeral one."""
    if port is not None:
        if not bindable(port, host):
            raise ValueError(f"port {port} is in use; pick another --port or leave it out to choose a free one")
        return port
    low = ephemeral_range()[0]
    rng = random.SystemRandom()
    for _ in range(tries):
        chosen = rng.randrange(max(1024, low - 12000), low)
        if bindable(chosen, host):
            return chosen
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def bindable(port: int, host: str = "127.0.0.1") -> bool:
    """Whether ``host:port`` can be bound now (as the rendezvous store binds: TIME_WAIT is free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
        return True


#: in a rank's environment: torch's rendezvous joins the store at the address as a client, on every rank
JOIN_HOSTED_STORE = {"TORCHELASTIC_USE_AGENT_STORE": "True"}


def host_store(port: int, world: int, timeout_s: float, host: str = "127.0.0.1"):
    """The rendezvous store of a job's ranks, served by the launcher on ``host:port`` until the
    returned ``TCPStore`` is dropped. Ranks with :data:`JOIN_HOSTED_STORE` in their environment join
    it as clients (torch's ``tcp://`` rendezvous, as under torchrun's agent) instead of rank 0
    serving it. It listens before any rank starts: a rank that connects before rank 0's store
    listens is refused and retries about half a second later."""
    return dist.TCPStore(host, port, world, True, timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def hosted_store(port: int | None, world: int, timeout_s: float, tries: int = 5, host: str = "127.0.0.1"):
    """``(port, store)``: :func:`host_store` on ``port``, or, when the caller named none, on a free
    port, chosen again when another process took it between the choice and the bind (``EADDRINUSE``),
    up to ``tries`` times. Once bound, the store holds the port for the whole job."""
    for attempt in range(tries):
        chosen = free_port(port, host)
        try:
            return chosen, host_store(chosen, world, timeout_s, host)
        except RuntimeError as e:  # torch's DistNetworkError / DistStoreError are RuntimeErrors
            taken = "address already in use" in str(e).lower()
            if port is not None or not taken or attempt == tries - 1:
                if taken:
                    raise ValueError(
                        f"port {chosen} was taken before the job could bind it; run the job again"
                    ) from None
                raise
    raise AssertionError("unreachable")

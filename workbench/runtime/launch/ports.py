"""The rendezvous port of a job: one the caller names, checked, or a free one."""

from __future__ import annotations

import socket


def free_port(port: int | None = None, host: str = "127.0.0.1") -> int:
    """``port`` if it can be bound (ValueError if in use), else a free ephemeral port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the rendezvous store binds: TIME_WAIT is free
        try:
            s.bind((host, port or 0))
        except OSError:
            raise ValueError(
                f"port {port} is in use; pick another --port or leave it out to choose a free one"
            ) from None
        return s.getsockname()[1]

"""Point-to-point transfers of activations and gradients with pre-posted non-blocking receives.

Message ``(kind, boundary, g)``: ``kind`` 0 = activation leaving stage ``boundary`` (input of stage
``boundary + 1``), 1 = gradient arriving at stage ``boundary`` (sent by the backward of stage
``boundary + 1``); ``g`` the microbatch id within the epoch. Each tensor ``i`` of a message has the
tag ``((g * S + boundary) * 2 + kind) * 8 + i`` so receives can be posted in any order, well before
the op that consumes them: :meth:`P2P.prefetch` keeps up to ``lookahead`` receives outstanding so
communication overlaps compute. Transfers between two ops of the same rank use a local mailbox.
Every wait has a timeout.
"""
from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist

MAX_TENSORS = 8


def tag(kind: int, boundary: int, g: int, i: int, num_stages: int) -> int:
    return ((g * num_stages + boundary) * 2 + kind) * MAX_TENSORS + i


class P2P:
    """Sends (``isend``), receives (``irecv`` posted ahead) and a local mailbox for one rank."""

    def __init__(self, rank: int, num_stages: int, device, timeout_s: float, lookahead: int = 4):
        self.rank, self.S, self.device = rank, num_stages, device
        self.timeout = timedelta(seconds=timeout_s)
        self.lookahead = lookahead
        self.sends: list = []
        self.posted: dict = {}
        self.local: dict = {}
        self.plan: list = []  # [(key, src, specs)] remote receives in consumption order
        self.next_post = 0
        self.bytes_sent = 0

    # ---- sends ------------------------------------------------------------------------
    def send(self, key: tuple[int, int, int], tensors: list[torch.Tensor], dst: int) -> None:
        if dst == self.rank:
            self.local[key] = [t.detach() for t in tensors]
            return
        if len(tensors) > MAX_TENSORS:
            raise ValueError(f"a stage boundary carries {len(tensors)} tensors; at most {MAX_TENSORS} are supported")
        self.sends = [(w, t) for w, t in self.sends if not w.is_completed()]
        for i, t in enumerate(tensors):
            t = t.detach().contiguous()
            w = dist.isend(t, dst, tag=tag(*key, i, self.S))
            self.sends.append((w, t))
            self.bytes_sent += t.numel() * t.element_size()

    def flush(self) -> None:
        for w, _ in self.sends:
            w.wait(self.timeout)
        self.sends = []

    # ---- receives ---------------------------------------------------------------------
    def set_plan(self, plan: list) -> None:
        """``plan``: remote receives ``(key, src, [(shape, dtype)])`` in the order they are consumed."""
        if self.posted:
            raise RuntimeError("receives still outstanding at the end of an epoch")
        self.plan, self.next_post = plan, 0

    def prefetch(self) -> None:
        while self.next_post < len(self.plan) and len(self.posted) < self.lookahead:
            key, src, specs = self.plan[self.next_post]
            bufs = [torch.empty(shape, dtype=dtype, device=self.device) for shape, dtype in specs]
            works = [dist.irecv(b, src, tag=tag(*key, i, self.S)) for i, b in enumerate(bufs)]
            self.posted[key] = (works, bufs, src)
            self.next_post += 1

    def recv(self, key: tuple[int, int, int]) -> tuple[list[torch.Tensor], float]:
        """The tensors of message ``key`` and the ms spent waiting for them."""
        if key in self.local:
            return self.local.pop(key), 0.0
        self.prefetch()
        if key not in self.posted:
            raise RuntimeError(f"rank {self.rank}: message {key} was not expected (receive plan out of order)")
        works, bufs, src = self.posted.pop(key)
        t = time.perf_counter()
        for w in works:
            try:
                w.wait(self.timeout)
            except Exception as e:  # noqa: BLE001 - re-raise with context
                raise TimeoutError(f"rank {self.rank}: no message {key} from rank {src} within "
                                   f"{self.timeout.total_seconds():.0f} s ({e})") from None
        waited = (time.perf_counter() - t) * 1e3
        self.prefetch()
        return bufs, waited

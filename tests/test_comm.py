"""The sender thread of workbench.runtime.transport.comm (no processes: a stand-in for ``isend``)."""

import threading
import time

import pytest
import torch

from workbench.runtime.transport.comm import Sender


def test_sender_posts_in_order_and_drain_waits_for_all():
    posted, main = [], threading.get_ident()

    def isend(key, tensors, dst):
        time.sleep(0.001)  # a slow post: drain must still see every one
        posted.append((key, dst, threading.get_ident() != main))

    s = Sender(isend)
    for g in range(20):
        s.put((0, 0, g), [], 1)
    s.drain(timeout_s=10)
    assert posted == [((0, 0, g), 1, True) for g in range(20)]  # in hand-over order, on the sender thread


def test_a_failed_send_is_reported_on_the_rank_thread():
    def isend(key, tensors, dst):
        raise OSError("connection reset by peer")

    s = Sender(isend)
    s.put((1, 0, 3), [], 0)
    with pytest.raises(RuntimeError, match="a send failed: connection reset"):
        s.drain(timeout_s=10)
    with pytest.raises(RuntimeError, match="a send failed"):
        s.put((1, 0, 4), [], 0)


def test_drain_times_out_instead_of_hanging():
    release = threading.Event()
    s = Sender(lambda *a: release.wait(5))
    s.put((0, 0, 0), [], 1)
    with pytest.raises(TimeoutError, match="not posted within"):
        s.drain(timeout_s=0.05)
    release.set()


def test_gloo_sends_are_not_polled_per_send(monkeypatch):
    """gloo's send works report completion only once waited on: polling every listed send on each new
    send found none and cost O(n^2) per epoch. With gloo the list is only appended (flush waits it);
    with other backends completed sends are dropped."""
    from workbench.runtime.transport import comm

    class Work:
        def __init__(self, done):
            self.done, self.polls = done, 0

        def is_completed(self):
            self.polls += 1
            return self.done

    for backend, done in (("gloo", False), ("nccl", True)):
        works = []
        monkeypatch.setattr(comm.dist, "isend", lambda t, dst, tag, group: works.append(Work(done)) or works[-1])
        p = comm.P2P(0, 2, "cpu", 5.0, backend=backend, send_thread=False)
        for g in range(5):
            p._isend((0, 0, g), [torch.zeros(2)], 1)
        if backend == "gloo":
            assert len(p.sends) == 5 and sum(w.polls for w in works) == 0
        else:
            assert len(p.sends) == 1 and works[0].polls == 1  # the completed ones dropped as new ones go out

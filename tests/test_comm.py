"""The sender thread of workbench.runtime.comm (no processes: a stand-in for ``isend``)."""
import threading
import time

import pytest

from workbench.runtime.comm import _Sender


def test_sender_posts_in_order_and_drain_waits_for_all():
    posted, main = [], threading.get_ident()

    def isend(key, tensors, dst):
        time.sleep(0.001)  # a slow post: drain must still see every one
        posted.append((key, dst, threading.get_ident() != main))

    s = _Sender(isend)
    for g in range(20):
        s.put((0, 0, g), [], 1)
    s.drain(timeout_s=10)
    assert posted == [((0, 0, g), 1, True) for g in range(20)]  # in hand-over order, on the sender thread


def test_a_failed_send_is_reported_on_the_rank_thread():
    def isend(key, tensors, dst):
        raise OSError("connection reset by peer")

    s = _Sender(isend)
    s.put((1, 0, 3), [], 0)
    with pytest.raises(RuntimeError, match="a send failed: connection reset"):
        s.drain(timeout_s=10)
    with pytest.raises(RuntimeError, match="a send failed"):
        s.put((1, 0, 4), [], 0)


def test_drain_times_out_instead_of_hanging():
    release = threading.Event()
    s = _Sender(lambda *a: release.wait(5))
    s.put((0, 0, 0), [], 1)
    with pytest.raises(TimeoutError, match="not posted within"):
        s.drain(timeout_s=0.05)
    release.set()

"""A job's rendezvous port: bound by the launcher and held, chosen again when another process takes a
free port between its choice and the bind (workbench/runtime/launch/ports.py)."""

from __future__ import annotations

import socket

import pytest

from workbench.runtime.launch import ports


@pytest.fixture
def taken():
    """A port another process listens on."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen()
    yield s.getsockname()[1]
    s.close()


def test_a_free_port_taken_before_the_bind_is_chosen_again(monkeypatch, taken):
    real, chosen = ports.free_port, []

    def race(port=None, host="127.0.0.1"):  # the first choice is taken by another process meanwhile
        chosen.append(taken if not chosen else real(port, host))
        return chosen[-1]

    monkeypatch.setattr(ports, "free_port", race)
    port, store = ports.hosted_store(None, 1, 5.0)
    assert chosen[0] == taken and port == chosen[-1] != taken and len(chosen) == 2
    store.set("k", "v")
    assert store.get("k") == b"v"


def test_a_port_always_taken_is_one_line_after_the_tries(monkeypatch, taken):
    monkeypatch.setattr(ports, "free_port", lambda port=None, host="127.0.0.1": taken)
    with pytest.raises(ValueError, match=rf"^port {taken} was taken before the job could bind it; run the job again$"):
        ports.hosted_store(None, 1, 5.0, tries=3)


def test_a_named_port_in_use_is_refused_in_one_line(taken):
    with pytest.raises(ValueError, match=rf"^port {taken} is in use; pick another --port"):
        ports.hosted_store(taken, 1, 5.0)


def test_a_chosen_port_is_one_the_kernel_never_hands_out():
    """Chosen ports lie below the ephemeral range, so no process's bind(0) or outgoing connection
    takes one between the choice and the job's bind (the EADDRINUSE torchrun once reported)."""
    low, _ = ports.ephemeral_range()
    chosen = {ports.free_port() for _ in range(20)}
    assert all(1024 <= p < low for p in chosen) and len(chosen) > 1
    for p in chosen:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # free when chosen


def test_the_ephemeral_range_falls_back_to_linuxs_default(tmp_path):
    assert ports.ephemeral_range(str(tmp_path / "none")) == (32768, 60999)
    (tmp_path / "range").write_text("40000\t50000\n")
    assert ports.ephemeral_range(str(tmp_path / "range")) == (40000, 50000)

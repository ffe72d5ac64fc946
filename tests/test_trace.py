"""The recording layer (workbench.runtime.transport.trace) in dry mode; live mode runs in test_one_tag."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from workbench.runtime.transport.trace import Call, DryGroup, Recorder, group_name, per_communicator


def test_calls_and_waits_are_recorded_in_issue_order_and_the_functions_restored():
    isend = dist.isend
    g = DryGroup("x", (0, 1))
    rec = Recorder(0, 2, {"act:0>1": g}, dry=True).install()
    try:
        w = dist.isend(torch.ones(3), 1, group=g, tag=7)
        buf = torch.full((2,), 5.0)
        v = dist.irecv(buf, 1, group=g, tag=8)
        v.wait()
        w.wait()
        dist.all_reduce(torch.ones(1), group=None)
    finally:
        rec.uninstall()
    assert dist.isend is isend
    assert [(c.what, c.group, c.peer, c.tag, c.nbytes, c.work) for c in rec.calls] == [
        ("send", "act:0>1", 1, 7, 12, 0),
        ("recv", "act:0>1", 1, 8, 8, 1),
        ("wait", "act:0>1", 1, 8, 8, 1),
        ("wait", "act:0>1", 1, 7, 12, 0),
        ("coll", "world", -1, 0, 4, 4),
        ("wait", "world", -1, 0, 4, 4),
    ]
    assert buf.tolist() == [0.0, 0.0]  # a dry receive reads zeros
    assert Call.from_json(rec.calls[0].to_json()) == rec.calls[0]
    by = per_communicator(rec.calls, 0)
    assert by == {("act:0>1", 0, 1): [("send", 1, 7, 12), ("recv", 1, 8, 8)]}


def test_a_peer_outside_the_group_is_refused_as_torch_refuses_it():
    g = DryGroup("act:1>2", (1, 2))
    rec = Recorder(1, 3, {"act:1>2": g}, dry=True).install()
    try:
        with pytest.raises(ValueError, match="rank 1: recv with rank 0 on group act:1>2 of ranks \\(1, 2\\): not a"):
            dist.irecv(torch.empty(1), 0, group=g)
    finally:
        rec.uninstall()


def test_group_names():
    assert group_name("fetch0-up", (0, 1, 2)) == "fetch0-up"
    assert group_name((0, 1), (0, 1)) == "replicas:0,1"
    assert group_name(("tied", 0, 3), (0, 3)) == "tied0:0,3"

"""The NCCL model (workbench.runtime.transport.nccl_model) on hand-written calls: each rule can fail."""

from __future__ import annotations

from workbench.runtime.transport.nccl_model import check_nccl
from workbench.runtime.transport.trace import Call

PAIR = (0, 1)


def send(group, peer, tag=0, work=0, nbytes=8, ranks=PAIR):
    return Call("send", group, ranks, peer, tag, nbytes, work)


def recv(group, peer, tag=0, work=0, nbytes=8, ranks=PAIR):
    return Call("recv", group, ranks, peer, tag, nbytes, work)


def wait(work):
    return Call("wait", "", (), work=work)


def test_matched_messages_on_two_communicators_pass():
    a = [send("a", 1, tag=1, work=0), recv("b", 1, tag=2, work=1), wait(0), wait(1)]
    b = [recv("a", 0, tag=1, work=0), send("b", 0, tag=2, work=1), wait(0), wait(1)]
    assert check_nccl([a, b]) == []


def test_messages_are_matched_by_order_not_by_tag():
    a = [send("a", 1, tag=1, work=0), send("a", 1, tag=2, work=1), wait(0), wait(1)]
    b = [recv("a", 0, tag=2, work=0), recv("a", 0, tag=1, work=1), wait(0), wait(1)]
    problems = check_nccl([a, b])
    assert problems == [
        "on a, rank 1's receive of tag 2 (8 B) from rank 0 is matched with its send of tag 1 (8 B)",
        "on a, rank 1's receive of tag 1 (8 B) from rank 0 is matched with its send of tag 2 (8 B)",
    ]


def test_creating_two_communicators_in_opposite_orders_deadlocks():
    """Lazy, blocking creation: rank 0 meets communicator a first, rank 1 meets b first. Once a is
    created first on both (a warm-up in one order), the same operations pass."""
    a = [recv("a", 1, work=0), send("b", 1, work=1), wait(0), wait(1)]
    b = [recv("b", 0, work=0), send("a", 0, work=1), wait(0), wait(1)]
    problems = check_nccl([a, b])
    assert len(problems) == 1 and problems[0].startswith("deadlock: rank 0 at call 0, creating the communicator of a")
    warm = [[send("a", 1, work=10), recv("b", 1, work=11), wait(10), wait(11)], [recv("a", 0, work=10)]]
    warm[1] += [send("b", 0, work=11), wait(10), wait(11)]
    assert check_nccl([warm[0] + a, warm[1] + b]) == []


def test_a_wait_blocks_the_host():
    """Both ranks wait for their receive before they send the message the other waits for: on two
    communicators (created beforehand) only a host-blocking wait makes this a deadlock."""
    made = [[send("a", 1, work=10), recv("b", 1, work=11)], [recv("a", 0, work=10), send("b", 0, work=11)]]
    a = made[0] + [recv("b", 1, tag=5, work=0), wait(0), send("a", 1, tag=6, work=1), wait(1)]
    b = made[1] + [recv("a", 0, tag=6, work=0), wait(0), send("b", 0, tag=5, work=1), wait(1)]
    problems = check_nccl([a, b])
    assert len(problems) == 1 and "at call 3 (wait for its recv of tag 5" in problems[0]
    a_later = made[0] + [recv("b", 1, tag=5, work=0), send("a", 1, tag=6, work=1), wait(0), wait(1)]
    assert check_nccl([a_later, b]) == []


def test_two_sends_facing_each_other_on_one_stream_deadlock():
    a = [send("p", 1, tag=1, work=0), recv("p", 1, tag=2, work=1), wait(1)]
    b = [send("p", 0, tag=2, work=0), recv("p", 0, tag=1, work=1), wait(1)]
    assert check_nccl([a, b])[-1].startswith("deadlock")


def test_one_stream_per_group_orders_its_peers():
    """Group g of three ranks: rank 1 receives from 0 before 2; rank 0 sends to 1 only once rank 2's
    message arrived, which rank 2 sends once its send to 1 completed. A stream per pair (torch)
    passes; one stream for the group's peers deadlocks (rank 1's stream head waits for rank 0)."""
    g = (0, 1, 2)
    r0 = [send("g", 1, 0, 10, ranks=g), recv("g", 2, 0, 11, ranks=g), wait(10), wait(11)]
    r1 = [recv("g", 0, 0, 10, ranks=g), send("g", 2, 0, 12, ranks=g), wait(10), wait(12)]
    r2 = [send("g", 0, 0, 11, ranks=g), recv("g", 1, 0, 12, ranks=g), wait(11), wait(12)]  # all created
    r0 += [recv("g", 2, 5, 0, ranks=g), wait(0), send("g", 1, 8, 1, ranks=g), wait(1)]
    r1 += [recv("g", 0, 8, 0, ranks=g), recv("g", 2, 9, 1, ranks=g), wait(0), wait(1)]
    r2 += [send("g", 1, 9, 0, ranks=g), wait(0), send("g", 0, 5, 1, ranks=g), wait(1)]
    assert check_nccl([r0, r1, r2]) == []
    assert check_nccl([r0, r1, r2], per_pair=False)[-1].startswith("deadlock")


def test_collectives_must_agree_and_groups_must_be_created_in_one_order():
    g = (0, 1)
    a = [Call("coll", "r", g, nbytes=8, work=0, op="all_reduce"), wait(0)]
    b = [Call("coll", "r", g, nbytes=16, work=0, op="all_reduce"), wait(0)]
    assert any("issue different ones" in p for p in check_nccl([a, b]))
    ga, gb = Call("group", "world", g, op="0,1"), Call("group", "world", g, op="1,2")
    assert any("new_group" in p for p in check_nccl([[ga], [gb]]))
    assert check_nccl([[ga], [ga]]) == []


def test_a_collective_one_member_never_reaches_is_a_deadlock():
    g = (0, 1)
    a = [Call("coll", "r", g, nbytes=8, work=0, op="all_reduce"), wait(0)]
    assert check_nccl([a, []])[-1].startswith("deadlock: rank 0 at call 0, creating the communicator of r")

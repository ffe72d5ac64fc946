"""workbench.runtime.transport.messages: the one name of a message's kind on both sides."""

from workbench.runtime.transport.comm import tag
from workbench.runtime.transport.messages import MessageKind


def test_a_kind_is_the_plans_number_as_key_and_in_tags():
    """The executors key messages by MessageKind, the communication plan (comm_plan.Message.kind)
    by 0 and 1: a key of either kind finds the other's entry, and a tag is the number's."""
    plan = {(0, 2, 7): "activation", (1, 2, 7): "gradient"}
    assert plan[(MessageKind.ACT, 2, 7)] == "activation" and plan[(MessageKind.GRAD, 2, 7)] == "gradient"
    assert {(MessageKind.GRAD, 0): "g"}[(1, 0)] == "g"
    assert tag(MessageKind.GRAD, 3, 5, 2, 4) == tag(1, 3, 5, 2, 4) != tag(MessageKind.ACT, 3, 5, 2, 4)
    assert [int(k) for k in MessageKind] == [0, 1]


def test_a_message_key_reads_with_its_kind_by_name():
    assert repr((MessageKind.ACT, 0, 3)) == "(ACT, 0, 3)"
    assert f"message {(MessageKind.GRAD, 1, 4)}" == "message (GRAD, 1, 4)"

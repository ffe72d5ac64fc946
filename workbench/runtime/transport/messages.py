"""What a point-to-point message between two stages carries: :class:`MessageKind`.

A message is keyed ``(kind, boundary, g)``: an activation leaving stage ``boundary`` (the input of
stage ``boundary + 1``) or a gradient arriving at stage ``boundary`` (sent by the backward of stage
``boundary + 1``), of microbatch (or unit) ``g``. The sender and the receiver name the kind with this
one enum; it is an ``IntEnum`` because the kind is also a number in every message tag
(:func:`workbench.runtime.transport.comm.tag`) and equals the plain ``0`` / ``1`` of
:class:`workbench.runtime.transport.comm_plan.Message`.
"""

from __future__ import annotations

from enum import IntEnum


class MessageKind(IntEnum):
    """``ACT`` (0): a stage's output, sent downstream; ``GRAD`` (1): the gradient of a stage's output,
    sent upstream by the backward of the next stage."""

    ACT = 0
    GRAD = 1

    def __repr__(self) -> str:  # message keys print as (ACT, 0, 3), not (<MessageKind.ACT: 0>, 0, 3)
        return self.name

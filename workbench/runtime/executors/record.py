"""One row of the measured timeline: :class:`OpRecord`, what an executor records about each op it ran.

A ``NamedTuple``: a tuple (cheap to build per op and to gather to rank 0 by pickling; positional
readers keep working) whose fields are the columns of ``timeline.csv`` (:mod:`~workbench.runtime.launch.outputs`).
"""

from __future__ import annotations

from typing import NamedTuple


class OpRecord(NamedTuple):
    """An op of ``worker``'s list: stage, microbatch (global; ``-1`` for AR / STEP), kind, ``start`` and
    ``end`` in ms since the rank's ``t0``, the weight version it read (an update: the version it made),
    the minibatch (``round``) it belongs to, and the ms it spent waiting for a receive / fetch
    (``wait_ms``). The pipeline and segment executors also record ``send_ms`` / ``data_ms`` (time
    inside the op posting sends / copying the microbatch's input or target) and ``send_at`` (ms since
    ``t0`` when its first send began, NaN without a send); DDP and Hogwild leave them ``None`` (empty
    in the CSV)."""

    worker: int
    stage: int
    microbatch: int
    kind: str
    start: float
    end: float
    version: int
    round: int
    wait_ms: float
    send_ms: float | None = None
    data_ms: float | None = None
    send_at: float | None = None


RECORD_COLUMNS = list(OpRecord._fields)


def timed(
    rank: int, stage: int, microbatch: int, kind: str, start: float, *, end: float, t0: float, version: int, rnd: int
) -> OpRecord:
    """The record of an op timed with ``time.perf_counter()`` (seconds since ``t0``, stored in ms),
    without the pipeline executors' send/data columns (DDP, Hogwild); ``microbatch < 0``: an AR/STEP."""
    return OpRecord(
        worker=rank,
        stage=stage,
        microbatch=microbatch,
        kind=kind,
        start=(start - t0) * 1e3,
        end=(end - t0) * 1e3,
        version=version,
        round=rnd,
        wait_ms=0.0,
    )

"""Closed-form bubble fractions, as the papers state them, for equal stages and free communication.

A schedule registers the form that applies to it (``register(..., bubble=fill_drain)``);
:func:`closed_form_bubble` reads the schedule's shape and evaluates it. With ``p`` the pipeline depth
(workers one microbatch crosses), ``m`` microbatches per flush, ``M`` microbatches in the schedule,
``v`` stages per worker, ``S`` workers, ``F`` / ``B`` the forward / backward time of a worker's share:

* fill and drain (GPipe, PipeDream-Flush, the master family's pipelines): ``(p-1) / (m+p-1)``;
* one round of 1F1B without flush (PipeDream, 2BW): ``(p-1) / (M+p-1)``;
* model parallelism (one microbatch in flight): ``(p-1) / p``;
* interleaved / looped (Narayanan et al. SC'21): ``(p-1) / (v m + p-1)``;
* ZB-H1 (Qi et al. ICLR'24) with ``BI = BW = B/2``: a bubble of ``(p-1) x`` per worker,
  ``(p-1) x / (m (F+B) + (p-1) x)`` with ``x = max(F, B/2)`` (the paper's ``(p-1)(T_F+T_B-T_W)``
  is the case ``F >= BI``; when ``BI > F`` the drain's chain of input-gradient backwards sets it);
* data parallelism (S workers, M microbatches round robin): ``1 - (M/S) / ceil(M/S)``.

Each form returns ``(fraction, formula with its values)``; NaN where no paper states a one-round form.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from workbench.schedules.core import Schedule
from workbench.schedules.dataflow import OpKind
from workbench.schedules.registry import REGISTRY


@dataclass(frozen=True)
class Shape:
    """What a closed form reads of a schedule (module docstring for the symbols)."""

    depth: int
    per_step: int
    total: int
    chunks: int
    workers: int
    fwd: float
    bwd: float

    @classmethod
    def of(cls, schedule: Schedule, fwd: float = 1.0, bwd: float = 2.0) -> Shape:
        return cls(
            pipeline_depth(schedule),
            schedule.microbatches_per_step,
            schedule.microbatches,
            max(1, schedule.num_stages // schedule.num_workers),
            schedule.num_workers,
            fwd,
            bwd,
        )


BubbleForm = Callable[[Shape], "tuple[float, str]"]


def pipeline_depth(schedule: Schedule) -> int:
    """Pipeline workers a microbatch crosses: the most distinct workers running one microbatch's forwards."""
    by_mb: dict[int, set] = {}
    for w, op in schedule:
        if op.kind == OpKind.F:
            by_mb.setdefault(op.microbatch, set()).add(w)
    return max((len(ws) for ws in by_mb.values()), default=1)


def fill_drain(c: Shape) -> tuple[float, str]:
    p, m = c.depth, c.per_step
    return (p - 1) / (m + p - 1), f"(p-1)/(m+p-1), p={p} (pipeline depth), m={m}"


def one_round(c: Shape) -> tuple[float, str]:
    p, M = c.depth, c.total
    return (p - 1) / (M + p - 1), f"(p-1)/(M+p-1) fill and drain of one round, p={p}, M={M}"


def one_in_flight(c: Shape) -> tuple[float, str]:
    return (c.depth - 1) / c.depth, f"(p-1)/p, p={c.depth}"


def interleaved(c: Shape) -> tuple[float, str]:
    p, v, m = c.depth, c.chunks, c.per_step
    return (p - 1) / (v * m + p - 1), f"(p-1)/(v m+p-1), p={p}, v={v}, m={m}"


def zb_h1(c: Shape) -> tuple[float, str]:
    p, m, x = c.depth, c.per_step, max(c.fwd, c.bwd / 2)
    return (
        (p - 1) * x / (m * (c.fwd + c.bwd) + (p - 1) * x),
        f"(p-1)x/(m(F+B)+(p-1)x), x=max(F,B/2)={x:g}, p={p}, m={m}",
    )


def zb_h2(c: Shape) -> tuple[float, str]:
    return math.nan, (
        "the paper's (p-1)(T_F+T_B-2T_W) is the per-step idle once steps tile; one round keeps the pipeline fill"
    )


def data_parallel(c: Shape) -> tuple[float, str]:
    S, M = c.workers, c.total
    return 1 - (M / S) / math.ceil(M / S), f"1 - (M/S)/ceil(M/S), S={S}, M={M}"


def closed_form_bubble(schedule: Schedule, fwd: float = 1.0, bwd: float = 2.0) -> tuple[float, str]:
    """(bubble fraction, formula) of ``schedule`` with a worker's forward ``fwd`` and backward
    ``bwd`` and free communication, from the form its registration names; NaN where none is stated."""
    sp = REGISTRY.get(schedule.name)
    if sp is None or sp.bubble is None:
        return math.nan, "no single-round closed form stated in the papers"
    return sp.bubble(Shape.of(schedule, fwd, bwd))

"""Training schedules as per-worker op lists (see :mod:`workbench.schedules.core`).

``build(name, plan_or_stage_count, microbatches, **options)`` makes any schedule of :data:`NAMES`;
``from_placement(w, stages, batches, workers, priority)`` makes a master-family schedule from a
user placement; ``worker_stats(schedule, timeline=None)`` tabulates per-worker statistics.
"""
from __future__ import annotations

from . import generators as _g
from . import master as _m
from . import seq1f1b as _seq
from .core import (COMPUTE, KINDS, UPDATE_RULES, Op, Schedule, ScheduleError, in_flight_peak, validate,
                   with_recompute)
from .generators import noam_warmup, stage_layout
from .master import from_placement, list_schedule, placement
from .stats import worker_stats

DESCRIPTIONS: dict[str, str] = {
    "model-parallel": "one microbatch in flight through all stages, then every stage updates",
    "gpipe": "fill-drain: all forwards, then all backwards, gradient accumulation, one step per flush",
    "pipedream": "1F1B: NOAM warm-up, then one forward one backward, round robin over replicas, no flush",
    "pipedream-flush": "1F1B inside each batch of microbatches, then a flush and a synchronous step",
    "pipedream-2bw": "1F1B without flush, gradient accumulation per batch, two weight buffers, delay one",
    "interleaved-1f1b": "Megatron 1F1B with `chunks` virtual stages per worker (stage s on worker s mod P)",
    "zb-h1": "zero-bubble H1: backward split into BI/BW, deferred BW fills bubbles, 1F1B peak memory",
    "seq1f1b": "Seq1F1B (Sun et al. 2024): 1F1B over (microbatch, segment) units, backward segments reversed",
    "seq1f1b-interleaved": "Seq1F1B with Megatron interleaving: `chunks` stages per worker over segment units",
    "seq1f1b-zb": "Seq1F1B with ZB-H1's split backward: deferred weight gradients fill the cool-down",
    "dp-bsp": "data parallel: each worker all stages, per-stage all-reduce overlapped with backward",
    "dp-asp": "data parallel, asynchronous: each worker steps on its own gradients, no all-reduce",
    "ddp": "master schedule w(s,b)=(b,b): a batch per worker, all weights everywhere",
    "fsdp": "master schedule w(s,b)=(b,s): a batch per worker, stage s's weights owned by worker s",
    "pp": "master schedule w(s,b)=(s,s): GPipe placement, greedy oldest-batch order",
    "lpp": "master schedule looped pipeline: h(s,b)=(R b mod W)+(s mod R) for compute and weights",
    "fslpp": "master schedule fully sharded looped pipeline: compute h(s,b), weights h(s,s)",
}
NAMES: list[str] = list(DESCRIPTIONS)

_EXPLICIT = {
    "model-parallel": (_g.model_parallel, set()),
    "gpipe": (_g.gpipe, {"steps"}),
    "pipedream": (_g.pipedream, {"weights"}),
    "pipedream-flush": (_g.pipedream_flush, {"steps"}),
    "pipedream-2bw": (_g.pipedream_2bw, {"microbatches_per_step"}),
    "interleaved-1f1b": (_g.interleaved_1f1b, {"chunks", "steps"}),
    "zb-h1": (_g.zb_h1, {"steps"}),
    "seq1f1b": (_seq.seq1f1b, {"segments", "seq_len", "steps", "model", "split"}),
    "seq1f1b-interleaved": (_seq.seq1f1b_interleaved, {"segments", "chunks", "seq_len", "steps", "model", "split"}),
    "seq1f1b-zb": (_seq.seq1f1b_zb, {"segments", "seq_len", "steps", "model", "split"}),
    "dp-bsp": (_g.dp_bsp, {"workers"}),
    "dp-asp": (_g.dp_asp, {"workers"}),
}
_MASTER_OPTIONS = {"workers", "group_size", "priority"}


def build(name: str, plan_or_stage_count, microbatches: int, recompute: bool = False, **options) -> Schedule:
    """The schedule ``name`` (one of :data:`NAMES`) for a Plan or a stage count and a number of
    microbatches (per step for gpipe / pipedream-flush / zb-h1 / interleaved-1f1b; in total for
    the others). ``recompute=True`` (any schedule): GPipe activation re-materialization
    (:func:`with_recompute`). The result passes :func:`validate`."""
    if recompute:
        return with_recompute(build(name, plan_or_stage_count, microbatches, **options))
    if name in _EXPLICIT:
        fn, allowed = _EXPLICIT[name]
    elif name in DESCRIPTIONS:
        fn, allowed = None, _MASTER_OPTIONS
    else:
        raise ValueError(f"unknown schedule {name!r}; expected one of {NAMES}")
    extra = set(options) - allowed
    if extra:
        raise ValueError(f"{name} takes options {sorted(allowed)}, not {sorted(extra)}")
    if fn is not None:
        return fn(plan_or_stage_count, microbatches, **options)
    S = len(stage_layout(plan_or_stage_count))
    return _m.build_master(name, S, int(microbatches), **options)


__all__ = ["COMPUTE", "KINDS", "UPDATE_RULES", "Op", "Schedule", "ScheduleError", "in_flight_peak", "validate",
           "build", "NAMES", "DESCRIPTIONS", "from_placement", "list_schedule", "placement", "worker_stats",
           "noam_warmup", "stage_layout", "with_recompute"]

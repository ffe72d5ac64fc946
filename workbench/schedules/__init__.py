"""Training schedules as per-worker op lists (see :mod:`workbench.schedules.core`).

``build(name, plan_or_stage_count, microbatches, **options)`` makes any registered schedule
(:data:`NAMES`; :func:`spec` gives its options, stages per worker, description and source);
``from_placement(w, stages, batches, workers, priority, costs=...)`` makes a master-family schedule
from a user placement; ``worker_stats(schedule, timeline=None)`` tabulates per-worker statistics;
``to_torch_csv`` / ``from_torch_csv`` exchange schedules with ``torch.distributed.pipelining``.

Adding a schedule: write its generator in a module of this package (a new file is fine) and put
``@register(name, description=..., source=..., options={...})`` on it (see
:mod:`workbench.schedules.registry`). Every module of the package is imported here, so the
builder, ``workbench simulate/train --schedule NAME --schedule-option key=value``, the runtime's
launcher, :func:`markdown_table` (the README's table) and the tests pick it up with no other edit.
"""

from __future__ import annotations

import gc
import importlib
import pkgutil
import warnings
from contextlib import contextmanager

from workbench.schedules.core import (
    COMPUTE,
    KINDS,
    UPDATE_RULES,
    Op,
    OpKind,
    Schedule,
    ScheduleError,
    in_flight_peak,
    producers,
    validate,
    with_recompute,
)
from workbench.schedules.registry import REGISTRY, Option, ScheduleSpec, markdown_table, register, spec

for _m in pkgutil.iter_modules(__path__):  # registers every schedule of the package (one decorator each)
    importlib.import_module(f"{__name__}.{_m.name}")

from workbench.schedules.closed_forms import closed_form_bubble  # noqa: E402
from workbench.schedules.generators import noam_warmup, stage_layout  # noqa: E402
from workbench.schedules.master import RULES, JobCosts, from_placement, list_schedule, placement  # noqa: E402
from workbench.schedules.stats import worker_stats  # noqa: E402
from workbench.schedules.torch_csv import from_torch_csv, to_torch_csv  # noqa: E402

NAMES: list[str] = list(REGISTRY)
DESCRIPTIONS: dict[str, str] = {n: s.description for n, s in REGISTRY.items()}


def build(name: str, plan_or_stage_count, microbatches: int, recompute: bool = False, **options) -> Schedule:
    """The schedule ``name`` (one of :data:`NAMES`) for a Plan or a stage count and a number of
    microbatches (per step or in total: ``spec(name).microbatches``). Options are checked against
    the registry (unknown names, wrong types and values give one ValueError). The result passes
    :func:`validate`. ``recompute=True`` (any schedule): GPipe activation re-materialization
    (:func:`with_recompute`)."""
    sp = spec(name)
    options = sp.check_options(options)
    is_plan = hasattr(plan_or_stage_count, "stages") and hasattr(plan_or_stage_count, "num_workers")
    if is_plan:
        _check_plan_shape(sp, plan_or_stage_count, options)
    else:
        _check_stage_count(plan_or_stage_count)
    with gc_paused():
        sched = sp.build(plan_or_stage_count, microbatches, **options)
    if is_plan and "workers" not in options and sched.num_workers != plan_or_stage_count.num_workers:
        raise ValueError(_reshape_message(sp, plan_or_stage_count, sched, options))
    recompute = Option("recompute", bool, False).check(name, recompute)  # "true"/"false" from a CLI
    return with_recompute(sched) if recompute else sched


MAX_STAGES = 1024  # a stage count beyond this is refused (a schedule of 1024 stages already takes seconds to simulate)


def _check_stage_count(n) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_STAGES:
        raise ValueError(f"the stage count must be a positive whole number (at most {MAX_STAGES}), got {n!r}")


def worker_options(name: str, workers: int, options: dict | None = None) -> dict:
    """``options`` typed by the registry (e.g. "2" from a command line -> 2), with ``workers`` set for
    a schedule that takes it (data parallel, master family)."""
    sp = spec(name)
    opts = sp.check_options(dict(options or {}))
    if sp.takes_workers:
        opts.setdefault("workers", workers)
    return opts


def build_for_workers(name: str, workers: int, microbatches: int, plan=None, options: dict | None = None) -> Schedule:
    """Schedule ``name`` on ``workers`` workers, shaped by the registry (no special case by name):
    the plan's stages, or ``spec.stages_for(workers, options)`` (k stages per worker, the ``chunks``
    option's count, 1 for data parallel, one per worker for the master family)."""
    opts = worker_options(name, workers, options)
    return build(name, plan if plan is not None else spec(name).stages_for(workers, opts), microbatches, **opts)


def executor_of(schedule: Schedule) -> str:
    """The runtime executor a schedule needs: its registration's (``pipeline``, ``ddp``,
    ``hogwild``); an unregistered schedule runs on ``hogwild`` when its updates are asynchronous,
    else on ``pipeline``."""
    sp = REGISTRY.get(schedule.name)
    if sp is not None:
        return sp.executor
    return "hogwild" if schedule.update == "async" else "pipeline"


@contextmanager
def gc_paused():
    """Pause Python's cyclic garbage collector while a schedule is built: op lists hold no reference
    cycles, and the collector's passes over 10^5 new objects cost about as much as the build
    itself (64 stages x 1024 microbatches: 1.07 s -> 0.59 s CPU). Reference counting still frees
    everything; the collector is re-enabled (if it was on) on exit."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _check_plan_shape(sp: ScheduleSpec, plan, options: dict) -> None:
    """No silent reshaping: a pipeline schedule on a plan of one replicated stage is data parallel
    under another name. A one-line warning (not an error: the partitioner legitimately returns such
    plans, e.g. VGG-16 on one 4-GPU server, and the schedule still runs, round robin over replicas)."""
    if sp.family == "pipeline" and not sp.data_parallel_plan and plan.num_stages == 1 and plan.num_workers > 1:
        warnings.warn(
            f"the plan is data parallel (1 stage on {plan.num_workers} workers), so {sp.name} runs as data "
            f"parallelism with gradient accumulation; use dp-bsp (or pipedream) to say so, or partition "
            f"into several stages (partition(..., straight=True), --straight) for a pipeline",
            UserWarning,
            stacklevel=3,
        )


def _reshape_message(sp: ScheduleSpec, plan, sched: Schedule, options: dict) -> str:
    have, got, S = plan.num_workers, sched.num_workers, sched.num_stages
    if isinstance(sp.stages_per_worker, str) and sp.stages_per_worker not in ("all", "placement"):
        k = sp.stages_per_worker
        v = options.get(k, sp.option(k).default)
        return (
            f"{sp.name} with {k}={v} runs the plan's {S} stages on {got} of its {have} workers (stage s on worker "
            f"s mod {got}, which a plan of one worker per stage cannot express); pass {k}=1, or a stage count "
            f"instead of the plan ({v * have} stages for {have} workers)"
        )
    return (
        f"{sp.name} uses {got} workers but the plan has {have}; pass workers={got} explicitly "
        f"(--schedule-option workers={got}) if that is intended"
    )


__all__ = [
    "COMPUTE",
    "KINDS",
    "UPDATE_RULES",
    "Op",
    "OpKind",
    "Schedule",
    "ScheduleError",
    "in_flight_peak",
    "validate",
    "producers",
    "build",
    "NAMES",
    "DESCRIPTIONS",
    "REGISTRY",
    "Option",
    "ScheduleSpec",
    "register",
    "spec",
    "markdown_table",
    "from_placement",
    "list_schedule",
    "placement",
    "RULES",
    "JobCosts",
    "worker_stats",
    "noam_warmup",
    "build_for_workers",
    "worker_options",
    "executor_of",
    "closed_form_bubble",
    "stage_layout",
    "to_torch_csv",
    "from_torch_csv",
    "with_recompute",
]

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

import importlib
import pkgutil

from .core import (COMPUTE, KINDS, UPDATE_RULES, Op, OpKind, Schedule, ScheduleError, in_flight_peak, producers,
                   validate, with_recompute)
from .registry import REGISTRY, Option, ScheduleSpec, markdown_table, register, spec

for _m in pkgutil.iter_modules(__path__):  # registers every schedule of the package (one decorator each)
    importlib.import_module(f"{__name__}.{_m.name}")

from .generators import noam_warmup, stage_layout  # noqa: E402
from .master import JobCosts, from_placement, list_schedule, placement  # noqa: E402
from .stats import worker_stats  # noqa: E402
from .torch_csv import from_torch_csv, to_torch_csv  # noqa: E402

NAMES: list[str] = list(REGISTRY)
DESCRIPTIONS: dict[str, str] = {n: s.description for n, s in REGISTRY.items()}


def build(name: str, plan_or_stage_count, microbatches: int, recompute: bool = False, **options) -> Schedule:
    """The schedule ``name`` (one of :data:`NAMES`) for a Plan or a stage count and a number of
    microbatches (per step or in total: ``spec(name).microbatches``). Options are checked against
    the registry (unknown names, wrong types and values give one ValueError). The result passes
    :func:`validate`. ``recompute=True`` (any schedule): GPipe activation re-materialization
    (:func:`with_recompute`)."""
    sp = spec(name)
    sched = sp.build(plan_or_stage_count, microbatches, **sp.check_options(options))
    recompute = Option("recompute", bool, False).check(name, recompute)  # "true"/"false" from a CLI
    return with_recompute(sched) if recompute else sched


__all__ = ["COMPUTE", "KINDS", "UPDATE_RULES", "Op", "OpKind", "Schedule", "ScheduleError", "in_flight_peak",
           "validate", "producers", "build", "NAMES", "DESCRIPTIONS", "REGISTRY", "Option", "ScheduleSpec", "register",
           "spec", "markdown_table", "from_placement", "list_schedule", "placement", "JobCosts", "worker_stats",
           "noam_warmup", "stage_layout", "to_torch_csv", "from_torch_csv", "with_recompute"]

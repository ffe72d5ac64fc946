"""Schedules planned at the durations the simulator will charge, and the bubble/memory table.

Some schedules order their ops by durations (the master family's greedy rule, the V-shape
zero-bubble family): their registration names the costs object they plan with (``costs_from``:
``"job"`` or ``"split"``). :func:`build_for_simulation` simulates the schedule once, reads those
durations back from the timeline (one cost model: the same charges the simulation will make) and
builds the schedule again with them. This lives beside the simulator so that the schedules package
never imports it.
"""

from __future__ import annotations

import pandas as pd

from workbench.schedules import build, spec
from workbench.schedules.core import Schedule
from workbench.schedules.master import JobCosts
from workbench.schedules.vshape_order import SplitCosts
from workbench.schedules.zero_bubble import COMPARED, TORCH_CLASS
from workbench.simulation import simulate  # the package's entry point (its __init__ does not import this module)


def planning_costs(schedule: Schedule, **simulate_kwargs) -> JobCosts | SplitCosts:
    """The costs ``schedule``'s registration plans with (``costs_from``), read from
    ``simulate(schedule, **simulate_kwargs)``'s timeline."""
    kind = spec(schedule.name).costs_from
    timeline = simulate(schedule, **simulate_kwargs).timeline
    if kind == "job":
        return JobCosts.from_timeline(timeline, schedule)
    if kind == "split":
        return SplitCosts.from_timeline(timeline, schedule.num_stages)
    raise ValueError(f"{schedule.name} does not plan its order with durations (registered costs_from={kind!r})")


def build_for_simulation(
    name: str, plan_or_stage_count, microbatches: int, simulate_kwargs: dict | None = None, **options
) -> Schedule:
    """:func:`~workbench.schedules.build`, and for a schedule whose order depends on durations (its
    registration's ``costs_from``) the order planned with the durations
    ``simulate(schedule, **simulate_kwargs)`` will charge, unless ``costs`` is given."""
    sched = build(name, plan_or_stage_count, microbatches, **options)
    if spec(name).costs_from is None or "costs" in options:
        return sched
    costs = planning_costs(sched, **(simulate_kwargs or {}))
    return build(name, plan_or_stage_count, microbatches, costs=costs, **options)


def bubble_memory_table(
    workers: int = 4, microbatches: int = 8, fwd: float = 1.0, bwd: float = 2.0, names=COMPARED
) -> pd.DataFrame:
    """Modeled (simulator, unit costs, no communication cost) bubble and peak activation memory of
    each schedule on ``workers`` workers and ``microbatches`` microbatches, for one model whose
    per-worker forward costs ``fwd`` and backward ``bwd`` (split: input and weight gradient
    ``bwd / 2`` each). A schedule with v stages per worker charges ``fwd / v``, ``bwd / v`` per stage.

    Columns: ``makespan`` of one step; ``bubble_fraction`` = 1 - busy / makespan (worst worker);
    ``span_bubble_fraction`` = 1 - busy / the worker's own span, first op to last (worst worker: the
    zero-bubble papers' bubble rate);
    ``steady_idle_per_step``: spacing of stage 0's updates over 3 steps minus M (fwd + bwd);
    ``peak_activations``: most microbatches' activations held by one worker, in 1F1B units (one
    microbatch of a whole worker's layers; a V chunk counts 1/2)."""
    rows = []
    for name in names:
        v = spec(name).stages_for(1, {})
        costs = dict(fwd=fwd / v, bwd=bwd / v)
        one = simulate(build_for_simulation(name, workers * v, microbatches, costs), fwd / v, bwd / v)
        three = simulate(build_for_simulation(name, workers * v, microbatches, costs, steps=3), fwd / v, bwd / v)
        rows.append(
            {
                "schedule": name,
                "stages_per_worker": v,
                "makespan": one.makespan,
                "bubble_fraction": max(one.metrics["bubble_fraction"]),
                "span_bubble_fraction": max(one.metrics["span_bubble_fraction"]),
                "steady_idle_per_step": three.metrics["steady_iteration_time"] - microbatches * (fwd + bwd),
                "peak_activations": max(one.metrics["peak_activations"]) / v,
                "torch": TORCH_CLASS.get(name, ""),
            }
        )
    return pd.DataFrame(rows).set_index("schedule")

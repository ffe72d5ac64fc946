"""ZB-1p, ZB-2p and any memory limit: the zero-bubble paper's automatic scheduler on a straight pipeline.

Qi et al., "Zero Bubble Pipeline Parallelism" (ICLR 2024, arXiv 2401.10241), §3.1. P stages, one per
worker, M microbatches, the backward split into B (``BI``, input gradient) and W (``BW``, weight
gradient), planned at given T_F, T_B, T_W and T_comm (:class:`SplitCosts`) under a memory limit of
``limit`` microbatches' activations per worker (counted from a microbatch's F to its W). ZB-1p is
the limit P (1F1B's peak), ZB-2p 2P. The heuristic (:class:`Heuristic`), the paper's four rules:

1. warm-up: every stage runs F of microbatch 0; then, from the last stage back, stage j adds F's
   while they fit in its memory and end before the first B's input gradient can arrive (knob
   ``late_f``: while they start before it, which may delay that B by less than T_F); a stage runs
   at least one F more than the next one (as many once both run all M);
2. steady state: each round every stage runs one F (from the first stage down) and one B (from
   the last stage up). Before each, pending W's fill the wait for the op's input: every W that
   ends before the input arrives, then one more when the input arrives within T_W (knob
   ``small_gaps``: always; otherwise only when idling would raise the largest cumulative bubble
   of any stage). A W also runs when the F would exceed the memory limit. The input stage's B
   feeds no other stage: once its F's are done its pending W's go before each B;
3. a stage ahead of the next by two or more F's skips its F when it would not fill a wait for its
   next B anyway (knob ``skip_f``); a skip propagates to the stages before it, so each keeps at
   least one F more than the next;
4. the W's left are run at the end.

The eight knob settings give eight orders. :func:`plan_orders` adds the memory-limited list
scheduler of :mod:`workbench.schedules.vshape` (its four variants, same costs and limit) and keeps,
of the candidates, the one with the shortest makespan (``objective="makespan"``) or the shortest
longest per-stage span, first F start to last W end (``objective="span"``: the figure the paper's
scheduler minimises, the period of one iteration when iterations follow each other without a
flush, as with the paper's optimizer post-validation); the other figure breaks ties. The paper's
ILP refinement of the heuristic is not run here.

Timing (:func:`workbench.schedules.vshape_order.order_times`): every op starts as soon as its
stage's order and its inputs allow, an input from another stage ``comm`` after its op ended; the
simulator charges the same times (tested).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from workbench.schedules.core import Schedule, ScheduleError, validate
from workbench.schedules.generators import Key, assign_versions, insert_updates, stage_layout
from workbench.schedules.registry import register
from workbench.schedules.vshape import VARIANTS, greedy_orders
from workbench.schedules.vshape_order import SplitCosts, order_times

OBJECTIVES = ("makespan", "span")


@dataclass(frozen=True)
class Knobs:
    """The heuristic's three binary settings (module docstring): ``late_f`` (warm-up F's that start
    before the first B's input arrives), ``skip_f`` (a stage ahead by >= 2 F's may skip one),
    ``small_gaps`` (a W fills every wait shorter than T_W)."""

    late_f: bool
    skip_f: bool
    small_gaps: bool


KNOBS = tuple(Knobs(*k) for k in itertools.product((True, False), repeat=3))


class MemoryFull(Exception):
    """The heuristic needs room for an F but the stage has no W left to free memory."""


class Heuristic:
    """One run of the heuristic (module docstring) for P stages, M microbatches, ``costs``, at most
    ``limit`` live microbatches per stage; :meth:`orders` gives the per-stage orders."""

    def __init__(self, P: int, M: int, costs: SplitCosts, limit: int, knobs: Knobs):
        self.P, self.M, self.c, self.limit, self.knobs = P, M, costs, limit, knobs
        self.done = {k: [0] * P for k in ("F", "BI", "BW")}
        self.free = [0.0] * P  # when each stage's last op ends
        self.bubble = [0.0] * P  # idle time after the stage's first op
        self.end: dict[Key, float] = {}
        self.out: list[list[Key]] = [[] for _ in range(P)]

    def arrival(self, kind: str, j: int) -> float:
        """When the input of stage j's next ``kind`` is there (its producer must have been put)."""
        i, c = self.done[kind][j], self.c.comm
        if kind == "F":
            return self.end[("F", j - 1, i)] + c if j > 0 else 0.0
        if kind == "BI":
            return self.end[("BI", j + 1, i)] + c if j < self.P - 1 else self.end[("F", j, i)]
        return self.end[("BI", j, i)]

    def put(self, kind: str, j: int) -> None:
        key = (kind, j, self.done[kind][j])
        start = max(self.free[j], self.arrival(kind, j))
        if self.out[j]:
            self.bubble[j] += start - self.free[j]
        self.end[key] = self.free[j] = start + self.c.duration(kind, j)
        self.out[j].append(key)
        self.done[kind][j] += 1

    def live(self, j: int) -> int:
        return self.done["F"][j] - self.done["BW"][j]

    def pending_w(self, j: int) -> bool:
        return self.done["BW"][j] < self.done["BI"][j]

    def fill(self, j: int, arrival: float) -> None:
        """Pending W's into stage j's wait for an input that arrives at ``arrival`` (rule 2)."""
        while self.pending_w(j) and self.free[j] + self.c.w[j] <= arrival:
            self.put("BW", j)
        if self.pending_w(j) and self.free[j] < arrival:
            raises_max = arrival - self.free[j] > max(self.bubble) - self.bubble[j]
            if self.knobs.small_gaps or raises_max:
                self.put("BW", j)

    def make_room(self, j: int) -> None:
        while self.live(j) + 1 > self.limit:
            if not self.pending_w(j):
                raise MemoryFull(f"stage {j} holds {self.live(j)} microbatches and has no W to free one")
            self.put("BW", j)

    def warmup(self) -> None:
        """Rule 1: F0 everywhere, the warm-up F's, then B0 from the last stage up."""
        P, M, c = self.P, self.M, self.c
        for j in range(P):
            self.put("F", j)
        count = [1] * P
        b_end = self.end[("F", P - 1, 0)] + c.b[P - 1]
        for j in range(P - 2, -1, -1):
            clock, due = self.free[j], b_end + c.comm
            while count[j] < min(M, self.limit) and (clock < due if self.knobs.late_f else clock + c.f[j] <= due):
                clock += c.f[j]
                count[j] += 1
            b_end = max(clock, due) + c.b[j]
        for j in range(1, P):  # one F fewer than the stage before, unless both have run all M
            n = min(count[j], count[j - 1])
            count[j] = max(1, n if n == M else min(n, count[j - 1] - 1))
        for j in range(P):
            for _ in range(count[j] - 1):
                self.put("F", j)
        for j in range(P - 1, -1, -1):
            self.put("BI", j)

    def skips(self, j: int) -> bool:
        """Rule 3: stage j (ahead of j + 1 by >= 2 F's) skips its F when the F would not fit in the
        wait for its next B, and the wait it leaves is filled by W's or raises no stage's maximum."""
        c, nxt = self.c, j + 1
        due = self.free[nxt] + c.f[nxt] + c.b[nxt] + c.comm  # B's input if stage j+1 runs F then B
        if self.free[j] + c.f[j] <= due:
            return False
        gap = due - self.free[j]
        pending = (self.done["BI"][j] - self.done["BW"][j]) * c.w[j]
        return gap <= 0 or pending >= gap or gap <= max(self.bubble) - self.bubble[j]

    def round(self) -> None:
        """Rule 2 for one round: one F per stage (rule 3's skips), then one B per stage."""
        P, f = self.P, self.done["F"]
        want = [f[j] < self.M for j in range(P)]
        if self.knobs.skip_f:
            for j in range(P - 1):
                if want[j] and f[j] >= f[j + 1] + 2 and self.skips(j):
                    want[j] = False
        for j in range(P - 2, -1, -1):
            want[j] = want[j] and (want[j + 1] or f[j + 1] >= self.M)
        for j in range(P):
            if want[j]:
                self.make_room(j)
                if j > 0:
                    self.fill(j, self.arrival("F", j))
                self.put("F", j)
        for j in range(P - 1, -1, -1):
            if j < P - 1:
                self.fill(j, self.arrival("BI", j))
            if j == 0 and f[0] == self.M:
                while self.pending_w(0):
                    self.put("BW", 0)
            self.put("BI", j)

    def orders(self) -> list[list[Key]]:
        self.warmup()
        for _ in range(1, self.M):
            self.round()
        for j in range(self.P):
            while self.pending_w(j):
                self.put("BW", j)
        return self.out


def spans(orders: list[list[Key]], costs: SplitCosts) -> tuple[float, float]:
    """(makespan, longest per-stage span: first op's start to last op's end) of straight-pipeline
    orders at ``costs``."""
    end = order_times(orders, list(range(len(orders))), costs)
    first = [end[o[0]] - costs.duration(o[0][0], o[0][1]) for o in orders]
    return max(end.values()), max(end[o[-1]] - s for o, s in zip(orders, first))


def candidates(P: int, M: int, costs: SplitCosts, limit: int) -> list[list[list[Key]]]:
    """The heuristic's orders (:data:`KNOBS`) and the list scheduler's (``VARIANTS``) that keep
    every stage within ``limit`` live microbatches."""
    out = []
    for knobs in KNOBS:
        try:
            out.append(Heuristic(P, M, costs, limit, knobs).orders())
        except MemoryFull:
            continue
    for prio, w_with_b in VARIANTS:
        try:
            out.append(greedy_orders(list(range(P)), M, [limit] * P, prio, w_with_b, cost=costs)[0])
        except ScheduleError:
            continue
    return out


def plan_orders(P: int, M: int, costs=None, limit: int | None = None, objective: str = "makespan") -> list[list[Key]]:
    """The best of :func:`candidates` for ``objective`` (module docstring); ``limit`` default P."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {list(OBJECTIVES)}, got {objective!r}")
    c = SplitCosts.of(costs, P)
    limit = P if limit is None else limit
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise ValueError(f"mem_limit must be a positive int (microbatches' activations per worker), got {limit!r}")
    pick = 0 if objective == "makespan" else 1

    def score(orders):
        ms = spans(orders, c)
        return (ms[pick], ms[1 - pick])

    return min(candidates(P, M, c, limit), key=score)


def zb_schedule(name: str, plan, microbatches: int, **how) -> Schedule:
    """Schedule ``name`` from :func:`plan_orders` (``how``: steps, costs, mem_limit, objective),
    repeated for ``steps`` steps, each stage stepping once per step."""
    layout = stage_layout(plan)
    if any(len(ws) != 1 for ws in layout) or sorted(ws[0] for ws in layout) != list(range(len(layout))):
        raise ValueError(f"{name} needs a straight pipeline (one worker per stage); pass a stage count")
    P, M, T = len(layout), _positive(microbatches, "microbatches"), _positive(how.get("steps", 1), "steps")
    limit = how.get("mem_limit")
    limit = P if limit is None else limit
    c = SplitCosts.of(how.get("costs"), P)
    one = plan_orders(P, M, c, limit, how.get("objective", "makespan"))
    orders = [[(k, s, b + t * M) for t in range(T) for k, s, b in o] for o in one]
    ops = assign_versions(insert_updates(orders, layout, lambda s, b: b // M, lambda s: T), "sync")
    sched = Schedule(
        name=name,
        num_stages=P,
        num_workers=P,
        microbatches=M * T,
        ops=tuple(tuple(o) for o in ops),
        stage_workers=layout,
        update="sync",
        microbatches_per_step=M,
        max_in_flight=(limit,) * P,
        options={"steps": T, "memory_limit": limit, "planned_costs": (c.f, c.b, c.w, c.comm)},
    )
    validate(sched)
    return sched


def _positive(x, what: str) -> int:
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise ValueError(f"{what} must be a positive int, got {x!r}")
    return x


COSTS_HELP = (
    "per-op durations the order is planned for: 'F,B,W[,C]' (B input gradient, W weight gradient, "
    "C per message between workers) or a SplitCosts; default unit F = B = W = 1, C = 0; "
    "build_for_simulation passes the simulator's"
)
OBJECTIVE_HELP = "makespan: shortest single step; span: shortest longest per-stage span (the paper's objective)"
OPTIONS = {"steps": "iterations (flushes) in the schedule", "costs": COSTS_HELP, "objective": OBJECTIVE_HELP}
SOURCE = "Qi et al., Zero Bubble Pipeline Parallelism (ICLR 2024), section 3.1 (automatic scheduling, heuristic)"


@register(
    "zb-auto",
    description="zero-bubble automatic scheduler: the paper's heuristic at the given costs under mem_limit microbatches per worker",
    source=SOURCE,
    options={**OPTIONS, "mem_limit": "microbatches' activations a worker may hold (F to W); default P"},
    choices={"objective": OBJECTIVES},
    costs_from="split",
)
def zb_at_limit(
    plan, microbatches: int, *, steps: int = 1, costs: object = None, mem_limit: int | None = None, objective="makespan"
) -> Schedule:
    """The automatic scheduler at any memory limit (module docstring)."""
    how = dict(steps=steps, costs=costs, mem_limit=mem_limit, objective=objective)
    return zb_schedule("zb-auto", plan, microbatches, **how)


@register(
    "zb-1p",
    description="ZB-1p: the zero-bubble automatic scheduler at 1F1B's memory (P microbatches), planned at the given costs",
    source=SOURCE,
    options=OPTIONS,
    choices={"objective": OBJECTIVES},
    costs_from="split",
)
def zb_1p(plan, microbatches: int, steps: int = 1, costs: object = None, objective="makespan") -> Schedule:
    """ZB-1p: :func:`zb_at_limit` with ``mem_limit`` = P."""
    P = len(stage_layout(plan))
    return zb_schedule("zb-1p", plan, microbatches, steps=steps, costs=costs, mem_limit=P, objective=objective)


@register(
    "zb-2p",
    description="ZB-2p: the zero-bubble automatic scheduler at twice 1F1B's memory (2P microbatches), planned at the given costs",
    source=SOURCE,
    options=OPTIONS,
    choices={"objective": OBJECTIVES},
    costs_from="split",
)
def zb_2p(plan, microbatches: int, steps: int = 1, costs: object = None, objective="makespan") -> Schedule:
    """ZB-2p: :func:`zb_at_limit` with ``mem_limit`` = 2P."""
    P = len(stage_layout(plan))
    return zb_schedule("zb-2p", plan, microbatches, steps=steps, costs=costs, mem_limit=2 * P, objective=objective)

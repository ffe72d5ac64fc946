"""ZB-H2 and the V-shape family (V-Min, V-Half, V-ZB): schedules under an activation-memory limit.

"Pipeline Parallelism with Controllable Memory" (Qi et al., NeurIPS 2024) places 2P stages in a V
on P workers (rank r holds stages r and 2P - 1 - r) and trades activation memory for bubbles. In
units of one microbatch's activations of a whole worker (1F1B's unit; 1F1B peaks at P), with
T_F = T_B = T_W, the paper's table:

=========  ================  ==============================
schedule   peak activations  bubble rate (1 - busy / span)
=========  ================  ==============================
V-Min      (P + 4) // 3      ~ 2P / 3M
V-Half     (P + 2) // 2      ~ P / 2M
V-ZB       P                 0
=========  ================  ==============================

A V chunk is half of a worker's layers, so the limits in chunks are twice these numbers
(:data:`V_PEAK`). How each is built is in :mod:`workbench.schedules.vshape_order`: V-Min and V-Half are
the paper's building blocks, repeated and squeezed as the authors' generator does; V-ZB is the
ZB-V rule (the same schedule as ``zb-v``). Each is planned at the F, B, W and communication costs
the simulator will charge (option ``costs``; :func:`workbench.simulation.costed_build.build_for_simulation`
passes them), and keeps, of its candidates within the memory limit (the paper's rule and the list
scheduler below, both at those costs), the shortest.

**List scheduler** (:func:`greedy_orders`; the zero-bubble paper's heuristic, §3): a free worker runs
(1) a ready B (input gradient, ``BI``: the critical path), (2) a ready F if the memory limit allows
it, (3) a pending W (``BW``), oldest microbatch first, then the later stage (:data:`VARIANTS` also
tries F before B and W glued to its B). A (stage, microbatch) pair holds one chunk from its F to its
W; a worker keeps one chunk free for a second-stage F (the turn of the V), so it cannot deadlock.

ZB-H2 (zero-bubble paper §3) is the list scheduler on a straight pipeline with every worker limited
to 2P - 1 microbatches (the paper's (2p - 1) M_B): per-step idle time (P - 1)(T_F + T_B - 2 T_W)
for T_W <= T_F (tested), zero at T_F = T_B = T_W once consecutive steps tile (each stage steps as
soon as its own W's are done: no global flush in this IR). A single step keeps the pipeline fill.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import NamedTuple

from workbench.schedules import closed_forms as cf
from workbench.schedules.core import Schedule, ScheduleError
from workbench.schedules.generators import Key, positive_int, repeat_steps, require_straight, stage_layout
from workbench.schedules.registry import register
from workbench.schedules.vshape_order import SplitCosts, block_orders, makespan, v_worker, zbv_orders
from workbench.schedules.zero_bubble import concat_steps, pipeline_size, schedule_of_orders, v_layout, zbv_order

VARIANTS = [
    (("BI", "F", "BW"), False),
    (("BI", "F", "BW"), True),
    (("F", "BI", "BW"), False),
    (("F", "BI", "BW"), True),
]  # (priority of ready kinds, W right after its B)


class GreedyRun(NamedTuple):
    """What :func:`greedy_orders` returns: the per-worker orders and their makespan at its costs."""

    orders: list[list[Key]]
    makespan: float


def greedy_orders(
    worker_of: list[int],
    M: int,
    limit: list[int],
    priority=("BI", "F", "BW"),
    w_with_b: bool = False,
    *,
    cost: SplitCosts | None = None,
) -> GreedyRun:
    """Per-worker orders of F/BI/BW for stages s = 0..S-1 on ``worker_of[s]``, M microbatches,
    at most ``limit[w]`` live (stage, microbatch) activation chunks on worker w, and the makespan
    of those orders at ``cost`` (default: F = B = W = 1, no communication; module docstring). A
    free worker runs the first op in ``priority`` whose inputs have arrived (an input from another
    worker ``cost.comm`` after its op ended), oldest microbatch first, then the later stage;
    ``w_with_b``: a B's W follows it at once (the pair acts as a full backward, freeing its chunk
    early)."""
    S, P = len(worker_of), max(worker_of) + 1
    cost = SplitCosts.of(cost, S)
    stages = [[s for s in range(S) if worker_of[s] == w] for w in range(P)]
    first = [min(ss) for ss in stages]
    end: dict[Key, float] = {}  # finish time of issued ops
    live = [0] * P  # chunks held: F issued, BW not
    free_at = [0.0] * P
    forced: list[Key | None] = [None] * P
    orders: list[list[Key]] = [[] for _ in range(P)]
    nxt = {(k, s): 0 for k in ("F", "BI", "BW") for s in range(S)}
    total, t = 3 * S * M, 0.0
    events: list = []

    def arrived(key, w):
        _, s, _ = key
        lag = cost.comm if worker_of[s] != w else 0.0
        return key in end and end[key] + lag <= t

    def ready(kind, s, b):
        w = worker_of[s]
        if kind == "F":
            return s == 0 or arrived(("F", s - 1, b), w)
        if kind == "BI":
            return arrived(("F", s, b), w) and (s == S - 1 or arrived(("BI", s + 1, b), w))
        return arrived(("BI", s, b), w)

    def admits(w, s):  # keep one chunk free for a second-stage F (the turn of the V)
        need = 2 if len(stages[w]) > 1 and s == first[w] else 1
        return live[w] + need <= limit[w]

    def pick(w):  # each (kind, stage) runs its microbatches in order, so only the next one can be ready
        if forced[w] is not None:
            return forced[w]
        for kind in priority:
            heads = sorted((nxt[(kind, s)], -s) for s in stages[w] if nxt[(kind, s)] < M)
            for b, ns in heads:
                if ready(kind, -ns, b) and (kind != "F" or admits(w, -ns)):
                    return (kind, -ns, b)
        return None

    while len(end) < total:
        progressed = False
        for w in range(P):
            if free_at[w] > t or (key := pick(w)) is None:
                continue
            kind, s, b = key
            end[key] = free_at[w] = t + cost.duration(kind, s)
            heapq.heappush(events, end[key])
            heapq.heappush(events, end[key] + cost.comm)
            orders[w].append(key)
            nxt[(kind, s)] += 1
            live[w] += {"F": 1, "BW": -1}.get(kind, 0)
            forced[w] = ("BW", s, b) if kind == "BI" and w_with_b else None
            progressed = True
        if progressed:
            continue
        while events and events[0] <= t:
            heapq.heappop(events)
        if not events:
            raise ScheduleError(f"memory limit {limit} admits no further op at time {t}; raise the limit")
        t = heapq.heappop(events)
    return GreedyRun(orders, max(free_at))


def best_orders(worker_of: list[int], M: int, limit: list[int]) -> list[list[Key]]:
    """The orders of the :data:`VARIANTS` of :func:`greedy_orders` with the smallest makespan at unit
    costs (the zero-bubble paper's scheduler also tries several settings and keeps the best)."""
    runs = [greedy_orders(worker_of, M, limit, prio, wb) for prio, wb in VARIANTS]
    return min(runs, key=lambda r: r.makespan).orders


@register(
    "zb-h2",
    description="zero-bubble H2: up to 2P-1 microbatches in flight, W fills every gap, no bubble once steps tile",
    source="Qi et al., Zero Bubble Pipeline Parallelism (ICLR 2024), section 3",
    options={"steps": "iterations (flushes) in the schedule"},
    bubble=cf.zb_h2,
)
def zb_h2(plan, microbatches: int, steps: int = 1) -> Schedule:
    """ZB-H2: worker i admits 2(P - 1 - i) + 1 microbatches (peak 2P - 1 on worker 0, about twice
    1F1B's P); greedy order of the module docstring; per-step idle (P-1)(T_F + T_B - 2 T_W)."""
    layout = stage_layout(plan)
    require_straight(layout, "zb-h2")
    P, M, T = len(layout), positive_int(microbatches), positive_int(steps, "steps")
    orders = best_orders(list(range(P)), M, [2 * P - 1] * P)
    return schedule_of_orders("zb-h2", layout, repeat_steps(orders, T, M), M, T, options={}, limit=2 * P - 1)


V_PEAK = {  # peak activations in 1F1B units (a whole worker's layers, one microbatch), Qi et al. 2024
    "v-min": lambda P: (P + 4) // 3,
    "v-half": lambda P: (P + 2) // 2,
    "v-zb": lambda P: P,
    "zb-v": lambda P: P,
}
RULE = {  # the paper's own construction of each schedule (module docstring of vplan)
    "v-min": lambda P, M, costs, limit: [block_orders(P, M, "min")],
    "v-half": lambda P, M, costs, limit: [block_orders(P, M, "half")],
    "v-zb": lambda P, M, costs, limit: zbv_orders(P, M, costs, limit),
    "zb-v": lambda P, M, costs, limit: zbv_orders(P, M, costs, limit),
}
COSTS_HELP = (
    "per-op durations the order is planned for: 'F,B,W[,C]' (B input gradient, W weight gradient, "
    "C per message between workers) or a SplitCosts; default unit F = B = W = 1, C = 0; "
    "build_for_simulation passes the simulator's"
)


def v_candidates(name: str, P: int, M: int, costs: SplitCosts) -> list[list[list[Key]]]:
    """Orders for ``name`` within its memory limit (2 V_PEAK[name](P) chunks per worker): the
    paper's rule (:data:`RULE`) and the list scheduler's :data:`VARIANTS`, all at ``costs``."""
    limit = 2 * V_PEAK[name](P)
    worker_of = [v_worker(P, s) for s in range(2 * P)]
    out = RULE[name](P, M, costs, limit)
    for prio, wb in VARIANTS:
        try:
            out.append(greedy_orders(worker_of, M, [limit] * P, prio, wb, cost=costs).orders)
        except ScheduleError:  # this variant stalls under the limit; the others remain
            continue
    return out


def v_schedule(name: str, plan, microbatches: int, steps: int = 1, costs=None) -> Schedule:
    """``name`` in :data:`V_PEAK`: V placement of 2P stages; of :func:`v_candidates` the order with
    the shortest makespan at ``costs`` (:func:`workbench.schedules.vshape_order.makespan`), repeated for
    ``steps`` steps."""
    P, _ = pipeline_size(plan, name, 2)
    M, T = positive_int(microbatches), positive_int(steps, "steps")
    c = SplitCosts.of(costs, 2 * P)
    worker_of = [v_worker(P, s) for s in range(2 * P)]
    best = min(v_candidates(name, P, M, c), key=lambda o: makespan(o, worker_of, c))
    limit = 2 * V_PEAK[name](P)
    opts = {"chunks": 2, "memory_limit_chunks": limit, "planned_costs": (c.f, c.b, c.w, c.comm)}
    return schedule_of_orders(name, v_layout(P), repeat_steps(best, T, M), M, T, options=opts, limit=limit)


V_OPTIONS = {"steps": "iterations (flushes) in the schedule", "costs": COSTS_HELP}
CONTROLLABLE = "Qi et al., Pipeline Parallelism with Controllable Memory (NeurIPS 2024)"
V_BLOCKS = {  # name: (one-line description, docstring) of each schedule built by v_schedule
    "v-min": (
        "V-Min: the paper's least-memory building block ((P+4)//3 microbatches of a worker, ~1/3 of 1F1B), squeezed, planned at the given costs",
        "V-Min: about 1/3 of 1F1B's activation memory ((P + 4) // 3 microbatches of a worker).",
    ),
    "v-half": (
        "V-Half: the paper's half-memory building block ((P+2)//2 microbatches of a worker), squeezed, planned at the given costs",
        "V-Half: about 1/2 of 1F1B's activation memory ((P + 2) // 2 microbatches of a worker).",
    ),
    "v-zb": (
        "V-ZB: the ZB-V greedy rule at 1F1B's memory (P microbatches of a worker), planned at the given costs",
        "V-ZB: 1F1B's activation memory (P microbatches of a worker), zero bubble at T_F = T_B = T_W; "
        "the same construction as ``zb-v``.",
    ),
}


def _v_generator(name: str, doc: str) -> Callable[..., Schedule]:
    """The registered generator of ``name`` in :data:`V_BLOCKS`: :func:`v_schedule` of ``name``."""

    def generator(plan, microbatches: int, steps: int = 1, costs: object = None) -> Schedule:
        return v_schedule(name, plan, microbatches, steps, costs)

    generator.__name__ = generator.__qualname__ = name.replace("-", "_")
    generator.__doc__ = doc
    return generator


v_min, v_half, v_zb = (
    register(
        name, description=description, source=CONTROLLABLE, stages_per_worker=2, options=V_OPTIONS, costs_from="split"
    )(_v_generator(name, doc))
    for name, (description, doc) in V_BLOCKS.items()
)


@register(
    "zb-v",
    description="ZB-V: V placement (rank r holds stages r and 2P-1-r), the paper's greedy rule at 1F1B memory planned at the given costs; variant=torch: ScheduleZBVZeroBubble's order",
    source="Qi et al., Zero Bubble Pipeline Parallelism (ICLR 2024), section 6; torch.distributed.pipelining (variant=torch)",
    stages_per_worker=2,
    costs_from="split",
    options={
        "steps": "iterations (flushes) in the schedule",
        "costs": COSTS_HELP,
        "variant": "paper: the zero-bubble generator's rule, every M; torch: ScheduleZBVZeroBubble "
        "(plans max(M, 2P-1) microbatches and drops the extra ones)",
    },
    choices={"variant": ("paper", "torch")},
)
def zb_v(plan, microbatches: int, steps: int = 1, costs: object = None, variant: str = "paper") -> Schedule:
    """ZB-V (zero-bubble paper §6): 2P stages in a V on P workers, peak 2P chunks (1F1B's P
    microbatches of a worker). ``variant="torch"``: torch's ScheduleZBVZeroBubble op by op
    (:func:`workbench.schedules.zero_bubble.zbv_order`; costs do not change it)."""
    if variant == "paper":
        return v_schedule("zb-v", plan, microbatches, steps, costs)
    P, _ = pipeline_size(plan, "zb-v", 2)
    M, T = positive_int(microbatches), positive_int(steps, "steps")
    orders = concat_steps(lambda r, off: zbv_order(r, P, M, off), P, M, T)
    return schedule_of_orders("zb-v", v_layout(P), orders, M, T, options={"chunks": 2, "variant": "torch"}, limit=2 * P)

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

A V chunk is half of a worker's layers, so the limits in chunks are twice these numbers.

**Building block (V-Min).** The paper's framework: a schedule repeats one microbatch's *building
block* (start times of its 6P ops) every PERIOD = 6 units (a worker's 2 chunks x (F + B + W)); a
chunk's activations live from its F to its W (its lifespan), so the steady-state peak of a worker is
the most lifespans overlapping modulo PERIOD (:func:`block_peak`). :func:`min_memory_block` places
the ops in dependency order, each in a free slot modulo PERIOD of its worker, and searches the
per-op delays (coordinate descent over {0, 1, 2}, deterministic) for the least peak, then the
shortest block: it reaches the paper's (P + 4) // 3 for P = 3..16 (tests: 3..10), for P = 2 one chunk less.
The per-worker order of the repeated block is the schedule; the executor starts each op as early as
the order allows, which squeezes out the empty warm-up and cool-down slots.

**List scheduler (V-Half, V-ZB, ZB-H2).** The zero-bubble paper's heuristic (§3, "automatic
scheduling"), simulated with unit times and no communication cost: a free worker runs (1) a ready B
(input gradient, ``BI``: the critical path), (2) a ready F if the memory limit allows it, (3) a
pending W (``BW``), oldest microbatch first, then the later stage (:data:`VARIANTS` also tries F
before B and W glued to its B). A (stage, microbatch) pair holds one chunk from its F to its W; a
worker keeps one chunk free for a second-stage F (the turn of the V), so it cannot deadlock. V-Half
and V-ZB take, of the candidates within their limit (the V-Min block, the list scheduler's
variants), the one with the shortest unit-time makespan.

ZB-H2 (zero-bubble paper §3) is the list scheduler on a straight pipeline with every worker limited
to 2P - 1 microbatches (the paper's (2p - 1) M_B): per-step idle time (P - 1)(T_F + T_B - 2 T_W)
for T_W <= T_F (tested), zero at T_F = T_B = T_W once consecutive steps tile (each stage steps as
soon as its own W's are done: no global flush in this IR). A single step keeps the pipeline fill.

The order is the schedule: the simulator, the runtime and the memory numbers read it like any other
schedule; other costs (T_F != T_B) change the timing, not the order.
"""
from __future__ import annotations

from .core import Schedule, ScheduleError
from .generators import Key, _check_m, _straight, stage_layout
from . import closed_forms as cf
from .registry import register
from .zero_bubble import _finish, _pipeline_size, v_layout

UNIT = {"F": 1, "BI": 1, "BW": 1}
VARIANTS = [(("BI", "F", "BW"), False), (("BI", "F", "BW"), True), (("F", "BI", "BW"), False),
            (("F", "BI", "BW"), True)]  # (priority of ready kinds, W right after its B)


def greedy_orders(worker_of: list[int], M: int, limit: list[int], priority=("BI", "F", "BW"), w_with_b: bool = False,
                  cost: dict = UNIT) -> tuple[list[list[Key]], float]:
    """Per-worker orders of F/BI/BW for stages s = 0..S-1 on ``worker_of[s]``, M microbatches,
    at most ``limit[w]`` live (stage, microbatch) activation chunks on worker w, and the makespan
    of those orders at ``cost`` (module docstring). A free worker runs the first ready op in
    ``priority`` (oldest microbatch first, then the later stage); ``w_with_b``: a B's W follows it
    at once (the pair acts as a full backward, freeing its chunk early)."""
    S, P = len(worker_of), max(worker_of) + 1
    stages = [[s for s in range(S) if worker_of[s] == w] for w in range(P)]
    first = [min(ss) for ss in stages]
    end: dict[Key, float] = {}  # finish time of issued ops
    live = [0] * P  # chunks held: F issued, BW not
    free_at = [0.0] * P
    forced: list[Key | None] = [None] * P
    orders: list[list[Key]] = [[] for _ in range(P)]
    nxt = {(k, s): 0 for k in ("F", "BI", "BW") for s in range(S)}
    total, t = 3 * S * M, 0.0

    def done(key):
        return end.get(key, t + 1) <= t

    def ready(kind, s, b):
        if (kind, s, b) in end:
            return False
        if kind == "F":
            return s == 0 or done(("F", s - 1, b))
        if kind == "BI":
            return done(("F", s, b)) and (s == S - 1 or done(("BI", s + 1, b)))
        return done(("BI", s, b))

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
            end[key] = free_at[w] = t + cost[kind]
            orders[w].append(key)
            nxt[(kind, s)] += 1
            live[w] += {"F": 1, "BW": -1}.get(kind, 0)
            forced[w] = ("BW", s, b) if kind == "BI" and w_with_b else None
            progressed = True
        if progressed:
            continue
        later = [x for x in free_at if x > t]
        if not later:
            raise ScheduleError(f"memory limit {limit} admits no further op at time {t}; raise the limit")
        t = min(later)
    return orders, max(free_at)


def best_orders(worker_of: list[int], M: int, limit: list[int]) -> list[list[Key]]:
    """The orders of the :data:`VARIANTS` of :func:`greedy_orders` with the smallest makespan at unit
    costs (the zero-bubble paper's scheduler also tries several settings and keeps the best)."""
    runs = [greedy_orders(worker_of, M, limit, prio, wb) for prio, wb in VARIANTS]
    return min(runs, key=lambda r: r[1])[0]


def _with_offset(orders: list[list[Key]], T: int, M: int) -> list[list[Key]]:
    return [[(k, s, b + t * M) for t in range(T) for k, s, b in o] for o in orders]


@register("zb-h2", description="zero-bubble H2: up to 2P-1 microbatches in flight, W fills every gap, no bubble once steps tile",
          source="Qi et al., Zero Bubble Pipeline Parallelism (ICLR 2024), section 3", options={"steps": "iterations (flushes) in the schedule"},
          bubble=cf.zb_h2)
def zb_h2(plan, microbatches: int, steps: int = 1) -> Schedule:
    """ZB-H2: worker i admits 2(P - 1 - i) + 1 microbatches (peak 2P - 1 on worker 0, about twice
    1F1B's P); greedy order of the module docstring; per-step idle (P-1)(T_F + T_B - 2 T_W)."""
    layout = stage_layout(plan)
    _straight(layout, "zb-h2")
    P, M, T = len(layout), _check_m(microbatches), _check_m(steps, "steps")
    orders = best_orders(list(range(P)), M, [2 * P - 1] * P)
    return _finish("zb-h2", layout, _with_offset(orders, T, M), M, T, {}, limit=2 * P - 1)


V_PEAK = {  # peak activations in 1F1B units (a whole worker's layers, one microbatch), Qi et al. 2024
    "v-min": lambda P: (P + 4) // 3,
    "v-half": lambda P: (P + 2) // 2,
    "v-zb": lambda P: P,
}


PERIOD = 6  # one microbatch's work on one worker: 2 chunks x (F + B + W) at unit times


def _v_worker(P: int, s: int) -> int:
    return s if s < P else 2 * P - 1 - s


def v_block(P: int, delays: list[int]) -> dict[tuple[str, int], int]:
    """A building block: start times of one microbatch's 6P unit ops (F of stages 0..2P-1, then B
    and W of stages 2P-1..0), each at the ``delays[i]``-th free slot (counted modulo PERIOD on its
    worker) at or after its dependency, so that the block repeated every PERIOD never puts two ops
    of a worker at the same time."""
    used: list[set[int]] = [set() for _ in range(P)]
    times: dict[tuple[str, int], int] = {}
    keys = [("F", s) for s in range(2 * P)] + [k for s in reversed(range(2 * P)) for k in (("BI", s), ("BW", s))]
    for (kind, s), skip in zip(keys, delays):
        w = _v_worker(P, s)
        x = times[("F", s - 1)] + 1 if kind == "F" and s > 0 else 0
        if kind == "BI":
            x = times[("BI", s + 1)] + 1 if s < 2 * P - 1 else times[("F", s)] + 1
        elif kind == "BW":
            x = times[("BI", s)] + 1
        while x % PERIOD in used[w] or skip:
            skip -= x % PERIOD not in used[w]
            x += 1
        used[w].add(x % PERIOD)
        times[(kind, s)] = x
    return times


def block_peak(P: int, times: dict) -> list[int]:
    """Peak live activation chunks per worker in the steady state of the repeated block: chunk s
    lives over [F_s, W_s + 1) (its lifespan l_s); with period PERIOD a worker holds at time x
    sum_s #{k : F_s + k PERIOD <= x < W_s + 1 + k PERIOD} chunks, about sum_s l_s / PERIOD."""
    out = []
    for w in range(P):
        count = [0] * PERIOD
        for s in (w, 2 * P - 1 - w):
            for x in range(times[("F", s)], times[("BW", s)] + 1):
                count[x % PERIOD] += 1
        out.append(max(count))
    return out


def min_memory_block(P: int) -> dict[tuple[str, int], int]:
    """The block with the least peak memory (then the shortest span) found by coordinate descent
    over per-op delays in {0, 1, 2}, starting from all ops as early as possible (deterministic)."""
    delays = [0] * (6 * P)

    def cost(d):
        times = v_block(P, d)
        return max(block_peak(P, times)), max(times.values())

    best = cost(delays)
    improved = True
    while improved:
        improved = False
        for i in range(len(delays)):
            for d in (0, 1, 2):
                old, delays[i] = delays[i], d
                c = cost(delays)
                if c < best:
                    best, improved = c, True
                else:
                    delays[i] = old
    return v_block(P, delays)


def block_orders(P: int, M: int, times: dict) -> list[list[Key]]:
    """Per-worker orders of the block repeated M times (microbatch b shifted by b PERIOD); an
    executor (the simulator) then starts each op as early as its order and inputs allow, which
    squeezes the empty warm-up and cool-down slots out."""
    events: list[list[tuple[int, Key]]] = [[] for _ in range(P)]
    for b in range(M):
        for (kind, s), x in times.items():
            events[_v_worker(P, s)].append((x + PERIOD * b, (kind, s, b)))
    return [[k for _, k in sorted(e)] for e in events]


def v_schedule(name: str, plan, microbatches: int, steps: int = 1) -> Schedule:
    """``name`` in :data:`V_PEAK`: V placement of 2P stages. ``v-min`` repeats the least-memory
    building block (:func:`min_memory_block`). ``v-half`` and ``v-zb`` allow 2 * V_PEAK[name](P)
    live chunks per worker (a chunk is half of a worker's layers) and take, of the candidates that
    fit (that block, the list scheduler's :data:`VARIANTS`), the one with the shortest unit-time
    makespan."""
    P, _ = _pipeline_size(plan, name, 2)
    M, T = _check_m(microbatches), _check_m(steps, "steps")
    layout = v_layout(P)
    times = min_memory_block(P)
    block_chunks = max(block_peak(P, times))
    limit = block_chunks if name == "v-min" else 2 * V_PEAK[name](P)
    candidates = [block_orders(P, M, times)] if block_chunks <= limit else []
    if name != "v-min":
        candidates += [greedy_orders([ws[0] for ws in layout], M, [limit] * P, prio, wb)[0] for prio, wb in VARIANTS]
    opts = {"chunks": 2, "memory_limit_chunks": limit}
    built = [_finish(name, layout, _with_offset(o, T, M), M, T, opts, limit) for o in candidates]
    return min(built, key=_unit_makespan)


def _unit_makespan(schedule: Schedule) -> float:
    from ..simulate import simulate  # here: the simulator imports this package
    return simulate(schedule, 1.0, 2.0).makespan


@register("v-min", description="V-shape, least activation memory: (P+4)//3 microbatches of a worker, about 1/3 of 1F1B",
          source="Qi et al., Pipeline Parallelism with Controllable Memory (NeurIPS 2024)", stages_per_worker=2, options={"steps": "iterations (flushes) in the schedule"})
def v_min(plan, microbatches: int, steps: int = 1) -> Schedule:
    """V-Min: about 1/3 of 1F1B's activation memory ((P + 4) // 3 microbatches of a worker)."""
    return v_schedule("v-min", plan, microbatches, steps)


@register("v-half", description="V-shape, at most (P+2)//2 microbatches of a worker, about 1/2 of 1F1B's activation memory",
          source="Qi et al., Pipeline Parallelism with Controllable Memory (NeurIPS 2024)", stages_per_worker=2, options={"steps": "iterations (flushes) in the schedule"})
def v_half(plan, microbatches: int, steps: int = 1) -> Schedule:
    """V-Half: about 1/2 of 1F1B's activation memory ((P + 2) // 2 microbatches of a worker)."""
    return v_schedule("v-half", plan, microbatches, steps)


@register("v-zb", description="V-shape, at most P microbatches of a worker (1F1B's activation memory), near zero bubble",
          source="Qi et al., Pipeline Parallelism with Controllable Memory (NeurIPS 2024)", stages_per_worker=2, options={"steps": "iterations (flushes) in the schedule"})
def v_zb(plan, microbatches: int, steps: int = 1) -> Schedule:
    """V-ZB: 1F1B's activation memory (P microbatches of a worker), zero bubble at T_F = T_B = T_W."""
    return v_schedule("v-zb", plan, microbatches, steps)

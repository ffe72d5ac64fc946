"""Memory-limited zero-bubble schedules made by a list scheduler: ZB-H2 and the V-shape family.

"Pipeline Parallelism with Controllable Memory" (Qi et al., NeurIPS 2024) places 2P stages in a V
on P workers (rank r holds stages r and 2P - 1 - r) and trades activation memory for bubbles. In
units of one microbatch's activations of a whole worker (= 1F1B's unit, 1F1B peaks at P):

=========  =================  ================================
schedule   peak activations   bubble rate (T_F = T_B = T_W)
=========  =================  ================================
V-Min      ceil-ish (P+4)//3  ~ 2P / 3M
V-Half     (P+2)//2           ~ P / 2M
V-ZB       P                  0
=========  =================  ================================

The paper obtains them from repeated building blocks; here each worker's order comes from the
greedy list scheduler of the zero-bubble paper's heuristic (its §3 "automatic scheduling"), run with
unit times T_F = T_B = T_W = 1 and no communication cost:

* a worker that is free runs, in this priority, (1) a ready B (input gradient, ``BI``) — it is on
  the critical path; (2) a ready F if the memory limit allows it; (3) a pending W (``BW``);
* memory: a (stage, microbatch) pair holds one chunk of activations from its F to its W. A
  worker admits the F of its first stage only if its live chunks plus one chunk reserved for every
  microbatch whose second-stage F is still to come stay within the limit, so the second-stage F
  (the one that turns the V around) is always admissible and the greedy cannot deadlock;
* the limit of a V schedule is 2 x the paper's peak (a V chunk is half a worker's layers).

ZB-H2 (zero-bubble paper §3) is the same scheduler on a straight pipeline with worker i limited to
2(P - 1 - i) + 1 microbatches (2P - 1 on worker 0): the order it produces has per-step idle time
(P - 1)(T_F + T_B - 2 T_W) = 0 when consecutive steps tile (each stage steps when its own W's are
done; no global flush in this IR).

The order is the schedule; the simulator, the runtime and the memory numbers then read it like any
other schedule, so other costs (T_F != T_B) only change the timing, not the order.
"""
from __future__ import annotations

from .core import Schedule, ScheduleError
from .generators import Key, _check_m, _straight, stage_layout
from .zero_bubble import _finish, _pipeline_size, v_layout

UNIT = {"F": 1, "BI": 1, "BW": 1}


def greedy_orders(worker_of: list[int], M: int, limit: list[int], cost: dict = UNIT) -> list[list[Key]]:
    """Per-worker orders of F/BI/BW for stages s = 0..S-1 on ``worker_of[s]``, M microbatches,
    at most ``limit[w]`` live (stage, microbatch) activation chunks on worker w (module docstring)."""
    S, P = len(worker_of), max(worker_of) + 1
    stages = [[s for s in range(S) if worker_of[s] == w] for w in range(P)]
    first = [min(ss) for ss in stages]
    end: dict[Key, float] = {}  # finish time of issued ops
    issued: set[Key] = set()
    live = [0] * P  # chunks held: F issued, BW not
    open_ = [0] * P  # microbatches past the first stage's F whose later stage F is not issued
    free_at = [0.0] * P
    orders: list[list[Key]] = [[] for _ in range(P)]
    total, t = 3 * S * M, 0.0

    def done(key):
        return key in end and end[key] <= t

    def ready(kind, s, b):
        if (kind, s, b) in issued:
            return False
        if kind == "F":
            return s == 0 or done(("F", s - 1, b))
        if kind == "BI":
            return done(("F", s, b)) and (s == S - 1 or done(("BI", s + 1, b)))
        return done(("BI", s, b))

    def admits(w, s):
        if len(stages[w]) == 1:
            return live[w] + 1 <= limit[w]
        return s != first[w] or live[w] + open_[w] + 2 <= limit[w]

    def pick(w):
        cands = [(b, -s) for b in range(M) for s in stages[w]]
        for kind in ("BI", "F", "BW"):
            for b, ns in cands:
                if ready(kind, -ns, b) and (kind != "F" or admits(w, -ns)):
                    return (kind, -ns, b)
        return None

    while len(issued) < total:
        progressed = False
        for w in range(P):
            if free_at[w] > t:
                continue
            key = pick(w)
            if key is None:
                continue
            kind, s, b = key
            issued.add(key)
            end[key] = t + cost[kind]
            free_at[w] = end[key]
            orders[w].append(key)
            live[w] += {"F": 1, "BW": -1}.get(kind, 0)
            if kind == "F" and len(stages[w]) > 1:
                open_[w] += 1 if s == first[w] else -1
            progressed = True
        if progressed:
            continue
        later = [x for x in list(end.values()) + free_at if x > t]
        if not later:
            raise ScheduleError(f"memory limit {limit} admits no further op at time {t}; raise the limit")
        t = min(later)
    return orders


def _with_offset(orders: list[list[Key]], T: int, M: int) -> list[list[Key]]:
    return [[(k, s, b + t * M) for t in range(T) for k, s, b in o] for o in orders]


def zb_h2(plan, microbatches: int, steps: int = 1) -> Schedule:
    """ZB-H2: worker i admits 2(P - 1 - i) + 1 microbatches (peak 2P - 1 on worker 0, about twice
    1F1B's P); greedy order of the module docstring; per-step idle (P-1)(T_F + T_B - 2 T_W)."""
    layout = stage_layout(plan)
    _straight(layout, "zb-h2")
    P, M, T = len(layout), _check_m(microbatches), _check_m(steps, "steps")
    orders = greedy_orders(list(range(P)), M, [2 * P - 1] * P)
    return _finish("zb-h2", layout, _with_offset(orders, T, M), M, T, {})


V_PEAK = {  # peak activations in 1F1B units (a whole worker's layers, one microbatch), Qi et al. 2024
    "v-min": lambda P: (P + 4) // 3,
    "v-half": lambda P: (P + 2) // 2,
    "v-zb": lambda P: P,
}


def v_schedule(name: str, plan, microbatches: int, steps: int = 1) -> Schedule:
    """``name`` in :data:`V_PEAK`: V placement of 2P stages, each worker limited to
    2 * V_PEAK[name](P) live chunks (a chunk is half of a worker's layers)."""
    P, _ = _pipeline_size(plan, name, 2)
    M, T = _check_m(microbatches), _check_m(steps, "steps")
    layout = v_layout(P)
    limit = 2 * V_PEAK[name](P)
    orders = greedy_orders([ws[0] for ws in layout], M, [limit] * P)
    return _finish(name, layout, _with_offset(orders, T, M), M, T, {"chunks": 2, "memory_limit_chunks": limit})


def v_min(plan, microbatches: int, steps: int = 1) -> Schedule:
    """V-Min: about 1/3 of 1F1B's activation memory ((P + 4) // 3 microbatches of a worker)."""
    return v_schedule("v-min", plan, microbatches, steps)


def v_half(plan, microbatches: int, steps: int = 1) -> Schedule:
    """V-Half: about 1/2 of 1F1B's activation memory ((P + 2) // 2 microbatches of a worker)."""
    return v_schedule("v-half", plan, microbatches, steps)


def v_zb(plan, microbatches: int, steps: int = 1) -> Schedule:
    """V-ZB: 1F1B's activation memory (P microbatches of a worker), zero bubble at T_F = T_B = T_W."""
    return v_schedule("v-zb", plan, microbatches, steps)

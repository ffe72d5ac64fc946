"""The master schedule of "Unifying Parallelization Schemes to Train Deep Nets" (A. Rahimi).

A job is (s, b, d): stage s of batch b in direction d ("forward" or "backward"). Backprop fixes
the predecessor of every job: pred(s, b, fwd) = (s-1, b, fwd), pred(S-1, b, bwd) = (S-1, b, fwd),
pred(s, b, bwd) = (s+1, b, bwd); so each batch is a chain of 2S jobs.

A schedule is two functions. The placement ``w(s, b, d) -> (compute_worker, weights_worker)``
(the doc writes the pair the other way round; here the compute worker comes first) and a priority
``n(s, b, d)`` (lower runs first) that breaks ties between ready jobs.

Greedy list scheduler (clock-free in the doc: only jobs carry times): whenever a worker is idle
it starts, among the jobs assigned to it whose predecessor has finished, the one with the
smallest n. With unit durations every job takes one tick, so the makespan is the latency column
of the doc's table. Built-in placements (W workers, G groups of R workers, W = G R):

    DDP   (b, b)            FSDP  (b, s)            PP (GPipe)  (s, s)
    LPP   (h(s,b), h(s,b))  FSLPP (h(s,b), h(s,s))  h(s, b) = (R b mod W) + (s mod R)

Weight ownership: ``stage_workers[s]`` = the weights workers of stage s. At the end of the
iteration every owner of s runs AR (if s has several owners) and STEP; gradients computed on a
worker that does not own the weights are pushed to ``weights_worker`` (see
``Schedule.step_microbatches``).
"""
from __future__ import annotations

import heapq
from typing import Callable

import pandas as pd

from .core import Op, Schedule, in_flight_peak, validate

Placement = Callable[[int, int, str], tuple[int, int]]
Priority = Callable[[int, int, str], float]
DIRECTIONS = ("forward", "backward")


def chain(S: int, b: int) -> list[tuple[int, int, str]]:
    """The 2S jobs of batch b in dependency order: F0..F(S-1), B(S-1)..B0."""
    return [(s, b, "forward") for s in range(S)] + [(s, b, "backward") for s in reversed(range(S))]


def priority_key(priority, S: int) -> Callable[[int, int, str], tuple]:
    """Sort key of a job for a named priority or a user function n(s, b, d).

    oldest-batch: smallest b first (depth first: a batch runs to completion before newer ones);
    oldest-stage: smallest s first, then b (breadth first: every batch's early stages first).
    Ties are broken by the job's position in its batch's chain, then b, for determinism."""
    def pos(s, d):
        return s if d == "forward" else 2 * S - 1 - s
    if priority == "oldest-batch":
        return lambda s, b, d: (b, pos(s, d))
    if priority == "oldest-stage":
        return lambda s, b, d: (s, b, pos(s, d))
    if callable(priority):
        return lambda s, b, d: (priority(s, b, d), b, pos(s, d))
    raise ValueError(f"priority must be 'oldest-batch', 'oldest-stage' or a function n(stage, batch, "
                     f"direction), got {priority!r}")


def _placements(w: Placement, S: int, B: int, W: int) -> dict:
    place = {}
    for b in range(B):
        for s in range(S):
            for d in DIRECTIONS:
                got = w(s, b, d)
                try:
                    c, o = (int(x) for x in got)
                except (TypeError, ValueError):
                    raise ValueError(f"w({s}, {b}, {d!r}) must return (compute_worker, weights_worker), "
                                     f"got {got!r}") from None
                if not (0 <= c < W and 0 <= o < W):
                    raise ValueError(f"w({s}, {b}, {d!r}) = {got!r} names a worker outside 0..{W - 1}")
                place[(s, b, d)] = (c, o)
            if place[(s, b, "forward")][0] != place[(s, b, "backward")][0]:
                raise ValueError(f"w({s}, {b}, ·) puts the forward on worker {place[(s, b, 'forward')][0]} "
                                 f"and the backward on {place[(s, b, 'backward')][0]}; the backward must "
                                 f"run where the forward's activations are stored")
    return place


def list_schedule(w: Placement, stages: int, batches: int, workers: int, priority="oldest-batch",
                  fwd: int = 1, bwd: int = 1) -> pd.DataFrame:
    """Run the greedy list scheduler; returns a timeline DataFrame with columns
    ``worker, stage, microbatch, kind, start, end, weights_worker`` (kind F or B), sorted by start.
    Durations are ``fwd`` and ``bwd`` ticks (unit ticks by default, as in the doc's table)."""
    S, B, W = int(stages), int(batches), int(workers)
    if min(S, B, W) < 1:
        raise ValueError(f"stages, batches and workers must be >= 1, got {S}, {B}, {W}")
    place = _placements(w, S, B, W)
    key = priority_key(priority, S)
    chains = [chain(S, b) for b in range(B)]
    nxt = [0] * B                                # index of each batch's next job in its chain
    ready: list[list] = [[] for _ in range(W)]   # per-worker heap of (key, job)
    free_at = [0] * W
    events: list[tuple[int, int]] = []           # (time, batch whose next job becomes ready)
    for b in range(B):
        heapq.heappush(events, (0, b))
    rows = []
    t = 0
    while events:
        t = events[0][0]
        while events and events[0][0] == t:      # release every job that becomes ready at t
            _, b = heapq.heappop(events)
            if b < 0:
                continue                         # a worker-free event
            if nxt[b] < 2 * S:
                job = chains[b][nxt[b]]
                heapq.heappush(ready[place[job][0]], (key(*job), job))
        for wk in range(W):
            if free_at[wk] <= t and ready[wk]:
                _, job = heapq.heappop(ready[wk])
                s, b, d = job
                end = t + (fwd if d == "forward" else bwd)
                rows.append((wk, s, b, "F" if d == "forward" else "B", t, end, place[job][1]))
                free_at[wk] = end
                nxt[b] += 1
                heapq.heappush(events, (end, b))
                heapq.heappush(events, (end, -1))
    df = pd.DataFrame(rows, columns=["worker", "stage", "microbatch", "kind", "start", "end", "weights_worker"])
    return df.sort_values(["start", "worker"], kind="stable").reset_index(drop=True)


def from_placement(w: Placement, stages: int, batches: int, workers: int, priority="oldest-batch",
                   name: str = "master") -> Schedule:
    """Schedule of placement ``w`` and ``priority`` (see module docstring): per-worker op order from
    the greedy list scheduler with unit ticks; one synchronous update per stage at the end."""
    tl = list_schedule(w, stages, batches, workers, priority)
    S, B, W = int(stages), int(batches), int(workers)
    owners = [sorted({int(o) for o in tl.loc[tl["stage"] == s, "weights_worker"]}) for s in range(S)]
    ops: list[list[Op]] = [[] for _ in range(W)]
    for r in tl.itertuples(index=False):
        ww = int(r.weights_worker)
        ops[r.worker].append(Op(r.kind, int(r.stage), int(r.microbatch), 0,
                                weights_worker=None if ww == r.worker else ww))
    for wk in range(W):
        for s in reversed(range(S)):
            if wk in owners[s]:
                if len(owners[s]) > 1:
                    ops[wk].append(Op("AR", s, step=0))
                ops[wk].append(Op("STEP", s, step=0))
    sched = Schedule(name, S, W, B, tuple(map(tuple, ops)), tuple(map(tuple, owners)), "sync", B,
                     tuple(in_flight_peak(o) for o in ops),
                     {"priority": priority if isinstance(priority, str) else "custom",
                      "latency_ticks": int(tl["end"].max())})
    validate(sched)
    return sched


# ---- built-in placements ----------------------------------------------------------------
def lpp_hash(s: int, b: int, R: int, W: int) -> int:
    """h(s, b) = (R b mod W) + (s mod R): group R(b mod G), position s mod R inside the group."""
    return (R * b) % W + s % R


def placement(name: str, workers: int, group_size: int = 1) -> Placement:
    """The doc's placement of ``name`` in (compute_worker, weights_worker) order."""
    W, R = workers, group_size
    if name in ("lpp", "fslpp") and (R < 1 or W % R):
        raise ValueError(f"{name}: group_size R={R} must divide workers W={W} (W = G R)")
    table = {
        "ddp": lambda s, b, d: (b % W, b % W),
        "fsdp": lambda s, b, d: (b % W, s % W),
        "pp": lambda s, b, d: (s % W, s % W),
        "lpp": lambda s, b, d: (lpp_hash(s, b, R, W),) * 2,
        "fslpp": lambda s, b, d: (lpp_hash(s, b, R, W), lpp_hash(s, s, R, W)),
    }
    if name not in table:
        raise ValueError(f"unknown placement {name!r}; expected one of {sorted(table)}")
    return table[name]


def build_master(name: str, stages: int, batches: int, workers: int | None = None,
                 group_size: int | None = None, priority="oldest-batch") -> Schedule:
    """Built-ins: ddp/fsdp (default W = B), pp (W = S), lpp (default R = 2 when it divides, W = the
    largest multiple of R <= S), fslpp (default R = 2, W = R^2)."""
    S, B = int(stages), int(batches)
    R = int(group_size) if group_size is not None else (2 if S >= 2 else 1)
    if workers is None:
        workers = {"ddp": B, "fsdp": B, "pp": S, "lpp": max(R, S // R * R), "fslpp": R * R}[name]
    W = int(workers)
    if name in ("ddp", "fsdp", "pp"):
        R = 1
    return from_placement(placement(name, W, R), S, B, W, priority, name=name)

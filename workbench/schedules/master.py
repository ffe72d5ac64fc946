"""The master schedule of "Unifying Parallelization Schemes to Train Deep Nets" (A. Rahimi).

A job is (s, b, d): stage s of batch b in direction d ("forward" or "backward"). Backprop fixes
the predecessor of every job: pred(s, b, fwd) = (s-1, b, fwd), pred(S-1, b, bwd) = (S-1, b, fwd),
pred(s, b, bwd) = (s+1, b, bwd); so each batch is a chain of 2S jobs.

A schedule is two functions. The placement ``w(s, b, d) -> (compute_worker, weights_worker)``
(the doc writes the pair the other way round; here the compute worker comes first) and a priority
``n(s, b, d)`` (lower runs first) that breaks ties between ready jobs.

Greedy rule (clock-free in the doc: only jobs carry times). The *frontier* is the set of jobs whose
predecessor is scheduled (one per batch: the next job of its chain). A job's finish time is

    t(s, b, d) = max(free(c), t(pred) + x(pred -> c), f(c)) + T(s, d),    c = compute worker of (s, b, d)

with ``free(c)`` the finish of the last job scheduled on c, ``x`` the activation/gradient transfer
when the predecessor ran on another worker, ``f(c)`` the time the weights have arrived when
``weights_worker o != c`` (the fetch starts with the previous job on c -- one job of prefetch, as
the simulator does -- once the link o -> c is free of the previous fetch) and ``T`` the forward or
backward duration of stage s. Activation links are not queued (the simulator queues them: with
transfers that overlap on one link the simulated time can exceed t). At each step the rule schedules the
frontier job of smallest ``t + ε n(s, b, d)`` (ε infinitesimal: ties in t broken by the priority n);
this is ``rule="finish"``, the default. The document's public simulator (``parallelsim.py``) reads
the rule differently, and ``rule="parallelsim"`` reproduces it: its frontier holds the *finished*
jobs; it schedules the successor of smallest start time ``t − T(s, d)``, ties broken by the
priority of the finished job (a virtual job (−1, b, forward) precedes F0). On looped placements
the finish rule is never slower on the recorded grid but may hold more activations (docs/schedules.md).
:func:`from_placement` runs either rule with the durations that will be simulated (:class:`JobCosts`);
with zero transfer and fetch costs, simulating the resulting per-worker order reproduces t exactly.
The unit-tick order (``costs="unit"``) is :func:`list_schedule`, the event-driven list scheduler
of the doc's table (every job one tick; an idle worker starts its ready job of smallest n): its
makespan is the latency column of the doc's table. Built-in placements (W workers, G groups of R workers, W = G R):

    DDP   (b, b)            FSDP  (b, s)            PP (GPipe)  (s, s)
    LPP   (h(s,b), h(s,b))  FSLPP (h(s,b), h(s,s))  h(s, b) = (R b mod W) + (s mod R)

Weight ownership: ``stage_workers[s]`` = the weights workers of stage s. At the end of the
iteration every owner of s runs AR (if s has several owners) and STEP; gradients computed on a
worker that does not own the weights are pushed to ``weights_worker`` (see
``Schedule.step_microbatches``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import pandas as pd

from workbench.schedules import closed_forms as cf
from workbench.schedules.core import Op, Schedule, in_flight_peak, validate
from workbench.schedules.generators import stage_layout
from workbench.schedules.registry import register

Placement = Callable[[int, int, str], tuple[int, int]]
Priority = Callable[[int, int, str], float]
DIRECTIONS = ("forward", "backward")


def chain(S: int, b: int) -> list[tuple[int, int, str]]:
    """The 2S jobs of batch b in dependency order: F0..F(S-1), B(S-1)..B0."""
    return [(s, b, "forward") for s in range(S)] + [(s, b, "backward") for s in reversed(range(S))]


PRIORITIES = {
    "oldest-batch": "smallest batch b first (depth first: a batch runs to completion before newer ones)",
    "lowest-stage": "smallest stage s first, then b, forward and backward alike (not breadth first: "
    "a backward of stage s precedes the forward of stage s of a later batch)",
    "breadth-first": "forwards by (s, b), then backwards by (-s, -b): PyTorch's looped BFS order",
    "stage-direction-batch": "smallest stage s first, then forwards before backwards, then b (the order "
    "parallelsim.py calls OldestStageFirst)",
}

RULES = {
    "finish": "the frontier job of smallest finish time t(j), ties broken by n(j) (the workbench's "
    "cost-aware reading of the greedy rule)",
    "parallelsim": "the document's simulator (parallelsim.py): the frontier job of smallest start time, ties "
    "broken by n of the job its batch ran last (a virtual job (-1, b, forward) before F0)",
}


def priority_key(priority, S: int) -> Callable[[int, int, str], tuple]:
    """Sort key n(s, b, d) of a job for a named priority (:data:`PRIORITIES`) or a user function
    n(s, b, d). Ties are broken by the job's position in its batch's chain, then b, for determinism."""

    def pos(s, d):
        return s if d == "forward" else 2 * S - 1 - s

    if priority == "oldest-batch":
        return lambda s, b, d: (b, pos(s, d))
    if priority == "lowest-stage":
        return lambda s, b, d: (s, b, pos(s, d))
    if priority == "breadth-first":
        return lambda s, b, d: (0, s, b) if d == "forward" else (1, -s, -b)
    if priority == "stage-direction-batch":
        return lambda s, b, d: (s, d != "forward", b)
    if callable(priority):
        return lambda s, b, d: (priority(s, b, d), b, pos(s, d))
    raise ValueError(
        f"priority must be one of {sorted(PRIORITIES)} or a function n(stage, batch, direction), got {priority!r}"
    )


@dataclass(frozen=True)
class JobCosts:
    """Durations the greedy rule schedules with, in the simulator's units (ms, or ticks):
    ``fwd_ms[s]`` / ``bwd_ms[s]`` per microbatch of stage s; ``transfer_ms(s, d, a, b)`` moving the
    input of job (s, ·, d) from worker a to worker b (the activation of stage s-1 for a forward, the
    gradient of stage s+1 for a backward); ``fetch_ms(s, a, b)`` the weights of stage s from owner a
    to b. Both are 0 when a == b; numbers mean the same cost for every pair of workers."""

    fwd_ms: tuple[float, ...]
    bwd_ms: tuple[float, ...]
    transfer_ms: Callable | float = 0.0
    fetch_ms: Callable | float = 0.0

    def __post_init__(self):
        for name in ("fwd_ms", "bwd_ms"):
            vals = getattr(self, name)
            if any(not math.isfinite(v) or v < 0 for v in vals):
                raise ValueError(f"JobCosts.{name} must be finite and >= 0, got {vals!r}")
        for name in ("transfer_ms", "fetch_ms"):
            v = getattr(self, name)
            if not callable(v) and (not math.isfinite(v) or v < 0):
                raise ValueError(f"JobCosts.{name} must be finite and >= 0 (or a function), got {v!r}")

    @classmethod
    def scalar(
        cls,
        fwd: float | Sequence[float],
        bwd: float | Sequence[float],
        stages: int,
        transfer_ms: Callable | float = 0.0,
        fetch_ms: Callable | float = 0.0,
    ) -> JobCosts:
        """Costs of ``stages`` stages from numbers or one number per stage (the simulator's
        ``fwd=``/``bwd=`` arguments)."""

        def per(x, what):
            vals = [float(x)] * stages if isinstance(x, (int, float)) else [float(v) for v in x]
            if len(vals) != stages:
                raise ValueError(f"{what} has {len(vals)} values for {stages} stages; give one per stage or a number")
            return tuple(vals)

        return cls(per(fwd, "fwd"), per(bwd, "bwd"), transfer_ms, fetch_ms)

    @classmethod
    def from_timeline(cls, tl: pd.DataFrame, schedule: Schedule) -> JobCosts:
        """The durations a simulated timeline of ``schedule`` charged
        (:func:`workbench.simulation.costed_build.build_for_simulation` simulates it): compute rows F/B
        per stage, ``send_act``/``send_grad`` and ``fetch_weights`` rows per link. Only pairs of
        workers that the placement uses appear, and the placement, not the order, fixes them: a
        schedule built with any order gives the costs to re-order it."""
        dur = tl["end"] - tl["start"]
        comp = tl["lane"] == "compute"
        per = {
            (k, int(st)): float(v)
            for (k, st), v in dur[comp].groupby([tl["kind"][comp], tl["stage"][comp]]).max().items()
        }
        S = schedule.num_stages
        fwd = tuple(per.get(("F", st), 0.0) for st in range(S))
        bwd = tuple(per.get(("B", st), 0.0) for st in range(S))
        links = {
            (str(r.kind), int(r.stage), int(r.src), int(r.dst)): float(r.end - r.start)
            for r in tl[~comp].itertuples(index=False)
            if r.kind in ("send_act", "send_grad", "fetch_weights")
        }
        return cls(
            fwd,
            bwd,
            transfer_ms=lambda st, d, a, b: links.get(
                ("send_act", st - 1, a, b) if d == "forward" else ("send_grad", st + 1, a, b), 0.0
            ),
            fetch_ms=lambda st, a, b: links.get(("fetch_weights", st, a, b), 0.0),
        )

    def duration(self, s: int, d: str) -> float:
        return self.fwd_ms[s] if d == "forward" else self.bwd_ms[s]

    def transfer(self, s: int, d: str, a: int, b: int) -> float:
        if a == b:
            return 0.0
        return float(self.transfer_ms(s, d, a, b)) if callable(self.transfer_ms) else float(self.transfer_ms)

    def fetch(self, s: int, a: int, b: int) -> float:
        if a == b:
            return 0.0
        return float(self.fetch_ms(s, a, b)) if callable(self.fetch_ms) else float(self.fetch_ms)


def job_costs(costs, stages: int) -> JobCosts:
    """:class:`JobCosts` from ``None`` (forward 1, backward 2: the simulator's default unit costs),
    a pair ``(fwd, bwd)`` of numbers or per-stage sequences, or a JobCosts."""
    if costs is None:
        return JobCosts.scalar(1.0, 2.0, stages)
    if isinstance(costs, JobCosts):
        if len(costs.fwd_ms) != stages or len(costs.bwd_ms) != stages:
            raise ValueError(f"costs give {len(costs.fwd_ms)} stages but the schedule has {stages}")
        return costs
    if isinstance(costs, tuple) and len(costs) == 2:
        return JobCosts.scalar(costs[0], costs[1], stages)
    raise ValueError(f"costs must be 'unit', None (forward 1, backward 2), (fwd, bwd) or a JobCosts, got {costs!r}")


class Placed(NamedTuple):
    """Where one job runs: the worker that computes it and the worker that holds its weights."""

    compute: int
    weights: int


def _placements(w: Placement, S: int, B: int, W: int) -> dict[tuple[int, int, str], Placed]:
    """Every job's :class:`Placed` from ``w``, checked: two workers in 0..W-1, the backward on the
    forward's worker."""
    place: dict[tuple[int, int, str], Placed] = {}
    for b in range(B):
        for s in range(S):
            for d in DIRECTIONS:
                got = w(s, b, d)
                try:
                    c, o = (int(x) for x in got)
                except (TypeError, ValueError):
                    raise ValueError(
                        f"w({s}, {b}, {d!r}) must return (compute_worker, weights_worker), got {got!r}"
                    ) from None
                if not (0 <= c < W and 0 <= o < W):
                    raise ValueError(f"w({s}, {b}, {d!r}) = {got!r} names a worker outside 0..{W - 1}")
                place[(s, b, d)] = Placed(c, o)
            fwd_on, bwd_on = place[(s, b, "forward")].compute, place[(s, b, "backward")].compute
            if fwd_on != bwd_on:
                raise ValueError(
                    f"w({s}, {b}, ·) puts the forward on worker {fwd_on} and the backward on {bwd_on}; "
                    f"the backward must run where the forward's activations are stored"
                )
    return place


def list_schedule(
    w: Placement, stages: int, batches: int, workers: int, priority="oldest-batch", *, fwd: int = 1, bwd: int = 1
) -> pd.DataFrame:
    """Run the greedy list scheduler; returns a timeline DataFrame with columns
    ``worker, stage, microbatch, kind, start, end, weights_worker`` (kind F or B), sorted by start.
    Durations are ``fwd`` and ``bwd`` ticks (unit ticks by default, as in the doc's table)."""
    S, B, W = int(stages), int(batches), int(workers)
    if min(S, B, W) < 1:
        raise ValueError(f"stages, batches and workers must be >= 1, got {S}, {B}, {W}")
    place = _placements(w, S, B, W)
    key = priority_key(priority, S)
    chains = [chain(S, b) for b in range(B)]
    nxt = [0] * B  # index of each batch's next job in its chain
    ready: list[list] = [[] for _ in range(W)]  # per-worker heap of (key, job)
    free_at = [0] * W
    events: list[tuple[int, int]] = []  # (time, batch whose next job becomes ready)
    for b in range(B):
        heapq.heappush(events, (0, b))
    rows = []
    t = 0
    while events:
        t = events[0][0]  # the heap's earliest (time, batch)
        while events and events[0][0] == t:  # release every job that becomes ready at t
            _, b = heapq.heappop(events)
            if b < 0:
                continue  # a worker-free event
            if nxt[b] < 2 * S:
                job = chains[b][nxt[b]]
                heapq.heappush(ready[place[job].compute], (key(*job), job))
        for wk in range(W):
            if free_at[wk] <= t and ready[wk]:
                _, job = heapq.heappop(ready[wk])
                s, b, d = job
                end = t + (fwd if d == "forward" else bwd)
                rows.append((wk, s, b, "F" if d == "forward" else "B", t, end, place[job].weights))
                free_at[wk] = end
                nxt[b] += 1
                heapq.heappush(events, (end, b))
                heapq.heappush(events, (end, -1))
    df = pd.DataFrame(rows, columns=["worker", "stage", "microbatch", "kind", "start", "end", "weights_worker"])
    return df.sort_values(["start", "worker"], kind="stable").reset_index(drop=True)


def check_rule(rule: str) -> str:
    if rule not in RULES:
        raise ValueError(f"rule must be one of {sorted(RULES)}, got {rule!r}")
    return rule


def frontier_schedule(
    w: Placement,
    stages: int,
    batches: int,
    workers: int,
    priority="oldest-batch",
    *,
    costs: JobCosts | None = None,
    rule: str = "finish",
) -> pd.DataFrame:
    """The doc's greedy rule with costs (module docstring): repeatedly schedule one frontier job
    (the next job of some batch's chain). ``rule="finish"``: the job of smallest finish time, ties
    broken by its priority n(job). ``rule="parallelsim"``: the job of smallest start time, ties
    broken by n(prev) of the job ``prev`` its batch ran last (parallelsim.py's reading: its
    frontier holds the finished jobs). Returns the timeline DataFrame of :func:`list_schedule`
    (same columns), times in the units of ``costs``."""
    S, B, W = int(stages), int(batches), int(workers)
    if min(S, B, W) < 1:
        raise ValueError(f"stages, batches and workers must be >= 1, got {S}, {B}, {W}")
    check_rule(rule)
    place = _placements(w, S, B, W)
    key = priority_key(priority, S)
    c = job_costs(costs, S)
    chains = [[(-1, b, "forward")] + chain(S, b) for b in range(B)]  # index 0: the virtual job before F0
    nxt, pred_end = [1] * B, [0.0] * B
    pred_worker: list[int | None] = [None] * B  # where each batch's last job ran
    free, last_start = [0.0] * W, [0.0] * W
    link_free: dict[tuple[int, int], float] = {}  # weight fetches: one at a time per (owner, worker) link
    rows = []
    for _ in range(2 * S * B):
        best: tuple[float, float, tuple, float] | None = None  # (start, end, job, fetched) of the chosen job
        best_order: tuple = ()
        for b in range(B):
            if nxt[b] > 2 * S:
                continue
            s, _, d = job = chains[b][nxt[b]]
            cw, ow = place[job]
            pw = pred_worker[b]
            ready = pred_end[b] + (c.transfer(s, d, pw, cw) if pw is not None else 0.0)
            fetched = 0.0
            if ow != cw:
                fetched = max(last_start[cw], link_free.get((ow, cw), 0.0)) + c.fetch(s, ow, cw)
            start = max(free[cw], ready, fetched)
            end = start + c.duration(s, d)
            order = (end, key(*job)) if rule == "finish" else (start, key(*chains[b][nxt[b] - 1]))
            if best is None or order < best_order:
                best, best_order = (start, end, job, fetched), order
        assert best is not None, "every round has a runnable job (chains are never all finished early)"
        start, end, (s, b, d), fetched = best
        cw, ow = place[(s, b, d)]
        rows.append((cw, s, b, "F" if d == "forward" else "B", start, end, ow))
        free[cw], last_start[cw] = end, start
        if ow != cw:
            link_free[(ow, cw)] = fetched
        nxt[b] += 1
        pred_end[b], pred_worker[b] = end, cw
    df = pd.DataFrame(rows, columns=["worker", "stage", "microbatch", "kind", "start", "end", "weights_worker"])
    return df.sort_values(["start", "worker"], kind="stable").reset_index(drop=True)


def from_placement(
    w: Placement,
    stages: int,
    batches: int,
    workers: int,
    priority="oldest-batch",
    *,
    name: str = "master",
    costs=None,
    rule: str = "finish",
) -> Schedule:
    """Schedule of placement ``w`` and ``priority`` (see module docstring); one synchronous update
    per stage at the end. ``costs``: the durations that will be simulated (:func:`job_costs`:
    None = forward 1, backward 2; ``(fwd, bwd)``; a :class:`JobCosts`), ordered by the doc's greedy
    rule (:func:`frontier_schedule`, ``rule`` one of :data:`RULES`); ``"unit"``: the unit-tick order
    of :func:`list_schedule`. ``options["latency"]`` is the greedy rule's makespan in the units of
    the costs. ``rule="parallelsim"`` with ``costs=None`` reproduces parallelsim.py's latency, peak
    activations and per-worker orders (``priority`` "oldest-batch" is its OldestBatchFirst,
    "stage-direction-batch" its OldestStageFirst)."""
    if isinstance(costs, str) and costs != "unit":
        raise ValueError(f"costs must be 'unit', None, (fwd, bwd) or a JobCosts, got {costs!r}")
    if check_rule(rule) != "finish" and costs == "unit":
        raise ValueError(
            f"rule {rule!r} orders by durations; costs='unit' is the list scheduler's tick order "
            f"(pass costs=(1, 1) for unit durations)"
        )
    tl = (
        list_schedule(w, stages, batches, workers, priority)
        if costs == "unit"
        else frontier_schedule(w, stages, batches, workers, priority, costs=costs, rule=rule)
    )
    S, B, W = int(stages), int(batches), int(workers)
    owners = [sorted({int(o) for o in tl.loc[tl["stage"] == s, "weights_worker"]}) for s in range(S)]
    ops: list[list[Op]] = [[] for _ in range(W)]
    for r in tl.itertuples(index=False):
        ww = int(r.weights_worker)
        ops[r.worker].append(
            Op(r.kind, int(r.stage), int(r.microbatch), 0, weights_worker=None if ww == r.worker else ww)
        )
    for wk in range(W):
        for s in reversed(range(S)):
            if wk in owners[s]:
                if len(owners[s]) > 1:
                    ops[wk].append(Op("AR", s, step=0))
                ops[wk].append(Op("STEP", s, step=0))
    opts = {
        "priority": priority if isinstance(priority, str) else "custom",
        "costs": "unit" if costs == "unit" else ("default" if costs is None else "given"),
        "rule": rule,
        "latency": float(tl["end"].max()),
    }
    if costs == "unit":
        opts["latency_ticks"] = int(tl["end"].max())
    sched = Schedule(
        name,
        S,
        W,
        B,
        tuple(map(tuple, ops)),
        tuple(map(tuple, owners)),
        "sync",
        B,
        tuple(in_flight_peak(o) for o in ops),
        opts,
    )
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


def build_master(
    name: str,
    stages: int,
    batches: int,
    workers: int | None = None,
    group_size: int | None = None,
    *,
    priority="oldest-batch",
    costs=None,
    rule: str = "finish",
) -> Schedule:
    """Built-ins: ddp/fsdp (default W = B), pp (W = S), lpp (default R = 2 when it divides, W = the
    largest multiple of R <= S), fslpp (default R = 2, W = R^2)."""
    S, B = int(stages), int(batches)
    R = int(group_size) if group_size is not None else (2 if S >= 2 else 1)
    if workers is None:
        workers = {"ddp": B, "fsdp": B, "pp": S, "lpp": max(R, S // R * R), "fslpp": R * R}[name]
    W = int(workers)
    if name in ("ddp", "fsdp", "pp"):
        R = 1
    return from_placement(placement(name, W, R), S, B, W, priority, name=name, costs=costs, rule=rule)


_DOC = "Rahimi, Unifying Parallelization Schemes to Train Deep Nets"
_HELP = {
    "workers": "workers W (default: the plan's; without a plan ddp/fsdp W = batches, pp W = S)",
    "priority": "tie break n(s,b,d): " + ", ".join(PRIORITIES) + " or a function",
    "costs": "'unit' (unit-tick order) or durations to order by (API: JobCosts; default F=1, B=2)",
    "rule": "greedy rule: 'finish' (smallest finish time first) or 'parallelsim' (the document's simulator: "
    "smallest start time first)",
}


# ---- the document's table, one row per placement ---------------------------------------------
# (S stages, B microbatches, G groups of R workers) -> the document's constraint on W and its row:
# latency, activation transmit, weight transmit, activation storage, weight storage (module docstring
# of notebooks/repro/unified.py, the reproduction beside the notebooks).
def _ddp_row(S, B, G, R):
    return dict(W=B, R=1, latency=S, act_xmit=0, weight_xmit=0, act_storage=S, weight_storage=S)


def _fsdp_row(S, B, G, R):
    return dict(W=B, R=1, latency=S, act_xmit=0, weight_xmit=S - 1, act_storage=S, weight_storage=1)


def _pp_row(S, B, G, R):
    return dict(W=S, R=1, latency=B + S - 1, act_xmit=B, weight_xmit=0, act_storage=min(S, B), weight_storage=1)


def _lpp_row(S, B, G, R):
    return dict(
        W=G * R,
        R=R,
        latency=S + B / G - 1,
        act_xmit=B,
        weight_xmit=0,
        act_storage=S / R * min(S, B / G),
        weight_storage=S / R,
    )


def _fslpp_row(S, B, G, R):
    return dict(_lpp_row(S, B, G, R), weight_xmit=S - 1, weight_storage=1)


def _master(name: str, description: str, bubble, document_row, group: bool = False):
    """Register master schedule ``name`` (:func:`build_master` of a Plan or a stage count); ``group``:
    it takes option ``group_size`` (R), which the registry reads from the generator's signature."""

    def grouped(
        plan,
        batches: int,
        workers: int | None = None,
        group_size: int | None = None,
        priority: str = "oldest-batch",
        *,
        costs: object = None,
        rule: str = "finish",
    ) -> Schedule:
        if workers is None and hasattr(plan, "num_workers"):
            workers = plan.num_workers
        return build_master(
            name, len(stage_layout(plan)), batches, workers, group_size, priority=priority, costs=costs, rule=rule
        )

    def ungrouped(
        plan,
        batches: int,
        workers: int | None = None,
        priority: str = "oldest-batch",
        costs: object = None,
        *,
        rule: str = "finish",
    ) -> Schedule:
        return grouped(plan, batches, workers, None, priority, costs=costs, rule=rule)

    target: Callable[..., Schedule] = grouped if group else ungrouped
    helps = {**_HELP, "group_size": "R workers per group (W = G R; default 2)"} if group else _HELP
    target.__name__ = target.__qualname__ = name
    target.__doc__ = f"Master schedule {name}: {description} (see :mod:`workbench.schedules.master`)."
    register(
        name,
        description=description,
        source=_DOC,
        options=helps,
        stages_per_worker="placement",
        microbatches="in total",
        family="master",
        bubble=bubble,
        costs_from="job",
        document_row=document_row,
    )(target)
    return target


ddp = _master(
    "ddp", "master schedule w(s,b)=(b,b): a batch per worker, all weights everywhere", cf.data_parallel, _ddp_row
)
fsdp = _master(
    "fsdp",
    "master schedule w(s,b)=(b,s): a batch per worker, stage s's weights owned by worker s",
    cf.data_parallel,
    _fsdp_row,
)
pp = _master("pp", "master schedule w(s,b)=(s,s): GPipe placement, greedy oldest-batch order", cf.fill_drain, _pp_row)
lpp = _master(
    "lpp",
    "master schedule looped pipeline: h(s,b)=(R b mod W)+(s mod R) for compute and weights",
    cf.fill_drain,
    _lpp_row,
    group=True,
)
fslpp = _master(
    "fslpp",
    "master schedule fully sharded looped pipeline: compute h(s,b), weights h(s,s)",
    cf.fill_drain,
    _fslpp_row,
    group=True,
)

"""Cost-aware planners of the V-shape zero-bubble schedules (ZB-V, V-ZB, V-Min, V-Half).

P workers hold 2P stages in a V: worker r runs stage r (its first leg, forward flowing r -> r + 1)
and stage 2P - 1 - r (its second leg, forward flowing r -> r - 1; the V turns on worker P - 1 and
the loss is on worker 0). The backward is split into B (``BI``, input gradient) and W (``BW``,
weight gradient). Durations are those the simulator will charge (:class:`SplitCosts`): F_s, B_s,
W_s per stage and C per message between two workers (0 between the two legs of worker P - 1 and
between the loss forward and its backward on worker 0).

**Timing** (:func:`order_times`): given per-worker orders, every op starts as early as its worker's
order and its inputs allow: F(s, b) after F(s-1, b), B(s, b) after F(s, b) and B(s+1, b), W(s, b)
after B(s, b), + C when the input comes from another worker. The simulator computes the same times
(tests replay the authors' orders through both).

**ZB-V / V-ZB** (:func:`zbv_orders`; Qi et al., ICLR 2024 §6 and NeurIPS 2024): a greedy rule that
keeps at most ``limit`` chunks (stage-microbatch activations, F to W) per worker (2P: 1F1B's memory):

1. warm-up: every worker runs one first-leg F; then from worker P - 1 down to 0, worker r adds
   first-leg F's (on workers 0..r) while they fit in its memory, minding 2r + 2 chunks for the
   microbatches still to turn, and end before the second-leg input reaches it, then runs its first
   second-leg F; then workers r = 1..P-1 catch up, alternating legs, until they have as many F's as
   worker r - 1;
2. 2M rounds: every worker runs one B (the second leg's when its input gradient exists, else the
   first leg's; issued downstream-first) and then one F (second leg first when its input exists).
   Before each, pending W's fill the wait for its input (a W that ends before the input arrives);
   one more W runs when the wait would exceed the largest idle time of any worker so far (for a
   first-leg B or an F only when the variant's ``fill_b`` / ``fill_f`` says so);
3. the remaining W's.

The rule is re-run with each worker's idle time of the previous run as its allowance while that
lowers the largest per-worker idle time; the four (``fill_b``, ``fill_f``) settings give four
orders.

**V-Min / V-Half** (:func:`block_orders`; Qi et al., NeurIPS 2024 §3): the paper's building block
of one microbatch places its four F/B ops of worker r at slots

* V-Min (peak about 1/3 of 1F1B): r, 2P - 1 - r, 2P + g + r, 4P + g - 1 - r with g = 2 if
  3 | P else 0;
* V-Half (about 1/2): 2r, 3P - 2 - r, 3P + g + 2r - 1, 6P + g - 2 - r with g = 3 if 2 | P else 0;

repeated every 6 slots (a worker's F, B, W of two chunks at unit time), W's in the first free slots
after their B. Then two squeezes at unit time: from the first completed microbatch's last B to the
last F (warm-up and steady state kept, the cool-down moved) each op moves to the earliest free slot
after its inputs that keeps the worker's peak memory; once with the W's placed, once without (W's
re-placed after). The squeezed order is then timed at the real costs.

**Re-planning with the real costs.** Each schedule keeps, of its candidates, the order with the
shortest makespan at the costs it is given: the rule's orders above and the memory-limited list
scheduler of :mod:`workbench.schedules.vshape` run at the same costs, under the same memory limit.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from workbench.schedules.generators import Key


@dataclass(frozen=True)
class SplitCosts:
    """Durations of a split-backward pipeline of S stages: forward ``f[s]``, input gradient
    ``b[s]`` (BI), weight gradient ``w[s]`` (BW), and ``comm`` per message between two workers."""

    f: tuple[float, ...]
    b: tuple[float, ...]
    w: tuple[float, ...]
    comm: float = 0.0

    def __post_init__(self):
        for name in ("f", "b", "w"):
            if any(not math.isfinite(x) or x < 0 for x in getattr(self, name)):
                raise ValueError(f"costs {name} must be finite and >= 0, got {getattr(self, name)!r}")
        if not math.isfinite(self.comm) or self.comm < 0:
            raise ValueError(f"costs comm must be finite and >= 0, got {self.comm!r}")

    @classmethod
    def of(cls, costs, stages: int) -> SplitCosts:
        """From None (unit: F = B = W = 1, no communication), a SplitCosts, or a tuple
        ``(F, B, W)`` / ``(F, B, W, C)`` of numbers or per-stage sequences (B: the input-gradient
        half, W: the weight-gradient half). A string ``"F,B,W[,C]"`` (the command line) too."""
        if costs is None:
            costs = (1.0, 1.0, 1.0)
        if isinstance(costs, SplitCosts):
            if len(costs.f) != stages:
                raise ValueError(f"costs give {len(costs.f)} stages but the schedule has {stages}")
            return costs
        if isinstance(costs, str):
            try:
                costs = tuple(float(x) for x in costs.split(","))
            except ValueError:
                raise ValueError(f"costs must be 'F,B,W' or 'F,B,W,C' numbers, got {costs!r}") from None
        if not isinstance(costs, (tuple, list)) or len(costs) not in (3, 4):
            raise ValueError(f"costs must be None, a SplitCosts or (F, B, W[, C]), got {costs!r}")

        def per(x, what):
            vals = [float(x)] * stages if isinstance(x, (int, float)) else [float(v) for v in x]
            if len(vals) != stages:
                raise ValueError(
                    f"costs {what} has {len(vals)} values for {stages} stages; give one per stage or a number"
                )
            return tuple(vals)

        return cls(
            per(costs[0], "F"), per(costs[1], "B"), per(costs[2], "W"), float(costs[3]) if len(costs) == 4 else 0.0
        )

    @classmethod
    def from_timeline(cls, timeline, stages: int) -> SplitCosts:
        """The durations a simulated timeline charged: the longest F, BI, BW of each stage and the
        longest activation or gradient transfer (0 when there is none)."""
        dur = timeline["end"] - timeline["start"]
        comp = timeline["lane"] == "compute"
        per = dur[comp].groupby([timeline["kind"][comp], timeline["stage"][comp]]).max().to_dict()
        msg = dur[timeline["kind"].isin(["send_act", "send_grad"])]

        def pick(k):
            return tuple(float(per.get((k, s), 0.0)) for s in range(stages))

        return cls(pick("F"), pick("BI"), pick("BW"), float(msg.max()) if len(msg) else 0.0)

    def duration(self, kind: str, s: int) -> float:
        return {"F": self.f, "BI": self.b, "BW": self.w}[kind][s]


def v_worker(P: int, s: int) -> int:
    """Worker of stage s in the V: s for s < P, 2P - 1 - s otherwise."""
    return s if s < P else 2 * P - 1 - s


def inputs_of(kind: str, s: int, b: int, S: int) -> list[Key]:
    """The ops whose outputs ``(kind, s, b)`` reads (split backward, straight stage chain)."""
    if kind == "F":
        return [("F", s - 1, b)] if s > 0 else []
    if kind == "BI":
        return [("F", s, b)] + ([("BI", s + 1, b)] if s < S - 1 else [])
    return [("BI", s, b)]


def order_times(orders: Sequence[Sequence[Key]], worker_of: Sequence[int], costs: SplitCosts) -> dict[Key, float]:
    """End time of every op when each starts as early as its worker's order and its inputs allow
    (module docstring, "Timing"). ValueError when the orders deadlock."""
    S = len(worker_of)
    end: dict[Key, float] = {}
    pos, free = [0] * len(orders), [0.0] * len(orders)
    left = sum(len(o) for o in orders)
    while left:
        moved = False
        for w, order in enumerate(orders):
            while pos[w] < len(order):
                kind, s, b = order[pos[w]]
                deps = inputs_of(kind, s, b, S)
                if any(d not in end for d in deps):
                    break
                arrivals = [end[(k, d, u)] + (costs.comm if worker_of[d] != w else 0.0) for k, d, u in deps]
                ready = max([free[w]] + arrivals)
                end[(kind, s, b)] = free[w] = ready + costs.duration(kind, s)
                pos[w] += 1
                left -= 1
                moved = True
        if not moved:
            raise ValueError("the orders deadlock: every worker waits for an op that has not run")
    return end


def makespan(orders, worker_of, costs: SplitCosts) -> float:
    """Last end time of :func:`order_times`."""
    return max(order_times(orders, worker_of, costs).values())


# ---- ZB-V / V-ZB: the greedy rule -----------------------------------------------------------------
class _RuleStuck(Exception):
    """The rule picked an op whose input has not run, or an F over the memory limit: it assumes
    equal costs on every stage (as the authors' generator does); with unequal ones a setting can
    get stuck and then gives no order."""


class _GreedyV:
    """One run of the ZB-V rule (module docstring) for one (fill_b, fill_f) setting and per-worker
    idle-time allowances ``allowed`` (None on the first run)."""

    def __init__(self, P: int, M: int, costs: SplitCosts, limit: int, allowed: list[float] | None):
        self.P, self.M, self.costs, self.limit = P, M, costs, limit
        self.allowed = allowed if allowed is not None else [-1.0] * P
        self.end: dict[Key, float] = {}
        self.clock = [0.0] * P
        self.live = [0] * P
        self.idle = [0.0] * P  # waits after the worker's first F
        self.count: dict[tuple[str, int], int] = {}  # (kind, stage) -> ops issued
        self.pending_w: list[deque] = [deque() for _ in range(P)]  # (stage, microbatch) of B's whose W has not run
        self.orders: list[list[Key]] = [[] for _ in range(P)]

    def legs(self, r: int) -> tuple[int, int]:
        return r, 2 * self.P - 1 - r

    def n(self, kind: str, s: int) -> int:
        return self.count.get((kind, s), 0)

    def upstream(self, kind: str, s: int, b: int) -> Key | None:
        """The input of ``(kind, s, b)`` that comes from another worker (None: none does)."""
        P = self.P
        if kind == "F":
            return ("F", s - 1, b) if s > 0 and s != P else None
        if kind == "BI":
            return ("BI", s + 1, b) if s < 2 * P - 1 and s != P - 1 else None
        return None

    def put(self, r: int, kind: str, s: int) -> None:
        s, b = self.pending_w[r].popleft() if kind == "BW" else (s, self.n(kind, s))
        src = self.upstream(kind, s, b)
        if (kind == "F" and self.live[r] + 1 > self.limit) or (src is not None and src not in self.end):
            raise _RuleStuck
        dur = self.costs.duration(kind, s)
        at = self.clock[r] + dur
        if src is not None:
            at = max(at, self.end[src] + self.costs.comm + dur)
        if self.n("F", r) > 0:
            self.idle[r] += at - (self.clock[r] + dur)
        self.end[(kind, s, b)] = self.clock[r] = at
        self.live[r] += {"F": 1, "BW": -1}.get(kind, 0)
        self.orders[r].append((kind, s, b))
        self.count[(kind, s)] = self.n(kind, s) + 1
        if kind == "BI":
            self.pending_w[r].append((s, b))

    def worst_idle(self, r: int) -> float:
        return max(max(self.idle), max(self.allowed) - self.allowed[r])

    def fill(self, r: int, src: Key | None, extra: bool) -> None:
        """Pending W's that end before ``src``'s output arrives; one more when the wait would
        exceed the worst idle time and ``extra`` allows it."""
        q = self.pending_w[r]
        if src is None:
            return
        arrive = self.end.get(src, -1.0) + self.costs.comm
        while q and arrive >= self.clock[r] + self.costs.w[q[0][0]]:
            self.put(r, "BW", -1)
        if q and extra and arrive - self.clock[r] > self.worst_idle(r) - self.idle[r]:
            self.put(r, "BW", -1)

    def warm_up(self) -> None:
        P, M = self.P, self.M
        for r in range(P):
            self.put(r, "F", r)
        for r in reversed(range(P)):
            s0, s1 = self.legs(r)
            if r < P - 1:
                arrive = self.end[("F", s1 - 1, 0)] + self.costs.comm
                while (
                    self.live[r] + 2 * r + 2 <= self.limit
                    and self.clock[r] + self.costs.f[s0] <= arrive
                    and self.n("F", s0) < M
                ):
                    for j in range(r + 1):
                        self.put(j, "F", j)
            self.put(r, "F", s1)
        leg = 0
        for r in range(1, P):

            def total(x):
                return self.n("F", x) + self.n("F", 2 * P - 1 - x)

            while total(r) < total(r - 1) or self.n("F", 2 * P - 1 - r) <= self.n("F", 2 * P - r) < M:
                for j in reversed(range(r, P)):
                    s = self.legs(j)[leg]
                    if self.n("F", s) < M:
                        self.put(j, "F", s)
                leg = 1 - leg

    def backward_round(self, fill_b: bool) -> None:
        P = self.P
        second, first = [], []
        for r in range(P):
            s0, s1 = self.legs(r)
            if self.n("BI", s0) >= self.n("BI", s1):
                second.append(r)
            elif r == P - 1 or ("BI", s0 + 1, self.n("BI", s0)) in self.end or self.n("BI", s1) >= self.M:
                first.append(r)
            else:
                second.append(r)
        for r, leg in [(r, 0) for r in reversed(first)] + [(r, 1) for r in second]:
            s = self.legs(r)[leg]
            self.fill(r, self.upstream("BI", s, self.n("BI", s)), leg == 0 or fill_b)
            self.put(r, "BI", s)

    def forward_round(self, fill_f: bool) -> None:
        P, M = self.P, self.M
        for r in range(P):
            s0, s1 = self.legs(r)
            if self.n("F", s1) >= M:
                continue
            if self.n("F", s1) >= self.n("F", s0) or r == P - 1:
                s = s0 if self.n("F", s1) >= self.n("F", s0) else s1
            elif ("F", s1 - 1, self.n("F", s1)) in self.end:
                s = s1
            elif self.n("F", s0) < M and (r == 0 or ("F", s0 - 1, self.n("F", s0)) in self.end):
                s = s0
            else:
                continue
            while self.live[r] + 1 > self.limit:
                self.put(r, "BW", -1)
            self.fill(r, self.upstream("F", s, self.n("F", s)), fill_f)
            self.put(r, "F", s)

    def run(self, fill_b: bool, fill_f: bool) -> _GreedyV:
        self.warm_up()
        for _ in range(2 * self.M):
            self.backward_round(fill_b)
            self.forward_round(fill_f)
        for r in range(self.P):
            while self.pending_w[r]:
                self.put(r, "BW", -1)
        return self


def zbv_orders(P: int, M: int, costs: SplitCosts, limit: int) -> list[list[list[Key]]]:
    """The ZB-V rule's orders (module docstring) for the four (fill_b, fill_f) settings, each
    re-run with its per-worker idle times as allowances while that lowers the worst idle time (a
    setting that gets stuck, :class:`_RuleStuck`, gives no order, or its last order before)."""
    out = []
    for fill_b in (True, False):
        for fill_f in (True, False):
            try:
                best = _GreedyV(P, M, costs, limit, None).run(fill_b, fill_f)
            except _RuleStuck:
                continue
            while True:
                try:
                    nxt = _GreedyV(P, M, costs, limit, list(best.idle)).run(fill_b, fill_f)
                except _RuleStuck:
                    break
                if max(nxt.idle) >= max(best.idle):
                    break
                best = nxt
            out.append(best.orders)
    return out


# ---- V-Min / V-Half: the building block, squeezed ---------------------------------------------------
LANES = ("F0", "F1", "B1", "B0")  # a worker's F of leg 0 and 1, B of leg 1 (first) and 0; tie order
REPEAT = 6  # slots between consecutive microbatches' blocks (2 chunks x F, B, W at unit time)


def block_offsets(P: int, memory: str) -> list[tuple[int, int, int, int]]:
    """Slots of one microbatch's F0, F1, B1, B0 on each worker in the paper's building block
    (module docstring): ``memory`` "min" (V-Min) or "half" (V-Half)."""
    if memory == "min":
        g = 2 if P % 3 == 0 else 0
        return [(r, 2 * P - 1 - r, 2 * P + g + r, 4 * P + g - 1 - r) for r in range(P)]
    if memory == "half":
        g = 3 if P % 2 == 0 else 0
        return [(2 * r, 3 * P - 2 - r, 3 * P + g + 2 * r - 1, 6 * P + g - 2 - r) for r in range(P)]
    raise ValueError(f"building block memory must be 'min' or 'half', got {memory!r}")


def _lane_key(P: int, r: int, lane: str, b: int) -> Key:
    kind = {"F": "F", "B": "BI", "W": "BW"}[lane[0]]
    return (kind, r if lane[1] == "0" else 2 * P - 1 - r, b)


def place_w(lanes: dict[str, list[int]], per_leg: bool) -> dict[str, list[int]]:
    """``lanes`` plus W slots: walking the slots in order, each empty slot takes one W of a B seen
    and not yet followed by a W (leg 1's first when ``per_leg``: lanes W1, W0; else one lane W);
    the rest follow the last slot."""
    at = {t: lane for lane in LANES for t in lanes[lane]}
    owed = {"W1": 0, "W0": 0} if per_leg else {"W": 0}
    out = {k: list(lanes[k]) for k in LANES} | {k: [] for k in owed}
    end = max(at)
    for t in range(end + 1):
        if t in at:
            if at[t][0] == "B":
                owed["W" + at[t][1] if per_leg else "W"] += 1
            continue
        lane = next((k for k, n in owed.items() if n), None)
        if lane is not None:
            out[lane].append(t)
            owed[lane] -= 1
    for lane, n in owed.items():
        for _ in range(n):
            end += 1
            out[lane].append(end)
    return out


def slot_peak(lanes: dict[str, list[int]]) -> int:
    """Most chunks a worker holds over the slots (+1 at an F, -1 at a W); without W lanes each B's
    W is taken to run in the first empty slot after it (as :func:`place_w` would put it)."""
    delta = {}
    for lane, times in lanes.items():
        for t in times:
            delta[t] = {"F": 1, "B": 0, "W": -1}[lane[0]]
    explicit_w = len(lanes) > len(LANES)
    live = peak = owed = 0
    for t in range(max(delta) + 1):
        if t in delta:
            live += delta[t]
            owed += t in lanes["B0"] or t in lanes["B1"]
        elif owed and not explicit_w:
            live, owed = live - 1, owed - 1
        peak = max(peak, live)
    return peak


def _earliest(P: int, slots: list[dict], r: int, lane: str, b: int) -> int:
    """First slot after the inputs of (lane, b) on worker r in the current slots: the neighbour's
    same lane (F0, B1 from r - 1; F1, B0 from r + 1), the previous lane of the same microbatch on r
    (F0 -> F1 -> B1 -> B0), the previous microbatch of the lane, and for a W lane the b-th B."""
    mine, deps = slots[r], [-1]
    if lane in ("F0", "B1") and r > 0:
        deps.append(slots[r - 1][lane][b])
    if lane in ("F1", "B0") and r < P - 1:
        deps.append(slots[r + 1][lane][b])
    if lane in LANES[1:]:
        deps.append(mine[LANES[LANES.index(lane) - 1]][b])
    if lane == "W":
        deps.append(sorted(mine["B1"] + mine["B0"])[b])
    if b > 0:
        deps.append(mine[lane][b - 1])
    return max(deps) + 1


def squeeze(P: int, M: int, slots: list[dict], with_w: bool) -> list[dict]:
    """One squeeze (module docstring) of per-worker lane slots, then unit-time ASAP slots of the
    resulting order (W's placed in empty slots when ``with_w`` is False)."""
    slots = [place_w(s, False) if with_w else {k: list(s[k]) for k in LANES} for s in slots]
    cap = max(slot_peak(s) for s in slots)
    taken: list[set[int]] = [set() for _ in range(P)]
    ops = sorted(
        (t, r, i, lane, b) for r, s in enumerate(slots) for i, lane in enumerate(s) for b, t in enumerate(s[lane])
    )
    phase = 0  # 0: warm-up, 1: steady state (kept), 2: cool-down (moved)
    for t, r, _, lane, b in ops:
        if phase == 0 and lane == "B0" and r == 0:
            phase = 1
        if phase == 1 or (phase == 0 and not with_w):
            phase += phase == 1 and lane == "F0" and b == M - 1
            taken[r].add(t)
            continue
        for x in range(_earliest(P, slots, r, lane, b), t):
            if x in taken[r]:
                continue
            slots[r][lane][b] = x
            if slot_peak(slots[r]) <= cap:
                break
        else:
            slots[r][lane][b] = t
        taken[r].add(slots[r][lane][b])
    slots = slots if with_w else [place_w(s, False) for s in slots]
    return _unit_asap(P, slots)


def lane_orders(P: int, slots: list[dict]) -> list[list[Key]]:
    """Per-worker orders of lane slots (a W lane "W": the k-th W follows the k-th B in slot order)."""
    out = []
    for r, s in enumerate(slots):
        ev = [(t, _lane_key(P, r, lane, b)) for lane in s if lane != "W" for b, t in enumerate(s[lane])]
        if "W" in s:
            bs = sorted((t, _lane_key(P, r, lane, b)) for lane in ("B1", "B0") for b, t in enumerate(s[lane]))
            ev += [(t, ("BW",) + bs[k][1][1:]) for k, t in enumerate(s["W"])]
        out.append([k for _, k in sorted(ev)])
    return out


def _unit_asap(P: int, slots: list[dict]) -> list[dict]:
    """Start slots of every lane op when the slots' order runs at unit time without communication."""
    orders = lane_orders(P, slots)
    unit = SplitCosts.of(None, 2 * P)
    end = order_times(orders, [v_worker(P, s) for s in range(2 * P)], unit)
    out = []
    for r, s in enumerate(slots):
        lanes = {lane: [int(end[_lane_key(P, r, lane, b)]) - 1 for b in range(len(s[lane]))] for lane in LANES}
        if "W" in s:  # anonymous W's: their slots in order
            lanes["W"] = sorted(int(end[k]) - 1 for k in orders[r] if k[0] == "BW")
        out.append(lanes)
    return out


def block_orders(P: int, M: int, memory: str) -> list[list[Key]]:
    """V-Min / V-Half orders (module docstring): the building block repeated M times, squeezed with
    and then without W's, W's placed per leg."""
    slots = [
        {lane: [x + REPEAT * b for b in range(M)] for lane, x in zip(LANES, offs)} for offs in block_offsets(P, memory)
    ]
    slots = squeeze(P, M, slots, with_w=True)
    slots = squeeze(P, M, [{k: s[k] for k in LANES} for s in slots], with_w=False)
    return lane_orders(P, [place_w({k: s[k] for k in LANES}, True) for s in slots])

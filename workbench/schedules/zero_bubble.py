"""Zero-bubble schedules beyond ZB-H1 with torch counterparts: interleaved zero bubble (ZB1P), ZB-V, DualPipeV.

Notation as in the zero-bubble paper (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024):
P workers (ranks), M microbatches per step, the backward split into B (input gradient, op ``BI``)
and W (weight gradient, op ``BW``) with times T_F, T_B, T_W. Per-worker idle time of one step:

* 1F1B:  (P - 1)(T_F + T_B + T_W), peak activations P microbatches (of one stage);
* ZB-H1: (P - 1)(T_F + T_B - T_W), peak P (:func:`workbench.schedules.generators.zb_h1`);
* ZB-H2: (P - 1)(T_F + T_B - 2 T_W), peak 2P - 1 (built by the list scheduler of
  :mod:`workbench.schedules.vshape`).

Several stages per worker (v chunks, S = P v stages):

* ``interleaved-zb`` (torch ``ScheduleInterleavedZeroBubble``, the paper's ZB1P with interleaving):
  stage s on worker s mod P; rank r warms up with min((v - 1) M_r + P - 1 - r, M v) forwards
  (M_r = M / max(1, M // P) microbatches per round), then F, B pairs (chunk k // M_r mod v for the
  k-th forward, reversed for backwards), each followed by a W once r pairs have run.
* ``zb-v`` with ``variant="torch"`` (torch ``ScheduleZBVZeroBubble``, paper §6): V placement, rank r
  holds stages r and 2P - 1 - r (the loss is computed on rank 0); torch's order (:func:`zbv_order`)
  plans max(M, 2P - 1) microbatches and drops the extra ones. Peak activation memory that of 1F1B
  (2P chunks of half a worker's layers on every rank). The default ``zb-v`` (the authors' rule,
  planned at the given costs) is registered in :mod:`workbench.schedules.vshape`.
* ``dualpipev`` (torch ``ScheduleDualPipeV``; DeepSeek-V3's DualPipe folded into a V): the same V
  placement; in steady state each rank runs the forward of one microbatch and the full backward of
  another as one overlapped pair (torch's OVERLAP_F_B). This IR has no overlap op: the pair is two
  consecutive ops, F then B, listed in ``schedule.options["overlap_f_b"]`` as
  ``(worker, (F stage, microbatch), (B stage, microbatch))``. The simulator charges them back to
  back (T_F + T_B); a model of real overlap (compute of one hiding the other's communication)
  would charge max(T_F, T_B) + the exposed part, which is the simulator owner's choice.

Per-rank orders of the three torch schedules are ports of torch 2.13's
``_calculate_single_rank_operations`` (microbatch counters per stage and kind); the tests build
torch's own ``pipeline_order`` without processes and compare op by op.
"""

from __future__ import annotations

from collections import Counter

from workbench.schedules.core import Schedule
from workbench.schedules.generators import (
    Key,
    flushing_schedule,
    in_flight_of,
    interleaved_rounds,
    positive_int,
    require_straight,
    stage_layout,
)
from workbench.schedules.registry import register


class _Counters:
    """Hands out microbatch indices in order, per (kind, stage): torch's ``*_mb_index`` counters."""

    def __init__(self, offset: int = 0):
        self.next: Counter = Counter()
        self.offset = offset

    def take(self, kind: str, stage: int) -> Key:
        b = self.next[(kind, stage)]
        self.next[(kind, stage)] += 1
        return (kind, stage, b + self.offset)


def v_layout(P: int) -> tuple[tuple[int, ...], ...]:
    """V placement of 2P stages on P workers: rank r holds stages r and 2P - 1 - r."""
    return tuple((s if s < P else 2 * P - 1 - s,) for s in range(2 * P))


def concat_steps(orders_of_step, P: int, M: int, T: int) -> list[list[Key]]:
    """Per-rank orders of T steps, concatenated: ``orders_of_step(rank, t M)`` is rank's order of
    step t, whose microbatches are t M .. t M + M - 1."""
    return [[k for t in range(T) for k in orders_of_step(r, t * M)] for r in range(P)]


def schedule_of_orders(name, layout, orders, M, T, *, options, limit: int | None = None) -> Schedule:
    """The flushing :class:`Schedule` of per-worker compute orders over T steps of M microbatches
    (:func:`~workbench.schedules.generators.flushing_schedule`: updates and versions, sync, each
    stage stepping once per step), validated, with ``options`` plus ``steps``; ``limit``: the schedule's bound on live (stage, microbatch) pairs per worker, which
    :func:`validate` then checks (default: the orders' own peak)."""
    cap = [limit if limit is not None else in_flight_of(o) for o in orders]
    return flushing_schedule(name, layout, orders, M, T, cap=cap, options=dict(options, steps=T))


def pipeline_size(plan, name: str, chunks: int) -> tuple[int, int]:
    """(P, v) from a stage count (or straight Plan) that must be a multiple of ``chunks``."""
    base = stage_layout(plan)
    require_straight(base, name)
    S, v = len(base), positive_int(chunks, "chunks")
    if S % v:
        raise ValueError(
            f"{name}: {S} stages do not split into {v} stages per worker; pass a stage count that "
            f"is a multiple of {v} (e.g. {v * max(1, S // v)})"
        )
    return S // v, v


# ---- interleaved zero bubble (torch ScheduleInterleavedZeroBubble) ----------------------------
def zb1p_order(rank: int, P: int, v: int, M: int, offset: int = 0) -> list[Key]:
    """Rank ``rank``'s order of torch's ScheduleInterleavedZeroBubble (see module docstring)."""
    per_round = interleaved_rounds(P, M, "interleaved-zb")
    warm = min((v - 1) * per_round + P - 1 - rank, M * v)
    total = M * v
    c = _Counters(offset)

    def f_stage(k):
        return (k // per_round) % v * P + rank

    def b_stage(k):
        return (v - 1 - ((k - warm) // per_round) % v) * P + rank

    out = [c.take("F", f_stage(k)) for k in range(warm)]
    backs, w = [], 0
    for k in range(warm, total + warm):
        if k < total:
            out.append(c.take("F", f_stage(k)))
        out.append(c.take("BI", b_stage(k)))
        backs.append(b_stage(k))
        if k - warm >= rank:
            out.append(c.take("BW", backs[w]))
            w += 1
    out += [c.take("BW", s) for s in backs[w:]]
    return out


@register(
    "interleaved-zb",
    description="interleaved zero bubble (torch ScheduleInterleavedZeroBubble): `chunks` stages per worker, split backward",
    source="Qi et al., Zero Bubble Pipeline Parallelism (ICLR 2024); torch.distributed.pipelining",
    stages_per_worker="chunks",
    options={
        "chunks": "stages per worker (stage s on worker s mod P)",
        "steps": "iterations (flushes) in the schedule",
    },
)
def interleaved_zb(plan, microbatches: int, chunks: int = 2, steps: int = 1) -> Schedule:
    """Interleaved zero bubble (ZB1P with v = ``chunks`` stages per worker, stage s on worker
    s mod P), torch's ScheduleInterleavedZeroBubble. M must be a multiple of max(1, M // P)."""
    P, v = pipeline_size(plan, "interleaved-zb", chunks)
    M, T = positive_int(microbatches), positive_int(steps, "steps")
    layout = tuple((s % P,) for s in range(P * v))
    orders = concat_steps(lambda r, off: zb1p_order(r, P, v, M, off), P, M, T)
    return schedule_of_orders("interleaved-zb", layout, orders, M, T, options={"chunks": v})


# ---- ZB-V (torch ScheduleZBVZeroBubble) -------------------------------------------------------
def zbv_order(rank: int, P: int, M: int, offset: int = 0) -> list[Key]:
    """Rank ``rank``'s order of torch's ScheduleZBVZeroBubble: chunk 0 = stage r, chunk 1 = stage
    2P-1-r; warm-up 2(P-r)-1 F0, r (F1 F0), P-r (F1 B1 W1); steady F0 B0 W0 F1 B1 W1; cool-down
    r (B0 B1), P-r (B0 W0), remaining W1 then W0. Built for max(2P-1, M) microbatches, the extra
    ones dropped (as torch does)."""
    n = max(2 * P - 1, M)
    s0, s1 = rank, 2 * P - 1 - rank
    c = _Counters(0)
    out: list[Key] = [c.take("F", s0) for _ in range(2 * (P - rank) - 1)]
    for _ in range(rank):
        out += [c.take("F", s1), c.take("F", s0)]
    for _ in range(P - rank):
        out += [c.take("F", s1), c.take("BI", s1), c.take("BW", s1)]
    while c.next[("F", s1)] < c.next[("F", s0)] or c.next[("F", s0)] < n:
        if c.next[("F", s0)] < n:
            out.append(c.take("F", s0))
        out += [c.take("BI", s0), c.take("BW", s0), c.take("F", s1), c.take("BI", s1), c.take("BW", s1)]
    for _ in range(rank):
        out += [c.take("BI", s0), c.take("BI", s1)]
    for _ in range(P - rank):
        out += [c.take("BI", s0), c.take("BW", s0)]
    while c.next[("BW", s1)] < c.next[("BI", s1)]:
        out.append(c.take("BW", s1))
    while c.next[("BW", s0)] < c.next[("BI", s0)]:
        out.append(c.take("BW", s0))
    return [(k, s, b + offset) for k, s, b in out if b < M]


# ---- DualPipeV (torch ScheduleDualPipeV) ------------------------------------------------------
def dualpipev_order(rank: int, P: int, M: int, offset: int = 0) -> tuple[list[Key], list[tuple]]:
    """Rank ``rank``'s order of torch's ScheduleDualPipeV and its overlapped (F, B) pairs.

    Steps (chunk 0 = stage r, chunk 1 = stage 2P-1-r): 1. 2(P-r-1) F0; 2. r+1 (F0 F1);
    3. P-r-1 (B1 W F1) with split backward; 4. M-2P+r+1 rounds of overlapped F0+B1, F1+B0 (the
    last rank's first F0, B1 not overlapped); 5. P-r-1 (B1, F1+B0); 6. r+1 (B1 B0), switching to
    split backward half way; 7. P-r-1 (W, B0); 8. r+1 W. A W takes the oldest pending split B."""
    s0, s1 = rank, 2 * P - 1 - rank
    c = _Counters(offset)
    out: list[Key] = []
    pairs: list[tuple] = []
    pending: list[tuple[int, int]] = []  # (stage, microbatch) of split B's whose W has not run

    def full_b(s):  # a full backward consumes the BI and BW counters alike (torch)
        _, _, b = c.take("BI", s)
        c.next[("BW", s)] += 1
        return ("B", s, b)

    def add(kind, s):
        if kind == "B":
            out.append(full_b(s))
        else:
            key = c.take(kind, s)
            out.append(key)
            if kind == "BI":
                _, _, b = key
                pending.append((s, b))

    def add_w():
        if pending:
            s, b = pending.pop(0)
            c.next[("BW", s)] += 1
            out.append(("BW", s, b))

    def overlap(sf, sb):
        f, b = c.take("F", sf), full_b(sb)
        out.extend([f, b])
        (_, fs, fb), (_, bs, bb) = f, b
        pairs.append((rank, (fs, fb), (bs, bb)))

    for _ in range(2 * (P - rank - 1)):
        add("F", s0)
    for _ in range(rank + 1):
        add("F", s0)
        add("F", s1)
    for _ in range(P - rank - 1):
        add("BI", s1)
        add_w()
        add("F", s1)
    for i in range(M - 2 * P + rank + 1):
        if i == 0 and rank == P - 1:
            add("F", s0)
            add("B", s1)
        else:
            overlap(s0, s1)
        overlap(s1, s0)
    for _ in range(P - rank - 1):
        add("B", s1)
        overlap(s1, s0)
    split = False
    for i in range(rank + 1):
        if i == (rank + 1) // 2 and rank % 2 == 1:
            split = True
        add("BI" if split else "B", s1)
        if i == (rank + 1) // 2 and rank % 2 == 0:
            split = True
        add("BI" if split else "B", s0)
    for _ in range(P - rank - 1):
        add_w()
        add("BI" if split else "B", s0)
    for _ in range(rank + 1):
        add_w()
    return out, pairs


@register(
    "dualpipev",
    description="DualPipeV (torch ScheduleDualPipeV): V placement, forward and backward of two microbatches paired",
    source="DeepSeek-AI, DeepSeek-V3 Technical Report (2024); torch.distributed.pipelining",
    stages_per_worker=2,
    options={"steps": "iterations (flushes) in the schedule"},
)
def dualpipev(plan, microbatches: int, steps: int = 1) -> Schedule:
    """DualPipeV (DeepSeek-V3 report; torch ScheduleDualPipeV): V placement, overlapped F/B pairs.
    Needs M >= 2P microbatches (the number of stages)."""
    P, _ = pipeline_size(plan, "dualpipev", 2)
    M, T = positive_int(microbatches), positive_int(steps, "steps")
    if M < 2 * P:
        raise ValueError(
            f"dualpipev needs at least as many microbatches as stages (2P = {2 * P} for {P} "
            f"workers); got {M}: use microbatches >= {2 * P} or fewer workers"
        )
    orders, pairs = [], []
    for r in range(P):
        o = []
        for t in range(T):
            keys, pr = dualpipev_order(r, P, M, t * M)
            o += keys
            pairs += pr
        orders.append(o)
    return schedule_of_orders(
        "dualpipev", v_layout(P), orders, M, T, options={"chunks": 2, "overlap_f_b": tuple(pairs)}
    )


# ---- one common setting for every pipeline schedule -------------------------------------------
TORCH_CLASS = {
    "pipedream-flush": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "zb-h1": "ScheduleInterleavedZeroBubble (1 stage/rank)",
    "interleaved-zb": "ScheduleInterleavedZeroBubble",
    "zb-v": "ScheduleZBVZeroBubble (variant=torch)",
    "dualpipev": "ScheduleDualPipeV",
}
COMPARED = [
    "pipedream-flush",
    "zb-h1",
    "zb-h2",
    "interleaved-1f1b",
    "interleaved-zb",
    "zb-v",
    "dualpipev",
    "v-min",
    "v-half",
    "v-zb",
]

"""Seq1F1B: sequence-level 1F1B (Sun et al. 2024, "Seq1F1B: Efficient Sequence-Level Pipeline
Parallelism for Large Language Model Training").

Every sequence of ``n`` tokens is cut into ``k`` segments of ``n_1, ..., n_k`` tokens, and the
pipeline runs 1F1B over (microbatch, segment) *units*. Causal attention makes segment j read the
keys and values of segments 0..j-1, so (see :mod:`workbench.schedules.core`):

* forward units run in order (b, 0), (b, 1), ..., (b, k-1) on every stage;
* a segment's backward needs the gradients that later segments send to its keys and values, so
  the backward order inside a sequence is reversed: (b, k-1), ..., (b, 0).

Warm-up: a worker of stage s of S first runs ``K_s = S - s + k - 1`` forward units (1F1B's S - s,
plus the k - 1 units the reversed backward order lags behind), then alternates one backward unit
and one forward unit, then cools down. At most ``S + k - 1`` units of about ``1/k`` of a sequence
each are in flight on the input stage, instead of 1F1B's S whole sequences: the peak activation
memory falls from ``S`` to about ``(S + k - 1) / k`` sequences.

Segment lengths are balanced by FLOPs, not tokens (the paper's estimate, L layers, model width d,
P parameters, N_i = n_1 + ... + n_i)::

    FLOPs(S_i) = 2 n_i P + 2 L n_i N_i d

so that every segment costs FLOPs(S) / k: equal token counts would make later segments (longer
attention context) slower and leave bubbles. :func:`segment_splits` returns both splits.

Variants: :func:`seq1f1b` (flush every ``microbatches``), :func:`seq1f1b_interleaved` (Megatron
interleaving: ``chunks`` stages per worker, stage s on worker s mod P) and :func:`seq1f1b_zb`
(ZB-H1's split backward: the weight-gradient half BW deferred to fill the cool-down bubble).
With ``k = 1`` they equal ``pipedream-flush``, ``interleaved-1f1b`` and ``zb-h1`` op for op.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from workbench.schedules.core import Schedule, validate
from workbench.schedules.dataflow import OpKind, peak_in_flight
from workbench.schedules.generators import (
    assign_versions,
    insert_updates,
    positive_int,
    require_straight,
    stage_layout,
    zb_h1_order,
)
from workbench.schedules.registry import register

Unit = tuple[int, int]  # (microbatch, segment)
_SOURCE = "Sun et al., Seq1F1B (NAACL 2025; arXiv 2406.03488)"
_OPTIONS = {
    "segments": "k: segments per sequence",
    "seq_len": "tokens per sequence (default: segments)",
    "steps": "iterations (flushes) in the schedule",
    "model": "(P, L, d) of the FLOP estimate, or 'P,L,d' (default: FLOPs proportional to tokens)",
    "split": "segment lengths: FLOP-balanced or equal tokens",
}
_CHOICES = {"split": ("flops", "tokens")}


# ---- segment lengths -----------------------------------------------------------------------
def segment_flops(tokens, params: float, layers: int, dim: int) -> list[float]:
    """FLOPs(S_i) = 2 n_i P + 2 L n_i (n_1 + ... + n_i) d for each segment of ``tokens``."""
    n = np.asarray(tokens, dtype=float)
    return (2 * n * params + 2 * layers * n * np.cumsum(n) * dim).tolist()


def balanced_tokens(seq_len: int, k: int, params: float, layers: int, dim: int) -> tuple[int, ...]:
    """Segment lengths (>= 1 token each, summing to ``seq_len``) whose FLOPs are as equal as
    integers allow. Continuous solution: for a target cost T, segment i's length x solves
    ``2 L d x^2 + (2 P + 2 L d N_(i-1)) x = T``; T is bisected until the k lengths sum to
    ``seq_len``; each cumulative boundary N_i is then rounded down or up so that the largest
    segment's FLOPs are smallest (:func:`_round_bounds`; rounding every N_i to the nearest integer
    on its own can give lengths like 16, 17, 15, 16, less even than equal ones)."""
    seq_len, k = positive_int(seq_len, "seq_len"), positive_int(k, "segments")
    if k > seq_len:
        raise ValueError(f"cannot cut {seq_len} tokens into {k} segments; use segments <= seq_len")
    a, c = 2.0 * layers * dim, 2.0 * params

    def lengths(T: float) -> list[float]:
        out, N = [], 0.0
        for _ in range(k):
            b = c + a * N
            x = T / b if a == 0 else (-b + math.sqrt(b * b + 4 * a * T)) / (2 * a)
            out.append(x)
            N += x
        return out

    lo, hi = 0.0, max(segment_flops([seq_len], params, layers, dim)[0], 1.0)
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if sum(lengths(mid)) < seq_len else (lo, mid)
    bounds = _round_bounds(list(np.cumsum(lengths(hi))), params, layers, dim)
    for i in range(k):  # at least one token per segment
        bounds[i] = min(max(bounds[i], (bounds[i - 1] if i else 0) + 1), seq_len - (k - 1 - i))
    return tuple(int(x) for x in np.diff(np.concatenate([[0], bounds])))


def _round_bounds(cont, params: float, layers: int, dim: int) -> np.ndarray:
    """Integer boundaries N_1 .. N_k, each the floor or the ceiling of the continuous ``cont`` (N_k
    exact), chosen to minimise the largest segment's FLOPs: a dynamic program along the chain, state
    = the rounding of the last boundary, value = (largest segment FLOPs so far, boundaries)."""

    def cost(a: int, z: int) -> float:
        return segment_flops([a, z - a], params, layers, dim)[1] if z > a else math.inf

    best: dict[int, tuple[float, list]] = {0: (0.0, [])}  # previous boundary -> (max FLOPs so far, boundaries)
    for x in cont:
        options = {int(round(x))} if x is cont[-1] else {int(math.floor(x)), int(math.floor(x)) + 1}
        best = {
            n: min(((max(m, cost(p, n)), bs + [n]) for p, (m, bs) in best.items()), key=lambda t: t[0]) for n in options
        }
    return np.array(min(best.values(), key=lambda t: t[0])[1])


def equal_tokens(seq_len: int, k: int) -> tuple[int, ...]:
    """``seq_len`` tokens in k segments of equal length (the first ``seq_len mod k`` one longer)."""
    q, r = divmod(positive_int(seq_len, "seq_len"), positive_int(k, "segments"))
    if q == 0:
        raise ValueError(f"cannot cut {seq_len} tokens into {k} segments; use segments <= seq_len")
    return tuple(q + (i < r) for i in range(k))


def segment_splits(seq_len: int, k: int, params: float, layers: int, dim: int) -> pd.DataFrame:
    """Both splits side by side, indexed by segment: ``equal_tokens``/``equal_flops`` (equal token
    counts) and ``balanced_tokens``/``balanced_flops`` (FLOP-balanced), FLOPs per the module's
    estimate; ``*_share`` = the segment's fraction of its split's total FLOPs (1/k when balanced)."""
    eq, bal = equal_tokens(seq_len, k), balanced_tokens(seq_len, k, params, layers, dim)
    fe, fb = segment_flops(eq, params, layers, dim), segment_flops(bal, params, layers, dim)
    df = pd.DataFrame(
        {
            "equal_tokens": eq,
            "equal_flops": fe,
            "equal_share": np.divide(fe, sum(fe)),
            "balanced_tokens": bal,
            "balanced_flops": fb,
            "balanced_share": np.divide(fb, sum(fb)),
        }
    )
    df.index.name = "segment"
    return df


def _segments(seq_len, segments, model, split):
    """(tokens, FLOP shares) of the segments: ``model = (P, L, d)`` for the FLOP estimate (None:
    attention-free, FLOPs proportional to tokens); ``split`` "flops" (balanced) or "tokens" (equal)."""
    if isinstance(model, str):  # "P,L,d" from a command line
        try:
            model = tuple(float(x) for x in model.split(","))
        except ValueError:
            raise ValueError(f"model must be 'P,L,d' (parameters, layers, width), got {model!r}") from None
    if model is not None and len(model) != 3:
        raise ValueError(f"model must be (P, L, d): parameters, layers, width; got {model!r}")
    P, L, d = model if model is not None else (1.0, 0, 0)
    if split not in ("flops", "tokens"):
        raise ValueError(f"split must be 'flops' (FLOP-balanced) or 'tokens' (equal lengths), got {split!r}")
    tokens = balanced_tokens(seq_len, segments, P, L, d) if split == "flops" else equal_tokens(seq_len, segments)
    f = segment_flops(tokens, P, L, d)
    return tokens, tuple(x / sum(f) for x in f)


# ---- per-worker orders ----------------------------------------------------------------------
def forward_units(microbatches: list[int], k: int) -> list[Unit]:
    return [(b, j) for b in microbatches for j in range(k)]


def backward_units(microbatches: list[int], k: int) -> list[Unit]:
    """Backward order: sequences oldest first, segments last to first inside a sequence."""
    return [(b, j) for b in microbatches for j in reversed(range(k))]


def one_f_one_b_units(fwd: list[Unit], bwd: list[Unit], K: int, stage: int) -> list[tuple]:
    """K forward units, then B(next backward unit), F(next forward unit) alternately, then the rest."""
    K = min(K, len(fwd))
    out = [("F", stage, u) for u in fwd[:K]]
    for i, u in enumerate(bwd):
        out.append(("B", stage, u))
        if i + K < len(fwd):
            out.append(("F", stage, fwd[i + K]))
    return out


def zb_h1_units(fwd: list[Unit], bwd: list[Unit], K: int, cap: int, stage: int) -> list[tuple]:
    """ZB-H1 over units: :func:`~workbench.schedules.generators.zb_h1_order` with forwards in the
    order ``fwd`` and backwards (BI, BW) in the order ``bwd``."""
    return zb_h1_order(fwd, K, cap, stage, backward_order=bwd)


def seq1f1b_warmup(num_stages: int, k: int) -> list[int]:
    """K_s = S - s + k - 1 forward units before the first backward (module docstring)."""
    return [num_stages - s + k - 1 for s in range(num_stages)]


# ---- schedules ------------------------------------------------------------------------------
def _make(name, layout, orders, M, T, *, k, tokens, flops, cap, options) -> Schedule:
    """Updates (one sync STEP per stage and flush of M microbatches) and versions from the unit
    orders, then Ops with ``microbatch`` and ``segment`` set; validated."""
    as_id = [[(kind, s, b * k + j) for kind, s, (b, j) in o] for o in orders]
    with_updates = insert_updates(as_id, layout, lambda s, u: u // k // M, lambda s: T)
    ops = [
        [
            op
            if op.kind in (OpKind.AR, OpKind.STEP)
            else dataclasses.replace(op, microbatch=op.microbatch // k, segment=op.microbatch % k)
            for op in o
        ]
        for o in assign_versions(with_updates, "sync")
    ]
    sched = Schedule(
        name=name,
        num_stages=len(layout),
        num_workers=len(orders),
        microbatches=M * T,
        ops=tuple(map(tuple, ops)),
        stage_workers=layout,
        update="sync",
        microbatches_per_step=M,
        max_in_flight=tuple(cap),
        options=dict(options),
        segment_tokens=tokens,
        segment_flops=flops,
    )
    validate(sched)
    return sched


def _stage_orders(S: int, M: int, T: int, k: int, order_of) -> list[list[tuple]]:
    """Each stage's order of a straight pipeline over T iterations of M sequences in k segments:
    ``order_of(stage, forward units, backward units)`` of iteration t's sequences t M .. t M + M - 1."""
    orders = []
    for s in range(S):
        o = []
        for t in range(T):
            mbs = list(range(t * M, (t + 1) * M))
            o += order_of(s, forward_units(mbs, k), backward_units(mbs, k))
        orders.append(o)
    return orders


def _common(plan, microbatches, segments, seq_len, steps, *, model, split):
    layout = stage_layout(plan)
    M, T, k = positive_int(microbatches), positive_int(steps, "steps"), positive_int(segments, "segments")
    seq_len = k if seq_len is None else seq_len
    tokens, flops = _segments(seq_len, k, model, split)
    opts = {"segments": k, "seq_len": seq_len, "steps": T, "split": split}
    return layout, M, T, k, tokens, flops, opts


@register(
    "seq1f1b",
    description="Seq1F1B: 1F1B over (microbatch, segment) units, segment backwards in reverse order",
    source=_SOURCE,
    options=_OPTIONS,
    choices=_CHOICES,
)
def seq1f1b(
    plan,
    microbatches: int,
    segments: int = 2,
    seq_len: int | None = None,
    steps: int = 1,
    *,
    model: object = None,
    split: str = "flops",
) -> Schedule:
    """Seq1F1B on a straight pipeline: per iteration of ``microbatches`` sequences, 1F1B over the
    (microbatch, segment) units with K_s warm-up units (module docstring), then a flush and one
    synchronous step. ``seq_len`` tokens (default: ``segments``) cut by FLOPs of ``model = (P, L,
    d)`` (``split="tokens"``: equal lengths)."""
    layout, M, T, k, tokens, flops, opts = _common(
        plan, microbatches, segments, seq_len, steps, model=model, split=split
    )
    require_straight(layout, "seq1f1b")
    K = seq1f1b_warmup(len(layout), k)
    orders = _stage_orders(len(layout), M, T, k, lambda s, fu, bu: one_f_one_b_units(fu, bu, K[s], s))
    return _make(
        "seq1f1b", layout, orders, M, T, k=k, tokens=tokens, flops=flops, cap=[min(x, M * k) for x in K], options=opts
    )


@register(
    "seq1f1b-zb",
    description="Seq1F1B with ZB-H1's split backward: deferred weight gradients fill the cool-down",
    source=_SOURCE + " with Qi et al., Zero Bubble (ICLR 2024)",
    options=_OPTIONS,
    choices=_CHOICES,
)
def seq1f1b_zb(
    plan,
    microbatches: int,
    segments: int = 2,
    seq_len: int | None = None,
    steps: int = 1,
    *,
    model: object = None,
    split: str = "flops",
) -> Schedule:
    """Seq1F1B with ZB-H1's split backward: BI (input and key/value gradients) in Seq1F1B's order,
    BW (weight gradients) deferred to fill the cool-down; no worker holds more units than the input
    stage's ``K_0 = S + k - 1``."""
    layout, M, T, k, tokens, flops, opts = _common(
        plan, microbatches, segments, seq_len, steps, model=model, split=split
    )
    require_straight(layout, "seq1f1b-zb")
    K = seq1f1b_warmup(len(layout), k)
    cap = min(max(K), M * k)
    orders = _stage_orders(len(layout), M, T, k, lambda s, fu, bu: zb_h1_units(fu, bu, K[s], cap, s))
    return _make(
        "seq1f1b-zb", layout, orders, M, T, k=k, tokens=tokens, flops=flops, cap=[cap] * len(layout), options=opts
    )


def interleaved_warmup(P: int, v: int, rank: int, fwd: list, bwd: list) -> int:
    """Warm-up forwards of ``rank``: torch's dependency term ``2 (P - 1 - rank)`` (``P - 1 - rank``
    when v = 1) plus the rank's own lag ``max_n (pos_F(bwd[n]) - n)``: the steady phase issues
    forward ``warm + n`` just before backward n, and backward n needs the forward of its own (stage,
    unit), at position ``pos_F`` in ``fwd``. Without segments the lag is torch's ``(v - 1) m``; with
    v = 1 the sum is Seq1F1B's ``K_s - 1 = S - s + k - 2``. Capped at the number of forwards."""
    pos = {key[1:]: i for i, key in enumerate(fwd)}
    lag = max(pos[key[1:]] - n for n, key in enumerate(bwd))
    return min((2 if v > 1 else 1) * (P - 1 - rank) + lag, len(fwd))


def interleaved_units_order(rank: int, P: int, v: int, fu: list[Unit], bu: list[Unit]) -> list[tuple]:
    """Torch's interleaved 1F1B order (``ScheduleInterleaved1F1B``, see
    :func:`~workbench.schedules.generators.interleaved_order`) over units: with m units per round,
    the i-th forward runs chunk ``(i // m) mod v`` (stage chunk P + rank) of forward unit
    ``m (i // (m v)) + i mod m``; the i-th backward chunk ``v - 1 - (i // m) mod v`` of the backward
    unit with that index; warm-up :func:`interleaved_warmup`."""
    U = len(fu)
    rounds = max(1, U // P) if v > 1 else 1  # one chunk: rounds do not change the order
    if U % rounds:
        raise ValueError(
            f"seq1f1b-interleaved: {U} units (microbatches x segments) on {P} workers run in "
            f"{rounds} rounds of equal size, which needs the units to be a multiple of {rounds}; "
            f"change microbatches or segments"
        )
    m, total = U // rounds, U * v

    def key(i, kind):
        grp, r = divmod(i, m * v)
        chunk = r // m if kind == "F" else v - 1 - r // m
        return (kind, chunk * P + rank, (fu if kind == "F" else bu)[grp * m + r % m])

    fwd, bwd = [key(i, "F") for i in range(total)], [key(i, "B") for i in range(total)]
    warm = interleaved_warmup(P, v, rank, fwd, bwd)
    out = fwd[:warm]
    for i in range(total - warm):
        out += [fwd[warm + i], bwd[i]]
    return out + bwd[total - warm :]


@register(
    "seq1f1b-interleaved",
    description="Seq1F1B with interleaving: `chunks` stages per worker over (microbatch, segment) units",
    source=_SOURCE + " with Narayanan et al., Megatron-LM (SC 2021)",
    stages_per_worker="chunks",
    options=_OPTIONS | {"chunks": "stages per worker (stage s on worker s mod P)"},
    choices=_CHOICES,
)
def seq1f1b_interleaved(
    plan,
    microbatches: int,
    segments: int = 2,
    chunks: int = 2,
    seq_len: int | None = None,
    *,
    steps: int = 1,
    model: object = None,
    split: str = "flops",
) -> Schedule:
    """Interleaved Seq1F1B: S = P v stages on P workers (stage s on worker s mod P), torch's
    interleaved 1F1B order over (microbatch, segment) units (:func:`interleaved_units_order`),
    a flush and one synchronous step per iteration."""
    base, M, T, k, tokens, flops, opts = _common(plan, microbatches, segments, seq_len, steps, model=model, split=split)
    require_straight(base, "seq1f1b-interleaved")
    S, v = len(base), positive_int(chunks, "chunks")
    if S % v:
        raise ValueError(
            f"seq1f1b-interleaved: {S} stages do not split into chunks={v} per worker; "
            f"pass a stage count that is a multiple of chunks"
        )
    P = S // v
    layout = tuple((s % P,) for s in range(S))
    orders, cap = [], []
    for rank in range(P):
        it = interleaved_units_order(rank, P, v, forward_units(list(range(M)), k), backward_units(list(range(M)), k))
        orders.append([(kd, s, (b + t * M, j)) for t in range(T) for kd, s, (b, j) in it])
        cap.append(peak_in_flight(it))
    return _make(
        "seq1f1b-interleaved",
        layout,
        orders,
        M,
        T,
        k=k,
        tokens=tokens,
        flops=flops,
        cap=cap,
        options=opts | {"chunks": v},
    )


__all__ = [
    "segment_flops",
    "balanced_tokens",
    "equal_tokens",
    "segment_splits",
    "seq1f1b",
    "seq1f1b_zb",
    "seq1f1b_interleaved",
    "seq1f1b_warmup",
    "interleaved_warmup",
]

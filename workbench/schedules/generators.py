"""Explicit schedule generators: per-worker op lists for the schedules of the pipeline papers.

Notation: S stages, worker set of stage s ``stage_workers[s]`` with r_s replicas, M microbatches.
Round robin: microbatch b of stage s runs on replica ``b mod r_s`` (PipeDream), for F and B alike.

* 1F1B (PipeDream): a worker of stage s first admits K_s forwards (NOAM warm-up), then strictly
  alternates one backward and one forward. For a straight pipeline K_s = S - s; with replicas
  K_s = ceil(sum_{s' >= s} r_s' / r_s), so the input stage admits NOAM = ceil(W / r_0).
* Updates are grouped: ``group(s, b)`` is the update (step) index whose gradient microbatch b's
  backward of stage s contributes to. A worker emits ``AR`` (replicated stages only) and ``STEP``
  of group g right after its last backward of g; a group with no backward on a worker is emitted
  just before that worker's next op (F or B) of a later group of that stage (or at the end), so
  that op reads the updated weights.
* Weight versions (``Op.version`` = updates of the stage applied to the weights an op reads) are
  assigned from the per-worker order by :func:`assign_versions` for the schedule's update rule.

PipeDream with replicas groups updates by rounds: update t of stage s averages the gradients of
microbatches t*r_s .. t*r_s + r_s - 1, one per replica (synchronous data parallelism inside a
stage, as in the PipeDream paper), so every replica of a stage holds the same version.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from workbench.schedules import closed_forms as cf
from workbench.schedules.core import Op, OpKind, Schedule, make_op, validate
from workbench.schedules.dataflow import peak_in_flight
from workbench.schedules.registry import register

Key = tuple[str, int, int]  # (kind, stage, microbatch)


# ---- layout -----------------------------------------------------------------------------
def stage_layout(plan_or_stage_count) -> tuple[tuple[int, ...], ...]:
    """``stage_workers`` from a Plan (its stages' workers) or an int S (worker s runs stage s)."""
    if isinstance(plan_or_stage_count, bool) or not hasattr(plan_or_stage_count, "stages"):
        try:
            S = int(plan_or_stage_count)
        except (TypeError, ValueError):
            raise ValueError(f"expected a Plan or a stage count, got {plan_or_stage_count!r}") from None
        if S < 1 or S != plan_or_stage_count:
            raise ValueError(f"stage count must be a positive int, got {plan_or_stage_count!r}")
        return tuple((s,) for s in range(S))
    layout = tuple(tuple(int(w) for w in st.workers) for st in plan_or_stage_count.stages)
    flat = sorted(w for ws in layout for w in ws)
    if flat != list(range(len(flat))):
        raise ValueError(f"plan workers must be 0..W-1, each on one stage; got {layout}")
    return layout


def noam_warmup(layout) -> list[int]:
    """K_s = ceil(sum_{s' >= s} r_s' / r_s): forwards a worker of stage s admits before its first
    backward (S - s for a straight pipeline; NOAM = ceil(W / r_0) for the input stage)."""
    r = [len(ws) for ws in layout]
    return [math.ceil(sum(r[s:]) / r[s]) for s in range(len(r))]


def _share(M0: int, M: int, r: int, j: int) -> list[int]:
    """Microbatches of ids M0..M0+M-1 that replica j of r runs (round robin b mod r)."""
    return [b for b in range(M0, M0 + M) if b % r == j]


def one_f_one_b(mbs: list[int], K: int, stage: int) -> list[Key]:
    """PipeDream 1F1B order of one worker: K forwards, then B(oldest), F(next) alternately."""
    K = min(K, len(mbs))
    out: list[Key] = [("F", stage, b) for b in mbs[:K]]
    for i, b in enumerate(mbs):
        out.append(("B", stage, b))
        if i + K < len(mbs):
            out.append(("F", stage, mbs[i + K]))
    return out


def zb_h1_order(mbs: list, K: int, cap: int, stage: int, backward_order: list | None = None) -> list[Key]:
    """ZB-H1 order of one worker: K forwards (as 1F1B), then ``cap - K`` rounds of BI, F with the
    weight-gradient BW deferred, then BI, BW, F; cool-down BI, BW; the deferred BWs last. At most
    ``cap`` microbatches (F done, BW not) are held, the peak of 1F1B's input stage. Forwards run in
    the order of ``mbs``, backwards in ``backward_order`` (default the same; Seq1F1B reverses the
    segments of a sequence)."""
    fwd, bwd = mbs, (mbs if backward_order is None else backward_order)
    n, K = len(fwd), min(K, len(fwd))
    out: list[Key] = [("F", stage, b) for b in fwd[:K]]
    f, bi, bw = K, 0, 0
    for _ in range(cap - K):
        if f >= n:
            break
        out += [("BI", stage, bwd[bi]), ("F", stage, fwd[f])]
        bi, f = bi + 1, f + 1
    while f < n:
        out += [("BI", stage, bwd[bi]), ("BW", stage, bwd[bw]), ("F", stage, fwd[f])]
        bi, bw, f = bi + 1, bw + 1, f + 1
    while bi < n:
        out += [("BI", stage, bwd[bi]), ("BW", stage, bwd[bw])]
        bi, bw = bi + 1, bw + 1
    out += [("BW", stage, b) for b in bwd[bw:]]
    return out


# ---- updates and versions ---------------------------------------------------------------
def insert_updates(
    orders: list[list[Key]], layout, group: Callable[[int, int], int], n_groups: Callable[[int], int]
) -> list[list[tuple]]:
    """Insert ("AR", s, g) / ("STEP", s, g) into each worker's order (rule in module docstring)."""
    out = []
    for w, order in enumerate(orders):
        stages = [s for s, ws in enumerate(layout) if w in ws]
        left = {s: [0] * n_groups(s) for s in stages}
        for kind, s, b in order:
            if kind in ("B", "BW"):
                left[s][group(s, b)] += 1
        nxt = {s: 0 for s in stages}
        res: list[tuple] = []

        def emit(s, upto):
            while nxt[s] <= upto and nxt[s] < len(left[s]):
                if len(layout[s]) > 1:
                    res.append(("AR", s, nxt[s]))
                res.append(("STEP", s, nxt[s]))
                nxt[s] += 1

        for key in order:
            kind, s, b = key
            g = group(s, b)
            while nxt[s] < g and left[s][nxt[s]] == 0:  # groups with nothing left on w
                emit(s, nxt[s])
            res.append(key)
            if kind in ("B", "BW"):
                left[s][g] -= 1
                if left[s][g] == 0 and nxt[s] == g:
                    emit(s, g)
        for s in sorted(stages, reverse=True):
            emit(s, len(left[s]) - 1)
        out.append(res)
    return out


def assign_versions(orders: list[list[tuple]], rule: str, two_bw_batch: int = 0) -> list[list[Op]]:
    """Turn (kind, stage, microbatch|step) tuples into Ops with ``version`` set for ``rule``.

    local(op) = STEPs of op's stage earlier in the same worker's list (the newest local version).
    sync, async: local; stash: F local, B/BI/BW = its F's; no-stash: every op local;
    vertical-sync: every op of microbatch b reads the version the input stage's F used for b;
    2bw: batch t = b // m reads W(t-1), version max(t - 1, 0); checked to be the newest local
    version or the one before (two buffers suffice).
    """
    if rule in ("sync", "async", "no-stash", "stash"):
        try:
            return [_local_versions(ops, rule == "stash") for ops in orders]
        except KeyError:  # a backward without its forward earlier on the worker: validate() says what
            pass
    local: dict[tuple[str, int, int], int] = {}
    for ops in orders:
        count: dict[int, int] = {}
        for kind, s, x in ops:
            if kind == "STEP":
                count[s] = count.get(s, 0) + 1
            elif kind != "AR":
                local[(kind, s, x)] = count.get(s, 0)

    def version(kind, s, b):
        if rule in ("sync", "async", "no-stash"):
            return local[(kind, s, b)]
        if rule == "stash":
            return local[("F", s, b)]
        if rule == "vertical-sync":
            return local[("F", 0, b)]
        if rule == "2bw":
            v = max(b // two_bw_batch - 1, 0)
            if local[(kind, s, b)] not in (v, v + 1):
                raise ValueError(
                    f"2BW needs at most two weight versions, but {kind}{s}.{b} would read "
                    f"version {v} while version {local[(kind, s, b)]} is current; use "
                    f"microbatches_per_step >= max_s K_s r_s (the number of stages if straight)"
                )
            return v
        raise ValueError(f"unknown update rule {rule!r}")

    return [
        [
            make_op(_KINDS[k], s, x, version(k, s, x)) if k != "AR" and k != "STEP" else make_op(_KINDS[k], s, step=x)
            for k, s, x in ops
        ]
        for ops in orders
    ]


_KINDS = {str(k): k for k in OpKind}


def _local_versions(ops: list[tuple], stash: bool) -> list[Op]:
    """One worker's Ops in one pass: every op reads the newest local version (STEPs of its stage
    earlier in the list); with ``stash`` a backward reads its forward's."""
    count: dict[int, int] = {}
    fwd: dict[tuple[int, int], int] = {}
    out = []
    for k, s, x in ops:
        if k == "STEP":
            out.append(make_op(OpKind.STEP, s, step=x))
            count[s] = count.get(s, 0) + 1
        elif k == "AR":
            out.append(make_op(OpKind.AR, s, step=x))
        else:
            v = count.get(s, 0)
            if k == "F":
                fwd[(s, x)] = v
            elif stash:
                v = fwd[(s, x)]
            out.append(make_op(_KINDS[k], s, x, v))
    return out


def _make(name, layout, orders, M, update, *, mps, group, n_groups, max_in_flight, options, two_bw_batch=0) -> Schedule:
    with_updates = insert_updates(orders, layout, group, n_groups)
    ops = assign_versions(with_updates, update, two_bw_batch)
    sched = Schedule(
        name=name,
        num_stages=len(layout),
        num_workers=len(orders),
        microbatches=M,
        ops=tuple(tuple(o) for o in ops),
        stage_workers=layout,
        update=update,
        microbatches_per_step=mps,
        max_in_flight=tuple(max_in_flight),
        options=dict(options),
    )
    validate(sched)
    return sched


def _per_worker(layout) -> list[tuple[int, int, int]]:
    """(stage, replica index, replica count) of each worker of a pipeline layout."""
    info = {}
    for s, ws in enumerate(layout):
        for j, w in enumerate(ws):
            info[w] = (s, j, len(ws))
    return [info[w] for w in range(len(info))]


def _replica_orders(layout, M: int, T: int, order_of: Callable[[int, list[int]], list[Key]]) -> list[list[Key]]:
    """Each worker's order over T iterations of M microbatches: ``order_of(stage, share)`` of its
    round-robin share of iteration t (microbatches t M .. t M + M - 1), iterations in turn."""
    return [[k for t in range(T) for k in order_of(s, _share(t * M, M, r, j))] for s, j, r in _per_worker(layout)]


def repeat_steps(orders: list[list[Key]], T: int, M: int) -> list[list[Key]]:
    """Per-worker orders of one iteration of M microbatches repeated for T iterations, iteration t
    on microbatches t M .. t M + M - 1."""
    return [[(k, s, b + t * M) for t in range(T) for k, s, b in o] for o in orders]


def flushing_schedule(name, layout, orders, M: int, T: int, *, cap, options) -> Schedule:
    """A flushing schedule: T iterations of M microbatches, every stage steps once (sync) at the
    end of each iteration, gradients accumulated over its M microbatches."""
    return _make(
        name,
        layout,
        orders,
        M * T,
        "sync",
        mps=M,
        group=lambda s, b: b // M,
        n_groups=lambda s: T,
        max_in_flight=cap,
        options=options,
    )


def positive_int(M, what="microbatches") -> int:
    """``M`` as an int when it is a positive whole number (not a bool), else a ValueError naming
    ``what``: the generators' check of counts (microbatches, steps, chunks, segments)."""
    try:
        ok = not isinstance(M, bool) and int(M) == M and M >= 1
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{what} must be a positive int, got {M!r}")
    return int(M)


# ---- pipeline schedules -----------------------------------------------------------------
@register(
    "model-parallel",
    description="one microbatch in flight through all stages, then every stage updates",
    source="Narayanan et al., PipeDream (SOSP 2019), Figure 2",
    microbatches="in total",
    bubble=cf.one_in_flight,
    takes_plan=True,
)
def model_parallel(plan, microbatches: int) -> Schedule:
    """One microbatch in flight: F0..F(S-1), B(S-1)..B0, then every stage updates (version b)."""
    layout, M = stage_layout(plan), positive_int(microbatches)
    orders: list[list[Key]] = [[] for _ in range(sum(map(len, layout)))]
    for b in range(M):
        for s, ws in enumerate(layout):
            orders[ws[b % len(ws)]] += [("F", s, b), ("B", s, b)]
    return _make(
        "model-parallel",
        layout,
        orders,
        M,
        "sync",
        mps=1,
        group=lambda s, b: b,
        n_groups=lambda s: M,
        max_in_flight=[1] * len(orders),
        options={},
    )


@register(
    "gpipe",
    description="fill-drain: all forwards, then all backwards, gradient accumulation, one step per flush",
    source="Huang et al., GPipe (NeurIPS 2019)",
    options={"steps": "iterations (flushes) in the schedule"},
    bubble=cf.fill_drain,
    takes_plan=True,
    flushes=True,
)
def gpipe(plan, microbatches: int, steps: int = 1) -> Schedule:
    """Fill-drain: per iteration every worker runs all its forwards, then its backwards in reverse
    order; the gradients of the M microbatches accumulate and each stage steps once at the flush."""
    layout, M, T = stage_layout(plan), positive_int(microbatches), positive_int(steps, "steps")
    orders = _replica_orders(
        layout, M, T, lambda s, mbs: [("F", s, b) for b in mbs] + [("B", s, b) for b in reversed(mbs)]
    )
    cap = [max(1, max(len(_share(t * M, M, r, j)) for t in range(T))) for _, j, r in _per_worker(layout)]
    return flushing_schedule("gpipe", layout, orders, M, T, cap=cap, options={"steps": T})


@register(
    "pipedream",
    description="1F1B: NOAM warm-up, then one forward one backward, round robin over replicas, no flush",
    source="Narayanan et al., PipeDream (SOSP 2019)",
    options={
        "weights": "weight rule: stashing, vertical sync or none",
        "warmup": "forwards each stage admits before its first backward (default NOAM; Plan.in_flight counts communication)",
    },
    choices={"weights": ("stash", "vertical-sync", "no-stash")},
    microbatches="in total",
    data_parallel_plan=True,
    bubble=cf.one_round,
    takes_plan=True,
)
def pipedream(plan, microbatches: int, weights: str = "stash", warmup: object = None) -> Schedule:
    """1F1B with NOAM warm-up, round robin over replicas, no flush, an update after every
    microbatch (a replicated stage: every round of r_s microbatches, AR then STEP).
    ``warmup``: forwards each stage admits before its first backward (one int per stage, e.g.
    ``Plan.in_flight`` which counts communication); default :func:`noam_warmup`."""
    rules = {"stash": "stash", "vertical-sync": "vertical-sync", "no-stash": "no-stash"}
    if weights not in rules:
        raise ValueError(f"weights must be one of {sorted(rules)}, got {weights!r}")
    layout, M = stage_layout(plan), positive_int(microbatches)
    K = _warmup(layout, warmup)
    orders, cap = _one_f_one_b_orders(layout, M, K)
    reps = [len(ws) for ws in layout]
    return _make(
        "pipedream",
        layout,
        orders,
        M,
        rules[weights],
        mps=1,
        group=lambda s, b: b // reps[s],
        n_groups=lambda s: math.ceil(M / reps[s]),
        max_in_flight=cap,
        options={"weights": weights, "noam": K[0]},
    )


def _one_f_one_b_orders(layout, M: int, K: list[int]) -> tuple[list[list[Key]], list[int]]:
    """(orders, in-flight caps) of 1F1B without flush over M microbatches, warm-up K_s per stage."""
    orders = _replica_orders(layout, M, 1, lambda s, mbs: one_f_one_b(mbs, K[s], s))
    return orders, [K[s] for s, _, _ in _per_worker(layout)]


def _warmup(layout, warmup) -> list[int]:
    """The 1F1B warm-up per stage: :func:`noam_warmup` unless ``warmup`` gives one count per stage."""
    if warmup is None:
        return noam_warmup(layout)
    if isinstance(warmup, (int, str)):
        raise ValueError(f"warmup must be one count per stage (e.g. Plan.in_flight), got {warmup!r}")
    K = [positive_int(k, "warmup") for k in warmup]
    if len(K) != len(layout):
        raise ValueError(f"warmup has {len(K)} values for {len(layout)} stages; give one per stage")
    return K


@register(
    "pipedream-flush",
    description="1F1B inside each batch of microbatches, then a flush and a synchronous step",
    source="Narayanan et al., PipeDream-2BW (ICML 2021)",
    options={
        "steps": "iterations (flushes) in the schedule",
        "warmup": "forwards each stage admits before its first backward (default NOAM, as torch's "
        "Schedule1F1B; Plan.in_flight adds what communication needs)",
    },
    bubble=cf.fill_drain,
    takes_plan=True,
    flushes=True,
)
def pipedream_flush(plan, microbatches: int, steps: int = 1, warmup: object = None) -> Schedule:
    """1F1B inside each iteration of M microbatches, then a flush and one synchronous update.
    ``warmup``: forwards each stage admits before its first backward (one int per stage, capped at
    M); default :func:`noam_warmup`. A larger first-stage count (``Plan.in_flight``, which counts the
    messages' latency) keeps the next activation on its way while the last stage computes, at the
    cost of that many microbatches' activations in memory."""
    layout, M, T = stage_layout(plan), positive_int(microbatches), positive_int(steps, "steps")
    K = _warmup(layout, warmup)
    orders = _replica_orders(layout, M, T, lambda s, mbs: one_f_one_b(mbs, K[s], s))
    cap = [min(K[s], M) for s, _, _ in _per_worker(layout)]
    return flushing_schedule(
        "pipedream-flush",
        layout,
        orders,
        M,
        T,
        cap=cap,
        options={"steps": T} if warmup is None else {"steps": T, "warmup": K},
    )


@register(
    "pipedream-2bw",
    description="1F1B without flush, gradient accumulation per batch, two weight buffers, delay one",
    source="Narayanan et al., PipeDream-2BW (ICML 2021)",
    microbatches="in total",
    options={
        "microbatches_per_step": "microbatches per update (default: max_s K_s r_s)",
        "warmup": "forwards each stage admits before its first backward (default NOAM; Plan.in_flight counts communication)",
    },
    bubble=cf.one_round,
    takes_plan=True,
)
def pipedream_2bw(plan, microbatches: int, microbatches_per_step: int | None = None, warmup: object = None) -> Schedule:
    """1F1B without flush; gradients accumulate over batches of m microbatches (default
    max_s K_s r_s, = S when straight with NOAM's warm-up K_s: enough for two buffers); two weight buffers and a delay of one update: W(t+1) = W(t) - nu * grad f(W(t-1)), so batch t reads version
    max(t-1, 0) for its forward and its backward. ``warmup``: K_s, one count per stage (as for
    ``pipedream``; e.g. ``Plan.in_flight``); default :func:`noam_warmup`."""
    layout, M = stage_layout(plan), positive_int(microbatches)
    K = _warmup(layout, warmup)
    m_min = max(k * len(ws) for k, ws in zip(K, layout))  # = S for a straight pipeline
    m = positive_int(microbatches_per_step if microbatches_per_step is not None else m_min, "microbatches_per_step")
    if m < m_min:
        raise ValueError(
            f"pipedream-2bw needs microbatches_per_step >= {m_min} (max_s K_s r_s; the number "
            f"of stages when straight) so that two weight buffers suffice; got {m}"
        )
    orders, cap = _one_f_one_b_orders(layout, M, K)
    return _make(
        "pipedream-2bw",
        layout,
        orders,
        M,
        "2bw",
        mps=m,
        group=lambda s, b: b // m,
        n_groups=lambda s: math.ceil(M / m),
        max_in_flight=cap,
        options={"microbatches_per_step": m} | ({} if warmup is None else {"warmup": K}),
        two_bw_batch=m,
    )


def require_straight(layout, name: str) -> None:
    """A ValueError unless every stage of ``layout`` has one worker (schedule ``name`` needs it)."""
    if any(len(ws) > 1 for ws in layout):
        raise ValueError(f"{name} needs a straight pipeline (one worker per stage); the plan has replicas")


def interleaved_rounds(P: int, M: int, name: str = "interleaved-1f1b") -> int:
    """Microbatches per round m of an interleaved schedule (torch's ``microbatches_per_round``, for
    interleaved 1F1B and interleaved zero bubble alike): the M microbatches run in rounds =
    max(1, floor(M / P)) rounds of m = M / rounds each; M must split evenly into those rounds (any
    M <= 2P - 1 does; M = 9 on P = 4 does not: a ValueError of schedule ``name`` says which do)."""
    rounds = max(1, M // P)
    if M % rounds:
        ok = [m for m in range(max(1, M - P), M + P + 1) if m % max(1, m // P) == 0]
        raise ValueError(
            f"{name}: {M} microbatches on {P} workers run in max(1, M // P) = {rounds} rounds of "
            f"M / rounds microbatches, which needs M to be a multiple of the {rounds} rounds; "
            f"use one of {ok[:6]} microbatches"
        )
    return M // rounds


def interleaved_order(rank: int, P: int, v: int, M: int) -> list[Key]:
    """One iteration of interleaved 1F1B on ``rank``, torch's ``ScheduleInterleaved1F1B`` order.

    With m = :func:`interleaved_rounds` microbatches per round, the k-th forward is chunk
    c(k) = floor(k / m) mod v (stage c P + rank) on microbatch m floor(k / (m v)) + k mod m; the j-th
    backward is chunk v - 1 - floor(j / m) mod v on the same microbatch formula in j. The rank warms
    up with min((v-1) m + 2 (P - 1 - rank), M v) forwards, then alternates forward, backward, then
    drains the backwards. With v = 1 it is plain 1F1B (warm-up P - 1 - rank)."""
    m, total = interleaved_rounds(P, M), M * v

    def key(k, kind):
        grp, i = divmod(k, m * v)
        chunk = i // m if kind == "F" else v - 1 - i // m
        return (kind, chunk * P + rank, grp * m + i % m)

    warm = min((v - 1) * m + 2 * (P - 1 - rank) if v > 1 else P - rank - 1, total)
    out = [key(k, "F") for k in range(warm)]
    for i in range(total - warm):
        out += [key(warm + i, "F"), key(i, "B")]
    return out + [key(i, "B") for i in range(total - warm, total)]


@register(
    "interleaved-1f1b",
    description="Megatron 1F1B with `chunks` virtual stages per worker (stage s on worker s mod P)",
    source="Narayanan et al., Megatron-LM (SC 2021)",
    stages_per_worker="chunks",
    options={"chunks": "virtual stages per worker", "steps": "iterations (flushes) in the schedule"},
    bubble=cf.interleaved,
)
def interleaved_1f1b(plan, microbatches: int, chunks: int = 2, steps: int = 1) -> Schedule:
    """Megatron interleaved 1F1B: S = P v stages on P workers, stage s on worker s mod P, per-rank
    order of :func:`interleaved_order` (equal to torch's ``ScheduleInterleaved1F1B``), a flush and
    one synchronous update per iteration of M microbatches."""
    layout, P, M, T, v = _looped_layout(plan, microbatches, chunks, steps, "interleaved-1f1b")
    its = [interleaved_order(rank, P, v, M) for rank in range(P)]
    cap = [in_flight_of(it) for it in its]
    return flushing_schedule(
        "interleaved-1f1b", layout, repeat_steps(its, T, M), M, T, cap=cap, options={"chunks": v, "steps": T}
    )


def _looped_layout(plan, microbatches, chunks, steps, name):
    """(layout, P, M, T, v) of a looped schedule: S = P v stages, stage s on worker s mod P."""
    base = stage_layout(plan)
    require_straight(base, name)
    S, M, T, v = len(base), positive_int(microbatches), positive_int(steps, "steps"), positive_int(chunks, "chunks")
    if S % v:
        raise ValueError(
            f"{name}: {S} stages do not split into chunks={v} per worker; "
            f"pass a stage count that is a multiple of chunks (e.g. {S - S % v or v})"
        )
    P = S // v
    return tuple((s % P,) for s in range(S)), P, M, T, v


def in_flight_of(order: list[Key]) -> int:
    """Most (stage, microbatch) pairs forwarded and not yet backwarded (B or BW) in ``order``, at
    least 1 (:func:`~workbench.schedules.dataflow.peak_in_flight`)."""
    return max(peak_in_flight(order), 1)


def looped_bfs_order(rank: int, P: int, v: int, M: int) -> list[Key]:
    """Breadth-first looped order of ``rank`` (torch's ``ScheduleLoopedBFS``): the forwards of its
    stages rank, rank + P, ..., each over microbatches 0..M-1, then the backwards of its stages
    from the last, each over microbatches M-1..0."""
    stages = range(rank, P * v, P)
    return [("F", s, b) for s in stages for b in range(M)] + [
        ("B", s, b) for s in reversed(stages) for b in reversed(range(M))
    ]


@register(
    "looped-bfs",
    description="breadth-first looped pipeline: all forwards stage by stage, then all backwards from the last stage",
    source="Lamy-Poirier, Breadth-First Pipeline Parallelism (MLSys 2023)",
    stages_per_worker="chunks",
    options={
        "chunks": "stages per worker (stage s on worker s mod P)",
        "steps": "iterations (flushes) in the schedule",
    },
    bubble=cf.interleaved,
)
def looped_bfs(plan, microbatches: int, chunks: int = 2, steps: int = 1) -> Schedule:
    """Looped BFS: S = P v stages, stage s on worker s mod P, per-rank order
    :func:`looped_bfs_order` (equal to torch's ``ScheduleLoopedBFS``), gradient accumulation over
    the M microbatches and one synchronous update per iteration. Every rank holds all M v of its
    (stage, microbatch) activations at the turn (peak M v)."""
    layout, P, M, T, v = _looped_layout(plan, microbatches, chunks, steps, "looped-bfs")
    orders = repeat_steps([looped_bfs_order(r, P, v, M) for r in range(P)], T, M)
    return flushing_schedule("looped-bfs", layout, orders, M, T, cap=[M * v] * P, options={"chunks": v, "steps": T})


@register(
    "zb-h1",
    description="zero-bubble H1: backward split into BI/BW, deferred BW fills bubbles, 1F1B peak memory",
    source="Qi et al., Zero Bubble Pipeline Parallelism (ICLR 2024)",
    options={"steps": "iterations (flushes) in the schedule"},
    bubble=cf.zb_h1,
    takes_plan=True,
    flushes=True,
)
def zb_h1(plan, microbatches: int, steps: int = 1) -> Schedule:
    """Zero-bubble H1: 1F1B with the backward split into BI (input gradient) and BW (weight
    gradient); BW of later stages is deferred to fill the cool-down bubble while no worker holds
    more microbatches than 1F1B's fullest worker (max_s K_s; K_0 = S for a straight pipeline)."""
    layout, M, T = stage_layout(plan), positive_int(microbatches), positive_int(steps, "steps")
    K = noam_warmup(layout)
    orders = _replica_orders(layout, M, T, lambda s, mbs: zb_h1_order(mbs, K[s], max(K), s))
    return flushing_schedule("zb-h1", layout, orders, M, T, cap=[max(K)] * len(orders), options={"steps": T})


# ---- data parallel ----------------------------------------------------------------------
def _dp_shape(plan, workers):
    S = len(stage_layout(plan))
    W = positive_int(workers if workers is not None else getattr(plan, "num_workers", S), "workers")
    return S, W


@register(
    "dp-bsp",
    description="data parallel: each worker all stages, per-stage all-reduce overlapped with backward",
    source="Li et al., PyTorch Distributed (VLDB 2020)",
    stages_per_worker="all",
    family="data-parallel",
    microbatches="in total",
    options={"workers": "data-parallel workers (default: the plan's)"},
    bubble=cf.data_parallel,
    executor="ddp",
)
def dp_bsp(plan, microbatches: int, workers: int | None = None) -> Schedule:
    """Data parallel, bulk synchronous: every worker holds all S stages (gradient buckets); worker
    w runs microbatches b = w mod W; each round, the AR of stage s follows B of s right away (it
    overlaps the remaining backward, like DDP buckets); then every stage steps."""
    S, W = _dp_shape(plan, workers)
    M = positive_int(microbatches)
    rounds = math.ceil(M / W)
    orders = []
    for w in range(W):
        o = []
        for t in range(rounds):
            b = t * W + w
            if b < M:
                o += [("F", s, b) for s in range(S)]
            for s in reversed(range(S)):
                if b < M:
                    o.append(("B", s, b))
                o.append(("AR", s, t))
            o += [("STEP", s, t) for s in reversed(range(S))]
        orders.append(o)
    layout = tuple(tuple(range(W)) for _ in range(S))
    ops = assign_versions(orders, "sync")
    sched = Schedule("dp-bsp", S, W, M, tuple(map(tuple, ops)), layout, "sync", W, (S,) * W, {"workers": W})
    validate(sched)
    return sched


@register(
    "dp-asp",
    description="data parallel, asynchronous: each worker steps on its own gradients, no all-reduce",
    source="Recht et al., Hogwild! (NeurIPS 2011)",
    stages_per_worker="all",
    family="data-parallel",
    microbatches="in total",
    options={"workers": "data-parallel workers (default: the plan's)"},
    bubble=cf.data_parallel,
    executor="hogwild",
)
def dp_asp(plan, microbatches: int, workers: int | None = None) -> Schedule:
    """Data parallel, asynchronous (parameter-server ASP): worker w runs microbatches b = w mod W,
    and after B of stage s pushes its gradient and pulls the current weights (STEP, no AR).
    Versions are the local update counts; the real staleness is decided at run time."""
    S, W = _dp_shape(plan, workers)
    M = positive_int(microbatches)
    orders = []
    for w in range(W):
        o, t = [], 0
        for b in range(w, M, W):
            o += [("F", s, b) for s in range(S)]
            for s in reversed(range(S)):
                o += [("B", s, b), ("STEP", s, t)]
            t += 1
        orders.append(o)
    layout = tuple(tuple(range(W)) for _ in range(S))
    ops = assign_versions(orders, "async")
    sched = Schedule("dp-asp", S, W, M, tuple(map(tuple, ops)), layout, "async", 1, (S,) * W, {"workers": W})
    validate(sched)
    return sched

"""Schedules: every generator validates, the validator rejects broken schedules, and the numbers of
the papers (NOAM, PipeDream Figure 8, version rules, the unifying document's table) hold."""

from __future__ import annotations

import dataclasses
import warnings

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.cost.plan import Plan
from workbench.schedules import (
    DESCRIPTIONS,
    NAMES,
    Op,
    ScheduleError,
    build,
    from_placement,
    in_flight_peak,
    list_schedule,
    noam_warmup,
    placement,
    validate,
    worker_stats,
)

FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def plan_of(replicas) -> Plan:
    return Plan.from_boundaries(list(range(len(replicas))), list(replicas))


def compute_ops(sched):
    return [(w, op) for w, op in sched if op.kind in ("F", "B", "BI", "BW")]


# ---- every schedule validates ----------------------------------------------------------------
PIPELINE = ["model-parallel", "gpipe", "pipedream", "pipedream-flush", "pipedream-2bw", "zb-h1", "dp-bsp", "dp-asp"]


@FAST
@given(
    name=st.sampled_from(PIPELINE),
    replicas=st.lists(st.integers(1, 3), min_size=1, max_size=4),
    M=st.integers(1, 9),
    opt=st.integers(0, 2),
)
def test_pipeline_schedules_validate(name, replicas, M, opt):
    options = {}
    if name == "pipedream":
        options["weights"] = ("stash", "vertical-sync", "no-stash")[opt]
    if name in ("gpipe", "pipedream-flush", "zb-h1"):
        options["steps"] = opt + 1
    if len(replicas) == 1 and replicas[0] > 1 and name not in ("pipedream", "dp-bsp", "dp-asp"):
        with pytest.warns(UserWarning, match="the plan is data parallel"):  # no silent reshaping
            sched = build(name, plan_of(replicas), M, **options)
    else:
        sched = build(name, plan_of(replicas), M, **options)
    validate(sched)
    steps = options.get("steps", 1)
    per_stage = {(op.kind, op.stage, op.microbatch) for _, op in compute_ops(sched)}
    assert sched.microbatches == M * steps
    for s in range(len(replicas)):  # every microbatch runs forward and backward of every stage
        for b in range(M * steps):
            assert ("F", s, b) in per_stage
            assert ("B", s, b) in per_stage or {("BI", s, b), ("BW", s, b)} <= per_stage
    for w, ops in enumerate(sched.ops):
        assert in_flight_peak(ops) <= sched.max_in_flight[w]


@FAST
@given(P=st.integers(1, 4), v=st.integers(1, 3), groups=st.integers(1, 3), steps=st.integers(1, 2))
def test_interleaved_validates(P, v, groups, steps):
    sched = build("interleaved-1f1b", P * v, P * groups, chunks=v, steps=steps)
    assert sched.num_workers == P
    for w, op in compute_ops(sched):
        assert w == op.stage % P  # stage s on worker s mod P


@FAST
@given(
    name=st.sampled_from(["ddp", "fsdp", "pp", "lpp", "fslpp"]),
    S=st.integers(1, 5),
    B=st.integers(1, 6),
    R=st.integers(1, 3),
    prio=st.sampled_from(["oldest-batch", "lowest-stage", "breadth-first"]),
)
def test_master_schedules_validate(name, S, B, R, prio):
    sched = (
        build(name, S, B, group_size=R, priority=prio) if name in ("lpp", "fslpp") else build(name, S, B, priority=prio)
    )
    validate(sched)
    assert sched.options["latency"] >= 3 * S  # one batch's chain: S forwards of 1, S backwards of 2


def test_names_and_descriptions():
    assert set(NAMES) == {
        "model-parallel",
        "gpipe",
        "pipedream",
        "pipedream-flush",
        "pipedream-2bw",
        "interleaved-1f1b",
        "looped-bfs",
        "zb-h1",
        "dp-bsp",
        "dp-asp",
        "ddp",
        "fsdp",
        "pp",
        "lpp",
        "fslpp",
        "zb-h2",
        "interleaved-zb",
        "zb-v",
        "dualpipev",
        "v-min",
        "v-half",
        "v-zb",
        "seq1f1b",
        "seq1f1b-interleaved",
        "seq1f1b-zb",
        "zb-auto",
        "zb-1p",
        "zb-2p",
    }
    assert all(DESCRIPTIONS[n] and "\n" not in DESCRIPTIONS[n] for n in NAMES)


def test_bad_input_raises_value_error():
    with pytest.raises(ValueError, match="unknown schedule"):
        build("nope", 2, 2)
    with pytest.raises(ValueError, match="options"):
        build("gpipe", 2, 2, chunks=3)
    with pytest.raises(ValueError, match="weights"):
        build("pipedream", 2, 2, weights="magic")
    with pytest.raises(ValueError, match="multiple"):
        build("interleaved-1f1b", 8, 9, chunks=2)  # 9 on 4 ranks: 2 rounds of 4.5
    with pytest.raises(ValueError, match="microbatches_per_step"):
        build("pipedream-2bw", 4, 8, microbatches_per_step=2)
    with pytest.raises(ValueError, match="positive"):
        build("gpipe", 0, 2)


# ---- the validator rejects broken schedules --------------------------------------------------
def _replace_ops(sched, w, ops):
    lists = list(sched.ops)
    lists[w] = tuple(ops)
    return dataclasses.replace(sched, ops=tuple(lists))


def test_validator_rejects_deadlock():
    sched = build("model-parallel", 2, 2)
    w1 = list(sched.ops[1])  # F1.0 B1.0 STEP F1.1 B1.1 STEP
    swapped = w1[3:5] + w1[0:3] + w1[5:]  # microbatch 1 first on worker 1: it waits for worker 0, which waits for B1.0
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(_replace_ops(sched, 1, swapped))


def test_validator_rejects_a_step_before_its_all_reduce():
    """A replica that steps before the all-reduce would apply its own unreduced gradients."""
    sched = build("pipedream", plan_of((2, 1)), 8, weights="stash")
    validate(sched)
    w0 = [str(op) for op in sched.ops[0]]
    i = w0.index("AR0#0")
    assert w0[i + 1] == "STEP0#0"
    ops = list(sched.ops[0])
    ops[i], ops[i + 1] = ops[i + 1], ops[i]
    with pytest.raises(ScheduleError, match=r"worker 0: STEP0#0 comes before AR0#0"):
        validate(_replace_ops(sched, 0, ops))


def test_validator_rejects_backward_on_wrong_worker():
    sched = build("gpipe", 2, 2)
    b = next(op for op in sched.ops[1] if op.kind == "B")
    s2 = _replace_ops(sched, 1, [op for op in sched.ops[1] if op is not b])
    s2 = _replace_ops(s2, 0, list(s2.ops[0]) + [b])
    with pytest.raises(ScheduleError, match="stashed"):
        validate(s2)


def test_validator_rejects_missing_backward_and_in_flight():
    sched = build("pipedream", 3, 4)
    with pytest.raises(ScheduleError, match="backward"):
        validate(_replace_ops(sched, 0, [op for op in sched.ops[0] if (op.kind, op.microbatch) != ("B", 1)]))
    with pytest.raises(ScheduleError, match="in flight"):
        validate(dataclasses.replace(sched, max_in_flight=(2, 2, 1)))
    bad = [
        dataclasses.replace(op, version=op.version + 1) if op.kind == "B" and op.microbatch == 3 else op
        for op in sched.ops[0]
    ]
    with pytest.raises(ScheduleError, match="version"):
        validate(_replace_ops(sched, 0, bad))


# ---- 1F1B: NOAM, Figure 8, round robin -------------------------------------------------------
@FAST
@given(S=st.integers(1, 6), extra=st.integers(0, 6))
def test_noam_warmup_straight(S, extra):
    M = S + extra
    sched = build("pipedream", S, M)
    for s in range(S):
        kinds = [op.kind for op in sched.ops[s] if op.kind in ("F", "B")]
        first_b = kinds.index("B")
        assert first_b == S - s  # stage s admits S - s forwards before its first backward
        steady = kinds[first_b : first_b + 2 * (M - (S - s))]
        assert steady == ["B", "F"] * (M - (S - s))  # then strictly one backward, one forward


def test_pipedream_flush_warmup_option():
    """pipedream-flush admits the given forwards before the first backward (default NOAM, torch's
    Schedule1F1B order); with message latency, one more forward on the first stage hides it (the
    simulated step shrinks by the round trips it took), without latency nothing changes."""
    from workbench.simulation import simulate

    default, deeper = build("pipedream-flush", 2, 8), build("pipedream-flush", 2, 8, warmup=[3, 1])
    first = lambda sc: " ".join(f"{op.kind}{op.microbatch}" for op in sc.ops[0] if op.kind in ("F", "B"))[:23]  # noqa: E731
    assert first(default) == "F0 F1 B0 F2 B1 F3 B2 F4" and first(deeper) == "F0 F1 F2 B0 F3 B1 F4 B2"
    assert deeper.ops[1] == default.ops[1] and deeper.max_in_flight == (3, 1) and default.max_in_flight == (2, 1)
    assert [in_flight_peak(o) for o in deeper.ops] == [3, 1]
    t = lambda sc, lat: simulate(sc, fwd=[1.0, 1.1], bwd=[1.6, 1.7], transfer=lat).makespan  # noqa: E731
    assert t(deeper, 0.0) == pytest.approx(t(default, 0.0))
    # latency L = 0.5: with one more forward in flight the last stage never waits after its first
    # input, F0 + L + M (F1 + B1) + L + B0; NOAM's strict alternation puts the loop rank 1's B(i-1)
    # -> rank 0's B(i-1), F(i+1) -> rank 1's F(i+1) (2L + B0 + F0) beside rank 1's F(i) B(i): it
    # waits 2L + F0 + B0 - F1 - B1 every second microbatch from F2 on, (M - 2) / 2 times
    assert t(deeper, 0.5) == pytest.approx(1.0 + 0.5 + 8 * 2.8 + 0.5 + 1.6)
    assert t(default, 0.5) - t(deeper, 0.5) == pytest.approx(3 * (2 * 0.5 + 1.0 + 1.6 - 1.1 - 1.7))
    for bad in (3, [3], [0, 1], ["a", 1]):
        with pytest.raises(ValueError, match="warmup"):
            build("pipedream-flush", 2, 8, warmup=bad)


def test_pipedream_figure_8():
    # PipeDream paper, Figure 8 (4 workers, straight): the first eight compute ops of each worker,
    # microbatches numbered from 1 in the paper, from 0 here.
    expect = {
        0: "F0 F1 F2 F3 B0 F4 B1 F5",
        1: "F0 F1 F2 B0 F3 B1 F4 B2",
        2: "F0 F1 B0 F2 B1 F3 B2 F4",
        3: "F0 B0 F1 B1 F2 B2 F3 B3",
    }
    sched = build("pipedream", 4, 10)
    for w, line in expect.items():
        got = [f"{op.kind}{op.microbatch}" for op in sched.ops[w] if op.kind in ("F", "B")][:8]
        assert " ".join(got) == line


@FAST
@given(
    replicas=st.lists(st.integers(1, 3), min_size=1, max_size=4),
    M=st.integers(1, 9),
    name=st.sampled_from(["pipedream", "gpipe", "pipedream-flush", "pipedream-2bw"]),
)
def test_round_robin_over_replicas(replicas, M, name):
    plan = plan_of(replicas)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a data-parallel plan warns (test_pipeline_schedules_validate)
        sched = build(name, plan, M)
    for w, op in compute_ops(sched):
        ws = plan.stages[op.stage].workers
        assert w == ws[op.microbatch % len(ws)]
    assert noam_warmup(sched.stage_workers)[0] == plan.noam
    if name == "pipedream":  # replicas update together: AR then STEP, one AR per round of r microbatches
        for s, ws in enumerate(sched.stage_workers):
            for t in range(-(-M // len(ws))):
                assert sched.step_microbatches(s, t) == [b for b in range(M) if b // len(ws) == t]


# ---- weight versions ----------------------------------------------------------------------------
@FAST
@given(S=st.integers(1, 5), M=st.integers(1, 10))
def test_versions_stash_vertical_nostash(S, M):
    st_ = {(op.kind, op.stage, op.microbatch): op.version for _, op in build("pipedream", S, M)}
    vs = {(op.kind, op.stage, op.microbatch): op.version for _, op in build("pipedream", S, M, weights="vertical-sync")}
    ns = {(op.kind, op.stage, op.microbatch): op.version for _, op in build("pipedream", S, M, weights="no-stash")}
    for s in range(S):
        for b in range(M):
            # 1F1B: F(b) on stage s follows the updates of microbatches 0..b-(S-s)
            assert st_[("F", s, b)] == max(0, b - (S - s) + 1)
            assert st_[("B", s, b)] == st_[("F", s, b)]  # stashing: backward reads its forward's version
            assert vs[("F", s, b)] == vs[("B", s, b)] == max(0, b - S + 1)  # input stage's version
            assert ns[("B", s, b)] == b  # no stashing: newest weights, after b updates
    if S > 1 and M > 1:
        assert any(ns[("B", 0, b)] != ns[("F", 0, b)] for b in range(M))  # the failure mode shows


@FAST
@given(S=st.integers(1, 4), M=st.integers(1, 12), extra=st.integers(0, 3))
def test_versions_2bw_delay_one(S, M, extra):
    m = S + extra
    sched = build("pipedream-2bw", S, M, microbatches_per_step=m)
    for _w, op in compute_ops(sched):
        assert op.version == max(op.microbatch // m - 1, 0)  # batch t reads W(t-1)
    for _w, ops in enumerate(sched.ops):  # at most two versions live: current and previous
        n = 0
        for op in ops:
            n += op.kind == "STEP"
            if op.kind in ("F", "B"):
                assert op.version in (n, n - 1)


@FAST
@given(
    name=st.sampled_from(["gpipe", "pipedream-flush", "zb-h1"]),
    S=st.integers(1, 4),
    M=st.integers(1, 5),
    steps=st.integers(1, 3),
)
def test_versions_sync(name, S, M, steps):
    sched = build(name, S, M, steps=steps)
    for _w, op in compute_ops(sched):
        assert op.version == op.microbatch // M
    for s in range(S):
        for t in range(steps):
            assert sched.step_microbatches(s, t) == list(range(t * M, (t + 1) * M))


# ---- zero bubble, data parallel -----------------------------------------------------------------
@FAST
@given(S=st.integers(1, 6), M=st.integers(1, 10))
def test_zb_h1_peak_equals_1f1b(S, M):
    zb, f1b = build("zb-h1", S, M), build("pipedream-flush", S, M)
    assert max(map(in_flight_peak, zb.ops)) == max(map(in_flight_peak, f1b.ops)) == min(S, M)
    assert zb.split_backward


def test_dp_bsp_ar_follows_each_backward():
    sched = build("dp-bsp", 3, 4, workers=2)
    ops = [str(op) for op in sched.ops[0]]
    assert ops[:3] == ["F0.0@v0", "F1.0@v0", "F2.0@v0"]
    assert ops[3:9] == ["B2.0@v0", "AR2#0", "B1.0@v0", "AR1#0", "B0.0@v0", "AR0#0"]
    assert [op.version for _, op in sched if op.kind == "F" and op.microbatch >= 2] == [1] * 6
    asp = build("dp-asp", 3, 4, workers=2)
    assert asp.update == "async" and not any(op.kind == "AR" for _, op in asp)


# ---- the unifying document's table ------------------------------------------------------------
def ticks(name, S, B, W, R=1, priority="oldest-batch"):
    return int(list_schedule(placement(name, W, R), S, B, W, priority)["end"].max())


@pytest.mark.parametrize("S,B", [(2, 2), (3, 5), (4, 8), (5, 3)])
def test_table_latency_unit_ticks(S, B):
    # unit ticks for forward and backward: the table's latency counts a forward+backward as 1, so x2
    assert ticks("pp", S, B, S) == 2 * (B + S - 1)
    assert ticks("ddp", S, B, B) == 2 * S
    assert ticks("fsdp", S, B, B) == 2 * S
    for G in (1, 2, 3):  # LPP with full groups (R = S): S + B/G - 1 per batch slice
        assert ticks("lpp", S, B * G, G * S, R=S) == 2 * (S + B - 1)
    # R interpolates: R = S with W = S is GPipe, R = 1 with W = B is DDP
    assert ticks("lpp", S, B, S, R=S) == ticks("pp", S, B, S)
    assert ticks("lpp", S, B, B, R=1) == ticks("ddp", S, B, B)


def test_table_transfers_and_storage():
    S = B = 4
    ddp, fsdp, pp = (worker_stats(build(n, S, B)) for n in ("ddp", "fsdp", "pp"))
    assert (ddp[["activation_transfers", "weight_transfers"]] == 0).all().all()
    assert (ddp["weight_storage"] == S).all() and (ddp["peak_activations"] == S).all()
    assert (fsdp["weight_transfers"] == S - 1).all() and (fsdp["weight_storage"] == 1).all()
    assert (fsdp["activation_transfers"] == 0).all() and (fsdp["peak_activations"] == S).all()
    assert (pp["weight_transfers"] == 0).all() and (pp["weight_storage"] == 1).all()
    # each worker receives B activations (if not first) and B gradients (if not last): 2B in the middle
    assert list(pp["activation_transfers"]) == [B] + [2 * B] * (S - 2) + [B]
    assert (pp["peak_activations"] <= S).all()
    assert (pp["busy"] == 3 * B).all()  # F = 1, B = 2 without a timeline


@pytest.mark.parametrize("S,B,R,W", [(4, 4, 2, 4), (6, 6, 2, 4), (8, 8, 2, 4), (6, 9, 3, 9)])
def test_table_looped(S, B, R, W):
    h = lambda s, b: (R * b) % W + s % R  # noqa: E731  (the doc's hash, written out independently)
    G = W // R
    lpp = worker_stats(build("lpp", S, B, workers=W, group_size=R))
    assert (lpp["weight_transfers"] == 0).all()
    assert (lpp["weight_storage"] == S // R).all()  # every group sees a batch (B >= G): S/R stages each
    items = [sum(h(s, b) == w for s in range(S) for b in range(B)) for w in range(W)]
    if B % G == 0:
        assert items == [S // R * B // G] * W
    assert (lpp["peak_activations"] <= items).all()  # the doc's bound: items the worker processes
    assert (lpp["busy"] == [3 * i for i in items]).all()
    fs = worker_stats(build("fslpp", S, B, workers=W, group_size=R))
    for w in range(W):
        own = sum(h(s, s) == w for s in range(S))
        fetch = sum(h(s, b) == w and h(s, s) != w for s in range(S) for b in range(B))
        assert fs.loc[w, "weight_storage"] == own
        assert fs.loc[w, "weight_transfers"] == fetch
    assert ticks("fslpp", S, B, W, R) == ticks("lpp", S, B, W, R)  # same compute placement


def test_from_placement_user_function_and_priority():
    S, B, W = 4, 4, 2
    w = lambda s, b, d: (s % 2, s % 2)  # noqa: E731  two workers, stages looped
    depth = from_placement(w, S, B, W, "oldest-batch")
    breadth = from_placement(w, S, B, W, "lowest-stage")
    newest = from_placement(w, S, B, W, lambda s, b, d: -b)
    validate(depth), validate(breadth), validate(newest)
    first_b = lambda sch: [op.microbatch for op in sch.ops[0] if op.kind in ("F", "B")][:4]  # noqa: E731
    assert first_b(depth) != first_b(breadth)
    assert [op for op in newest.ops[0] if op.kind == "F"][0].microbatch == B - 1
    with pytest.raises(ValueError, match="outside"):
        from_placement(lambda s, b, d: (5, 0), S, B, W)
    with pytest.raises(ValueError, match="activations"):
        from_placement(lambda s, b, d: (0 if d == "forward" else 1, 0), S, B, W)
    with pytest.raises(ValueError, match="priority"):
        from_placement(w, S, B, W, "newest")
    with pytest.raises(ValueError, match="priority must be one of .*'lowest-stage'"):
        from_placement(w, S, B, W, "oldest-stage")


def test_fsdp_gradients_reach_owner():
    sched = build("fsdp", 3, 3)
    assert sched.stage_workers == ((0,), (1,), (2,))
    for s in range(3):
        assert sched.step_microbatches(s, 0) == [0, 1, 2]


def test_worker_stats_with_timeline():
    sched = build("gpipe", 2, 2)
    tl = pd.DataFrame(
        {"worker": [0, 0, 1, 1], "kind": ["F", "STEP", "F", "B"], "start": [0, 5, 1, 2], "end": [1.5, 6, 2, 4.5]}
    )
    df = worker_stats(sched, tl)
    assert list(df.columns) == [
        "peak_activations",
        "activation_transfers",
        "weight_transfers",
        "weight_storage",
        "busy",
    ]
    assert df["busy"].tolist() == [1.5, 3.5]
    with pytest.raises(ValueError, match="columns"):
        worker_stats(sched, tl.drop(columns="kind"))


# ---- the simulator on the same table (workbench.simulate, written by another helper) -----------
def _simulate():
    from workbench.simulation import simulate

    return simulate


@pytest.mark.parametrize("S,B", [(2, 3), (4, 6)])
def test_table_latency_simulated(S, B):
    simulate = _simulate()
    assert simulate(build("pp", S, B), fwd=1, bwd=2).makespan == pytest.approx(3 * (B + S - 1))
    assert simulate(build("ddp", S, B), fwd=1, bwd=2).makespan == pytest.approx(3 * S)
    stats = simulate(build("pp", S, B), fwd=1, bwd=2).worker_stats
    assert (stats["busy"] == 3 * B).all()


def test_validator_sees_remote_weight_and_gradient_push_dependencies():
    """Worker 1 computes stage 0 with worker 0's weights. Its first op reads version 1, which only
    worker 0's STEP#0 creates; that STEP needs worker 1's later version-0 gradient push: deadlock."""
    from workbench.schedules import Schedule, ScheduleError, validate

    def sched(w1_ops):
        w0 = (Op("F", 0, 0, 0), Op("B", 0, 0, 0), Op("STEP", 0, step=0))
        return Schedule("remote", 1, 2, 3, (w0, tuple(w1_ops)), ((0,),), update="sync")

    remote = lambda kind, b, v: Op(kind, 0, b, v, weights_worker=0)  # noqa: E731
    ok = [remote("F", 2, 0), remote("B", 2, 0), remote("F", 1, 1), remote("B", 1, 1)]
    validate(sched(ok))
    bad = ok[2:] + ok[:2]
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(sched(bad))


# ---- the validator against an independent deadlock check ----------------------------------------
def _deadlocks(sched) -> bool:
    """Fixed-point execution written independently of core: a worker advances over a compute op once
    its producers ran (F(s-1,b); F(s,b) and BI(s+1,b) or B(s+1,b); BI(s,b) for BW), over STEP at once,
    over AR(s,t) once every holder of s stands at it."""
    ops, W = sched.ops, sched.num_workers
    keys = {(op.kind, op.stage, op.microbatch) for _, op in sched}

    def needs(op):
        s, b = op.stage, op.microbatch
        if op.kind == "F":
            return [("F", s - 1, b)] if s else []
        if op.kind == "BW":
            return [("BI", s, b)]
        nxt = [("BI", s + 1, b) if ("BI", s + 1, b) in keys else ("B", s + 1, b)] if s < sched.num_stages - 1 else []
        return [("F", s, b)] + nxt

    pos, done, moved = [0] * W, set(), True
    while moved:
        moved = False
        for w in range(W):
            while pos[w] < len(ops[w]):
                op = ops[w][pos[w]]
                if op.kind == "AR":
                    hs = sched.stage_workers[op.stage]
                    if all(
                        pos[h] < len(ops[h])
                        and (ops[h][pos[h]].kind, ops[h][pos[h]].stage, ops[h][pos[h]].step)
                        == ("AR", op.stage, op.step)
                        for h in hs
                    ):
                        for h in hs:
                            pos[h] += 1
                        moved = True
                        continue
                    break
                if op.kind in ("F", "B", "BI", "BW"):
                    if not all(k in done for k in needs(op)):
                        break
                    done.add((op.kind, op.stage, op.microbatch))
                pos[w] += 1
                moved = True
    return any(pos[w] < len(ops[w]) for w in range(W))


@FAST
@given(
    name=st.sampled_from(["gpipe", "pipedream-flush", "zb-h1", "dp-bsp", "interleaved-1f1b", "looped-bfs"]),
    S=st.integers(2, 4),
    M=st.integers(1, 6),
    data=st.data(),
)
def test_validator_agrees_with_an_independent_deadlock_check(name, S, M, data):
    opts = {"workers": 2} if name == "dp-bsp" else {"chunks": 2} if name in ("interleaved-1f1b", "looped-bfs") else {}
    if name == "interleaved-1f1b" and M % max(1, M // S):
        M = S  # a count torch's round rule refuses (tested elsewhere)
    sched = dataclasses.replace(build(name, 2 * S if "chunks" in opts else S, M, **opts), max_in_flight=None)
    lists = [list(o) for o in sched.ops]
    for _ in range(data.draw(st.integers(1, 3))):  # swap two ops of one worker
        w = data.draw(st.integers(0, len(lists) - 1))
        i, j = data.draw(st.integers(0, len(lists[w]) - 1)), data.draw(st.integers(0, len(lists[w]) - 1))
        lists[w][i], lists[w][j] = lists[w][j], lists[w][i]
    mutated = dataclasses.replace(sched, ops=tuple(map(tuple, lists)))
    if _deadlocks(mutated):
        with pytest.raises(ScheduleError, match="deadlock"):
            validate(mutated)
    elif _steps_before_their_all_reduce(mutated):
        with pytest.raises(ScheduleError, match="comes before AR"):
            validate(mutated)
    else:
        validate(mutated)


def _steps_before_their_all_reduce(sched) -> bool:
    """Whether a worker lists a STEP before its AR of the same (stage, step), by positions."""
    for ops in sched.ops:
        at = {(op.kind, op.stage, op.step): i for i, op in enumerate(ops) if op.kind in ("AR", "STEP")}
        if any(k == "STEP" and at.get(("AR", s, t), -1) > i for (k, s, t), i in at.items()):
            return True
    return False


def test_updates_per_round_counts_each_stages_steps_on_its_first_replica():
    """``Schedule.updates_per_round``: the STEPs of each stage in one pass (the runtime's rounds
    offset versions by it); a replicated stage updates once per round of its replicas."""
    assert build("gpipe", 3, 4, steps=2).updates_per_round == (2, 2, 2)
    assert build("pipedream", 4, 8).updates_per_round == (8, 8, 8, 8)
    replicated = build("pipedream", Plan.from_boundaries([0, 1], [2, 1]), 8)
    assert replicated.updates_per_round == (4, 8)
    for sched in (replicated, build("interleaved-1f1b", 4, 4, chunks=2, steps=3)):
        counted = tuple(
            sum(op.kind == "STEP" and op.stage == s for op in sched.ops[sched.stage_workers[s][0]])
            for s in range(sched.num_stages)
        )
        assert sched.updates_per_round == counted


@pytest.mark.parametrize("name", ["interleaved-1f1b", "interleaved-zb"])
def test_interleaved_schedules_refuse_microbatches_that_do_not_split_into_rounds_alike(name):
    with pytest.raises(
        ValueError, match=rf"^{name}: 9 microbatches on 4 workers .* multiple of the 2 rounds; use one of"
    ):
        build(name, 8, 9, chunks=2)
    assert build(name, 8, 10, chunks=2).microbatches == 10


def test_remote_inputs_are_named_records_of_the_producers_on_other_workers():
    from workbench.schedules.core import RemoteInput

    sched = build("pipedream", 3, 2)
    got = sched.remote_inputs(1)
    assert len(got) == 4 and all(type(r) is RemoteInput for r in got)  # 2 activations from 0, 2 gradients from 2
    for r in got:
        _, stage, _ = r.producer
        assert stage != sched.ops[1][r.op].stage and sched.where()[r.producer] == r.src != 1

"""Tests of the discrete-event simulator. Expected numbers are derived by hand in comments, from
closed forms (GPipe bubble, ring all-reduce) or from bounds (memory-time), never from the code."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from workbench import Profile
from workbench.schedules.core import Op, Schedule, validate
from workbench.simulation import simulate
from workbench.viz.files import save_simulation

F_, B_ = 1.0, 2.0  # unit costs used throughout: forward 1, backward 2


# ---- hand-built schedules (independent of the schedule generators) -------------------------
def one_f_one_b(S: int, M: int) -> Schedule:
    """PipeDream 1F1B, straight pipeline: stage s warms up with S - s forwards (NOAM = S at the
    input stage), then alternates B and F; weight stashing with a STEP after every B."""
    ops = []
    for s in range(S):
        lst, steps, fv = [], 0, {}

        def fwd(b):
            fv[b] = steps
            lst.append(Op("F", s, b, version=steps))

        def bwd(b):
            nonlocal steps
            lst.append(Op("B", s, b, version=fv[b]))
            lst.append(Op("STEP", s, step=steps))
            steps += 1

        warm = min(S - s, M)
        for b in range(warm):
            fwd(b)
        for b in range(warm, M):
            bwd(b - warm)
            fwd(b)
        for b in range(M - warm, M):
            bwd(b)
        ops.append(lst)
    return Schedule("1f1b", S, S, M, ops, tuple((s,) for s in range(S)), update="stash")


def gpipe(S: int, M: int) -> Schedule:
    ops = [
        [Op("F", s, b) for b in range(M)] + [Op("B", s, b) for b in range(M)] + [Op("STEP", s, step=0)]
        for s in range(S)
    ]
    return Schedule("gpipe", S, S, M, ops, tuple((s,) for s in range(S)), microbatches_per_step=M)


class FlatTopology:
    """Duck-typed topology: every pair of distinct workers joined at ``bw`` bytes/s, one level."""

    def __init__(self, n, bw):
        self.num_workers, self.levels, self._bw = n, [(n, bw)], bw

    def bandwidth_between(self, a, b):
        return math.inf if a == b else self._bw


def profile(fwd, bwd, act, params) -> Profile:
    return Profile(
        pd.DataFrame(
            {
                "name": [f"l{i}" for i in range(len(fwd))],
                "fwd_ms": fwd,
                "bwd_ms": bwd,
                "act_bytes": act,
                "param_bytes": params,
            }
        ),
        {"name": "toy"},
    )


def compute_rows(tl: pd.DataFrame) -> pd.DataFrame:
    return tl[tl["lane"] == "compute"]


# ---- GPipe bubble ---------------------------------------------------------------------------
@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (4, 4), (4, 16), (8, 3), (6, 32)])
def test_gpipe_bubble_matches_closed_form(p, m):
    """Fill-drain with equal stages: makespan (m + p - 1)(f + b), busy m (f + b) on every worker,
    so the bubble fraction is (p - 1) / (m + p - 1)."""
    res = simulate(gpipe(p, m), fwd=F_, bwd=B_)
    assert res.makespan == pytest.approx((m + p - 1) * (F_ + B_))
    assert res.metrics["bubble_fraction"] == pytest.approx([(p - 1) / (m + p - 1)] * p)


def test_gpipe_bubble_with_generator():
    from workbench.schedules import build

    for p, m in [(3, 5), (4, 8)]:
        res = simulate(build("gpipe", p, m), fwd=F_, bwd=B_)
        assert res.metrics["bubble_fraction"] == pytest.approx([(p - 1) / (m + p - 1)] * p)


def test_span_bubble_counts_only_idle_inside_each_workers_span():
    """2 stages, 1 microbatch, F = 1, B = 2 by hand: worker 0 runs F [0, 1] and B [4, 6], worker 1
    F [1, 2] and B [2, 4]. Whole makespan (6): both workers busy 3 -> 1/2 each. Per-worker span
    (the zero-bubble papers' rate): worker 0 spans 6 -> 1/2, worker 1 spans 3 with no gap -> 0."""
    res = simulate(gpipe(2, 1), fwd=1.0, bwd=2.0)
    assert res.metrics["bubble_fraction"] == pytest.approx([0.5, 0.5])
    assert res.metrics["span_bubble_fraction"] == pytest.approx([0.5, 0.0])
    assert "span_bubble_fraction" in res.summary()


def test_unit_costs_leave_activation_bytes_out_of_the_summary_and_say_why():
    """Unit costs know no activation sizes: the summary's table has no column of NaN (one line says so);
    with a profile the column is there, with numbers."""
    text = simulate(gpipe(2, 4), fwd=1.0, bwd=2.0).summary()
    assert "NaN" not in text and "peak_activation_bytes: not modeled (no activation sizes without a profile" in text
    prof = Profile.from_frame(
        pd.DataFrame(
            dict(name=["a", "b"], fwd_ms=[1.0, 1.0], bwd_ms=[2.0, 2.0], act_bytes=[1e3, 1e3], param_bytes=[0.0, 0.0])
        )
    )
    sized = simulate(gpipe(2, 4), profile=prof).summary()
    assert "NaN" not in sized and "peak_activation_bytes  " in sized and "not modeled" not in sized


# ---- 1F1B -------------------------------------------------------------------------------------
def _idle_in_window(tl: pd.DataFrame, worker: int, lo: float, hi: float) -> float:
    ops = compute_rows(tl)
    ops = ops[ops["worker"] == worker]
    covered = (np.minimum(ops["end"], hi) - np.maximum(ops["start"], lo)).clip(lower=0).sum()
    return (hi - lo) - covered


@pytest.mark.parametrize("S,M", [(4, 64), (6, 48)])
def test_1f1b_steady_state_has_no_idle_time(S, M):
    res = simulate(one_f_one_b(S, M), fwd=F_, bwd=B_)
    L = res.makespan
    for w in range(S):
        assert _idle_in_window(res.timeline, w, L / 3, 2 * L / 3) == pytest.approx(0.0, abs=1e-9)
    # and the whole run: (M + S - 1)(f + b) for balanced stages, like GPipe
    assert L == pytest.approx((M + S - 1) * (F_ + B_))


def test_pipedream_figure8_timeline():
    """PipeDream (SOSP'19) Fig. 8: 4 stages, NOAM = 4, forward 1, backward 2. By hand:
    w0: F0..F3 at 0,1,2,3; B0 waits for B1.0, which waits for B2.0 (8), B3.0 (4..6): B0 at 10.
    w3: F0 at 3, B0 at 4, F1 at 6 (F2.1 done at 4), B1 at 7, F2 at 9 (F2.2 runs 8..9), B2 at 10.
    w2: F0 2, F1 3, B0 6, F2 8, B1 9.   w1: F0 1, F1 2, F2 3, B0 8, F3 10, B1 11."""
    expect = {
        0: [("F", 0, 0), ("F", 1, 1), ("F", 2, 2), ("F", 3, 3), ("B", 0, 10), ("F", 4, 12), ("B", 1, 13)],
        1: [("F", 0, 1), ("F", 1, 2), ("F", 2, 3), ("B", 0, 8), ("F", 3, 10), ("B", 1, 11)],
        2: [("F", 0, 2), ("F", 1, 3), ("B", 0, 6), ("F", 2, 8), ("B", 1, 9)],
        3: [("F", 0, 3), ("B", 0, 4), ("F", 1, 6), ("B", 1, 7), ("F", 2, 9), ("B", 2, 10)],
    }
    schedules = [one_f_one_b(4, 8)]
    try:
        from workbench.schedules import build

        schedules.append(build("pipedream", 4, 8))
    except ImportError:
        pass
    for sched in schedules:
        res = simulate(sched, fwd=F_, bwd=B_)
        comp = compute_rows(res.timeline)
        for w, ops in expect.items():
            got = comp[(comp["worker"] == w) & comp["kind"].isin(["F", "B"])].sort_values("start")
            got = list(zip(got["kind"], got["microbatch"], got["start"]))[: len(ops)]
            assert got == [(k, b, float(t)) for k, b, t in ops], (sched.name, w)
        # NOAM: the input stage admits 4 minibatches before its first backward
        w0 = comp[comp["worker"] == 0].sort_values("start")
        first_b = list(w0["kind"]).index("B")
        assert list(w0["kind"])[:first_b] == ["F"] * 4
        assert res.metrics["peak_activations"] == [4, 3, 2, 1]
        # weight stashing: stage 0 holds NOAM versions (steady state: one per in-flight minibatch)
        assert res.metrics["weight_versions"] == [4, 3, 2, 1]


# ---- the bound rho <= M / S for every schedule -----------------------------------------------
def _chain(kinds_split: bool, S: int, s: int, f: float, b: float) -> float:
    """Shortest time the input activation of stage s must live: F_s .. F_{S-1}, then the backward
    chain down to stage s (BI halves and the final BW_s for a split backward)."""
    if kinds_split:
        return (S - s) * f + (S - s) * b / 2 + b / 2
    return (S - s) * (f + b)


def _names():
    try:
        from workbench.schedules import NAMES

        return list(NAMES)
    except ImportError:
        return []


@pytest.mark.parametrize("name", _names() or ["(schedules.build missing)"])
def test_throughput_bounds_hold_for_every_schedule(name):
    """With L the makespan, W workers, S stages, B microbatches, f = b = 1 (the "Unifying" doc's
    unit: a forward or a backward takes one tick), and M_w the peak activations of worker w:
      1. work fits: S B (f + b) <= L W, i.e. microbatches per unit time B / L <= W / (S (f + b));
      2. memory-time: every activation x_s^b lives at least its dependency chain, so
         B * sum_s chain(s) <= L * sum_w M_w;
      3. hence, without a split backward (chain = 2(S - s)), rho = S B / (L W) <= M / S, M = max_w M_w."""
    from workbench.schedules import build

    for f, b in ((1.0, 1.0), (1.0, 2.0)):
        sched = build(name, 4, 8)
        validate(sched)
        res = simulate(sched, fwd=f, bwd=b)
        L, W, S, B = res.makespan, sched.num_workers, sched.num_stages, sched.microbatches
        assert B / L <= W / (S * (f + b)) + 1e-9
        peaks = res.metrics["peak_activations"]
        split = sched.split_backward
        assert B * sum(_chain(split, S, s, f, b) for s in range(S)) <= L * sum(peaks) + 1e-9
        if f == b == 1.0 and not split:
            assert S * B / (L * W) <= max(peaks) / S + 1e-9
        assert 0 < res.metrics["rho"] <= 1 + 1e-9


# ---- the "Unifying" table with unit costs ---------------------------------------------------
def test_unifying_table_latency_and_columns():
    """Latency in units of one stage's forward + backward: PP B + S - 1; LPP with R = S
    (G independent pipelines of B/G microbatches) S + B/G - 1. Storage and transfer columns:
    PP and DDP move no weights; FSDP fetches S - 1 stages' weights on workers that own one."""
    from workbench.schedules import build

    f, b = 1.0, 2.0
    for S, B in [(4, 8), (3, 6)]:
        res = simulate(build("pp", S, B), fwd=f, bwd=b)
        assert res.makespan == pytest.approx((B + S - 1) * (f + b))
        st = res.worker_stats
        assert (st["weight_transfers"] == 0).all() and (st["weight_storage"] == 1).all()
        G = 2
        res = simulate(build("lpp", S, B, workers=G * S, group_size=S), fwd=f, bwd=b)
        assert res.makespan == pytest.approx((S + B / G - 1) * (f + b))
    S, B = 4, 8
    ddp = simulate(build("ddp", S, B), fwd=f, bwd=b)
    assert ddp.makespan == pytest.approx(S * (f + b))
    assert (ddp.worker_stats["weight_transfers"] == 0).all()
    assert (ddp.worker_stats["weight_storage"] == S).all()
    fsdp = simulate(build("fsdp", S, B), fwd=f, bwd=b).worker_stats
    assert list(fsdp["weight_transfers"][:S]) == [S - 1] * S


# ---- profile-based costs ----------------------------------------------------------------------
def _two_stage_model_parallel() -> Schedule:
    ops = [[Op("F", 0, 0), Op("B", 0, 0)], [Op("F", 1, 0), Op("B", 1, 0)]]
    return Schedule("mp2", 2, 2, 1, ops, ((0,), (1,)))


def test_transfer_adds_exactly_its_latency():
    """Stage 0 = layer 0 (fwd 3, bwd 5 ms), stage 1 = layer 1 (fwd 2, bwd 4 ms). The cut carries
    act_bytes[0] = 2e6 bytes over a 1e9 B/s link: 2 ms forward and 2 ms for the gradient back."""
    prof = profile([3.0, 2.0], [5.0, 4.0], [2e6, 1e3], [0.0, 0.0])
    sched = _two_stage_model_parallel()
    free = simulate(sched, profile=prof)
    assert free.makespan == pytest.approx(3 + 2 + 4 + 5)
    res = simulate(sched, profile=prof, topology=FlatTopology(2, 1e9))
    assert res.makespan == pytest.approx(3 + 2 + 4 + 5 + 2 * 2.0)
    comm = res.timeline[res.timeline["lane"] == "comm"].sort_values("start")
    assert list(comm["kind"]) == ["send_act", "send_grad"]
    assert list(comm["start"]) == pytest.approx([3.0, 3 + 2 + 2 + 4])
    assert res.metrics["comm_stall"] == pytest.approx([2.0, 2.0])
    assert sum(res.metrics["bytes_per_level"].values()) == pytest.approx(4e6)
    assert res.label.startswith("modeled from the") and " of toy" in res.label
    assert free.metrics["peak_activation_bytes"] == pytest.approx([2e6, 1e3])


def test_real_topology_levels_if_available():
    topo_mod = pytest.importorskip("workbench.cost.topology")
    topo = topo_mod.Topology(levels=((2, 1e9), (2, 1e8)))
    prof = profile([1.0] * 4, [1.0] * 4, [1e6] * 4, [0.0] * 4)
    ops = [[Op("F", s, 0), Op("B", s, 0)] for s in range(4)]
    res = simulate(Schedule("mp4", 4, 4, 1, ops, tuple((s,) for s in range(4))), profile=prof, topology=topo)
    # cuts 0|1 and 2|3 inside a server (1 ms each way), cut 1|2 across servers (10 ms each way)
    assert res.makespan == pytest.approx(8 * 1.0 + 2 * (1 + 10 + 1))
    levels = res.metrics["bytes_per_level"]
    assert sorted(levels.values()) == pytest.approx([2e6, 4e6])


def _replicated(r: int, two_stages: bool) -> Schedule:
    if two_stages:
        ops = [
            [
                Op("F", 0, w),
                Op("F", 1, w),
                Op("B", 1, w),
                Op("AR", 1, step=0),
                Op("B", 0, w),
                Op("AR", 0, step=0),
                Op("STEP", 1, step=0),
                Op("STEP", 0, step=0),
            ]
            for w in range(r)
        ]
        return Schedule("dp", 2, r, r, ops, (tuple(range(r)),) * 2, microbatches_per_step=r)
    ops = [[Op("F", 0, w), Op("B", 0, w), Op("AR", 0, step=0), Op("STEP", 0, step=0)] for w in range(r)]
    return Schedule("dp", 1, r, r, ops, (tuple(range(r)),), microbatches_per_step=r)


@pytest.mark.parametrize("r", [2, 4])
def test_allreduce_time_of_replicated_stage(r):
    """Ring all-reduce of P = 1e9 bytes over 1e9 B/s among r replicas: 2 (r - 1) / r * 1000 ms. It
    overlaps the backward (1..3) that produces the gradients: starts with it at t = 1, so the STEP
    ends at 1 + max(2, AR)."""
    prof = profile([1.0], [2.0], [0.0], [1e9])
    res = simulate(_replicated(r, False), profile=prof, topology=FlatTopology(r, 1e9))
    ar = 2 * (r - 1) / r * 1000.0
    rows = res.timeline[res.timeline["kind"] == "allreduce"]
    assert len(rows) == r
    assert (rows["end"] - rows["start"]).to_numpy() == pytest.approx([ar] * r)
    assert res.makespan == pytest.approx(1 + max(2, ar))
    assert simulate(
        _replicated(r, False), profile=prof, topology=FlatTopology(r, 1e9), overlap_comm=False
    ).makespan == pytest.approx(1 + 2 + ar)
    # each worker sends 2 (r - 1) / r * P bytes around the ring
    assert sum(res.metrics["bytes_per_level"].values()) == pytest.approx(r * 2 * (r - 1) / r * 1e9)


def test_allreduce_overlaps_backward_unless_disabled():
    """Two stages per worker (DDP buckets): AR of stage 1 (A = 1000 ms) may start with B of stage 1
    (t = f0 + f1 = 2) and runs during B of stage 0 (D = 300 ms, 4..304); AR of stage 0 queues
    behind it on the collective channel: 2 + A + A = 2002. Not overlapped: each AR waits for its
    backward and blocks the worker: t1 = f0 + f1 + b1 = 4, then t1 + A + D + A = 2304."""
    prof = profile([1.0, 1.0], [300.0, 2.0], [0.0, 0.0], [1e9, 1e9])
    sched = _replicated(2, True)
    validate(sched)
    kw = dict(profile=prof, topology=FlatTopology(2, 1e9), microbatch_fraction=1.0)
    assert simulate(sched, **kw).makespan == pytest.approx(2002.0)
    assert simulate(sched, overlap_comm=False, **kw).makespan == pytest.approx(2304.0)


def test_weight_fetch_and_gradient_push_unit_costs():
    """Worker 1 computes stage 0 whose weights live on worker 0 (weight_fetch = 5). F's fetch
    runs 0..5, F 5..6; B's fetch may start with F (prefetch one op) but queues behind the first
    fetch on the link: 5..10; B 10..12; its weight gradient goes back to worker 0 (5): STEP at 17."""
    ops = [[Op("STEP", 0, step=0)], [Op("F", 0, 0, weights_worker=0), Op("B", 0, 0, weights_worker=0)]]
    sched = Schedule("fetch", 1, 2, 1, ops, ((0,),))
    res = simulate(sched, fwd=1, bwd=2, weight_fetch=5.0)
    comp = compute_rows(res.timeline).set_index("kind")
    assert comp.loc["F", "start"] == 5 and comp.loc["B", "start"] == 10 and comp.loc["STEP", "start"] == 17
    assert res.metrics["weight_fetches"] == [0, 2]


# ---- errors -----------------------------------------------------------------------------------
def test_deadlock_is_detected_and_named():
    ops = [[Op("F", 0, 0), Op("B", 0, 0)], [Op("B", 1, 0), Op("F", 1, 0)]]  # B1 before its own F1
    sched = Schedule("bad", 2, 2, 1, ops, ((0,), (1,)))
    with pytest.raises(ValueError, match=r"deadlock.*B1\.0"):
        simulate(sched)


def test_missing_allreduce_member_and_bad_costs():
    ops = [[Op("F", 0, 0), Op("B", 0, 0), Op("AR", 0, step=0)], [Op("F", 0, 1), Op("B", 0, 1)]]
    with pytest.raises(ValueError, match="AR of stage 0"):
        simulate(Schedule("ar", 1, 2, 2, ops, ((0, 1),)))
    with pytest.raises(ValueError, match="fwd has 3 values"):
        simulate(gpipe(2, 2), fwd=[1, 2, 3])
    with pytest.raises(ValueError, match="need a profile"):
        simulate(gpipe(2, 2), topology=FlatTopology(2, 1e9))


# ---- result object ----------------------------------------------------------------------------
def test_result_schema_metrics_and_save(tmp_path):
    res = simulate(one_f_one_b(3, 6), transfer=0.5)
    tl = res.timeline
    for col in ("worker", "stage", "microbatch", "kind", "start", "end", "version", "lane", "src", "dst"):
        assert col in tl
    assert set(tl["lane"]) == {"compute", "comm"}
    assert set(tl.loc[tl["lane"] == "comm", "kind"]) == {"send_act", "send_grad"}
    assert res.label == "modeled (unit costs)"
    assert res.metrics["steps"] == 6 and res.metrics["iteration_time"] == pytest.approx(res.makespan / 6)
    ws = res.worker_stats
    assert list(ws.columns) == [
        "peak_activations",
        "activation_transfers",
        "weight_transfers",
        "weight_storage",
        "busy",
    ]
    assert ws["busy"].to_numpy() == pytest.approx([6 * 3.0] * 3)
    assert "bubble_fraction" in res.summary()
    out = save_simulation(res, tmp_path / "sim")
    assert {p.name for p in out.iterdir()} == {"timeline.csv", "metrics.json", "timeline.html", "trace.json"}
    assert len(pd.read_csv(out / "timeline.csv")) == len(tl)


# ---- one default split, one timeline schema ---------------------------------------------------
@pytest.mark.slow
def test_simulator_and_runtime_split_the_same_way_by_default():
    """Mini VGG-16 has 16 layers; on 4 stages both cut after layers 3, 7, 11 (Plan.even)."""
    from workbench.cost.plan import Plan
    from workbench.runtime.semantics.stages import even_bounds
    from workbench.simulation.costs import stage_ranges

    prof = profile([1.0] * 15 + [30.0], [2.0] * 16, [0.0] * 16, [0.0] * 16)  # a heavy last layer
    sched = gpipe(4, 2)
    assert stage_ranges(sched, prof, None) == even_bounds(16, 4) == [(0, 3), (4, 7), (8, 11), (12, 15)]
    assert [s.last for s in Plan.even(10, 4).stages] == [2, 5, 7, 9]


def test_timeline_schema_is_shared_with_the_runtime():
    from workbench.io.timeline import COMMON_COLUMNS
    from workbench.runtime.launch.outputs import TIMELINE_COLUMNS as MEASURED

    tl = simulate(one_f_one_b(2, 3), transfer=0.5).timeline
    assert set(COMMON_COLUMNS) <= set(tl.columns) and set(COMMON_COLUMNS) <= set(MEASURED)
    assert (tl["round"] == 0).all() and (tl["step"] == tl["round"]).all()
    steps = tl[tl["kind"] == "STEP"].sort_values("start")
    assert sorted(steps.loc[steps["stage"] == 0, "update"]) == [0, 1, 2]  # update index of the stage


@pytest.mark.parametrize(
    "name, stages, kw",
    [
        ("pipedream", 4, {}),
        ("gpipe", 3, {}),
        ("zb-h1", 3, {}),
        ("interleaved-1f1b", 2, {"chunks": 2}),
        ("seq1f1b", 3, {"segments": 3}),
        ("seq1f1b-zb", 2, {"segments": 2}),
        ("fsdp", 3, {}),
        ("dp-bsp", 2, {}),
    ],
)
def test_simulator_edges_are_schedule_dependencies(name, stages, kw):
    """The simulator evaluates the dataflow on integer arrays; its compute-op edges must be exactly
    Schedule.dependencies() (the derivation the validator and the runtime read)."""
    from workbench.schedules import build
    from workbench.simulation.costs import unit_costs
    from workbench.simulation.edges import build_graph

    sched = build(name, stages, 4, **kw)
    g = build_graph(
        sched,
        unit_costs(sched, 1.0, 2.0, None, 0.0, weight_fetch=0.0, step_ms=0.0, latency_ms=0.0, op_overhead_ms=0.0),
    )
    key = [(op.kind, op.stage, sched.unit(op)) if op.kind in ("F", "B", "BI", "BW") else None for op in g.flat]
    got = {
        (key[p], key[c])
        for p in range(len(g.flat))
        for c in g.cons_idx[g.cons_ptr[p] : g.cons_ptr[p + 1]]
        if key[p] is not None and key[c] is not None
    }
    want = {(p, c) for c, ps in sched.dependencies().items() for p in ps}
    assert got == want


# ---- overlapped F/B pairs (DeepSeek-V3's DualPipe) hide each other's all-to-all ---------------------
def paired_one_stage() -> Schedule:
    """One worker, one stage, 2 microbatches: F0, [F1 B0] as an overlapped pair, B1, STEP."""
    ops = (Op("F", 0, 0), Op("F", 0, 1), Op("B", 0, 0), Op("B", 0, 1), Op("STEP", 0, step=0))
    return Schedule("paired", 1, 1, 2, (ops,), ((0,),), "sync", 2, None, {"overlap_f_b": ((0, (0, 1), (0, 0)),)})


@pytest.mark.parametrize(
    "a,paired,back_to_back",
    [
        # a = 1: F0 1+1, pair F1 1+max(0, 1-2) and B0 2+max(0, 1-1), B1 2+1 -> 2+1+2+3 = 8; back to back 2+2+3+3 = 10
        (1.0, 8.0, 10.0),
        # a = 3: F0 4, pair F1 1+(3-2) and B0 2+(3-1), B1 5 -> 4+2+4+5 = 15; back to back 4+4+5+5 = 18
        (3.0, 15.0, 18.0),
    ],
)
def test_overlapped_pair_hides_each_others_alltoall(a, paired, back_to_back):
    sched = paired_one_stage()
    validate(sched)
    on = simulate(sched, fwd=F_, bwd=B_, alltoall=a)
    off = simulate(sched, fwd=F_, bwd=B_, alltoall=a, overlap_pairs=False)
    assert (on.makespan, off.makespan) == (paired, back_to_back)
    assert on.metrics["busy"] == off.metrics["busy"] == [2 * F_ + 2 * B_]  # the exposed all-to-all is not compute
    assert list(on.worker_stats["busy"]) == [2 * F_ + 2 * B_]  # compute rows of the timeline: compute only
    assert on.metrics["alltoall_exposed"] == [paired - 6.0] and off.metrics["alltoall_exposed"] == [4 * a]
    assert on.metrics["comm_stall"] == on.metrics["alltoall_exposed"]
    comm = on.timeline[on.timeline["kind"] == "alltoall"]
    assert (comm["end"] - comm["start"]).sum() == pytest.approx(paired - 6.0)
    assert simulate(sched, fwd=F_, bwd=B_).makespan == 6.0  # no all-to-all: the pair changes nothing


def test_dualpipev_overlap_gain_over_the_same_order_back_to_back():
    """DualPipeV, 4 workers (8 stages), 16 microbatches, F = 1, B = 2 per stage, all-to-all 1 per F/B/BI:
    back to back every op waits for its all-to-all (2 stages x 16 microbatches x (F + B) = 64 per worker);
    paired, a pair's all-to-alls fit in each other's compute, so only unpaired ops wait, and the step is
    shorter. A schedule without pairs (ZB-V, same V placement) is charged the same either way: the
    pairing comes from the schedule, not from its name."""
    from workbench.schedules import build

    sched = build("dualpipev", 8, 16)
    pairs = sched.overlapped_pairs()
    on = simulate(sched, fwd=1, bwd=2, alltoall=1.0)
    off = simulate(sched, fwd=1, bwd=2, alltoall=1.0, overlap_pairs=False)
    assert off.metrics["alltoall_exposed"] == [64.0] * 4
    for w in range(4):  # each pair hides both of its all-to-alls: 2 per pair
        n = sum(1 for p in pairs if p[0] == w)
        assert on.metrics["alltoall_exposed"][w] == 64.0 - 2 * n
    assert on.makespan < off.makespan
    zbv = build("zb-v", 8, 16)
    assert not zbv.overlapped_pairs()
    assert (
        simulate(zbv, fwd=1, bwd=2, alltoall=1.0).makespan
        == simulate(zbv, fwd=1, bwd=2, alltoall=1.0, overlap_pairs=False).makespan
    )


def test_overlapped_pairs_must_be_consecutive():
    from workbench.schedules.core import ScheduleError

    sched = paired_one_stage()
    bad = Schedule(
        "bad", 1, 1, 2, sched.ops, sched.stage_workers, "sync", 2, None, {"overlap_f_b": ((0, (0, 0), (0, 1)),)}
    )
    with pytest.raises(ScheduleError, match="not two consecutive ops"):
        simulate(bad, fwd=1, bwd=2, alltoall=1.0)
    with pytest.raises(ScheduleError, match="not two consecutive ops"):
        validate(bad)
    with pytest.raises(ValueError, match="alltoall"):
        simulate(sched, fwd=1, bwd=2, alltoall=[1.0, 2.0])


@pytest.mark.slow
def test_a_weight_tied_across_stages_charges_its_all_reduce_to_every_owners_step():
    """The zoo gpt with its output projection tied to the token embedding (layers 0 and 3): the
    profile lists the tie; on 2 workers joined by 1 GB/s every owner's STEP lasts the ring
    all-reduce of the embedding's bytes, 2 (r-1)/r n / B = n / 1e9 s, longer than without the tie."""
    import dataclasses

    from workbench import Topology, profile
    from workbench.models import build as build_model

    m = build_model("gpt", num_layers=2, tie_weights=True)
    prof = profile(m, iterations=1, warmup=0, batch_size=2, progress=False)
    nbytes = m.layers[0].tok.weight.numel() * 4
    assert prof.meta["tied"] == [[[0, 3], nbytes]]
    untied = dataclasses.replace(prof, meta={k: v for k, v in prof.meta.items() if k != "tied"})
    from workbench.schedules import build

    sched, topo = build("gpipe", 2, 2), Topology.flat(2, 1e9)
    steps = [
        simulate(sched, profile=p, topology=topo, step_ms=0.5).timeline.query("kind == 'STEP'") for p in (prof, untied)
    ]
    extra = (steps[0]["end"] - steps[0]["start"]).to_numpy() - (steps[1]["end"] - steps[1]["start"]).to_numpy()
    assert extra == pytest.approx([nbytes / 1e9 * 1e3] * 2)


# ---- steady-state figures only where the run reached a steady state --------------------------------
def test_too_short_a_run_has_no_steady_state_figure():
    """4 microbatches through 4 PipeDream stages are warm-up and drain only (the input stage holds 4):
    no time per minibatch, no throughput, and the reason; the makespan figure is labelled as such."""
    from workbench import schedules as sch
    from workbench.simulation import simulate as sim

    res = sim(sch.build("pipedream", 4, 4), fwd=1, bwd=2)
    m = res.metrics
    assert res.time_per_minibatch_ms is None and m["steady_state"] is False
    assert res.throughput_minibatches_per_s is None and res.throughput_samples_per_s is None
    assert "4 microbatches are all warm-up or drain (the input stage holds 4 at once" in m["no_steady_state_reason"]
    assert m["makespan_per_minibatch"] == m["makespan"] / 4
    assert "no steady state" in repr(res) and "no steady state" in res.summary()
    long = sim(sch.build("pipedream", 4, 12), fwd=1, bwd=2)
    assert long.time_per_minibatch_ms == 3.0 and long.metrics["no_steady_state_reason"] is None


def test_short_pipedream_run_never_beats_the_plans_bottleneck():
    """The issue's case: a short PipeDream run used to report a 'steady state' below the plan's
    bottleneck (its drain completes microbatches faster); every figure given now is >= it."""
    from workbench import Topology, partition
    from workbench import schedules as sch
    from workbench.profiling.pipedream import shipped
    from workbench.simulation import simulate as sim

    prof, topo = shipped("vgg16"), Topology.flat(4, 10e9)
    plan = partition(prof, topo, straight=True, refine=False)
    for m in (2, 3, 4, 6, 8, 16, 32, 64):
        res = sim(sch.build("pipedream", plan, m, warmup=list(plan.in_flight)), profile=prof, plan=plan, topology=topo)
        t = res.time_per_minibatch_ms
        assert t is None or t >= plan.bottleneck_ms * (1 - 1e-6), (m, t, plan.bottleneck_ms)
    assert t == pytest.approx(plan.predicted_ms, rel=0.02)


def test_one_flush_is_not_a_steady_state_but_several_are():
    from workbench import schedules as sch
    from workbench.simulation import simulate as sim

    assert sim(sch.build("gpipe", 4, 8), fwd=1, bwd=2).time_per_minibatch_ms is None
    assert sim(sch.build("gpipe", 4, 32, steps=4), fwd=1, bwd=2).time_per_minibatch_ms is not None


# ---- typed records: edge kinds and communication rows ----------------------------------------------
def _edge_kinds(sched: Schedule, transfer: float) -> dict[tuple[int, int], int]:
    """(producer, consumer) op ids -> the op graph's edge kind, at unit costs with ``transfer``."""
    from workbench.simulation.costs import unit_costs
    from workbench.simulation.edges import build_graph

    costs = unit_costs(
        sched, 1.0, 2.0, None, transfer, weight_fetch=0.0, step_ms=0.0, latency_ms=0.0, op_overhead_ms=0.0
    )
    g = build_graph(sched, costs)
    return {(p, g.cons_idx[j]): g.etype[j] for p in range(g.N) for j in range(g.cons_ptr[p], g.cons_ptr[p + 1])}


def test_edge_kinds_name_what_each_edge_carries():
    from workbench.schedules import build
    from workbench.simulation import EdgeKind

    sched = build("pipedream", 3, 4)
    worker = [w for w, ops in enumerate(sched.ops) for _ in ops]
    paid, free = _edge_kinds(sched, 0.5), _edge_kinds(sched, 0.0)
    assert paid.keys() == free.keys()
    for (p, c), kind in paid.items():
        crosses = worker[p] != worker[c]
        assert kind == (EdgeKind.ACT if crosses else EdgeKind.LOCAL)
        assert free[(p, c)] == (EdgeKind.FREE if crosses else EdgeKind.LOCAL)
    # worker 1 computes microbatch 1 of stage 0 with version 1 of worker 0's weights (master family)
    w0 = [Op("F", 0, 0), Op("B", 0, 0), Op("STEP", 0, step=0), Op("STEP", 0, step=1)]
    w1 = [Op("F", 0, 1, version=1, weights_worker=0), Op("B", 0, 1, version=1, weights_worker=0)]
    remote = Schedule("remote", 1, 2, 2, (w0, w1), ((0,),))
    validate(remote)
    kinds = _edge_kinds(remote, 0.0)
    assert {e for e, k in kinds.items() if k == EdgeKind.VERSION} == {(2, 4), (2, 5)}  # STEP 0 -> the reads of v1
    assert {e for e, k in kinds.items() if k == EdgeKind.WGRAD} == {(5, 3)}  # B's gradient -> the owner's STEP 1


def test_comm_rows_are_named_records_and_become_the_comm_lane():
    from workbench.cost.plan import Plan
    from workbench.schedules import build
    from workbench.simulation import CommKind, CommRow
    from workbench.simulation.costs import simulation_costs
    from workbench.simulation.edges import build_graph
    from workbench.simulation.engine import sweep
    from workbench.simulation.options import SimOptions

    sched = build("pipedream", Plan.from_boundaries([0, 1], [2, 1]), 6)
    opts = SimOptions(transfer=0.3, allreduce=0.5)
    costs = simulation_costs(sched, 1.0, 2.0, None, None, topology=None, options=opts)
    rows = sweep(build_graph(sched, costs), costs, opts.overlap_comm).comm_rows
    assert rows and all(type(r) is CommRow for r in rows)
    assert {r.kind for r in rows} == {CommKind.SEND_ACT, CommKind.SEND_GRAD, CommKind.ALLREDUCE}
    sends = [r for r in rows if r.kind != CommKind.ALLREDUCE]
    assert [r.end - r.start for r in sends] == pytest.approx([0.3] * len(sends))
    assert all(r.src == r.worker != r.dst and r.update == -1 for r in sends)
    assert all(r.end - r.start >= 0.5 - 1e-12 and r.microbatch == -1 for r in rows if r.kind == CommKind.ALLREDUCE)
    comm = simulate(sched, **{"transfer": 0.3, "allreduce": 0.5}).timeline.query("lane == 'comm'")
    got = sorted(comm[list(CommRow._fields)].itertuples(index=False, name=None))
    assert got == sorted(tuple(r) for r in rows)
    assert all(type(k) is str for k in comm["kind"])  # the column holds the strings, not enum members

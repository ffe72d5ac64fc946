"""Tests of the calibration helpers and the simulator's fixed costs (latency per message, overhead per
op). Expected values are derived by hand in the comments, never taken from the code's output."""

from __future__ import annotations

import math
import os
import platform

import numpy as np
import pandas as pd
import pytest

from workbench import Profile
from workbench.runtime.calibration.machine import (
    StageProfile,
    fit_link,
    measured_step_ms,
    modeled_step_ms,
    repeat_rounds,
    solve_overhead,
)
from workbench.schedules.core import Op, Schedule, validate
from workbench.simulation import simulate


def two_stage_gpipe(M: int) -> Schedule:
    ops = [
        [Op("F", s, b) for b in range(M)] + [Op("B", s, b) for b in range(M)] + [Op("STEP", s, step=0)]
        for s in range(2)
    ]
    return Schedule("gpipe2", 2, 2, M, ops, ((0,), (1,)), microbatches_per_step=M)


def two_stage_one_microbatch() -> Schedule:
    return Schedule("mp2", 2, 2, 1, [[Op("F", 0, 0), Op("B", 0, 0)], [Op("F", 1, 0), Op("B", 1, 0)]], ((0,), (1,)))


# ---- latency per message ---------------------------------------------------------------------
@pytest.mark.parametrize("lat", [0.5, 3.0])
def test_latency_adds_once_per_transfer_on_the_critical_path(lat):
    """F0 (1) -> act -> F1 (1) -> B1 (2) -> grad -> B0 (2): the critical path crosses the cut twice,
    so the makespan is 1 + 1 + 2 + 2 + 2 * lat, and each comm row lasts exactly lat."""
    sched = two_stage_one_microbatch()
    res = simulate(sched, fwd=1.0, bwd=2.0, latency_ms=lat)
    assert res.makespan == pytest.approx(6.0 + 2 * lat)
    comm = res.timeline[res.timeline["lane"] == "comm"]
    assert sorted(comm["kind"]) == ["send_act", "send_grad"]
    assert (comm["end"] - comm["start"]).to_numpy() == pytest.approx([lat, lat])


def test_latency_adds_to_bandwidth_term():
    """1e6 bytes over 1e9 B/s = 1 ms per transfer, plus 0.25 ms latency, twice: 3 + 4 + 2 * 1.25."""
    prof = Profile(
        pd.DataFrame(
            {
                "name": ["a", "b"],
                "fwd_ms": [1.0, 1.0],
                "bwd_ms": [2.0, 2.0],
                "act_bytes": [1e6, 0.0],
                "param_bytes": [0.0, 0.0],
            }
        ),
        {"name": "toy"},
    )

    class Flat:
        num_workers, levels = 2, [(2, 1e9)]

        def bandwidth_between(self, a, b):
            return math.inf if a == b else 1e9

    res = simulate(two_stage_one_microbatch(), profile=prof, topology=Flat(), latency_ms=0.25)
    assert res.makespan == pytest.approx(6.0 + 2 * 1.25)


def test_latency_in_gpipe_fill_and_drain():
    """GPipe, 2 stages, M microbatches, f = 1, b = 2, latency l < f. By hand: F0's run 0..M; F1.b
    starts when its activation lands, (b + 1) f + l, so F1's end at f + l + M f; B1's run back to
    back (M b); B0.(M-1) starts when the first gradient lands (f + l + M f + b + l) and the later
    gradients arrive every b, so worker 0's B's run back to back: makespan f + M f + b + M b + 2 l."""
    M, lat = 4, 0.5
    res = simulate(two_stage_gpipe(M), fwd=1.0, bwd=2.0, latency_ms=lat)
    expect = (1 + lat + M + 2 + lat) + 2 * M
    assert res.makespan == pytest.approx(expect)
    assert simulate(two_stage_gpipe(M), fwd=1.0, bwd=2.0).makespan == pytest.approx(expect - 2 * lat)


def test_overhead_adds_per_op_and_defaults_keep_behaviour():
    """Per-op overhead o: the chain F0, F1, B1, B0 gets 6 + 4 o. GPipe on 2 stages has makespan
    f + M f + b + M b + step (previous test with l = 0); every op gets o, so f, b, step -> + o."""
    sched = two_stage_one_microbatch()
    assert simulate(sched, fwd=1.0, bwd=2.0, op_overhead_ms=0.5).makespan == pytest.approx(6.0 + 4 * 0.5)
    M, o = 3, 0.25
    g = simulate(two_stage_gpipe(M), fwd=1.0, bwd=2.0, step_ms=1.0, op_overhead_ms=o)
    assert g.makespan == pytest.approx((M + 1) * (1 + o + 2 + o) + 1 + o)
    base = simulate(two_stage_gpipe(M), fwd=1.0, bwd=2.0, step_ms=1.0)
    assert base.makespan == pytest.approx((M + 1) * 3 + 1)


def test_allreduce_gets_ring_latency():
    """2 replicas of one stage: ring all-reduce sends 2 (r - 1) = 2 messages: AR = 2 l (no bytes)."""
    ops = [[Op("F", 0, w), Op("B", 0, w), Op("AR", 0, step=0), Op("STEP", 0, step=0)] for w in range(2)]
    sched = Schedule("dp", 1, 2, 2, ops, ((0, 1),), microbatches_per_step=2)
    assert simulate(sched, fwd=1.0, bwd=2.0, latency_ms=0.75, overlap_comm=False).makespan == pytest.approx(3.0 + 1.5)
    # overlapped with the backward (1..3) that produces the gradients: ends at 1 + max(2, 1.5)
    assert simulate(sched, fwd=1.0, bwd=2.0, latency_ms=0.75).makespan == pytest.approx(3.0)
    assert simulate(sched, fwd=1.0, bwd=2.0, latency_ms=1.5).makespan == pytest.approx(1 + 3.0)


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "1"])
def test_bad_fixed_costs(bad):
    with pytest.raises(ValueError, match="latency_ms"):
        simulate(two_stage_one_microbatch(), latency_ms=bad)
    with pytest.raises(ValueError, match="op_overhead_ms"):
        simulate(two_stage_one_microbatch(), op_overhead_ms=bad)


# ---- link fit ----------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha,beta", [(0.05, 2e9), (0.8, 3e8), (0.0, 1e10)])
def test_fit_link_recovers_latency_and_bandwidth(alpha, beta):
    n = np.array([4, 1 << 10, 1 << 14, 1 << 16, 1 << 20, 1 << 22], dtype=float)
    t = alpha + n / beta * 1e3 + (1e-6 if alpha == 0 else 0.0)  # a tiny floor keeps t > 0 at 4 bytes
    fit = fit_link(n, t)
    assert fit["latency_ms"] == pytest.approx(alpha, abs=2e-6)
    assert fit["bandwidth_bytes_per_s"] == pytest.approx(beta, rel=1e-3)
    assert fit["rel_rmse"] < 1e-2


def test_fit_link_with_noise_stays_close():
    rng = np.random.default_rng(0)
    n = np.repeat(np.array([4, 1 << 12, 1 << 16, 1 << 20, 1 << 22], dtype=float), 20)
    t = (0.1 + n / 1e9 * 1e3) * rng.uniform(0.95, 1.05, size=n.shape)
    fit = fit_link(n, t)
    assert fit["latency_ms"] == pytest.approx(0.1, rel=0.1)
    assert fit["bandwidth_bytes_per_s"] == pytest.approx(1e9, rel=0.1)


def test_fit_link_bad_input():
    with pytest.raises(ValueError, match="two different message sizes"):
        fit_link([8, 8], [1.0, 1.1])
    with pytest.raises(ValueError, match="grow with message size"):
        fit_link([8, 1 << 20], [2.0, 1.0])
    with pytest.raises(ValueError, match="> 0"):
        fit_link([8, 16], [0.0, 1.0])


# ---- overhead solve, repeated rounds, step statistics -----------------------------------------
def test_solve_overhead_inverts_a_monotone_model():
    """predict(o) = 10 + 17 o (17 ops on the critical path): target 18.5 -> o = 0.5."""
    assert solve_overhead(lambda o: 10 + 17 * o, 18.5) == pytest.approx(0.5, abs=1e-3)
    assert solve_overhead(lambda o: 10 + 17 * o, 9.0) == 0.0
    with pytest.raises(ValueError, match="raise hi"):
        solve_overhead(lambda o: 10 + o, 100.0, hi=1.0)


def test_repeat_rounds_is_valid_and_sequential_rounds_add_up():
    """GPipe drains at the end of a round (worker 0 ends with B0.0 then STEP, after worker 1's
    last B), so K rounds take K times one round: spacing of round starts = one round."""
    sched = two_stage_gpipe(4)
    rep = repeat_rounds(sched, 3)
    validate(rep)
    assert rep.microbatches == 12 and len(rep.ops[0]) == 3 * len(sched.ops[0])
    one = simulate(sched, fwd=1.0, bwd=2.0, step_ms=0.5).makespan
    assert simulate(rep, fwd=1.0, bwd=2.0, step_ms=0.5).makespan == pytest.approx(3 * one)


def _stage_profile(f, b, step, cut=0.0):
    prof = Profile(
        pd.DataFrame(
            {"name": ["l0", "l1"], "fwd_ms": f, "bwd_ms": b, "act_bytes": [cut, 0.0], "param_bytes": [0.0, 0.0]}
        ),
        {"name": "toy"},
    )
    return StageProfile(prof, ((0, 0), (1, 1)), tuple(step), 32, 1, tuple(f), tuple(b))


def test_modeled_step_matches_gpipe_closed_form():
    """GPipe on 2 balanced stages (f = 1, b = 2, step 0.5): a round drains, so the spacing of round
    starts is one round, (M + 1)(f + b) + step; with overhead o: (M + 1)(f + b + 2 o) + step + o."""
    sp = _stage_profile([1.0, 1.0], [2.0, 2.0], [0.5, 0.5])
    M, o = 8, 0.1
    sched = two_stage_gpipe(M)
    assert modeled_step_ms(sched, sp) == pytest.approx((M + 1) * 3 + 0.5)
    assert modeled_step_ms(sched, sp, op_overhead_ms=o) == pytest.approx((M + 1) * (3 + 2 * o) + 0.5 + o)
    # layer level equals stage level here (one layer per stage)
    assert modeled_step_ms(sched, sp, level="layer") == pytest.approx((M + 1) * 3 + 0.5)


def test_first_backward_of_an_update_skips_the_accumulation():
    """The runtime's first B of an update writes its gradient into the empty buffer; the others add
    into it (the profile's B) and cost ``a`` more. GPipe: one fresh B per worker per round; the last
    stage's is on the critical path, so the round is (M + 1)(f + b) + step - a. PipeDream updates
    after every microbatch: all its B's are fresh. A stage that all-reduces keeps a flat buffer
    (zeroed, then added into): nothing fresh."""
    import dataclasses

    from workbench.schedules import build

    sp = _stage_profile([1.0, 1.0], [2.0, 2.0], [0.5, 0.5])
    a, M = 0.3, 8
    acc = dataclasses.replace(sp, grad_accumulate_ms=(a, a))
    g = two_stage_gpipe(M)
    assert modeled_step_ms(g, acc) == pytest.approx(modeled_step_ms(g, sp) - a)
    assert modeled_step_ms(g, acc) == pytest.approx((M + 1) * 3 + 0.5 - a)
    flush, pd_ = build("pipedream-flush", 2, M), build("pipedream", 2, M)
    for w in (0, 1):
        bs = [i for i, op in enumerate(flush.ops[w]) if op.kind == "B"]
        assert flush.fresh_backwards(w) == {bs[0]}
        assert pd_.fresh_backwards(w) == {i for i, op in enumerate(pd_.ops[w]) if op.kind == "B"}
    zb = build("zb-h1", 2, M)  # split backward: the first BW of the update is the fresh one
    for w in (0, 1):
        (i,) = zb.fresh_backwards(w)  # exactly one
        assert zb.ops[w][i].kind == "BW" and i == min(j for j, op in enumerate(zb.ops[w]) if op.kind == "BW")
    dp = build("dp-bsp", 1, M, workers=2)
    assert dp.flat_buffers(0) == {0} and dp.fresh_backwards(0) == frozenset()
    # the simulated op durations: pipedream's every B, flush's first B per worker
    res = simulate(pd_, profile=acc.as_profile("stage"), plan=_plan2(), microbatch_fraction=1.0)
    bdur = res.compute[res.compute.kind == "B"].eval("end - start")
    assert np.allclose(bdur, 2.0 - a)


def _plan2():
    from workbench.cost.plan import Plan

    return Plan.from_boundaries([0, 1], [1, 1])


def test_in_flight_of_a_calibration_counts_the_link():
    """calibrate.in_flight = CostModel.in_flight on the measured stages and link: stage 0 needs the
    gradient of its oldest microbatch back within K_0 slots of P = 3 ms (the bottleneck): F0 + B0 +
    2 messages + the last stage's slot: ceil((3 + 2 (L + n / beta) + 3) / 3); without a link NOAM
    (2, 1); L = 0.5 ms, 64 KiB at 1.6 GB/s: ceil(2.35) = 3."""
    from workbench.runtime.calibration.machine import in_flight

    sp = _stage_profile([1.0, 1.0], [2.0, 2.0], [0.0, 0.0], cut=64 << 10)
    assert in_flight(sp, None) == [2, 1]
    assert in_flight(sp, dict(latency_ms=0.5, bandwidth_bytes_per_s=1.6e9, message_cpu_ms=0.0)) == [3, 1]
    assert in_flight(sp, dict(latency_ms=0.5, bandwidth_bytes_per_s=1.6e9), replicas=[1, 1]) == [3, 1]
    # L = 1.4: (6 + 2.88) / 3 = 2.96 -> 3; L = 1.6: (6 + 3.28) / 3 = 3.09 -> 4
    assert in_flight(sp, dict(latency_ms=1.4, bandwidth_bytes_per_s=1.6e9)) == [3, 1]
    assert in_flight(sp, dict(latency_ms=1.6, bandwidth_bytes_per_s=1.6e9)) == [4, 1]
    # a link slower than the stages is the bottleneck, P = L + n / beta = 3.141: ceil((3 + 3P) / P) = 4
    assert in_flight(sp, dict(latency_ms=3.1, bandwidth_bytes_per_s=1.6e9)) == [4, 1]


def test_measured_step_is_the_median_spacing():
    rows = []
    for r, t in enumerate([0.0, 50.0, 60.0, 70.0, 81.0, 90.0]):
        rows.append(dict(worker=0, stage=0, microbatch=r, kind="F", start=t, end=t + 1, round=r))
        rows.append(dict(worker=1, stage=1, microbatch=r, kind="F", start=t + 2, end=t + 3, round=r))
    tl = pd.DataFrame(rows)
    # after skipping 1 round: spacings 10, 10, 11, 9 -> median 10
    assert measured_step_ms(tl, skip=1) == pytest.approx(10.0)


# ---- optimizer steps: in place unless a stashed version is still read ---------------------------
def test_stashing_steps_are_exactly_those_whose_old_version_is_read_later():
    """PipeDream on 2 stages, 8 minibatches: stage 0 holds 2 minibatches in flight, so each of its
    first 7 updates replaces a version a forwarded minibatch still needs for its backward; its last
    update of the round and every update of the last stage (one in flight) may run in place.
    Flushed schedules never stash; the master family (weights fetched by other workers) always
    writes new tensors."""
    from workbench.schedules import build

    pd_ = build("pipedream", 2, 8)
    steps0 = [i for i, op in enumerate(pd_.ops[0]) if op.kind == "STEP"]
    assert sorted(pd_.stashing_steps(0)) == steps0[:7]
    assert pd_.stashing_steps(1) == frozenset()
    for name in ("gpipe", "pipedream-flush", "zb-h1"):
        s = build(name, 2, 8)
        assert all(s.stashing_steps(w) == frozenset() for w in range(2)), name
    f = build("fsdp", 2, 4, workers=2)
    assert all(
        f.stashing_steps(w) == frozenset(i for i, op in enumerate(f.ops[w]) if op.kind == "STEP") for w in range(2)
    )


def test_simulator_charges_the_copying_step_only_where_a_version_is_stashed():
    from workbench.schedules import build

    sched = build("pipedream", 2, 8)
    res = simulate(sched, fwd=1.0, bwd=2.0, step_ms=0.5, step_copy_ms=1.25)
    steps = res.compute[res.compute.kind == "STEP"]
    dur = (steps.end - steps.start).round(9)
    assert sorted(dur[steps.worker == 0]) == [0.5] + [1.25] * 7
    assert list(dur[steps.worker == 1]) == [0.5] * 8
    same = simulate(sched, fwd=1.0, bwd=2.0, step_ms=0.5)  # default: every step costs step_ms
    assert set((same.compute.end - same.compute.start)[same.compute.kind == "STEP"].round(9)) == {0.5}


@pytest.mark.slow
def test_sgd_update_in_place_and_into_new_tensors():
    import torch

    from workbench.runtime.semantics.stages import sgd_update

    w = {"a": torch.tensor([1.0, 2.0], requires_grad=True)}
    d = {"a": torch.tensor([2.0, -2.0])}
    new = sgd_update(w, d, 0.5, in_place=False)
    assert torch.equal(new["a"].detach(), torch.tensor([0.0, 3.0])) and new["a"].requires_grad
    assert torch.equal(w["a"].detach(), torch.tensor([1.0, 2.0]))  # the stashed version is untouched
    same = sgd_update(w, d, 0.5, in_place=True)
    assert same["a"] is w["a"] and torch.equal(w["a"].detach(), torch.tensor([0.0, 3.0]))


@pytest.mark.slow
def test_measure_allreduce_expresses_gloo_in_the_ring_model():
    """Two gloo processes: the times grow with the size, and the ring parameters it reports
    (bus bandwidth, per-step latency) give back, through the ring formula (r = 2:
    t = n / B_bus + 2 α), exactly the straight line fitted to its measured times."""
    from workbench.cost.model import ring_allreduce_ms
    from workbench.runtime.calibration.machine import fit_link, measure_allreduce

    m = measure_allreduce("gloo", sizes=(4, 256 << 10, 8 << 20), repeats=5, warmup=2, timeout_s=120)
    assert m["world_size"] == 2 and m["bandwidth_bytes_per_s"] > 0
    assert m["ms"][-1] > m["ms"][0] > 0  # 8 MiB take longer than 4 bytes
    line = fit_link(m["sizes"], m["ms"], relative=False)
    for n in m["sizes"]:
        want = line["latency_ms"] + n / line["bandwidth_bytes_per_s"] * 1e3
        assert ring_allreduce_ms(n, 2, m["bandwidth_bytes_per_s"], m["latency_ms"]) == pytest.approx(want, rel=1e-9)
    with pytest.raises(ValueError, match="world_size"):
        measure_allreduce(world_size=1)


def test_pin_rank_gives_each_rank_its_own_cores(monkeypatch):
    import os

    from workbench.runtime.launch.affinity import pin_rank

    cpus = sorted(os.sched_getaffinity(0))
    calls = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, s: calls.append(sorted(s)))
    n = len(cpus)
    assert pin_rank(n - 1, n, 1) == [cpus[-1]] and calls[-1] == [cpus[-1]]
    assert pin_rank(0, n + 1, 1) is None  # more ranks than cores: the scheduler balances them
    assert pin_rank(0, 1, n + 1) is None  # more threads than cores
    assert pin_rank(0, 1, 1, "cuda") is None
    monkeypatch.setenv("WORKBENCH_PIN", "0")
    assert pin_rank(0, 1, 1) is None
    assert len(calls) == 1


@pytest.mark.slow
def test_loaded_link_reports_message_cpu_time():
    from workbench.runtime.calibration.machine import measure_link

    m = measure_link("gloo", sizes=(4, 16 << 20), repeats=10, warmup=2, busy=True, timeout_s=120)
    assert m["busy"] and len(m["cpu_ms_per_message"]) == 2 and m["message_cpu_ms"] >= 0
    assert all(t > 0 for t in m["one_way_ms"])


@pytest.mark.slow
@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="the shm transport needs x86-64")
def test_link_through_the_shared_memory_transport():
    """measure_link(transport="shm") times the runtime's shm channels: a 16 MiB message takes longer
    than 4 bytes, the result says which transport, and the channel files are gone afterwards."""
    from workbench.runtime.calibration.machine import measure_link
    from workbench.runtime.transport import shm

    m = measure_link("gloo", sizes=(4, 16 << 20), repeats=10, warmup=2, timeout_s=120, transport="shm")
    assert m["transport"] == "shm" and m["one_way_ms"][1] > m["one_way_ms"][0] > 0
    # this process's channel files only (the token names the launcher's pid): other jobs may run meanwhile
    assert not list(shm.SHM_DIR.glob(f"workbench-{shm.pid_namespace()}.{os.getpid()}.*"))
    with pytest.raises(ValueError, match="transport must be"):
        measure_link("gloo", transport="tcp")


@pytest.mark.slow
def test_stage_profile_measures_every_column():
    """A real (small) stage profile: one value per stage for every measured column, finite and
    >= 0, carried into the stage-level profile the simulator reads."""
    from workbench.models import build
    from workbench.runtime.calibration.machine import stage_profile
    from workbench.schedules import build as build_schedule

    sp = stage_profile(
        build("mlp", seed=0, depth=4, width=64, in_features=64), [(0, 1), (2, 3)], 8, iterations=3, warmup=1
    )
    for col in ("fwd_ms", "bwd_ms", "step_ms", "step_copy_ms", "bwd_input_ms", "bwd_weight_ms", "grad_accumulate_ms"):
        vals = getattr(sp, col)
        assert len(vals) == 2 and all(math.isfinite(v) and v >= 0 for v in vals), col
    assert all(f > 0 and b > 0 for f, b in zip(sp.fwd_ms, sp.bwd_ms))
    df = sp.as_profile("stage").layers
    assert list(df.grad_accumulate_ms) == list(sp.grad_accumulate_ms)
    assert modeled_step_ms(build_schedule("pipedream", 2, 4), sp) > 0


def test_on_ranks_takes_each_stage_from_its_rank_and_a_replicated_stage_at_its_slowest():
    """Two cores profiled the same 2 stages; core 1 is slower. Stage s on rank s: stage 0 from core
    0, stage 1 from core 1 (the mean would put the bottleneck stage 1.5 ms below what its rank runs);
    a stage on both ranks (data parallel): the slower core, as its synchronous step waits for it."""
    from workbench.runtime.calibration.machine import on_ranks

    fast = _stage_profile([1.0, 2.0], [2.0, 4.0], [0.5, 0.5])
    slow = _stage_profile([1.5, 3.0], [3.0, 6.0], [0.75, 0.75])
    sp = on_ranks([fast, slow], [[0], [1]])
    assert sp.fwd_ms == (1.0, 3.0) and sp.bwd_ms == (2.0, 6.0) and sp.step_ms == (0.5, 0.75)
    assert sp.meta["stage_ranks"] == [[0], [1]]
    M = 8
    # stage 1 bound: stage 0's first F, M (f1 + b1), stage 0's last B and its step
    assert modeled_step_ms(two_stage_gpipe(M), sp) == pytest.approx(1 + M * 9 + 2 + 0.5)
    both = on_ranks([slow, fast], [[0, 1], [1]])
    assert both.fwd_ms == (1.5, 2.0) and both.bwd_ms == (3.0, 4.0)
    with pytest.raises(ValueError, match="names 1 stages"):
        on_ranks([fast, slow], [[0]])
    with pytest.raises(ValueError, match="stage 1"):
        on_ranks([fast, slow], [[0], [2]])


def test_runtime_link_takes_the_idle_transit_and_the_loaded_cpu_per_message():
    from workbench.runtime.calibration.machine import runtime_link

    idle = dict(latency_ms=0.03, bandwidth_bytes_per_s=5e9, busy=False)
    loaded = dict(latency_ms=0.87, bandwidth_bytes_per_s=1.3e9, busy=True, message_cpu_ms=0.22)
    r = runtime_link(idle, loaded)
    assert (r["latency_ms"], r["bandwidth_bytes_per_s"], r["message_cpu_ms"]) == (0.03, 5e9, 0.22)
    assert (r["loaded_latency_ms"], r["loaded_bandwidth_bytes_per_s"]) == (0.87, 1.3e9)
    # a message on the critical path: 1F1B on 2 stages, 64 KiB activations; the loaded transit costs
    # every one of them the 0.84 ms more, the runtime link none of it
    sp = _stage_profile([1.0, 1.0], [2.0, 2.0], [0.5, 0.5], cut=65536.0)
    sched = two_stage_gpipe(8)
    assert modeled_step_ms(sched, sp, r) < modeled_step_ms(sched, sp, loaded)
    with pytest.raises(ValueError, match="idle first"):
        runtime_link(loaded, idle)


def test_stage_timing_runs_the_ops_in_1f1b_order(monkeypatch):
    """The profile times a stage's forwards and backwards in the 1F1B steady state's order (F0 F1
    B0 F2 B1 F3 B2 B3: a forward mostly right after a backward, as the runtime's 1F1B ranks run it),
    then the update's STEP right after its last backward, then the split half (forwards, then BI/BW
    per microbatch); F's figure holds only the 1F1B forwards, and the STEPs alternate in place / into
    new tensors. Checked on the call sequence of the runtime's stage functions it times."""
    import torch

    import workbench.runtime.semantics.stages as stages
    from workbench.runtime.calibration.machine import time_stage

    calls = []
    for name in ("run_stage", "run_stage_layers", "vjp", "split_input_grad", "split_weight_grad", "sgd_update"):
        real = getattr(stages, name)

        def spy(*a, _real=real, _name=name, **k):
            calls.append((_name, k.get("in_place", a[3] if _name == "sgd_update" and len(a) > 3 else None)))
            return _real(*a, **k)

        monkeypatch.setattr(stages, name, spy)
    layers = [torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 8)]
    before = [p.detach().clone() for p in layers[0].parameters()]
    f, b, bi, bw, acc, step, step_copy = time_stage(
        layers, torch.randn(4, 8), first=False, iterations=2, warmup=0, microbatches=4
    )
    short = {
        "run_stage": "F",
        "run_stage_layers": "Fs",
        "vjp": "B",
        "split_input_grad": "BI",
        "split_weight_grad": "BW",
        "sgd_update": "STEP",
    }
    one = ["F", "F", "B", "F", "B", "F", "B", "B", "STEP"] + ["Fs"] * 4 + ["BI", "BW"] * 4
    assert [short[c] for c, _ in calls] == one * 2
    assert [flag for c, flag in calls if c == "sgd_update"] == [True, False]
    assert min(f, b, bi, bw, step, step_copy) > 0 and acc >= 0
    # the timed steps leave the layers' own parameters alone (the profile works on copies)
    assert all(torch.equal(p, q) for p, q in zip(before, layers[0].parameters()))

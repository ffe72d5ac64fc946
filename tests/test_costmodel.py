"""The one cost model: closed forms by hand, the plan's prediction against the simulator on the
shipped PipeDream GPU profiles (the sweep), refinement, and bad input."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from workbench.cost.model import CostModel, ring_allreduce_ms
from workbench.cost.plan import Plan, Stage
from workbench.cost.topology import Topology
from workbench.partitioning.pricing import data_parallel_ms, with_predictions
from workbench.partitioning.search import partition
from workbench.profiling.measure import Profile
from workbench.profiling.pipedream import shipped
from workbench.schedules import build, noam_warmup
from workbench.simulation import simulate, simulate_plan


def make_profile(fwd, bwd, act, par, **meta):
    n = len(fwd)
    return Profile.from_frame(
        pd.DataFrame(dict(name=[f"l{i}" for i in range(n)], fwd_ms=fwd, bwd_ms=bwd, act_bytes=act, param_bytes=par)),
        **meta,
    )


# ---- closed forms by hand ------------------------------------------------------------------
def test_message_cut_and_allreduce_by_hand():
    """Two levels: 4 GPUs at 10 GB/s (α 0.1 ms), 2 servers at 1 GB/s (α 2 ms)."""
    p = make_profile([1, 2], [2, 4], [1e9, 5e8], [1e9, 0])
    topo = Topology(((4, 10e9), (2, 1e9)))
    cm = CostModel.from_profile(p, topo, latency_ms=[0.1, 2.0])
    assert cm.message_ms(1e9, 0, 1) == pytest.approx(0.1 + 100.0)  # α_1 + 1e9 / 10e9 s
    assert cm.message_ms(1e9, 0, 4) == pytest.approx(2.0 + 1000.0)  # across servers
    assert cm.message_ms(1e9, 3, 3) == 0.0
    # ring over workers 0, 1, 4, 5: slowest link 1 GB/s and α 2 ms: 2*3/4*1e9/1e9 s + 2*3*2 ms
    assert cm.allreduce_ms(1e9, (0, 1, 4, 5)) == pytest.approx(1500.0 + 12.0)
    assert ring_allreduce_ms(1e9, 1, 1e9, 2.0) == 0.0
    # cut after layer 0 from 2 replicas {0, 4} to 1 worker {1}: lcm 2; link 0->1 (100.1 ms) and
    # 4->1 (1002 ms) each carry every second minibatch: worst / 2
    assert cm.cut_ms(0, (0, 4), (1,)) == pytest.approx((2.0 + 1000.0) / 2)
    # stage 0 on {0, 1} (one server): F 1, B 2, AR = 2*1/2*1e9/10e9 s + 2*0.1 = 100.2 ms;
    # exposed max(0, 100.2 - 2): round = 1 + 2 + 98.2, per minibatch / 2
    assert cm.stage_ms(0, 0, (0, 1)) == pytest.approx((1 + 2 + 98.2) / 2)
    no_overlap = CostModel.from_profile(p, topo, latency_ms=[0.1, 2.0], overlap_allreduce=False)
    assert no_overlap.stage_ms(0, 0, (0, 1)) == pytest.approx((1 + 2 + 100.2) / 2)


def test_in_flight_is_noam_without_communication_and_grows_with_slow_cuts():
    """Four balanced stages, free links: K_s = S - s (PipeDream's NOAM). A slow cut after stage
    1 (message 25 ms, P = 10): stages 0 and 1 must cover F + B + 2 * 25 + lag downstream."""
    p = make_profile([4] * 4, [6] * 4, [0, 0, 0, 0], [0] * 4)
    plan = Plan.from_boundaries([0, 1, 2, 3])
    free = CostModel.from_profile(p, Topology.flat(4, 1e9))
    assert free.predicted_ms(plan) == pytest.approx(10.0)
    assert free.in_flight(plan) == [4, 3, 2, 1]
    slow = make_profile([4] * 4, [6] * 4, [0, 2.5e7, 0, 0], [0] * 4)
    cm = CostModel.from_profile(slow, Topology.flat(4, 1e9))
    assert cm.predicted_ms(plan) == pytest.approx(25.0)  # the cut is the bottleneck: 2.5e7 / 1e9 s
    # P = 25: K_3 = 1 (T_3 = 25), K_2 = max(2, ceil((10 + 25) / 25)) = 2 (T = 50),
    # K_1 = max(3, ceil((10 + 2 * 25 + 50) / 25)) = 5 (T = 125), K_0 = max(4, ceil((10 + 125) / 25)) = 6
    assert cm.in_flight(plan) == [6, 5, 2, 1]
    assert cm.stage_memory_bytes(plan, [6, 5, 2, 1])[1] == pytest.approx(5 * 2.5e7)


def test_dp_estimate_equals_prediction_on_one_level():
    p = shipped("alexnet")
    plan = partition(p, Topology.flat(8, 12e9), refine=False)
    assert plan.predicted_ms == pytest.approx(plan.bottleneck_ms, rel=1e-9)


# ---- the sweep: plan prediction vs simulated steady state -----------------------------------
TOPOLOGIES = {
    "flat4": Topology.flat(4, 12e9),
    "flat8": Topology.flat(8, 12e9),
    "4x4": Topology(((4, 12e9), (4, 1.25e9))),  # PCIe in a server, 10 Gbps between servers
    "8x2": Topology(((8, 25e9), (2, 25e9 / 8))),  # NVLink in a server, 25 Gbps between
    # replicated stages spanning servers: PipeDream's Cluster-A (4 V100 per server, 10 Gbps between)
    # on 2 and 4 servers, and 8-GPU NVLink servers on 2 servers
    "clusterA-8": Topology.preset("4xV100-pcie-10g", servers=2),
    "clusterA-16": Topology.preset("4xV100-pcie-10g", servers=4),
    "nvlink-8x2": Topology.preset("8xV100-nvlink-25g", servers=2),
}
DP_TOPOLOGIES = ["flat4", "flat8", "4x4", "8x2", "clusterA-8", "clusterA-16", "nvlink-8x2"]


def one_stage_plan(prof, workers):
    """All layers on one stage replicated on ``workers`` (the data-parallel layout)."""
    n = len(prof.layers)
    return Plan(
        (Stage(0, n - 1, workers, tuple(range(workers)), 0.0),),
        bottleneck_ms=0.0,
        single_worker_ms=0.0,
        data_parallel_ms=0.0,
        method="data-parallel",
        meta={},
    )


@pytest.mark.parametrize("topo", DP_TOPOLOGIES)
@pytest.mark.parametrize("model", ["vgg16", "resnet50", "alexnet"])
def test_data_parallel_ms_equals_simulated_dp_bsp(model, topo):
    """``data_parallel_ms`` (the planner's BSP figure and its all-replicated DP candidate) is the
    simulated ``dp-bsp`` steady state per minibatch within 5%, on flat and two-level topologies:
    one ring all-reduce per round over all replicas at the slowest link the ring crosses."""
    prof, top = shipped(model), TOPOLOGIES[topo]
    W = top.num_workers
    one = one_stage_plan(prof, W)
    res = simulate(build("dp-bsp", one, 6 * W), profile=prof, plan=one, topology=top)
    assert res.metrics["steady_state"]
    dp = data_parallel_ms(prof, top)
    ratio = res.time_per_minibatch_ms / dp
    assert abs(ratio - 1) <= 0.05, (
        f"{model} {topo}: simulated dp-bsp {res.time_per_minibatch_ms:.2f} ms, data_parallel_ms {dp:.2f}"
    )
    plan = partition(prof, top, refine=False)
    assert plan.data_parallel_ms == pytest.approx(dp)
    assert plan.bottleneck_ms <= dp * (1 + 1e-9)  # the all-replicated plan is one of the DP's candidates


@pytest.mark.parametrize("straight", [True, False], ids=["straight", "replicated"])
@pytest.mark.parametrize("topo", list(TOPOLOGIES))
@pytest.mark.parametrize("model", ["vgg16", "resnet50", "alexnet"])
def test_simulated_steady_state_within_5_percent_of_the_plan(model, topo, straight):
    """PipeDream 1F1B with the plan's own warm-up (``in_flight``), enough minibatches for a steady
    state: the simulator's time per minibatch is within 5% of the cost model's closed form."""
    prof = shipped(model)
    plan = partition(prof, TOPOLOGIES[topo], straight=straight, refine=False)
    res = simulate_plan(plan, prof, microbatches=max(64, 4 * plan.in_flight_count * plan.stages[0].replicas))
    assert res.metrics["steady_state"]
    ratio = res.time_per_minibatch_ms / plan.predicted_ms
    assert abs(ratio - 1) <= 0.05, (
        f"{model} {topo} straight={straight}: simulated/predicted = {ratio:.3f}\n{plan.describe()}"
    )


def test_refinement_keeps_a_plan_that_agrees_and_reports_both_figures(tmp_path):
    prof = shipped("resnet50")
    topo = TOPOLOGIES["flat4"]
    plan = partition(prof, topo, straight=True)
    assert math.isfinite(plan.simulated_ms) and plan.simulated_ms == pytest.approx(plan.predicted_ms, rel=0.05)
    assert plan.in_flight_count > plan.noam  # big ResNet activations: NOAM alone stalls the pipeline
    d = Plan.load(plan.save(tmp_path / "plan.json")).to_dict()
    assert d["simulated_ms"] == pytest.approx(plan.simulated_ms) and d["predicted_ms"] == pytest.approx(
        plan.predicted_ms
    )
    assert d["in_flight"] == list(plan.in_flight)
    text = plan.describe()
    assert "predicted" in text and "simulated" in text and "why:" in text
    assert "\n" not in repr(plan) and "ms/minibatch" in repr(plan)
    assert "simulated" in plan._repr_html_()


def test_refinement_respects_the_memory_limit():
    """The communication-aware warm-up holds more minibatches; a limit between the two memory
    figures makes refinement keep NOAM's."""
    prof = shipped("resnet50")
    topo = TOPOLOGIES["flat4"]
    free = partition(prof, topo, straight=True, refine=False)
    noam = with_predictions(
        free, CostModel.from_profile(prof, topo), noam_warmup(tuple(s.workers for s in free.stages))
    )
    limit = (max(noam.stage_memory_bytes) + max(free.stage_memory_bytes)) / 2
    assert max(noam.stage_memory_bytes) < limit < max(free.stage_memory_bytes)
    plan = partition(prof, topo, straight=True, memory_bytes=limit)
    assert max(plan.stage_memory_bytes) <= limit and plan.in_flight == noam.in_flight
    assert plan.simulated_ms > free.predicted_ms  # the stall the bigger warm-up would have removed


def test_throughput_units_gpipe_and_pipedream_agree_per_minibatch():
    """Issue 11: one profile, compute-only. GPipe with 4 microbatches per minibatch over 8 steps
    and PipeDream on the same 2 stages: times per *minibatch* are comparable (GPipe's flush adds
    its bubble (S-1)/M), samples/s use the profile's batch size."""
    p = make_profile([1.0, 1.0], [2.0, 2.0], [0, 0], [0, 0], batch_size=32)
    plan = Plan.from_boundaries([0, 1])
    pd_ = simulate(build("pipedream", plan, 64), profile=p, plan=plan)
    assert pd_.time_per_minibatch_ms == pytest.approx(3.0)
    assert pd_.throughput_samples_per_s == pytest.approx(32 * 1e3 / 3.0)
    gp = simulate(build("gpipe", plan, 4, steps=8), profile=p, plan=plan)
    # per step: (M + S - 1) * (f + b) / M per microbatch-op = 5 * 0.75 = 3.75 ms for one minibatch
    assert gp.time_per_minibatch_ms == pytest.approx(3.75)
    assert "\n" not in repr(gp) and len(gp._repr_html_()) < 4000


# ---- bad input -----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw, match",
    [
        (dict(transfer=float("nan")), "transfer must be a finite number >= 0"),
        (dict(transfer=float("inf")), "transfer must be a finite number >= 0"),
        (dict(transfer=-1.0), "transfer must be a finite number >= 0"),
        (dict(weight_fetch=-1), "weight_fetch must be a finite number >= 0"),
        (dict(fwd=-1.0), "fwd must be a finite number >= 0"),
        (dict(bwd=float("nan")), "bwd must be a finite number >= 0"),
        (dict(allreduce=float("inf")), "allreduce must be a finite number >= 0"),
        (dict(latency_ms=-0.1), "latency_ms must be a finite number >= 0"),
        (dict(op_overhead_ms=float("nan")), "op_overhead_ms must be a finite number >= 0"),
    ],
)
def test_bad_costs_give_one_clear_line(kw, match):
    with pytest.raises(ValueError, match=match) as e:
        simulate(build("gpipe", 2, 2), **kw)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "levels, match",
    [
        (((2, 0.0),), "bandwidth must be > 0"),
        (((2, -1e9),), "bandwidth must be > 0"),
        (((2, float("nan")),), "bandwidth must be > 0"),
    ],
)
def test_bad_bandwidths(levels, match):
    with pytest.raises(ValueError, match=match):
        Topology(levels)


def test_bad_cost_model_inputs():
    p = make_profile([1.0], [1.0], [0.0], [0.0])
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="latency_ms must be a finite number >= 0"):
            CostModel.from_profile(p, Topology.flat(2, 1e9), latency_ms=bad)
        with pytest.raises(ValueError, match="op_overhead_ms must be a finite number >= 0"):
            partition(p, Topology.flat(1, 1e9), op_overhead_ms=bad)
    with pytest.raises(ValueError, match="latency_ms has 1 values for 2 topology levels"):
        CostModel.from_profile(p, Topology(((2, 1e9), (2, 1e8))), latency_ms=[0.1])
    with pytest.raises(ValueError, match="'fwd_ms' must be finite and >= 0"):
        CostModel(np.array([-1.0]), np.zeros(1), np.zeros(1), np.zeros(1))


# ---- the CLI shows both figures and uses the plan's topology --------------------------------
@pytest.mark.slow
def test_cli_partition_and_simulate_use_one_topology(tmp_path, capsys):
    from workbench.cli.commands import main

    prof = tmp_path / "p.csv"
    prof.write_text("name,fwd_ms,bwd_ms,act_bytes,param_bytes\n" + "".join(f"l{i},1,2,2e7,1e3\n" for i in range(8)))
    plan = tmp_path / "plan.json"
    args = ["partition", "--profile", str(prof), "--topology", "2x1e9,2x1e8", "--straight", "--out", str(plan)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "DP estimate" in out and "predicted" in out and "simulated" in out and "why:" in out
    assert main(args) == 0 and (tmp_path / "plan-2.json").exists()  # the first plan is kept
    assert (
        main(
            [
                "simulate",
                "--profile",
                str(prof),
                "--plan",
                str(plan),
                "--microbatches",
                "64",
                "--out",
                str(tmp_path / "sim"),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "topology (the plan's): 4 workers" in out and "predicted" in out
    predicted = Plan.load(plan).predicted_ms
    simulated = float(out.split("vs simulated ")[1].split(" ")[0])
    assert simulated == pytest.approx(predicted, rel=0.05)


def test_cli_bad_latency_is_one_line_exit_2(tmp_path, capsys):
    from workbench.cli.commands import main

    prof = tmp_path / "p.csv"
    prof.write_text("name,fwd_ms,bwd_ms,act_bytes,param_bytes\nl0,1,2,0,0\nl1,1,2,0,0\n")
    assert main(["partition", "--profile", str(prof), "--workers", "2", "--latency-ms", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "latency_ms must be a finite number >= 0" in err


# ---- refinement over the dynamic program's candidates -----------------------------------------
@pytest.mark.parametrize("model,topo", [("vgg16", "clusterA-16"), ("alexnet", "4x4"), ("resnet50", "flat8")])
def test_refinement_simulates_the_dp_candidates_and_keeps_the_fastest(model, topo):
    """partition() lists the DP's candidates (all-replicated and the best split per replica count
    of the last top-level stage): the DP optimum is the smallest DP estimate among them, it is
    simulated, and the kept plan is the fastest simulated candidate (no worse than the optimum's)."""
    from workbench.partitioning.search import refine_plan

    prof, top = shipped(model), TOPOLOGIES[topo]
    plan = partition(prof, top)
    rows = plan.meta["candidates"]
    assert len(rows) >= 2
    dp_only = partition(prof, top, refine=False)
    assert min(r["dp_estimate_ms"] for r in rows) == pytest.approx(dp_only.bottleneck_ms)
    simulated = [r["simulated_ms"] for r in rows if r["simulated_ms"] is not None]
    assert plan.simulated_ms == pytest.approx(min(simulated), rel=0.005)
    cm = CostModel.from_profile(prof, top)
    assert plan.simulated_ms <= refine_plan(dp_only, prof, top, cm).simulated_ms * 1.005
    # a candidate left unsimulated is predicted no faster than the kept plan's simulated figure
    assert all(r["predicted_ms"] >= plan.simulated_ms * 0.995 for r in rows if r["simulated_ms"] is None)
    # one figure shown twice is the same number: the kept plan's row
    kept = [
        r
        for r in rows
        if r["last_layers"] == [s.last for s in plan.stages]
        and r["replicas"] == "-".join(str(s.replicas) for s in plan.stages)
    ]
    assert kept and kept[0]["simulated_ms"] == plan.simulated_ms and kept[0]["predicted_ms"] == plan.predicted_ms


def test_refinement_under_a_memory_limit_simulates_rather_than_trusts_the_prediction():
    """VGG-16 on 8 flat workers within 15 GB per worker: a 1-7 candidate has the best closed-form
    prediction (89 ms; the DP, which charges its cut to one link, rates it 137 ms) but needs more
    minibatches in flight than fit, and at the warm-up that fits it simulates at about 124 ms;
    refinement simulates it and keeps the faster DP optimum (4-4, 109 ms), within the limit."""
    prof, top = shipped("vgg16"), TOPOLOGIES["flat8"]
    dp_only = partition(prof, top, memory_bytes=15e9, refine=False)
    plan = partition(prof, top, memory_bytes=15e9)
    rows = plan.meta["candidates"]
    first = rows[0]  # ranked by prediction
    assert first["predicted_ms"] < dp_only.predicted_ms * 0.9
    assert first["simulated_ms"] > dp_only.predicted_ms  # simulated: slower than the DP optimum
    assert [s.last for s in plan.stages] == [s.last for s in dp_only.stages]
    assert [s.replicas for s in plan.stages] == [s.replicas for s in dp_only.stages]
    assert plan.simulated_ms < first["simulated_ms"] * 0.95
    assert max(plan.stage_memory_bytes) <= 15e9


def test_calibrated_allreduce_replaces_the_links_in_every_ring():
    """A library's all-reduce measured on its own (bus bandwidth 1 GB/s, 0.5 ms per ring step)
    replaces the links (10 / 1 GB/s, α 0.1 / 2 ms) in the ring formula, flat and across servers."""
    p = make_profile([1, 2], [2, 4], [1e9, 5e8], [1e9, 0])
    topo = Topology(((4, 10e9), (2, 1e9)))
    cm = CostModel.from_profile(
        p, topo, latency_ms=[0.1, 2.0], allreduce_bandwidth=[1e9, 0.5e9], allreduce_latency_ms=[0.5, 3.0]
    )
    # inside a server, 2 replicas: 2*1/2*1e9/1e9 s + 2*1*0.5 ms
    assert cm.allreduce_ms(1e9, (0, 1)) == pytest.approx(1000.0 + 1.0)
    # across servers (0, 1, 4, 5): slowest calibrated step 0.5 GB/s, 3 ms: 2*3/4*1e9/0.5e9 s + 2*3*3 ms
    assert cm.allreduce_ms(1e9, (0, 1, 4, 5)) == pytest.approx(3000.0 + 18.0)
    # the outer-level ring of the partitioner's DP reads the same calibration
    assert cm.outer_allreduce_ms(1e9, 2, 2, inner_workers=2) == pytest.approx(3000.0 + 18.0)
    # messages still use the links
    assert cm.message_ms(1e9, 0, 1) == pytest.approx(0.1 + 100.0)
    # and the simulator charges it: dp-bsp on 2 workers of one server
    res = simulate(
        build("dp-bsp", 1, 2, workers=2),
        profile=make_profile([1], [2], [0], [1e9]),
        topology=Topology(((2, 10e9),)),
        allreduce_bandwidth=1e9,
        allreduce_latency_ms=0.5,
    )
    ar = res.timeline[res.timeline.kind == "allreduce"]
    assert (ar.end - ar.start).max() == pytest.approx(1000.0 + 1.0)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), "fast"])
def test_bad_allreduce_bandwidth_is_one_clear_error(bad):
    with pytest.raises(ValueError, match="allreduce_bandwidth"):
        CostModel.from_profile(make_profile([1], [2], [0], [1]), Topology(((2, 1e9),)), allreduce_bandwidth=bad)


def test_message_cpu_time_is_charged_alike_by_the_plan_and_the_simulator():
    """LogP's overhead o (message_cpu_ms = 0.25): each activation/gradient message takes 0.25 ms
    of CPU at the sending and at the receiving worker. Two stages F = 1, B = 2: each stage handles 2
    messages per minibatch and 1F1B leaves no idle time to hide them in, so the closed form is
    1 + 2 + 2 * 0.25 = 3.5 ms per minibatch, and the simulated steady state is the same."""
    p = make_profile([1, 1], [2, 2], [1e3, 0], [0, 0])
    topo = Topology.flat(2, 1e12)
    plan = Plan.from_boundaries([0, 1], [1, 1])
    cm = CostModel.from_profile(p, topo, message_cpu_ms=0.25)
    assert cm.predicted_ms(plan) == pytest.approx(3.5, rel=1e-6)
    res = simulate(build("pipedream", plan, 32), profile=p, plan=plan, topology=topo, message_cpu_ms=0.25)
    assert res.time_per_minibatch_ms == pytest.approx(3.5, rel=1e-3)
    with pytest.raises(ValueError, match="message_cpu_ms"):
        CostModel.from_profile(p, topo, message_cpu_ms=-1.0)


def test_measured_split_backward_replaces_the_halves():
    """A profile with bwd_input_ms / bwd_weight_ms (the first stage needs no input gradient) gives
    BI and BW their measured times; without the columns each is half of bwd_ms."""
    df = pd.DataFrame(
        dict(
            name=["a", "b"],
            fwd_ms=[1.0, 1.0],
            bwd_ms=[2.0, 2.0],
            act_bytes=[0.0, 0.0],
            param_bytes=[0.0, 0.0],
            bwd_input_ms=[0.1, 1.0],
            bwd_weight_ms=[2.0, 1.5],
        )
    )
    sched = build("zb-h1", 2, 4)
    res = simulate(sched, profile=Profile(df, {"name": "split"}), microbatch_fraction=1.0)
    dur = (res.compute.end - res.compute.start).round(9)
    by = {(k, s): set(dur[(res.compute.kind == k) & (res.compute.stage == s)]) for k in ("BI", "BW") for s in (0, 1)}
    assert by == {("BI", 0): {0.1}, ("BI", 1): {1.0}, ("BW", 0): {2.0}, ("BW", 1): {1.5}}
    plain = simulate(
        sched,
        profile=Profile(df.drop(columns=["bwd_input_ms", "bwd_weight_ms"]), {"name": "p"}),
        microbatch_fraction=1.0,
    )
    assert set((plain.compute.end - plain.compute.start)[plain.compute.kind.isin(["BI", "BW"])].round(9)) == {1.0}


def test_message_cpu_time_runs_in_idle_time_first():
    """Model parallelism, 2 stages, one minibatch, F = 1, B = 2, free links, 0.25 ms of CPU per
    message end. By hand: worker 0's F ends at 1 and sends (its 0.25 runs in its idle time until its
    B); worker 1 receives at 1 and must do its 0.25 before computing: F on [1, 2.25], B on
    [2.25, 4.25], sends; worker 0 receives at 4.25: B on [4.25, 6.5]. Makespan 6.5 (6 without the
    CPU time; 7 if every message stretched both its ops)."""
    p = make_profile([1, 1], [2, 2], [1e3, 0], [0, 0])
    plan = Plan.from_boundaries([0, 1], [1, 1])
    res = simulate(
        build("model-parallel", 2, 1),
        profile=p,
        plan=plan,
        topology=Topology.flat(2, 1e18),
        message_cpu_ms=0.25,
        microbatch_fraction=1.0,
    )
    c = res.compute.set_index(["worker", "kind"])
    assert (c.loc[(0, "F")].start, c.loc[(0, "F")].end) == pytest.approx((0.0, 1.0))
    assert (c.loc[(1, "F")].start, c.loc[(1, "F")].end) == pytest.approx((1.0, 2.25))
    assert (c.loc[(1, "B")].start, c.loc[(1, "B")].end) == pytest.approx((2.25, 4.25))
    assert (c.loc[(0, "B")].start, c.loc[(0, "B")].end) == pytest.approx((4.25, 6.5))
    assert res.makespan == pytest.approx(6.5)


def test_measured_allreduce_curve_and_ddp_buckets():
    """A measured all-reduce curve (2 replicas: 1 MiB 3 ms, 8 MiB 7 ms, 16 MiB 12 ms) is
    interpolated; DDP's buckets (1 MiB first, then 25 MiB) turn 9 MiB of gradients into two
    all-reduces: 1 MiB (3 ms) + 8 MiB (7 ms) = 10 ms, where one all-reduce of 9 MiB costs 7.625 ms.
    Other replica counts use the ring formula."""
    mib = 2**20
    curve = dict(sizes=[4, mib, 8 * mib, 16 * mib], ms=[0.1, 3.0, 7.0, 12.0], world_size=2)
    p = make_profile([1], [2], [0], [9 * mib])
    topo = Topology.flat(4, 1e9)
    one = CostModel.from_profile(p, topo, allreduce_curve=curve)
    assert one.allreduce_ms(9 * mib, (0, 1)) == pytest.approx(7.0 + 5.0 / 8)  # between 8 and 16 MiB
    assert one.allreduce_ms(32 * mib, (0, 1)) == pytest.approx(12.0 + 16 * 5.0 / 8)  # beyond: the last line
    ddp = CostModel.from_profile(p, topo, allreduce_curve=curve, allreduce_buckets=(mib, 25 * mib))
    assert ddp.bucket_bytes(9 * mib) == [mib, 8 * mib]
    assert ddp.allreduce_ms(9 * mib, (0, 1)) == pytest.approx(3.0 + 7.0)
    # 4 replicas: not the measured count, so the ring at the link (1 GB/s), per bucket
    assert ddp.allreduce_ms(9 * mib, (0, 1, 2, 3)) == pytest.approx(1.5 * mib / 1e6 + 1.5 * 8 * mib / 1e6)
    with pytest.raises(ValueError, match="allreduce_buckets"):
        CostModel.from_profile(p, topo, allreduce_buckets=(0, 1))
    with pytest.raises(ValueError, match="allreduce_curve"):
        CostModel.from_profile(p, topo, allreduce_curve={"sizes": [1]})


def test_cost_options_object_equals_keywords():
    """``from_profile(p, topo, CostOptions(...))`` builds the model the keywords build; keywords
    override the object's fields."""
    from workbench.cost.model import CostOptions

    p, topo = make_profile([1, 2, 3], [2, 4, 6], [1e8, 2e8, 3e8], [1e8, 0, 5e7]), Topology(((2, 10e9), (2, 1e9)))
    curve = {"sizes": [1e6, 1e8], "ms": [0.5, 40.0], "world_size": 2}
    kw = dict(latency_ms=[0.1, 2.0], op_overhead_ms=0.05, message_cpu_ms=0.2, allreduce_curve=curve)
    a = CostModel.from_profile(p, topo, **kw)
    b = CostModel.from_profile(p, topo, CostOptions(**kw))
    c = CostModel.from_profile(
        p,
        topo,
        CostOptions(latency_ms=9.0, **{k: v for k, v in kw.items() if k != "latency_ms"}),
        latency_ms=[0.1, 2.0],
    )
    for cm in (b, c):
        assert cm.latency_ms == a.latency_ms == (0.1, 2.0)
        assert cm.allreduce_curve == a.allreduce_curve and cm.label == a.label
        assert cm.message_ms(1e8, 0, 3) == a.message_ms(1e8, 0, 3)
        assert cm.allreduce_ms(1e8, (0, 1)) == a.allreduce_ms(1e8, (0, 1))
    with pytest.raises(TypeError):
        CostModel.from_profile(p, topo, latency=0.1)

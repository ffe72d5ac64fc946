"""PipeDream Figure 1 (notebook 02): the paper's four observations read back from the quick run's
CSV, the bytes-per-sample comparison, the measured share, and the model's closed form on a toy."""

import dataclasses
import math

import pandas as pd
import pytest

from repro import dp_overhead as dpo
from workbench import Topology, schedules
from workbench.profiling.measure import Profile
from workbench.simulation import simulate

NB = "02_dp_communication_overhead"
HEAVY = ["alexnet", "vgg16", "gnmt8", "gnmt16"]  # large fully connected or recurrent layers


@pytest.fixture(scope="module")
def fig1(any_run):
    df = pd.read_csv(any_run / NB / "figure1_dp_overhead.csv")
    return df[df.source == "projected"]


def _shares(fig1, server):
    return fig1[fig1.server == server].pivot_table(index="gpus", columns="model", values="comm_share")


def test_figure1_covers_the_three_servers_and_1_to_32_gpus(fig1):
    assert set(fig1.server) == set(dpo.SERVERS)
    assert sorted(set(fig1.gpus)) == [1, 2, 4, 8, 16, 32]
    assert {"resnet50", "vgg16"} <= set(fig1.model) and set(fig1.model) & {"gnmt8", "gnmt16"}
    assert fig1.label.str.startswith("modeled (profile: workbench.project").all()
    one = fig1[fig1.gpus == 1]
    assert (one.comm_share.abs() < 1e-9).all()  # one GPU: no all-reduce, no stall


def test_resnet50_scales_well_and_its_row_reads_the_figure(any_run, fig1):
    """SOSP §2.1: data parallelism scales well for ResNet-50 (compact convolutional weights), less
    well for models with fully connected or recurrent layers: on every server the heaviest of those
    stalls more than twice as long as ResNet-50; the claim row counts the servers where ResNet-50 has
    the lowest share of all."""
    lowest = 0
    for server in dpo.SERVERS:
        at32 = _shares(fig1, server).loc[32]
        heavy = at32[[m for m in HEAVY if m in at32.index]]
        assert heavy.max() > 2 * at32["resnet50"], (server, at32.to_dict())
        lowest += int(at32["resnet50"] <= at32.min() + 1e-12)
    claims = pd.read_csv(any_run / NB / "claims.csv")
    row = claims[claims["claim"].str.startswith("data parallelism scales well for ResNet-50")]
    assert len(row) == 1 and row["ours"].iloc[0] == lowest and row["paper"].iloc[0] == len(dpo.SERVERS)


def test_the_takeaways_rows_read_the_figure(any_run, fig1):
    """Each of the text's four takeaways is a ``holds`` row of claims.csv whose count is the one
    :func:`dp_overhead.observations` gives on the run's own Fig. 1 table (the protocol's rules)."""
    claims = pd.read_csv(any_run / NB / "claims.csv")
    obs = dpo.observations(pd.read_csv(any_run / NB / "figure1_dp_overhead.csv"))
    for k in dpo.TAKEAWAYS:
        row = claims[claims["claim"].str.startswith(f"takeaway {k}:")]
        assert len(row) == 1 and row["comparison"].iloc[0] == "holds", k
        o = obs[obs.takeaway == k]
        assert row["paper"].iloc[0] == len(o) and row["ours"].iloc[0] == int(o.holds.sum()), (k, o)
        assert (row["met"].iloc[0] == "yes") == bool(o.holds.all())
    upto = claims[(claims["comparison"] == "up to") & claims["claim"].str.contains("max over Fig. 1", regex=False)]
    assert len(upto) == 1 and upto["ours"].iloc[0] == pytest.approx(100 * fig1["comm_share"].max())


def test_takeaways_2_to_4_hold_on_the_modeled_figure(fig1):
    """Spike then plateau across servers, growth with GPUs, V100 above 1080 Ti: on every server."""
    obs = dpo.observations(fig1)
    assert obs[obs.takeaway.isin([2, 3, 4])].holds.all(), obs[~obs.holds]


def test_takeaway_rules_can_fail():
    """The rules are not vacuous: a flat figure (no spike, no growth) fails takeaways 1 to 3."""
    rows = [
        dict(model=m, source="projected", server=s, gpus=g, gpus_per_server=4, comm_share=0.1)
        for m in ("a", "b", "c")
        for s in ("s1",)
        for g in (1, 2, 4, 8, 16)
    ]
    obs = dpo.observations(pd.DataFrame(rows))
    assert not obs.holds.any() and set(obs.takeaway) == {1, 2, 3}


def test_pipedream_profiles_agree_with_projection_on_the_observations(any_run):
    df = pd.read_csv(any_run / NB / "figure1_dp_overhead.csv")
    real = df[(df.source == "pipedream") & (df.gpus == 32)].set_index(["server", "model"]).comm_share
    for server in ("4xV100-pcie-10g", "8xV100-nvlink-25g"):
        assert real[(server, "resnet50")] < real[(server, "alexnet")]


def test_bytes_per_sample_pipedream_configs_send_less(any_run):
    df = pd.read_csv(any_run / NB / "bytes_per_sample.csv").set_index(["model", "pick"])
    assert df.loc[("vgg16", "3-1"), "reduction"] > 0.5  # the paper: more than 85% less; claims.csv has ours
    assert df.loc[("vgg16", "3-1"), "stages"].endswith("x1")  # replicated front, the FC layers on one worker
    assert df.loc[("awd-lstm", "straight"), "reduction"] > 0.5
    assert df.loc[("vgg16", "straight"), "reduction"] < 0  # early conv activations: a straight VGG sends more
    assert (df.dp_bytes_per_sample > 0).all()


def test_measured_share_on_this_machine(quick_run):
    df = pd.read_csv(quick_run / NB / "measured_dp_overhead.csv")
    assert len(df) >= 1
    assert df.label.str.startswith("measured (this machine: 2 CPU gloo ranks").all()
    assert (df.step_ms_1 > 0).all() and (df.step_ms_n > 0).all()
    assert df.comm_share.apply(math.isfinite).all()


# ---- the model itself, without the notebook -----------------------------------------------------
def _toy(compute_ms, param_bytes):
    half = [c / 2 for c in compute_ms]
    df = pd.DataFrame(
        dict(
            name=[f"l{i}" for i in range(len(half))],
            fwd_ms=half,
            bwd_ms=half,
            act_bytes=[1.0] * len(half),
            param_bytes=param_bytes,
        )
    )
    return Profile.from_frame(df, kind="modeled", batch_size=1)


def test_single_bucket_share_is_the_exposed_allreduce():
    """One bucket: its all-reduce may start with its backward (the cost model's DDP overlap) and
    the step waits for it, so T = C + max(0, AR - B) with AR = 2 (W-1)/W P / B_link."""
    C, P, bw, W = 10.0, 8e6, 1e9, 2
    ar_ms = 2 * (W - 1) / W * P / bw * 1e3  # 8 ms > the 5 ms backward
    r = dpo.dp_comm_share(_toy([C], [P]), Topology.flat(W, bw), W)
    assert r["iteration_ms"] == pytest.approx(C + ar_ms - C / 2)
    assert r["comm_share"] == pytest.approx(1 - C / r["iteration_ms"])  # the cost model's share = 1 - C / T
    hidden = dpo.dp_comm_share(_toy([C], [P / 2]), Topology.flat(W, bw), W)  # AR 4 ms < B 5 ms
    assert hidden["iteration_ms"] == pytest.approx(C) and hidden["comm_share"] == pytest.approx(0, abs=1e-12)


def test_buckets_are_reduced_one_at_a_time_from_the_output_side():
    """Two 30 MiB buckets, 5 ms forward and backward each: the output bucket's all-reduce starts
    with its backward (t = 10), the input bucket's waits for the collective channel: T = 10 + 2 AR."""
    prof = _toy([10.0, 10.0], [30 * 2**20, 30 * 2**20])
    plan = dpo.bucket_plan(prof)
    assert [(s.first, s.last) for s in plan.stages] == [(0, 0), (1, 1)]
    r = dpo.dp_comm_share(prof, Topology.flat(2, 1e9), 2)
    ar_ms = 30 * 2**20 / 1e9 * 1e3  # per bucket, 2 (W-1)/W = 1
    assert r["iteration_ms"] == pytest.approx(10.0 + 2 * ar_ms)
    assert r["comm_share"] == pytest.approx(1 - 20.0 / r["iteration_ms"])


def test_bucket_plan_fills_25mib_buckets_from_the_output_side():
    prof = _toy([1.0] * 6, [10 * 2**20, 1e6, 20 * 2**20, 8 * 2**20, 3e8, 5e6])
    # from layer 5 back: 5e6 + 3e8 closes at 4; 8 MiB + 20 MiB closes at 2; the rest is the last bucket
    assert [(s.first, s.last) for s in dpo.bucket_plan(prof).stages] == [(0, 1), (2, 3), (4, 5)]


def test_settings_reject_bad_values():
    with pytest.raises(ValueError, match="unknown model 'vgg17'"):
        dpo.settings(True, models=["vgg17"])
    with pytest.raises(ValueError, match="GPU counts must be integers >= 1"):
        dpo.settings(True, gpu_counts=[0])
    with pytest.raises(ValueError, match="unknown server type"):
        dpo.settings(True, servers=["16xA100"])
    with pytest.raises(ValueError, match="ranks must be an integer >= 2"):
        dpo.settings(True, ranks=1)


@pytest.mark.parametrize("ready", ["backward-start", "backward-end"])
@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize(
    ("server", "gpus"), [("8xV100-nvlink-25g", 16), ("4xV100-pcie-10g", 4), ("4xV100-pcie-10g", 32)]
)
def test_bucketed_round_closed_form_equals_the_simulator(ready, overlap, server, gpus):
    """One model of data parallelism: CostModel.bucketed_round_ms (what the papers' BSP rows read)
    is the simulated dp-bsp round over DDP's buckets (what Fig. 1 reads), to float precision."""
    from workbench.cost.model import CostModel
    from workbench.profiling.pipedream import shipped

    prof = shipped("alexnet")
    topo = dpo.server_topology(server, gpus)
    plan = dpo.bucket_plan(prof)
    kw = dict(allreduce_ready=ready, overlap_allreduce=overlap, op_overhead_ms=0.1, allreduce_latency_ms=0.02)
    closed = CostModel.from_profile(prof, topo, **kw).bucketed_round_ms(
        [(s.first, s.last) for s in plan.stages], range(gpus)
    )
    res = simulate(
        schedules.build("dp-bsp", plan, gpus * 3, workers=gpus), profile=prof, plan=plan, topology=topo, **kw
    )
    assert closed["round_ms"] == pytest.approx(gpus * float(res.metrics["time_per_minibatch_ms"]), rel=1e-9)
    assert closed["exposed_ms"] / closed["round_ms"] == pytest.approx(
        sum(res.metrics["comm_wait_share"]) / gpus, abs=1e-9
    )


def test_a_ddp_bucket_waits_for_its_own_backward():
    """allreduce_ready='backward-end': a bucket's all-reduce starts once its backward has ended, so
    the last bucket's (the input layers') is never hidden; 'backward-start' may hide it."""
    from workbench.cost.model import CostModel
    from workbench.profiling.pipedream import shipped

    prof = shipped("resnet50")
    topo = dpo.server_topology("4xV100-pcie-10g", 16)
    buckets = [(s.first, s.last) for s in dpo.bucket_plan(prof).stages]
    start, end = (
        CostModel.from_profile(prof, topo, allreduce_ready=r).bucketed_round_ms(buckets, range(16))
        for r in ("backward-start", "backward-end")
    )
    first = CostModel.from_profile(prof, topo).allreduce_ms(
        prof.layers["param_bytes"].iloc[: buckets[0][1] + 1].sum(), range(16)
    )
    assert end["exposed_ms"] >= first - 1e-9 and end["exposed_ms"] > start["exposed_ms"]
    with pytest.raises(ValueError, match="allreduce_ready must be one of"):
        CostModel.from_profile(prof, topo, allreduce_ready="whenever")


def test_the_measured_epochs_ratios_are_the_ones_the_rows_use(any_run):
    """notebook 02's ``dp_global_batch.csv`` (data parallelism at the paper's global batch against
    PipeDream at each configuration, the stand-in task) gives the epochs ratio each SOSP row without
    stated epochs multiplies its modeled throughput ratio by: the same number, in the row's value
    and explanation."""
    from repro import paper_fit
    from repro import time_to_accuracy as tta

    every = pd.read_csv(any_run / NB / "dp_global_batch.csv")
    cfg = tta.Config(seeds=tuple(sorted(set(every["seed"]))))
    table = every[every["task"] == cfg.model]
    u = cfg.samples_per_update
    assert set(table["samples_per_update"]) == {u, 4 * u}
    claims = pd.read_csv(any_run / NB / "claims.csv")
    base, _ = paper_fit.claim_rows()  # without the measurement: the throughput ratio x 1
    arms = paper_fit.epochs_arms()
    for plain, n in zip(base, paper_fit.PAPER):
        if not paper_fit.epochs_measured(n):
            continue
        got = tta.dp_global_batch_ratio(table, cfg, arms[(n.setting, n.model)]["plan"])
        row = claims[claims["claim"] == plain["claim"]]
        assert len(row) == 1 and got["text"] in row["explanation"].iloc[0]
        assert row["ours"].iloc[0] == pytest.approx(plain["ours"] * got["ratio"], rel=1e-3, nan_ok=True)
        for task, g in every[every["task"] != cfg.model].groupby("task"):  # the second task's, in the interval
            pick = g[g["chosen"] & (g["scheme"] == tta.PIPEDREAM)].iloc[0]
            lm = dataclasses.replace(cfg, model=task, lr=float(pick["lr"]), target=float(pick["target"]),
                                     samples_per_update=int(pick["samples_per_update"]))  # fmt: skip
            other = tta.dp_global_batch_ratio(g, lm, arms[(n.setting, n.model)]["plan"])
            ours = plain["ours"] * other["ratio"]
            if math.isfinite(row["ours"].iloc[0]):  # a NaN point (a seed short of the target) stays NaN
                assert row["low"].iloc[0] <= ours * (1 + 1e-3) and ours <= row["high"].iloc[0] * (1 + 1e-3), task
            assert f'{ours:.3g} ("{paper_fit.AT_ROWS_CONFIG}")' in row["explanation"].iloc[0], task
            assert f"second stand-in task ({task}" in row["explanation"].iloc[0]

"""Notebook 03 (time to accuracy): the statistics on small inputs, the weight rules against
hand-written ones, and the quick run's CSVs."""

import math

import numpy as np
import pandas as pd
import pytest
import torch

from repro import CLAIM_COLUMNS, paper_fit, protocol
from repro import convergence as cv
from repro import time_to_accuracy as tta


def curves_of(scheme, accs_by_seed, engine="reference"):
    rows = [
        dict(scheme=scheme, seed=seed, epoch=e + 1, test_accuracy=a, test_loss=1.0, engine=engine)
        for seed, accs in enumerate(accs_by_seed)
        for e, a in enumerate(accs)
    ]
    return pd.DataFrame(rows)


# ---- statistics, no processes ----------------------------------------------------------------------
def test_epochs_to_target_first_epoch_at_or_above_target_and_nan_when_never():
    c = pd.concat([curves_of("a", [[0.5, 0.9, 0.95]]), curves_of("b", [[0.5, 0.6, 0.7]])], ignore_index=True)
    c.loc[5, "test_loss"] = math.nan
    got = cv.epochs_to_target(c, 0.9).set_index("scheme")
    assert got.loc["a", "epochs_to_target"] == 2 and got.loc["a", "best_accuracy"] == 0.95
    assert math.isnan(got.loc["b", "epochs_to_target"]) and got.loc["b", "diverged"] and got.loc["b", "budget"] == 3


@pytest.mark.slow
def test_mean_ci_is_the_student_t_interval():
    m, lo, hi = cv.mean_ci([10, 12, 14])
    half = 4.302652729911275 * 2 / math.sqrt(3)  # t_{0.975, 2} * s / sqrt(n), s = 2
    assert m == 12 and lo == pytest.approx(12 - half) and hi == pytest.approx(12 + half)
    assert cv.mean_ci([5, 5, 5]) == (5, 5, 5)
    assert cv.mean_ci([3, math.inf]) == (math.inf, math.inf, math.inf)  # a seed that never reached
    m, lo, hi = cv.mean_ci([7])
    assert m == 7 and math.isnan(lo) and math.isnan(hi)


def test_summary_and_tests_between_schemes():
    fast = curves_of("pipedream", [[0.5] * (k - 1) + [0.9] * (12 - k + 1) for k in (3, 3, 4, 4, 3)])
    slow = curves_of("dp-asp", [[0.5] * (k - 1) + [0.9] * (12 - k + 1) for k in (8, 9, 9, 10, 8)])
    never = curves_of("no-stash", [[0.5] * 12, [0.5] * 5 + [0.9] * 7, [0.5] * 12, [0.5] * 12, [0.5] * 12])
    per_seed = cv.epochs_to_target(pd.concat([fast, slow, never], ignore_index=True), 0.9)
    s = cv.scheme_summary(per_seed).set_index("scheme")
    assert s.loc["pipedream", "epochs_mean"] == pytest.approx(3.4) and s.loc["pipedream", "reached"] == 5
    assert s.loc["pipedream", "ci_low"] < 3.4 < s.loc["pipedream", "ci_high"]
    assert s.loc["no-stash", "epochs_mean"] == math.inf and s.loc["no-stash", "reached"] == 1
    assert s.loc["pipedream", "epochs_median"] == 3 and s.loc["dp-asp", "epochs_median"] == 9
    assert s.loc["no-stash", "epochs_median"] == math.inf  # 1 of 5 reached
    c = cv.compare(per_seed, "pipedream").set_index("scheme")
    # fully separated 5 vs 5: the exact two-sided Mann-Whitney p is 2 / C(10, 5) = 2/252
    assert c.loc["dp-asp", "p_mannwhitney"] == pytest.approx(2 / 252)
    assert c.loc["dp-asp", "ratio"] == pytest.approx(8.8 / 3.4) and c.loc["dp-asp", "p_welch"] < 1e-4
    # censored seeds rank last: still a valid rank test; Welch's t has no finite sample
    assert c.loc["no-stash", "p_mannwhitney"] < 0.05 and math.isnan(c.loc["no-stash", "p_welch"])
    assert c.loc["no-stash", "ratio"] == math.inf and c.loc["no-stash", "ratio_median"] == math.inf
    assert c.loc["dp-asp", "ratio_median"] == pytest.approx(9 / 3)
    # final accuracy: ASP's seeds end at 0.9 like PipeDream's (no difference); four no-stash seeds end at 0.5
    assert c.loc["dp-asp", "p_final_accuracy"] == pytest.approx(1.0) and c.loc["no-stash", "p_final_accuracy"] < 0.05
    twin = per_seed[per_seed["scheme"] == "pipedream"].assign(scheme="twin")
    same = cv.compare(pd.concat([per_seed, twin]), "pipedream").set_index("scheme")
    assert same.loc["twin", "p_mannwhitney"] == pytest.approx(1.0) and same.loc["twin", "ratio"] == 1


def test_slow_scheme_target_is_the_best_accuracy_of_its_median_curve():
    c = curves_of("dp-asp", [[0.2, 0.487, 0.45], [0.3, 0.52, 0.6]])  # two seeds: median = mean 0.25, 0.5035, 0.525
    assert cv.slow_scheme_target(c, "dp-asp") == pytest.approx(0.52)
    with pytest.raises(ValueError, match="no runs"):
        cv.slow_scheme_target(c, "gpipe")
    # one of three seeds collapses (diverged Hogwild: NaN accuracy counts as 0): the median curve
    # 0.4, 0.5, 0.55 ignores it, where the mean curve (best 0.3967) would move the target down
    three = curves_of("dp-asp", [[0.4, 0.5, 0.55], [0.3, 0.6, 0.7], [0.45, 0.09, math.nan]])
    assert cv.slow_scheme_target(three, "dp-asp") == pytest.approx(0.55)


def test_lower_median_is_finite_exactly_while_half_the_seeds_reached():
    inf = math.inf
    assert cv.lower_median([3, 5, inf, 4, inf]) == 5  # 3 of 5 reached: the median
    assert cv.lower_median([3, inf, inf, 4, inf]) == inf  # 2 of 5
    assert cv.lower_median([2, math.nan]) == 2  # 1 of 2: the lower middle value; NaN counts as inf
    assert cv.lower_median([6, 2, 4, 8]) == 4 and cv.lower_median([inf, inf]) == inf
    assert math.isnan(cv.lower_median([]))


def test_asp_is_compared_at_its_median_curves_best_with_median_epochs_and_a_finite_ratio():
    """Five ASP seeds, one never learns: ASP's mean epochs are inf at any target, its median is not;
    the claim's ratio is finite, states the seeds that reached and ASP's U test against BSP."""
    n = 12
    ramp = lambda k, top: [min(top, 0.1 + (top - 0.1) * (e + 1) / k) for e in range(n)]  # noqa: E731 (top at epoch k)
    curves = pd.concat(
        [
            curves_of("pipedream", [ramp(k, 0.9) for k in (3, 3, 4, 4, 3)]),
            curves_of("dp-bsp", [ramp(k, 0.9) for k in (3, 4, 4, 4, 3)]),
            curves_of("dp-asp", [ramp(k, 0.5) for k in (8, 9, 9, 10)] + [[0.1] * n], engine="runtime"),
        ],
        ignore_index=True,
    )
    speed = pd.Series({"pipedream": 1.0, "dp-bsp": 2.0, "dp-asp": 0.5})
    asp = tta.asp_target_table(curves, speed)
    st = asp.set_index("scheme")
    assert st.loc["dp-asp", "target"] == pytest.approx(0.5)  # the median curve's best
    assert st.loc["dp-asp", "reached"] == 4 and st.loc["dp-asp", "epochs_mean"] == math.inf
    assert math.isfinite(st.loc["dp-asp", "epochs_median"]) and st.loc["dp-asp", "epochs_median"] > 4
    assert st.loc["dp-bsp", "p_mannwhitney"] == pytest.approx(2 / 252)  # fully separated 5 vs 5
    assert st.loc["pipedream", "ratio_median"] == pytest.approx(
        st.loc["pipedream", "epochs_median"] / st.loc["dp-asp", "epochs_median"]
    )
    hw = pd.DataFrame(dict(scheme=["pipedream", "dp-asp"] * 2, gpus=[4, 4, 8, 8], stages=[2, 1, 2, 1],
                           speedup_modeled=[3.0, 4.0, 6.0, 8.0]))  # fmt: skip
    t = tta.time_to_target(asp, hw, "epochs_median")
    assert (t["epochs_statistic"] == "epochs_median").all()
    cfg = tta.Config(seeds=(0, 1, 2, 3, 4), gpus=(4, 8))
    rows = {r["claim"]: r for r in tta.asp_claims(t, asp, cfg)}
    e = st.loc["dp-asp", "epochs_median"] / st.loc["pipedream", "epochs_median"]
    modeled, measured = rows[tta.ASP_CLAIM], rows[tta.ASP_CLAIM + " (this machine)"]
    assert modeled["ours"] == pytest.approx(e * 3 / 4) and modeled["fit"] == "out-of-sample"
    assert measured["ours"] == pytest.approx(e * 0.5 / 1.0) and measured["label"].startswith("measured")
    for r in (modeled, measured):
        assert math.isfinite(r["ours"]) and "dp-asp" in r["explanation"] and "4/5 seeds reached" in r["explanation"]
        assert f"ASP vs dp-bsp p = {2 / 252:.3g}" in r["explanation"]
    with pytest.raises(ValueError, match="epochs must be"):
        tta.time_to_target(asp, hw, "epochs_max")


def test_asp_against_pipedream_at_each_gpu_count_from_the_delay_model():
    """asp_delay_table: at each GPU count, ASP's own level from its median curve there, median epochs
    of ASP and PipeDream to it, times the hardware factor; the modeled claim takes the largest and
    names the Hogwild ratio beside it."""
    n = 12
    ramp = lambda k, top: [min(top, 0.1 + (top - 0.1) * (e + 1) / k) for e in range(n)]  # noqa: E731 (top at epoch k)
    curves = pd.concat(
        [
            curves_of("pipedream", [ramp(k, 0.9) for k in (3, 3, 4)]),
            curves_of("dp-bsp", [ramp(k, 0.9) for k in (3, 4, 4)]),
            curves_of("dp-asp", [ramp(k, 0.6) for k in (6, 6, 7)], engine="runtime"),
        ],
        ignore_index=True,
    )
    delay = pd.concat(
        [
            curves_of("dp-asp", [ramp(k, 0.8) for k in (4, 5, 5)], engine="delay model").assign(gpus=4, delay=3),
            curves_of("dp-asp", [ramp(k, 0.5) for k in (10, 10, 11)], engine="delay model").assign(gpus=16, delay=15),
        ],
        ignore_index=True,
    )
    hw = pd.DataFrame(dict(scheme=["pipedream", "dp-asp"] * 2, gpus=[4, 4, 16, 16], stages=[2, 1, 2, 1],
                           speedup_modeled=[3.0, 4.0, 15.0, 16.0]))  # fmt: skip
    d = tta.asp_delay_table(delay, curves, hw).set_index("gpus")
    assert d.loc[4, "target"] == pytest.approx(0.8) and d.loc[16, "target"] == pytest.approx(0.5)
    assert d.loc[16, "asp_epochs_median"] == 10 and d.loc[16, "pipedream_epochs_median"] == 2  # 0.5 at epoch 2
    assert d.loc[16, "x_vs_pipedream_modeled"] == pytest.approx(10 / 2 * 15 / 16)
    assert d.loc[4, "x_vs_pipedream_modeled"] == pytest.approx(
        d.loc[4, "asp_epochs_median"] / d.loc[4, "pipedream_epochs_median"] * 3 / 4
    )
    asp = tta.asp_target_table(curves, pd.Series({"pipedream": 1.0, "dp-bsp": 2.0, "dp-asp": 0.5}))
    t = tta.time_to_target(asp, hw, "epochs_median")
    cfg = tta.Config(seeds=(0, 1, 2), gpus=(4, 16))
    rows = {r["claim"]: r for r in tta.asp_claims(t, asp, cfg, d.reset_index())}
    modeled = rows[tta.ASP_CLAIM]
    assert modeled["ours"] == pytest.approx(d["x_vs_pipedream_modeled"].max())
    assert "at 16 GPUs" in modeled["explanation"] and "15 updates old" in modeled["explanation"]
    assert "Hogwild ranks measured here instead" in modeled["explanation"]
    assert "baselines.asp_delay=workers - 1" in modeled["protocol"]


@pytest.mark.slow
def test_the_delay_model_is_sgd_at_delay_zero_and_reads_old_weights_otherwise():
    """delayed_sgd at delay 0 equals BSP's reference on the same 64-sample updates (one ASP epoch:
    60 updates); at delay 2 it equals the rule written by hand for the first updates."""
    torch.set_num_threads(1)
    setup = cv.Setup(samples_per_update=64, lr=0.3)
    asp, bsp = cv.job_for(setup, "dp-asp", 0, None), cv.job_for(setup, "dp-bsp", 0, None)
    _, w0 = cv.delayed_sgd(asp, 0, 1, curve=False)
    ref = cv.reference_train(schedule=bsp.schedule, model=bsp.model_fn(), bounds=bsp.bounds, dataset=bsp.dataset_fn(),
                             batch_size=bsp.optim.batch_size, lr=bsp.optim.lr, seed=0, rounds=60)  # fmt: skip
    assert max(float((w0[0][k] - ref[0][k]).abs().max()) for k in ref[0]) < 1e-5
    # by hand: w(t+1) = w(t) - lr grad f_t(w(t-2)), over the first ASP round (4 updates)
    model, ds = asp.model_fn(), asp.dataset_fn()
    mod = cv.stage_module(model.layers, *asp.bounds[0])
    order = cv.DataOrder(len(ds), asp.optim.batch_size, asp.schedule.microbatches, 0)
    perm, ws = order.permutation(0), [cv.stage_params(mod)]
    for t in range(4):
        x, y = cv.microbatch(ds, order.indices(perm, 0, t))
        read = {k: v.detach().requires_grad_(True) for k, v in ws[max(0, t - 2)].items()}
        g = torch.autograd.grad(model.loss(cv.run_stage(mod, read, x), y), list(read.values()))
        ws.append({k: v - 0.3 * gk for (k, v), gk in zip(ws[-1].items(), g)})
    _, (got,) = cv.delayed_sgd(asp, 2, 1, curve=False, updates=4)
    assert max(float((got[k] - ws[-1][k]).abs().max()) for k in got) < 1e-6
    _, (got0,) = cv.delayed_sgd(asp, 0, 1, curve=False, updates=4)
    assert max(float((got0[k] - ws[-1][k]).abs().max()) for k in got0) > 1e-4  # the delay matters
    with pytest.raises(ValueError, match="delay must be"):
        cv.delayed_sgd(asp, -1, 1)


# ---- the schemes' runs ----------------------------------------------------------------------------
@pytest.mark.slow
def test_every_scheme_averages_the_same_number_of_samples_per_update():
    setup = cv.Setup(samples_per_update=64)
    for scheme in cv.SCHEMES:
        job = cv.job_for(setup, scheme, 0, None)
        mb = job.optim.batch_size // job.schedule.microbatches
        assert mb * job.schedule.microbatches_per_step == 64, scheme
        assert (job.stream is not None) == (cv.SCHEMES[scheme][0] in ("pipedream", "model-parallel")), scheme
    with pytest.raises(ValueError, match="not divisible"):
        cv.job_for(cv.Setup(samples_per_update=30), "dp-bsp", 0, None)


@pytest.mark.slow
def test_staleness_of_the_weight_rules():
    """Stashing: stage k reads weights n-1-k updates old in forward and backward; no stashing: the
    backward reads the newest; vertical sync: every stage n-1 old (the input stage's version)."""
    st = cv.staleness(cv.Setup(workers=4)).set_index(["scheme", "stage"])
    for k in range(4):
        assert st.loc[("pipedream", k), "forward_delay"] == st.loc[("pipedream", k), "backward_delay"] == 3 - k
        assert st.loc[("pipedream-no-stash", k), "backward_delay"] == 0
        assert st.loc[("pipedream-vertical-sync", k), "backward_delay"] == 3


@pytest.mark.slow
def test_vertical_sync_equals_the_hand_written_rule():
    """The stream schedule's vertical sync through the semantic reference (which the runtime is
    tested equal to) is PipeDream's rule w(t+1) = w(t) - lr grad f(w^(t-n+1)) written by hand on the
    whole model; stashing and no stashing are not (the comparison can fail)."""
    torch.set_num_threads(1)
    got = cv.vertical_sync_check(cv.Setup(workers=4), seed=1, count=12).set_index("rule")["max_abs_weight_diff"]
    assert got["vertical-sync"] < 1e-12
    assert got["stash"] > 1e-4 and got["no-stash"] > 1e-4


def test_modeled_hardware_on_the_calibrated_cluster_a_vgg16():
    hw = tta.modeled_hardware("vgg16", tta.SETTING, (4, 8), ("pipedream", "dp-bsp", "model-parallel"))
    by = hw.set_index(["scheme", "gpus"])
    # one number, two ways: the simulated BSP equals the planner's closed form (partition.data_parallel_ms)
    # and the calibration's BSP speedup on the same calibrated links
    params = paper_fit.fitted_params()["arxiv-A"]
    for n in (4, 8):
        sim = by.loc[("dp-bsp", n), "speedup_modeled"]
        assert sim == pytest.approx(by.loc[("dp-bsp", n), "planner_speedup"], rel=1e-6)
        assert sim == pytest.approx(
            paper_fit.bsp(paper_fit.SETTINGS["arxiv-A"], "vgg16", n, params)["speedup"], rel=1e-6
        )
    # on the calibrated links PipeDream replicates the convolutions and beats BSP (the paper's 2.99x at 8)
    assert by.loc[("pipedream", 8), "stages"] > 1
    assert by.loc[("pipedream", 8), "speedup_modeled"] > 2 * by.loc[("dp-bsp", 8), "speedup_modeled"]
    # model parallelism keeps one microbatch in flight: no speedup over one GPU
    assert by.loc[("model-parallel", 4), "speedup_modeled"] < 1
    assert (hw["speedup_modeled"] > 0).all() and hw["label"].str.startswith("modeled").all()


def test_asp_has_no_communication_overhead_as_the_protocol_says():
    """ASP's modeled time per minibatch is its compute alone (the arXiv text, the protocol's
    baselines.asp_communication): W workers run W times one GPU's rate; BSP pays its exchange."""
    from repro import protocol

    assert protocol.value("baselines.asp_communication") == "none"
    hw = tta.modeled_hardware("vgg16", tta.SETTING, (4, 8), ("dp-bsp", "dp-asp")).set_index(["scheme", "gpus"])
    for n in (4, 8):
        assert hw.loc[("dp-asp", n), "speedup_modeled"] == pytest.approx(n)
        assert hw.loc[("dp-asp", n), "comm_share_modeled"] == 0.0
        assert hw.loc[("dp-bsp", n), "speedup_modeled"] < n / 2
        assert "no communication overhead" in hw.loc[("dp-asp", n), "label"]


def test_bad_parameters_fail_with_one_clear_line():
    with pytest.raises(ValueError, match="unknown scheme"):
        tta.Config(schemes=("pipedream", "hogwild2"))
    with pytest.raises(ValueError, match="must include 'dp-bsp'"):
        tta.Config(schemes=("pipedream", "gpipe"))
    with pytest.raises(ValueError, match="target"):
        tta.Config(target=1.5)
    with pytest.raises(ValueError, match="check_epochs"):
        tta.Config(epochs=3, check_epochs=4)
    with pytest.raises(ValueError, match="hardware setting"):
        tta.Config(setting="9xA100")
    with pytest.raises(ValueError, match="whole number"):
        tta.modeled_hardware("vgg16", "sosp-A", (6,), ("dp-bsp",))


# ---- the quick run's outputs ----------------------------------------------------------------------
def test_claims_csv_has_the_contract_columns_and_labels(out03):
    claims = pd.read_csv(out03 / "claims.csv")
    assert tuple(claims.columns) == CLAIM_COLUMNS
    assert claims["label"].str.match(r"^(measured|modeled)").all()
    for claim_text in (
        "PipeDream faster than model parallelism (low end) (this machine)",
        "PipeDream faster than GPipe (this machine)",
        "PipeDream faster than ASP to target accuracy",
    ):
        assert (claims["claim"] == claim_text).any()
    done = claims.dropna(subset=["ours"])
    assert (done["ratio"] - done["ours"] / done["paper"]).abs().max() < 1e-9
    page = (out03 / "figures.html").read_text()
    for title in ("Statistical efficiency", "Time to accuracy on this machine", "Modeled: epochs"):
        assert title in page


def test_every_scheme_has_every_seed_and_says_which_engine_trained_it(out03):
    cfg = pd.read_json(out03 / "config.json", typ="series")
    stats = pd.read_csv(out03 / "statistical.csv").set_index("scheme")
    assert set(stats.index) == set(cv.SCHEMES) and (stats["seeds"] == len(cfg["seeds"])).all()
    assert stats.loc["dp-asp", "engine"] == "runtime" and (stats.drop("dp-asp")["engine"] == "reference").all()
    assert (stats["s_per_epoch_measured"] > 0).all()  # every scheme has real runs on this machine
    sig = pd.read_csv(out03 / "significance.csv")
    assert set(sig["baseline"]) == {"pipedream", "dp-bsp"}
    if len(cfg["seeds"]) < protocol.value("statistical_efficiency.min_seeds"):  # quick: no spread, no numbers
        assert (stats[["ci_low", "ci_high"]] == "not computed").all().all()
        assert (sig[["p_mannwhitney", "p_welch", "p_final_accuracy"]] == "not computed").all().all()
    else:
        done = stats[np.isfinite(stats["epochs_mean"]) & (stats["reached"] > 1)]
        assert ((done["ci_low"] <= done["epochs_mean"]) & (done["epochs_mean"] <= done["ci_high"])).all()
        assert sig["p_mannwhitney"].between(0, 1).all()
    asp = pd.read_csv(out03 / "asp_target.csv").set_index("scheme")
    # ASP's own target is its median curve's best: at least half its seeds reach it, a finite median
    assert 2 * asp.loc["dp-asp", "reached"] >= asp.loc["dp-asp", "seeds"] and np.isfinite(asp["epochs_median"]).any()
    assert math.isfinite(asp.loc["dp-asp", "epochs_median"])
    # every ASP seed's staleness, measured by its replicas (updates by the others between read and write)
    runs = pd.read_csv(out03 / "asp_runs.csv")
    assert sorted(runs["seed"]) == sorted(cfg["seeds"]) and (runs["staleness_mean"] >= 0).all()  # NaN fails too
    assert (runs["staleness_max"] >= runs["staleness_mean"]).all() and runs["label"].str.startswith("measured").all()
    # the ratio is finite unless PipeDream itself stays below ASP's level (quick mode's 3 epochs can)
    claims = pd.read_csv(out03 / "claims.csv").set_index("claim")
    for c in (tta.ASP_CLAIM, tta.ASP_CLAIM + " (this machine)"):
        why = claims.loc[c, "explanation"]
        assert "seeds reached" in why and "ASP vs dp-bsp p = " in why, c
        assert math.isfinite(claims.loc[c, "ours"]) or not math.isfinite(asp.loc["pipedream", "epochs_median"]), c
    at_asp = pd.read_csv(out03 / "time_to_asp_target.csv")
    assert (at_asp["epochs_statistic"] == "epochs_median").all()
    # the modeled claim is the largest ratio of the delay model's table, one row per GPU count of the run
    delay = pd.read_csv(out03 / "asp_delay.csv")
    assert sorted(delay["gpus"]) == sorted(cfg["gpus"]) and (delay["delay"] == delay["gpus"] - 1).all()
    assert (delay["asp_reached"] * 2 >= delay["seeds"]).all()  # ASP's own level: half its seeds reach it
    assert claims.loc[tta.ASP_CLAIM, "ours"] == pytest.approx(delay["x_vs_pipedream_modeled"].max(), nan_ok=True)
    curves = pd.read_csv(out03 / "asp_delay_curves.csv")
    assert (
        set(curves["engine"]) == {"delay model"} and len(curves) == len(cfg["gpus"]) * len(cfg["seeds"]) * cfg["epochs"]
    )


def test_the_real_runtime_agrees_with_the_reference(out03):
    """Seed 0 of every deterministic scheme through gloo ranks: the same weights (float32 rounding)
    and the same test accuracy as the semantic reference that produced the sweep."""
    check = pd.read_csv(out03 / "runtime_check.csv").set_index("scheme")
    assert len(check) == len(cv.SCHEMES) - 1
    # no stashing's inconsistent gradients amplify float32 rounding (summation order differs between
    # the engines); in float64 the runtime equals the reference (test_runtime's stream-ns run)
    stable = check.drop(index="pipedream-no-stash")
    assert (stable["max_abs_weight_diff"] < 1e-4).all() and (stable["max_abs_accuracy_diff"] <= 0.002).all(), (
        check.to_string()
    )
    assert check.loc["pipedream-no-stash", "max_abs_accuracy_diff"] <= 0.05
    vs = pd.read_csv(out03 / "vertical_sync_check.csv").set_index("rule")["max_abs_weight_diff"]
    assert vs["vertical-sync"] < 1e-12 and vs["stash"] > 1e-4


def test_pipedream_plans_pipelines_that_beat_bsp_on_the_calibrated_cluster(out03):
    """On the calibrated Cluster-A (links fitted to the paper's BSP numbers) PipeDream's plans are
    pipelines, modeled faster than BSP at every GPU count (the data-parallel case: the next test)."""
    tta_df = pd.read_csv(out03 / "time_to_target.csv")
    stages = tta_df[tta_df["scheme"] == "pipedream"].set_index("gpus")["stages"]
    assert (stages > 1).all()
    hw = pd.read_csv(out03 / "hardware.csv").set_index(["scheme", "gpus"])
    for gpus in stages.index:
        assert hw.loc[("pipedream", gpus), "speedup_modeled"] > hw.loc[("dp-bsp", gpus), "speedup_modeled"]


def test_a_data_parallel_pipedream_plan_takes_bsp_epochs():
    """time_to_target's rule: where PipeDream's plan is one stage on every GPU it is BSP, so its
    epochs to target are BSP's (the calibrated run never plans that, so a table states it here)."""
    stats = pd.DataFrame(
        dict(
            scheme=["pipedream", "dp-bsp"],
            engine=["reference"] * 2,
            epochs_mean=[9.0, 5.0],
            reached=[5, 5],
            seeds=[5, 5],
            s_per_epoch_measured=[1.0, 1.0],
        )
    )
    hw = pd.DataFrame(dict(scheme=["pipedream", "dp-bsp", "pipedream"], gpus=[4, 4, 8], stages=[1, 1, 2],
                           speedup_modeled=[2.0, 2.0, 4.0]))  # fmt: skip
    out = tta.time_to_target(stats, hw).set_index(["scheme", "gpus"])
    assert out.loc[("pipedream", 4), "epochs_to_target"] == 5.0  # BSP's, not its own 9
    assert (
        out.loc[("pipedream", 4), "tta_single_gpu_epochs_modeled"]
        == out.loc[("dp-bsp", 4), "tta_single_gpu_epochs_modeled"]
    )
    assert out.loc[("pipedream", 8), "epochs_to_target"] == 9.0  # a pipeline keeps its own


# ---- data parallelism at the papers' global batch (protocol baselines.dp_global_batch) ----------
def test_data_parallelisms_lr_rule_favours_it_most_seeds_then_fewest_epochs_then_the_smaller_lr():
    rows = pd.DataFrame(
        [dict(lr=0.3, seed=s, epochs_to_target=e) for s, e in enumerate([10.0, math.nan])]
        + [dict(lr=0.6, seed=s, epochs_to_target=e) for s, e in enumerate([30.0, 40.0])]
        + [dict(lr=1.2, seed=s, epochs_to_target=e) for s, e in enumerate([20.0, 30.0])]
        + [dict(lr=2.4, seed=s, epochs_to_target=e) for s, e in enumerate([25.0, 25.0])]
    )
    assert tta.choose_dp_lr(rows) == 1.2  # 2/2 seeds beat 1/2 however fast; then 25 = 25 -> the smaller lr
    assert tta.choose_dp_lr(rows[rows["lr"] != 1.2]) == 2.4
    assert tta.choose_dp_lr(rows[rows["lr"] == 0.3]) == 0.3


def test_the_candidates_are_the_protocols_multiples_of_the_lr():
    cfg = tta.Config(lr=0.25, workers=4)
    assert tta.dp_lr_candidates(cfg) == [("1", 0.25), ("sqrt(workers)", 0.5), ("workers", 1.0)]


def test_dp_at_the_global_batch_runs_workers_x_the_samples_per_step_in_as_many_steps():
    cfg = tta.Config(epochs=1, seeds=(0,), target=0.01, check_epochs=0)
    tab = tta.dp_global_batch(cfg, [(), (1, 1, 2), (4,)])  # (4,) is data parallelism itself: not run
    pd_rows = tab[tab["scheme"] == cv.PIPEDREAM].set_index("config")
    dp = tab[tab["scheme"] == cv.BSP]
    assert sorted(pd_rows.index) == ["1-1-1-1", "1-1-2"]
    assert (pd_rows["samples_per_update"] == cfg.samples_per_update).all() and (pd_rows["lr"] == cfg.lr).all()
    assert (pd_rows["budget"] == 4).all()  # one budget for every arm
    assert cfg.stage_lr == "replicas" and (pd_rows["stage_lr"] == "replicas").all() and (dp["stage_lr"] == "").all()
    assert (dp["samples_per_update"] == cfg.workers * cfg.samples_per_update).all() and (dp["budget"] == 4).all()
    assert list(dp["lr"]) == pytest.approx([cfg.lr, 2 * cfg.lr, 4 * cfg.lr]) and set(dp["config"]) == {"data parallel"}
    assert (tab["epochs_to_target"] == 1).all()  # every curve reaches 1% and stops there
    assert dp["chosen"].sum() == 1 and dp.loc[dp["chosen"], "lr"].iloc[0] == pytest.approx(cfg.lr)
    assert tab["label"].str.startswith("measured").all()
    one = tta.dp_global_batch_ratio(tab, cfg, (4,))
    assert one["ratio"] == 1.0 and "data parallelism's own update rule" in one["text"]
    assert tta.dp_global_batch_ratio(tab, cfg, (1, 1, 2))["ratio"] == 1.0  # 1 epoch each side
    with pytest.raises(ValueError, match="no PipeDream arm at 2-1-1"):
        tta.dp_global_batch_ratio(tab, cfg, (2, 1, 1))


def test_a_replicated_stage_averages_its_replicas_microbatches_in_one_step(tmp_path):
    """Setup.replicas: the model's layers split evenly over the stages, the replicated stage on two
    workers, every microbatch the setup's samples per update (PipeDream's per-GPU minibatch)."""
    setup = cv.Setup(workers=4, samples_per_update=64, replicas=(1, 1, 2), stage_lr="replicas")
    job = cv.job_for(setup, cv.PIPEDREAM, 0, tmp_path / "a")
    assert job.bounds == [(0, 1), (2, 2), (3, 3)] and job.schedule.stage_workers == ((0,), (1,), (2, 3))
    assert job.optim.stage_lr == "replicas"  # the replicated stage at lr x 2 / 1 (stages.stage_lrs)
    cfg = tta.Config(lr=0.3)
    assert "lr 0.3-0.3-0.6 by stage" in tta._pipeline_lr_text(cfg, (1, 1, 2))
    assert "lr 0.3-0.15-0.15 by stage" in tta._pipeline_lr_text(cfg, (2, 1, 1))
    assert tta._pipeline_lr_text(cfg, (1, 1, 1, 1)) == "lr 0.3"
    assert job.optim.batch_size == setup.microbatches * 64
    with pytest.raises(ValueError, match="summing to 4"):
        cv.job_for(cv.Setup(workers=4, replicas=(1, 1, 1)), cv.PIPEDREAM, 0, tmp_path / "b")


def test_the_epochs_ratio_is_data_parallelisms_mean_over_pipedreams_and_inf_when_a_seed_misses():
    cfg = tta.Config(seeds=(0, 1))
    rows = [dict(scheme=cv.PIPEDREAM, config="1-1-1-1", lr_multiple="pipeline lr", lr=0.3, seed=s, epochs_to_target=e, budget=25,
                 final_accuracy=0.9, chosen=True) for s, e in enumerate([10.0, 14.0])]  # fmt: skip
    rows += [dict(scheme=cv.BSP, config="data parallel", lr_multiple="sqrt(workers)", lr=0.6, seed=s, epochs_to_target=e, budget=100,
                  final_accuracy=0.9, chosen=True) for s, e in enumerate([30.0, 42.0])]  # fmt: skip
    rows += [dict(scheme=cv.BSP, config="data parallel", lr_multiple="1", lr=0.3, seed=s, epochs_to_target=math.nan, budget=100,
                  final_accuracy=0.8, chosen=False) for s in (0, 1)]  # fmt: skip
    got = tta.dp_global_batch_ratio(pd.DataFrame(rows), cfg)
    assert got["ratio"] == pytest.approx(36 / 12) and got["dp_lr"] == 0.6
    assert got["p"] == pytest.approx(1 / 3)  # 2 seeds a side, fully separated: 2 of the 6 splits as extreme
    assert (
        "epochs ratio 3.00" in got["text"]
        and "2/2 seeds" in got["text"]
        and "most favourable of sqrt(workers), 1" in got["text"]
    )
    rows[2]["epochs_to_target"] = math.nan
    assert tta.dp_global_batch_ratio(pd.DataFrame(rows), cfg)["ratio"] == math.inf


# ---- the rows at the ends of the protocol's seeds and target intervals (no training) -------------
def _toy_grid(task, n_seeds, levels, target, used):
    """A grid dict as run() holds it (:func:`repro.lr_grid.run_grid`'s, with ``task`` and ``used``)
    whose arm a at lr reaches ``levels[a](lr) + seed/1000`` at its last of 4 epochs."""
    from repro import lr_grid as lg

    rows = [dict(arm=a, scheme=a, lr=lr, seed=s, epoch=e, test_accuracy=f(lr) * e / 4 + s / 1000, test_loss=1.0,
                 engine="reference", cpu_s=1.0)
            for a, f in levels.items() for lr in task.lrs for s in range(n_seeds) for e in range(1, 5)]  # fmt: skip
    curves = pd.DataFrame(rows).assign(task=task.name)
    return dict(task=task, used=used, curves=curves, lr=task.lrs[0], target=target, majority=0.1,
                **lg.grid_tables(task, curves, target, 0.1))  # fmt: skip


def _interval_inputs(n_seeds=10):
    """What run() computes claim rows from, for the first ``n_seeds`` seeds, made so that seeds 5-9
    and the target 0.88 move rows: model parallelism's seeds 5-9 reach 0.9 at epoch 8 (0-4 at 4);
    GPipe reaches 0.88 at epoch 3, 0.89 at 5; the first grid's baseline learns at lr 1 only at
    0.88 (median best 0.4935 or 0.491 against 0.49 at 0.88, 0.495 at 0.89), where vertical sync is
    lower. Returns (curves, speed, hardware, grids, delay_curves)."""
    from repro import lr_grid as lg

    seeds, n = range(n_seeds), 12
    ramp = lambda k, top: [min(top, 0.1 + (top - 0.1) * (e + 1) / k) for e in range(n)]  # noqa: E731
    step = lambda k: [0.5] * (k - 1) + [0.9] * (n - k + 1)  # noqa: E731 (0.9 from epoch k)
    curves = pd.concat([
        curves_of("pipedream", [step(3) for _ in seeds]),
        curves_of("dp-bsp", [step(3 + s % 2) for s in seeds]),
        curves_of("model-parallel", [step(4 if s < 5 else 8) for s in seeds]),
        curves_of("gpipe", [[0.5, 0.7, 0.885, 0.885, 0.895] + [0.9] * 7 for _ in seeds]),
        curves_of("dp-asp", [ramp(8 + s % 3, 0.5) for s in seeds], engine="runtime"),
    ], ignore_index=True)  # fmt: skip
    delay = pd.concat([
        curves_of("dp-asp", [ramp(4 + s % 2, 0.8) for s in seeds], engine="delay model").assign(gpus=4, delay=3),
        curves_of("dp-asp", [ramp(9 + s % 3 if s < 5 else 12, 0.5) for s in seeds],
                  engine="delay model").assign(gpus=16, delay=15),
    ], ignore_index=True)  # fmt: skip
    schemes = ["pipedream", "dp-bsp", "model-parallel", "gpipe", "dp-asp"]
    hw = pd.DataFrame(dict(scheme=schemes * 2, gpus=[4] * 5 + [16] * 5, stages=[2, 1, 4, 4, 1] * 2,
                           speedup_modeled=[3.0, 2.0, 0.9, 2.5, 4.0, 12.0, 6.0, 0.9, 8.0, 16.0]))  # fmt: skip
    speed = pd.Series({"pipedream": 1.0, "dp-bsp": 2.0, "model-parallel": 1.5, "gpipe": 1.2, "dp-asp": 0.5})
    setup = cv.Setup(epochs=4)
    first = lg.Task("cnn1d", "toy task", setup, (0.1, 1.0), tuple(seeds))
    lm = lg.Task("toy-lm", "toy LM", setup, (0.1, 1.0), tuple(seeds))
    both = protocol.used("statistical_efficiency.seeds", "statistical_efficiency.target")
    grids = {
        "cnn1d": _toy_grid(first, n_seeds, {"dp-bsp": lambda lr: 0.8 if lr < 0.5 else 0.489,
                                            "pipedream": lambda lr: 0.8 if lr < 0.5 else 0.489,
                                            lg.VSYNC: lambda lr: 0.8 if lr < 0.5 else 0.3}, 0.89, both),
        "toy-lm": _toy_grid(lm, n_seeds, {"dp-bsp": lambda lr: 0.6, "pipedream": lambda lr: 0.6,
                                          lg.VSYNC: lambda lr: 0.6 if lr < 0.5 else 0.3}, 0.5,
                            protocol.used("statistical_efficiency.seeds")),
    }  # fmt: skip
    return curves, speed, hw, grids, delay


def _by_claim(rows):
    return {r["claim"]: r for r in rows}


def test_the_protocol_intervals_these_tests_are_built_on():
    assert protocol.interval("statistical_efficiency.target") == (0.88, 0.89, 0.89)
    low, point, high = protocol.interval("statistical_efficiency.seeds")
    assert list(low) == list(range(5)) and list(point) == list(high) == list(range(10))
    assert tta.Config().seeds == tuple(range(10)) and tta.Config().target == 0.89


def test_the_rows_at_seeds_0_to_4_are_the_rows_of_curves_that_only_have_seeds_0_to_4():
    """claim_ends' seeds end restricts every curve (the time-to-target and ASP rows', the delay
    model's, both grids') to seeds 0-4: each row equals the one claims_at computes from inputs made
    with five seeds only, number and words, and some differ from the ten seeds' rows."""
    from dataclasses import replace

    cfg = tta.Config(gpus=(4, 16))
    ends = tta.claim_ends(cfg, *_interval_inputs(10)[:4], _interval_inputs(10)[4])
    assert set(ends) == {"seeds 0-4", "target 0.88"}
    curves, speed, hw, grids, delay = _interval_inputs(5)
    five, _ = tta.claims_at(replace(cfg, seeds=tuple(range(5))), curves, speed, hw, grids, delay)
    got = _by_claim(ends["seeds 0-4"])
    assert set(got) == set(_by_claim(five)) and len(got) == len(five)
    for c, want in _by_claim(five).items():
        assert got[c]["ours"] == pytest.approx(want["ours"], nan_ok=True), c
        assert got[c]["explanation"] == want["explanation"], c
    point = _by_claim(tta.claims_at(cfg, *_interval_inputs(10)[:4], _interval_inputs(10)[4])[0])
    moved = [c for c in point if not point[c]["ours"] == pytest.approx(got[c]["ours"], nan_ok=True)]
    assert "PipeDream faster than model parallelism (low end) (this machine)" in moved
    assert tta.ASP_CLAIM in moved  # the delay model's seeds 5-9 at 16 GPUs are slower
    assert any("10 seeds per arm" in point[c]["explanation"] for c in point)
    assert not any("10 seeds per arm" in got[c]["explanation"] for c in got)


def test_each_row_takes_its_interval_over_the_ends_and_says_ours_there():
    cfg = tta.Config(gpus=(4, 16))
    inputs = _interval_inputs(10)
    rows, read = tta.interval_claims(cfg, *inputs)
    ends = {k: _by_claim(v) for k, v in tta.claim_ends(cfg, *inputs).items()}
    point = _by_claim(tta.claims_at(cfg, *inputs)[0])
    rows = _by_claim(rows)
    assert set(rows) == set(point) and set(read) >= {"statistical", "time_to_target", "asp_target", "asp_delay"}
    mp = "PipeDream faster than model parallelism (low end) (this machine)"
    vals = [point[mp]["ours"], ends["seeds 0-4"][mp]["ours"], ends["target 0.88"][mp]["ours"]]
    assert rows[mp]["low"] == pytest.approx(min(vals)) and rows[mp]["high"] == pytest.approx(max(vals))
    assert rows[mp]["low"] < rows[mp]["high"] and rows[mp]["ours"] == point[mp]["ours"]
    gp = "PipeDream faster than GPipe (this machine)"  # 5 epochs to 0.89, 3 to 0.88
    assert ends["target 0.88"][gp]["ours"] == pytest.approx(point[gp]["ours"] * 3 / 5)
    assert rows[gp]["low"] == pytest.approx(point[gp]["ours"] * 3 / 5) and rows[gp]["high"] == point[gp]["ours"]
    assert "seeds 0-4: " in rows[gp]["explanation"] and "target 0.88: " in rows[gp]["explanation"]
    vs = "vertical sync's effect on statistical efficiency is negligible (toy task)"
    assert point[vs]["ours"] == 1 and ends["target 0.88"][vs]["ours"] == 0  # lr 1 is read at 0.88: lower there
    assert (rows[vs]["low"], rows[vs]["high"], rows[vs]["verdict"]) == (0, 1, "consistent")
    lm = "vertical sync's effect on statistical efficiency is negligible (toy LM)"  # its own target
    assert lm not in ends["target 0.88"] and lm in ends["seeds 0-4"]
    assert "target 0.88" not in rows[lm]["explanation"] and "seeds 0-4: " in rows[lm]["explanation"]
    for c, r in rows.items():  # the interval is the hull of ours at the point and at every end that has the row
        at = [e[c]["ours"] for e in ends.values() if c in e] + [point[c]["ours"]]
        at = [v for v in at if math.isfinite(v)]
        if math.isfinite(r["ours"]):
            assert (r["low"], r["high"]) == pytest.approx((min(at), max(at))), c


def test_quick_mode_and_a_runs_own_seeds_or_target_have_no_end():
    inputs = _interval_inputs(10)
    quick = tta.quick_config(gpus=(4, 16))
    assert tta.interval_seeds(quick) == () and tta.claim_ends(quick, *inputs) == {}
    rows, _ = tta.interval_claims(quick, *inputs)
    assert rows and all(r["low"] == r["high"] or math.isnan(r["ours"]) for r in rows)
    assert not any("interval ends" in r["explanation"] for r in rows)
    assert tta.interval_seeds(tta.Config(seeds=tuple(range(12)))) == ()  # a superset is the user's seeds
    assert tta.interval_seeds(tta.Config(seeds=tuple(range(5)))) == ()
    assert set(tta.claim_ends(tta.Config(seeds=tuple(range(12)), gpus=(4, 16)), *inputs)) == {"target 0.88"}
    assert set(tta.claim_ends(tta.Config(target=0.85, gpus=(4, 16)), *inputs)) == {"seeds 0-4"}
    assert tta.seeds_text((0, 1, 2, 3, 4)) == "0-4" and tta.seeds_text((0, 2, 5)) == "0, 2, 5"


# ---- the modeled ASP row on the second stand-in task too (no training) ---------------------------
def _with_lm_asp(grids, asp_accs, pipedream_accs, lr=0.1):
    """``grids`` with the second task's grid at ``lr`` holding ASP and PipeDream curves (each seed's
    accuracies), other arms and another lr beside them that the row must not read."""
    lm = grids["toy-lm"]
    at = lambda scheme, accs, lr_, arm=None, **kw: curves_of(scheme, accs, **kw).assign(  # noqa: E731
        arm=arm or scheme, lr=lr_, cpu_s=1.0, task="toy-lm"
    )
    fast = [[0.9] * 6 for _ in range(10)]
    curves = pd.concat(
        [lm["curves"], at("dp-asp", asp_accs, lr, engine="runtime"), at("pipedream", pipedream_accs, lr),
         at("dp-asp", fast, 1.0, engine="runtime"), at("pipedream", [[0.0] * 6] * 10, 1.0),
         at("dp-bsp", fast, lr, arm="dp-bsp-global")],
        ignore_index=True,
    )  # fmt: skip
    return dict(grids, **{"toy-lm": dict(lm, curves=curves, lr=lr)})


def test_the_modeled_asp_row_also_spans_the_second_task():
    """ASP's level on the LM grid at its lr: the best accuracy of ASP's median curve, 0.40, reached
    by ASP at epoch 5 and PipeDream at 2; times PipeDream's speedup / ASP's at the row's GPU count."""
    cfg = tta.Config(gpus=(4, 16), seeds=tuple(range(12)), target=0.85)  # a run's own seeds and target: no end
    curves, speed, hw, grids, delay = _interval_inputs(10)
    assert tta.claim_ends(cfg, curves, speed, hw, grids, delay) == {}
    asp = [[0.1, 0.2, 0.3, 0.35, 0.4, 0.4] if s % 2 else [0.1, 0.2, 0.3, 0.35, 0.405, 0.41] for s in range(10)]
    two = _with_lm_asp(grids, asp, [[0.3, 0.45, 0.5, 0.5, 0.5, 0.5]] * 10)
    point, read = tta.claims_at(cfg, curves, speed, hw, two, delay)
    g = tta.asp_row_gpus(read["time_to_asp_target"], read["asp_delay"])
    assert f"at {g} GPUs (the max over [4, 16])" in _by_claim(point)[tta.ASP_CLAIM]["explanation"]
    s = hw.set_index(["scheme", "gpus"])["speedup_modeled"]
    want = 5 / 2 * s[("pipedream", g)] / s[("dp-asp", g)]
    ours, words = tta.task_asp_ratio(two["toy-lm"], hw, g)
    assert ours == pytest.approx(want) and "level (the best test accuracy of its median curve" in words
    assert "ASP 5 (10/10 seeds reached), PipeDream 2 (10/10)" in words and " 0.40;" in words
    rows = _by_claim(tta.interval_claims(cfg, curves, speed, hw, two, delay)[0])
    r, first = rows[tta.ASP_CLAIM], _by_claim(point)[tta.ASP_CLAIM]
    assert first["low"] == first["high"] == first["ours"] != pytest.approx(want)
    assert r["ours"] == first["ours"] and (r["low"], r["high"]) == pytest.approx(tuple(sorted([first["ours"], want])))
    assert r["low"] < r["high"]
    assert f"(task: toy LM), at {g} GPUs as above: {want:.3g}x" in r["explanation"]
    cell = protocol.parse_used(r["protocol"])
    assert len(cell) == len(r["protocol"].split("; "))  # no entry named twice
    assert cell["statistical_efficiency.lm_epochs"] == str(cfg.lm_epochs)
    assert set(cell) - set(protocol.parse_used(first["protocol"])) == {
        f"statistical_efficiency.{k}" for k in tta.LM_KEYS if k.startswith("lm_")
    }
    repeat = tta.ASP_CLAIM + " (this machine)"
    assert rows[repeat] == _by_claim(point)[repeat]  # the measured repeat row has no such end


def test_no_second_task_end_without_its_asp_curves_or_where_asp_does_not_learn_there():
    cfg = tta.Config(gpus=(4, 16))
    inputs = list(_interval_inputs(10))
    bare = _by_claim(tta.with_ends(tta.claims_at(cfg, *inputs)[0], tta.claim_ends(cfg, *inputs)))
    rows = _by_claim(tta.interval_claims(cfg, *inputs)[0])  # the toy LM grid has no ASP arm
    r = rows[tta.ASP_CLAIM]
    assert (r["low"], r["high"], r["ours"]) == (bare[tta.ASP_CLAIM]["low"], bare[tta.ASP_CLAIM]["high"], r["ours"])
    assert (
        "(task: toy LM)" in r["explanation"] and "none (its grid has no dp-asp and pipedream curves" in r["explanation"]
    )
    inputs[3] = _with_lm_asp(inputs[3], [[0.4] * 6] * 10, [[0.5] * 6] * 10)  # both at ASP's level after one epoch
    r = _by_claim(tta.interval_claims(cfg, *inputs)[0])[tta.ASP_CLAIM]
    assert (r["low"], r["high"]) == (bare[tta.ASP_CLAIM]["low"], bare[tta.ASP_CLAIM]["high"])
    assert "ASP does not learn there" in r["explanation"]


@pytest.mark.slow  # the LM's four rule curves and both tasks' arms within a budget of a few epochs
def test_the_second_task_is_measured_at_the_lr_and_target_its_rule_picks():
    """notebook 02 measures the epochs ratio on the second stand-in task too: the LM of the protocol's
    ``lm_*`` entries at the lr and target the protocol's rule picks on its BSP curves (notebook 03's
    rule), every arm as on the first task; the ratio is kept per task beside the first task's."""
    cfg = tta.Config(epochs=1, lm_epochs=1, seeds=(0,), target=0.01, check_epochs=0, processes=1)
    lm, rule = tta.second_task(cfg)
    v = protocol.value
    assert lm.model == v("statistical_efficiency.lm_model") and lm.epochs == 1 and lm.seeds == cfg.seeds
    assert lm.dataset_options == v("statistical_efficiency.lm_dataset_options")
    assert lm.samples_per_update == v("statistical_efficiency.lm_samples_per_update")
    assert sorted(rule["lr"]) == sorted(v("statistical_efficiency.lm_lr_grid")) and rule["chosen"].sum() == 1
    assert lm.lr == rule.loc[rule["chosen"], "lr"].iloc[0]
    assert lm.target == math.floor(100 * rule["worst_seed_best_accuracy"].max() + 1e-9) / 100
    arms = {("sosp-X", "m"): dict(plan=(1, 1, 2), paper=None)}
    table, out = tta.measured_epochs(cfg, arms, tasks=(lm,))
    assert set(table["task"]) == {cfg.model, lm.model}
    on_lm = table[table["task"] == lm.model]
    assert (on_lm["target"] == lm.target).all() and set(on_lm["config"]) == {"1-1-2", "data parallel"}
    assert sorted(set(on_lm["lr"])) == pytest.approx([lm.lr, 2 * lm.lr, 4 * lm.lr])
    second = out[("sosp-X", "m")]["tasks"][lm.model]
    assert second == tta.dp_global_batch_ratio(on_lm, lm, (1, 1, 2))
    assert "second stand-in task" in second["text"] and "second stand-in task" not in out[("sosp-X", "m")]["text"]

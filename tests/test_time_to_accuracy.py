"""Notebook 03 (time to accuracy): the module's pieces on small inputs, and the quick run's CSVs."""
import math
from pathlib import Path

import pandas as pd
import pytest

from workbench.experiments import CLAIM_COLUMNS
from workbench.experiments import time_to_accuracy as tta



# ---- pieces, no processes ------------------------------------------------------------------------
def test_epochs_to_target_first_epoch_at_or_above_target_and_nan_when_never():
    curves = pd.DataFrame(dict(setting="main", lr=0.1, scheme=["a"] * 3 + ["b"] * 3, seed=0, epoch=[1, 2, 3] * 2,
                               test_accuracy=[0.5, 0.9, 0.95, 0.5, 0.6, 0.7], test_loss=[1.0] * 5 + [math.nan],
                               wall_s=[1.0, 2.0, 3.0] * 2))
    got = tta.epochs_to_target(curves, 0.9).set_index("scheme")
    assert got.loc["a", "epochs_to_target"] == 2 and got.loc["a", "wall_s_to_target"] == 2.0
    assert math.isnan(got.loc["b", "epochs_to_target"]) and got.loc["b", "diverged"]
    assert got.loc["a", "wall_s_per_epoch"] == pytest.approx(1.0)
    stats = tta.statistical_summary(pd.concat([tta.epochs_to_target(curves, 0.9),
                                               tta.epochs_to_target(curves.assign(seed=1), 0.5)]))
    stats = stats.set_index("scheme")
    # mean over seeds; one seed that never reaches the target makes the scheme's time to target inf
    assert stats.loc["a", "epochs_to_target"] == pytest.approx(1.5) and stats.loc["a", "reached"] == 2
    assert stats.loc["b", "epochs_to_target"] == math.inf and stats.loc["b", "reached"] == 1


def test_modeled_hardware_on_cluster_a_vgg16():
    hw = tta.modeled_hardware("vgg16", tta.CLUSTER_A, (4, 8), ("pipedream", "dp-bsp", "model-parallel"))
    by = hw.set_index(["scheme", "gpus"])
    # on 4 GPUs PipeDream's optimal plan is one stage on all four: the same work as BSP, the same time
    assert by.loc[("pipedream", 4), "stages"] == 1
    assert by.loc[("pipedream", 4), "ms_per_minibatch_modeled"] == pytest.approx(
        by.loc[("dp-bsp", 4), "ms_per_minibatch_modeled"], rel=1e-9)
    # BSP's communication share jumps when training spans two servers over 10 Gbps
    assert by.loc[("dp-bsp", 8), "comm_share_modeled"] > 2 * by.loc[("dp-bsp", 4), "comm_share_modeled"]
    # model parallelism keeps one microbatch in flight: no speedup over one GPU
    assert by.loc[("model-parallel", 4), "speedup_modeled"] < 1
    assert (hw["speedup_modeled"] > 0).all() and hw["label"].str.startswith("modeled").all()


def test_bad_parameters_fail_with_one_clear_line():
    with pytest.raises(ValueError, match="unknown scheme"):
        tta.Config(schemes=("pipedream", "hogwild2"))
    with pytest.raises(ValueError, match="target"):
        tta.Config(target=1.5)
    with pytest.raises(ValueError, match="preset"):
        tta.Config(preset="9xA100")
    with pytest.raises(ValueError, match="whole number"):
        tta.modeled_hardware("vgg16", tta.CLUSTER_A, (6,), ("dp-bsp",))


# ---- the quick run's outputs ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def out03(quick_run):
    """The 03_time_to_accuracy folder of the session's ``workbench reproduce --quick`` (tests/conftest.py)."""
    return Path(quick_run) / "03_time_to_accuracy"


def test_claims_csv_has_the_contract_columns_and_labels(out03):
    claims = pd.read_csv(out03 / "claims.csv")
    assert tuple(claims.columns) == CLAIM_COLUMNS
    assert claims["label"].str.match(r"^(measured|modeled)").all()
    for claim_text in ("VGG-16 Cluster-A BSP speedup over 1 machine, 8 machines", "PipeDream faster than GPipe"):
        assert (claims["claim"] == claim_text).any()
    done = claims.dropna(subset=["ours"])
    assert (done["ratio"] - done["ours"] / done["paper"]).abs().max() < 1e-9
    page = (out03 / "figures.html").read_text()
    for title in ("Statistical efficiency", "Weight stashing ablation", "Measured on this machine", "Modeled: epochs"):
        assert title in page


def test_pipedream_with_stashing_reaches_the_target_and_without_stashing_does_worse(out03):
    """The ablation setting (a learning rate where staleness bites, several seeds): every seed of
    PipeDream with weight stashing reaches the target; without stashing fewer seeds do, or later, or
    to a lower final accuracy."""
    stats = pd.read_csv(out03 / "statistical.csv")
    stats = stats[stats["setting"] == "ablation"].set_index("scheme")
    stash, nostash = stats.loc["pipedream"], stats.loc["pipedream-no-stash"]
    assert stash["reached"] == stash["seeds"], "PipeDream with weight stashing must reach the target in every seed"
    worse = (nostash["reached"] < stash["reached"]
             or nostash["epochs_to_target"] > stash["epochs_to_target"]
             or nostash["final_accuracy"] < stash["final_accuracy"])
    assert worse, stats.loc[["pipedream", "pipedream-no-stash"]].to_string()
    assert stash["seeds"] >= 3


def test_pipedream_reaches_the_target_no_later_than_bsp_in_modeled_time_on_cluster_a(out03):
    """At the paper's headline size (16 GPUs = 4 Cluster-A servers) PipeDream's time to target is at
    most BSP's; where PipeDream's plan is plain data parallelism the two are the same scheme and tie."""
    tta_df = pd.read_csv(out03 / "time_to_target.csv")
    t = tta_df.pivot(index="gpus", columns="scheme", values="tta_single_gpu_epochs_modeled")
    assert t.loc[16, "pipedream"] <= t.loc[16, "dp-bsp"], t.to_string()
    stages = tta_df[tta_df["scheme"] == "pipedream"].set_index("gpus")["stages"]
    for gpus in stages[stages == 1].index:
        assert t.loc[gpus, "pipedream"] == pytest.approx(t.loc[gpus, "dp-bsp"])

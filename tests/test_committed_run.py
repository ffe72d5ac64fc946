"""The committed full run under ``results/reproduce/``: made by the current code's reproduction, it
has a row for every claim of the paper with its ``fit``, says which commit made it, and its
statistical-efficiency table separates ASP from BSP."""

from __future__ import annotations

import math

import pandas as pd

from repro import lr_grid as lg
from repro import paper_fit as cal
from repro import protocol
from repro.common import CLAIM_COLUMNS, FITS

#: Claims the reproduction must carry, as substrings of ``claims.csv``'s claim column.
REQUIRED = (
    "vgg16 arXiv Cluster-A BSP speedup over 1 GPU, 4 GPUs",
    "vgg16 arXiv Cluster-A PipeDream speedup over 1 GPU, 16 GPUs",
    "vgg16 arXiv Cluster-A BSP share of time communicating, 8 GPUs",
    "vgg16 arXiv Cluster-A PipeDream speedup over data parallelism to target accuracy, 8 GPUs",
    "inception_v3 arXiv Cluster-A BSP share of time communicating",
    "inception_v3 arXiv Cluster-A BSP speedup",
    "vgg16 arXiv Cluster-B PipeDream speedup over data parallelism",
    "inception_v3 arXiv Cluster-B PipeDream speedup over data parallelism",
    "S2VT stand-in) arXiv Cluster-A BSP speedup",
    "S2VT stand-in) arXiv Cluster-A PipeDream speedup over data parallelism",
    "vgg16 arXiv Cluster-A PipeDream's communication below data parallelism's, more than",
    "S2VT stand-in) arXiv Cluster-A PipeDream's communication stall time below data parallelism's",
    "arXiv v1 abstract: PipeDream up to this much faster in time-to-accuracy",
    "arXiv v1 abstract: PipeDream's communication up to this much below",
    "SOSP abstract: PipeDream up to this much faster in time-to-accuracy",
    "PipeDream faster than ASP to target accuracy",
    "SOSP Cluster-A PipeDream speedup over data parallelism",
    "gnmt_large SOSP Cluster-B",
    "awd-lstm SOSP Cluster-A",
    "S2VT stand-in) SOSP Cluster-C",
    "PipeDream speedup over model parallelism, the range over the models",  # SOSP's '2.6-15x': one range row
    "PipeDream speedup over GPipe",
    "up to this share of training time (max over Fig. 1)",
    "takeaway 1: the overhead is high for many models",
    "takeaway 2: the overhead spikes, then plateaus",
    "takeaway 3: the overhead grows with the number of workers",
    "takeaway 4: the overhead is higher on V100s than on 1080 Tis",
    "data parallelism scales well for ResNet-50",
    "naive model parallelism is no faster than one GPU",
    "PipeDream's 1F1B has no pipeline flush in steady state",
    "vertical sync's effect on statistical efficiency is negligible",
    "naive pipelining (no weight stashing) does not reach data parallelism's accuracy",
    "PipeDream's statistical efficiency is comparable to data parallelism's",
    "model parallelism beats data parallelism through smaller minibatches",
    "bytes/sample saved vs DP",
    "PipeDream speedup over hybrid parallelism",
)


def test_the_committed_run_says_which_code_made_it(committed_run):
    summary = (committed_run / "summary.md").read_text()
    assert "Mode: **full**" in summary and "Code: commit " in summary and "at the start" in summary
    assert "## How close" in summary and "## Hardware settings" in summary


def test_every_claim_has_a_row_with_its_fit(committed_run):
    claims = pd.read_csv(committed_run / "claims.csv")
    assert tuple(claims.columns[1:]) == CLAIM_COLUMNS and set(claims["fit"]) <= set(FITS)
    for text in REQUIRED:
        assert claims["claim"].str.contains(text, regex=False).any(), text
    # every paper number of the calibration has its row, in-sample exactly where it calibrates
    cal_rows = claims[claims["experiment"] == cal.EXPERIMENT].reset_index(drop=True)
    # a range claim's two numbers are one row (its low end's), then the abstracts' "up to" claims
    # (maxima of the rows above), the qualitative rows (three of SOSP, two of the arXiv notes) and
    # the untestable ones
    nums = [n for n in cal.PAPER if n.quantity not in cal.RANGES.values()]
    n_up, tail = len(cal.ABSTRACT_CLAIMS), ["holds"] * 5 + ["point"] * len(cal.UNTESTABLE)
    assert len(cal_rows) == len(nums) + n_up + len(tail)
    assert list(cal_rows["comparison"].iloc[len(nums) :]) == ["up to"] * n_up + tail
    for row, num in zip(cal_rows.itertuples(), nums):
        assert row.fit == ("in-sample" if num.role == "dp" else "out-of-sample") and row.paper == num.paper
    assert (cal_rows["comparison"] == "range").sum() == len(cal.RANGES)
    # a measured number is never a fitted one
    assert (claims.loc[claims["label"].str.startswith("measured"), "fit"] == "none").all()


def test_no_two_claims_hold_the_same_measured_number(committed_run):
    claims = pd.read_csv(committed_run / "claims.csv")
    measured = claims[
        claims["label"].str.startswith("measured")
        & claims["ours"].map(math.isfinite)
        & (claims["comparison"] != "holds")  # a qualitative row's count (0 or 1) is no measured number
    ]
    assert not measured.duplicated(subset=["ours", "unit"]).any(), measured[
        measured.duplicated(["ours", "unit"], keep=False)
    ]


def test_every_large_gap_names_its_cause(committed_run):
    claims = pd.read_csv(committed_run / "claims.csv")
    off = claims[(claims["ratio"] - 1).abs() > 0.25]
    assert off["explanation"].fillna("").str.len().gt(20).all()
    assert not off["explanation"].fillna("").str.contains("no cause identified").any()


def test_statistical_efficiency_separates_asp_from_bsp(committed_run):
    out = committed_run / "03_time_to_accuracy"
    sig = pd.read_csv(out / "significance.csv")
    row = sig[(sig["scheme"] == "dp-asp") & (sig["baseline"] == "dp-bsp")].iloc[0]
    assert row["p_mannwhitney"] < 0.05
    stats = pd.read_csv(out / "statistical.csv").set_index("scheme")
    assert stats.loc["dp-bsp", "epochs_mean"] >= 10  # the task needs >= 10 epochs of BSP to its target


def test_every_statistical_claim_stands_on_ten_seeds_and_two_tasks_over_the_whole_grid(committed_run):
    out = committed_run / "03_time_to_accuracy"
    grid = pd.read_csv(out / "grid.csv")
    assert set(grid["task"]) == {"cnn1d", "awd-lstm"} and (grid["seeds"] >= 10).all()
    for task, key in (("cnn1d", "lr_grid"), ("awd-lstm", "lm_lr_grid")):
        g = grid[grid["task"] == task]
        lrs = sorted(protocol.value(f"statistical_efficiency.{key}"))
        assert all(sorted(a["lr"]) == lrs for _, a in g.groupby("arm")), task  # every arm over the whole grid
    comp = pd.read_csv(out / "grid_comparisons.csv")
    assert comp["p_best_accuracy"].between(0, 1).all() and (comp["seeds"] >= 10).all()
    claims = pd.read_csv(committed_run / "claims.csv")
    for c in lg.CLAIMS:
        rows = claims[claims["claim"].str.startswith(c.words)]
        assert len(rows) == 2 and rows["explanation"].str.contains("10 seeds per arm").all(), c.words

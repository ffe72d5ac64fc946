"""Notebook 03's tables as shown (repro.few_seeds): with two seeds (quick mode) the interval and the
tests read "not computed" with the reason, an epoch count no seed reached reads "not reached"; with
enough seeds the numbers stay."""

from __future__ import annotations

import math

import pandas as pd

from repro import convergence as cv
from repro.few_seeds import significance_shown, statistical_shown


def per_seed(epochs: dict[str, list[float]]) -> pd.DataFrame:
    rows = [
        dict(scheme=s, engine="reference", target=0.3, epochs_to_target=e, budget=3, final_accuracy=0.4, diverged=False)
        for s, es in epochs.items()
        for e in es
    ]
    return pd.DataFrame(rows)


def test_two_seeds_show_no_interval_and_no_tests():
    seeds = per_seed({"pipedream": [2.0, 3.0], "bsp": [1.0, math.nan]})  # bsp's second seed never reached
    stats = cv.scheme_summary(seeds)
    assert stats.loc[0, "ci_low"] < 0  # the t interval from two seeds reaches below zero epochs
    shown = statistical_shown(stats)
    assert shown.loc[0, "ci_low"] == "not computed: 2 seed(s), a 95% interval needs 3"
    assert shown.loc[0, "epochs_mean"] == 2.5 and shown.loc[1, "epochs_mean"].startswith("not reached (1/2 seeds")
    sig = significance_shown(cv.compare(seeds, "pipedream"), dict(zip(stats["scheme"], stats["seeds"], strict=True)))
    assert sig.loc[0, "p_mannwhitney"] == "not computed: 2 vs 2 seeds (an exact U test cannot fall below 0.33)"
    assert sig.loc[0, "ratio"].startswith("not reached")
    assert "inf" not in shown.to_string() + sig.to_string()


def test_enough_seeds_keep_the_numbers():
    seeds = per_seed({"pipedream": [2.0, 3.0, 2.0, 4.0], "bsp": [1.0, 2.0, 1.0, 2.0]})
    stats = cv.scheme_summary(seeds)
    shown = statistical_shown(stats)
    assert shown.loc[0, "ci_low"] == stats.loc[0, "ci_low"] and shown.loc[0, "ci_high"] == stats.loc[0, "ci_high"]
    sig = significance_shown(cv.compare(seeds, "pipedream"), dict(zip(stats["scheme"], stats["seeds"], strict=True)))
    assert isinstance(sig.loc[0, "p_mannwhitney"], float) and isinstance(sig.loc[0, "p_welch"], float)

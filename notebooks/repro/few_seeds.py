"""Notebook 03's statistics tables as shown: a figure that cannot be computed from the seeds run (quick
mode runs two) reads "not computed" with the reason, and a count of epochs no seed reached reads "not
reached", not ``inf``. The CSVs keep the numbers; only what the notebook displays changes.

* a 95% Student-t interval needs :data:`MIN_SEEDS` seeds: from two, ``t_{0.975, 1} = 12.7`` standard
  errors a side, wide enough to reach below zero epochs;
* an exact Mann-Whitney U test of ``n`` against ``m`` seeds cannot fall below
  ``2 / C(n + m, n)`` (1/3 for two a side), so with fewer than :data:`MIN_SEEDS` a side it can never
  reject; Welch's t-test needs two a side and every seed at the target.
"""

from __future__ import annotations

import math

import pandas as pd

#: seeds per scheme below which the interval and the tests are not computed
MIN_SEEDS = 3
_EPOCH_COLUMNS = ("epochs_mean", "ci_low", "ci_high", "epochs_median", "epochs_min", "epochs_max")


def statistical_shown(stats: pd.DataFrame) -> pd.DataFrame:
    """``time_to_accuracy``'s ``statistical`` table (:func:`repro.convergence.scheme_summary`) for display."""
    out = stats.astype({c: object for c in _EPOCH_COLUMNS if c in stats.columns})
    for i, row in stats.iterrows():
        if row["seeds"] < MIN_SEEDS:
            why = f"not computed: {row['seeds']} seed(s), a 95% interval needs {MIN_SEEDS}"
            out.loc[i, ["ci_low", "ci_high"]] = why
        for c in _EPOCH_COLUMNS:
            v = row[c]
            if isinstance(v, float) and math.isinf(v) and not str(out.loc[i, c]).startswith("not computed"):
                out.loc[i, c] = f"not reached ({row['reached']}/{row['seeds']} seeds reached the target)"
    return out


def significance_shown(significance: pd.DataFrame, seeds: dict[str, int]) -> pd.DataFrame:
    """The ``significance`` table (:func:`repro.convergence.compare` rows) for display; ``seeds``: the
    seeds run per scheme (the ``statistical`` table's ``seeds``)."""
    out = significance.astype({c: object for c in significance.columns if c.startswith(("p_", "ratio"))})
    for i, row in significance.iterrows():
        n, m = seeds.get(row["scheme"], 0), seeds.get(row["baseline"], 0)
        if min(n, m) < MIN_SEEDS:
            why = (
                f"not computed: {n} vs {m} seeds (an exact U test cannot fall below {2 / math.comb(n + m, n):.2g})"
                if n and m
                else "not computed: no seeds"
            )
            for c in ("p_mannwhitney", "p_welch", "p_final_accuracy"):
                if c in out.columns:
                    out.loc[i, c] = why
        elif "p_welch" in out.columns and isinstance(row["p_welch"], float) and math.isnan(row["p_welch"]):
            out.loc[i, "p_welch"] = "not computed: a seed did not reach the target"
        for c in ("ratio", "ratio_median"):
            v = row.get(c)
            if isinstance(v, float) and math.isinf(v):
                out.loc[i, c] = "not reached: a seed of this scheme never reached the target"
    return out

"""Notebook 03's grid: every weight rule over the whole learning-rate grid on two stand-in tasks; the
exact Mann-Whitney test, Hodges-Lehmann shifts, verdicts and the claim rule on small inputs, and the
quick run's grid tables."""

import math
from itertools import combinations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from repro import convergence as cv
from repro import lr_grid as lg
from repro import protocol
from repro import time_to_accuracy as tta


def _enumerated_p(x, y):
    """Two-sided Mann-Whitney p by listing every split (the definition), inf ranked last."""
    big = max(np.where(np.isfinite(v), v, 0).max() for v in (x, y)) + 1
    a, b = np.where(np.isfinite(x), x, big), np.where(np.isfinite(y), y, big)
    n, m = len(a), len(b)
    r = stats.rankdata(np.concatenate([a, b]))
    c = n * (n + m + 1) / 2
    d = abs(r[:n].sum() - c)
    return np.mean([abs(r[list(k)].sum() - c) >= d - 1e-9 for k in combinations(range(n + m), n)])


def test_the_exact_mann_whitney_p_equals_listing_every_split_with_ties_and_infs():
    rng = np.random.default_rng(3)
    for t in range(40):
        n, m = rng.integers(2, 7, 2)
        x, y = rng.integers(0, 4, n).astype(float), rng.integers(0, 4, m).astype(float)
        if t % 3 == 0:
            x[0] = math.inf
        assert cv.mannwhitney_p(x, y) == pytest.approx(_enumerated_p(x, y), abs=1e-12), (x, y)


def test_ten_seeds_a_side_reach_a_p_of_about_1e_minus_5():
    p = cv.mannwhitney_p(np.arange(10.0), np.arange(10.0) + 10)
    assert p == pytest.approx(2 / math.comb(20, 10)) and p < 2e-5
    assert cv.mannwhitney_p(np.arange(5.0), np.arange(5.0) + 5) == pytest.approx(2 / 252)


def test_hodges_lehmann_shift_and_its_moses_interval():
    x = np.arange(10.0)
    shift, lo, hi = cv.hodges_lehmann(x + 3, x)
    assert shift == 3 and lo < 3 < hi
    d = np.sort((x[:, None] + 3 - x[None, :]).ravel())
    assert (lo, hi) == (d[23], d[100 - 24])  # n = m = 10 at 5%: the 24th smallest and largest difference
    assert all(math.isnan(v) for v in cv.hodges_lehmann([1.0, 2.0], [1.0, 3.0])[1:])  # too few for an interval
    assert cv.cliffs_delta([2, 3], [1, 1]) == 1 and cv.cliffs_delta([1, math.inf], [1, 2]) == pytest.approx(0.25)


def test_verdicts_read_the_interval_against_the_margin():
    assert cv.verdict(-0.01, 0.015, 0.5, 0.02, 0.05) == "equivalent"
    assert cv.verdict(-0.2, -0.05, 0.001, 0.02, 0.05) == "lower"
    assert cv.verdict(0.05, 0.2, 0.001, 0.02, 0.05) == "higher"
    assert cv.verdict(-0.2, -0.05, 0.2, 0.02, 0.05) == "inconclusive"  # not significant
    assert cv.verdict(-0.05, 0.01, 0.01, 0.02, 0.05) == "inconclusive"  # straddles the margin
    assert cv.verdict(math.nan, 0.01, 0.5, 0.02, 0.05) == "inconclusive"


def _grid_curves(arms: dict, lrs=(0.1, 1.0), seeds=10, epochs=4):
    """Curves whose seed s of arm a at lr reaches ``level(lr) + s/1000`` at the last epoch."""
    rows = []
    for arm, level in arms.items():
        for lr in lrs:
            for s in range(seeds):
                for e in range(1, epochs + 1):
                    acc = level(lr) * e / epochs + s / 1000
                    rows.append(dict(arm=arm, scheme=arm, lr=lr, seed=s, epoch=e, test_accuracy=acc, test_loss=1.0,
                                     engine="reference", cpu_s=1.0))  # fmt: skip
    return pd.DataFrame(rows)


def test_the_grid_compares_every_arm_at_every_lr_and_the_claim_rule_reads_it():
    curves = _grid_curves(
        {"dp-bsp": lambda lr: 0.8, "same": lambda lr: 0.8, "worse": lambda lr: 0.5 if lr > 0.5 else 0.8}
    )
    summary = cv.grid_summary(curves, 0.7, 0.1)
    assert len(summary) == 6 and summary["learns"].all() and (summary["seeds"] == 10).all()
    comp = cv.grid_comparisons(curves, [("same", "dp-bsp"), ("worse", "dp-bsp")], 0.7, cv.Reading())
    v = comp.set_index(["arm", "lr"])["verdict_margin_point"]
    assert v[("same", 0.1)] == v[("same", 1.0)] == "equivalent" and v[("worse", 1.0)] == "lower"
    assert comp.set_index(["arm", "lr"]).loc[("worse", 1.0), "p_best_accuracy"] < 1e-4
    learns = {0.1: True, 1.0: True}
    same, worse = comp[comp["arm"] == "same"], comp[comp["arm"] == "worse"]
    col = "verdict_margin_point"
    assert cv.claim_verdict(same, learns, {"equivalent"}, {"lower", "higher"}, col) == "holds"
    assert cv.claim_verdict(worse, learns, {"equivalent"}, {"lower", "higher"}, col) == "contradicted"
    assert cv.claim_verdict(worse, {0.1: True}, {"equivalent"}, {"lower"}, col) == "holds"  # 1.0 not read
    assert cv.claim_verdict(worse, {}, {"equivalent"}, {"lower"}, col) == "untestable"


def test_two_seeds_give_not_computed_not_numbers():
    curves = _grid_curves({"dp-bsp": lambda lr: 0.8, "same": lambda lr: 0.8}, seeds=2)
    comp = cv.grid_comparisons(curves, [("same", "dp-bsp")], 0.7, cv.Reading())
    assert (comp["verdict_margin_point"] == "not computed").all() and comp["p_best_accuracy"].isna().all()
    learns = {0.1: True, 1.0: True}
    assert cv.claim_verdict(comp, learns, {"equivalent"}, {"lower"}, "verdict_margin_point") == "not computed"
    view = lg.summary_view(cv.grid_summary(curves, 0.7, 0.1), 5)
    assert (view["best_accuracy_min"] == "not computed").all()


def test_the_protocol_gives_ten_seeds_and_two_tasks_of_different_families():
    assert len(protocol.value("statistical_efficiency.seeds")) >= 10
    cfg = tta.Config()
    first, lm = lg.tasks(cfg.setup, cfg.seeds, cfg.lm_epochs)
    assert first.setup.model == "cnn1d" and lm.setup.model == "awd-lstm"
    assert first.lrs == tuple(protocol.value("statistical_efficiency.lr_grid"))
    assert lm.lrs == tuple(protocol.value("statistical_efficiency.lm_lr_grid")) and lm.setup.epochs == cfg.lm_epochs
    job = cv.job_for(lm.setup, "pipedream", 0, None)
    x, y = job.dataset_fn().tensors
    assert x.shape[1] == protocol.value("statistical_efficiency.lm_dataset_options")["seq_len"]
    assert int(y.max()) < protocol.value("statistical_efficiency.lm_model_options")["vocab_size"]
    assert 0 < cv.majority_accuracy(lm.setup) < 0.5  # the most frequent character (a space) is not the task


def test_the_quick_run_has_every_arm_at_every_lr_of_both_tasks_quick_grids(out03):
    """The quick run's grids: every other learning rate of the protocol's (tta.QUICK), the first
    task's holding the protocol's lr; every arm at each."""
    grid = pd.read_csv(out03 / "grid.csv")
    cfg = pd.read_json(out03 / "config.json", typ="series")
    assert cfg["lr_grid_every"] == tta.QUICK["lr_grid_every"] == 2
    for task, key in (("cnn1d", "lr_grid"), ("awd-lstm", "lm_lr_grid")):
        g = grid[grid["task"] == task]
        whole = protocol.value(f"statistical_efficiency.{key}")
        assert sorted(set(g["lr"])) == sorted(whole[::2]) and len(whole[::2]) == 2, task
        arms = set(cv.SCHEMES) | {lg.GLOBAL}
        assert set(g["arm"]) == arms and len(g) == len(arms) * g["lr"].nunique(), task
        assert (g["seeds"] == len(cfg["seeds"])).all() and (g["cpu_s_per_curve"].dropna() > 0).all()
    seeds = pd.read_csv(out03 / "grid_seeds.csv")  # what the comparisons read, one row per seed
    assert len(seeds) == grid["seeds"].sum() and not seeds.duplicated(["task", "arm", "lr", "seed"]).any()
    again = seeds.groupby(["task", "arm", "lr"])["best_accuracy"].median()
    assert np.allclose(again.loc[list(zip(grid["task"], grid["arm"], grid["lr"]))], grid["best_accuracy_median"])
    comp = pd.read_csv(out03 / "grid_comparisons.csv")
    assert (comp["verdict_margin_point"] == "not computed").all()  # two seeds: no statistic
    claims = pd.read_csv(out03 / "claims.csv")
    for c in lg.CLAIMS:
        rows = claims[claims["claim"].str.startswith(c.words)]
        assert len(rows) == 2 and rows["ours"].isna().all(), c.words  # both tasks; not computed on two seeds
        assert rows["explanation"].str.contains("not computed").all()


def test_claim_rows_say_holds_or_contradicted_with_every_lr_in_words():
    same = _grid_curves({"dp-bsp": lambda lr: 0.8, "pipedream": lambda lr: 0.8, lg.VSYNC: lambda lr: 0.8})
    worse = _grid_curves({"dp-bsp": lambda lr: 0.8, "pipedream": lambda lr: 0.8, lg.VSYNC: lambda lr: 0.5})
    task = lg.Task("t", "toy task", cv.Setup(epochs=4), (0.1, 1.0), tuple(range(10)))
    for curves, value in ((same, 1.0), (worse, 0.0)):
        arms = list(dict.fromkeys(curves["arm"]))
        g = dict(summary=cv.grid_summary(curves, 0.7, 0.1),
                 comparisons=cv.grid_comparisons(curves, lg.pairs(arms), 0.7, lg.reading()))  # fmt: skip
        rows = {r["claim"]: r for r in lg.claim_rows(task, g, "")}
        row = rows["vertical sync's effect on statistical efficiency is negligible (toy task)"]
        assert row["ours"] == value and row["comparison"] == "holds"
        assert "lr 0.1 (baseline learns)" in row["explanation"] and "lr 1 (baseline learns)" in row["explanation"]
        assert "10 seeds per arm" in row["explanation"] and "own best lr" in row["explanation"]


def test_a_grid_read_again_at_fewer_seeds_or_another_target_is_recomputed_from_its_curves():
    """read_at (a protocol interval's end, nothing run): the summary and comparisons of the grid's
    curves restricted to the seeds, or at the target (which decides where the baseline learns)."""
    curves = _grid_curves({"dp-bsp": lambda lr: 0.8 if lr < 0.5 else 0.489, "same": lambda lr: 0.8})
    task = lg.Task("t", "toy task", cv.Setup(epochs=4), (0.1, 1.0), tuple(range(10)))
    g = dict(curves=curves, target=0.89, majority=0.1, **lg.grid_tables(task, curves, 0.89, 0.1))
    five = lg.read_at(task, g, seeds=range(5))
    want = lg.grid_tables(task, curves[curves["seed"] < 5], 0.89, 0.1)
    assert (five["summary"]["seeds"] == 5).all() and set(five["curves"]["seed"]) == set(range(5))
    pd.testing.assert_frame_equal(five["summary"], want["summary"])
    pd.testing.assert_frame_equal(five["comparisons"], want["comparisons"])
    assert g["summary"].set_index(["arm", "lr"]).loc[("dp-bsp", 1.0), "learns"] == False  # noqa: E712
    low = lg.read_at(task, g, target=0.88)
    assert low["target"] == 0.88 and (low["summary"]["target"] == 0.88).all()
    assert low["summary"].set_index(["arm", "lr"]).loc[("dp-bsp", 1.0), "learns"] == True  # noqa: E712
    assert g["target"] == 0.89 and len(g["curves"]) == len(curves)  # the grid itself is left as it was


def test_a_grid_step_below_one_is_one_line():
    with pytest.raises(ValueError, match=r"^lm_epochs, processes and lr_grid_every must be >= 1, got 3, 1 and 0$"):
        tta.Config(lm_epochs=3, processes=1, lr_grid_every=0)

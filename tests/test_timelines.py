"""Notebook 04 (pipeline timelines): closed forms vs the simulator, and the quick run's CSVs."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import workbench as wb
from workbench.experiments import CLAIM_COLUMNS
from workbench.experiments import timelines as tl


@pytest.mark.parametrize("workers,microbatches", [(2, 6), (4, 8), (4, 12)])
def test_unit_cost_simulation_equals_every_closed_form(workers, microbatches):
    """GPipe / 1F1B (p-1)/(m+p-1), interleaved (p-1)/(vm+p-1), ZB-H1 (p-1)/(3m+p-1), model parallel
    (p-1)/p, data parallel 0: the simulator with F=1, B=2 reproduces each."""
    checked = 0
    for name in tl.schedule_names():
        sched = tl.build_for(name, workers, microbatches)
        formula, _ = tl.closed_form_bubble(sched)
        sim = wb.simulate(sched, fwd=1.0, bwd=2.0)
        assert tl.bubble_fraction(sim.timeline) == pytest.approx(float(np.mean(sim.metrics["bubble_fraction"])))
        if math.isfinite(formula):
            assert tl.bubble_fraction(sim.timeline) == pytest.approx(formula, abs=1e-12), name
            checked += 1
    assert checked >= 14


def test_bubble_fraction_of_a_hand_made_timeline():
    t = pd.DataFrame(dict(worker=[0, 0, 1], kind=["F", "B", "F"], start=[0.0, 1.0, 1.0], end=[1.0, 3.0, 2.0]))
    # makespan 3; worker 0 busy 3 -> 0, worker 1 busy 1 -> 2/3; mean 1/3
    assert tl.bubble_fraction(t) == pytest.approx(1 / 3)
    # per-worker span: worker 0 spans [0, 3] busy 3 -> 0; worker 1 spans [1, 2] busy 1 -> 0; worst 0
    assert tl.span_bubble_fraction(t) == 0.0
    gap = pd.DataFrame(dict(worker=[0, 0], kind=["F", "BW"], start=[0.0, 3.0], end=[1.0, 4.0]))
    assert tl.span_bubble_fraction(gap) == pytest.approx(0.5)  # span 4, work 2
    # one worker busy throughout, op times that do not sum exactly to the makespan: 0, not -2e-16
    full = pd.DataFrame(
        dict(worker=[0, 0, 0], kind=["F", "B", "STEP"], start=[0.0, 0.24, 2.36], end=[0.24, 2.36, 5.61])
    )
    assert 1 - (full["end"] - full["start"]).groupby(full["worker"]).sum()[0] / 5.61 < 0  # what sums give
    assert tl.bubble_fraction(full) == 0.0


def test_compute_stretch_matches_the_same_ops_and_weights_by_time():
    """Worker 0's ops took 2x their modeled cost, worker 1's 4x (two STEPs share a key: matched in
    start order); a communication op and an op the model lacks do not count."""
    modeled = pd.DataFrame(
        dict(worker=[0, 0, 0, 0, 1], stage=[0, 0, 0, 0, 1], microbatch=[0, 0, -1, -1, 0],
             kind=["F", "B", "STEP", "STEP", "F"], start=[0.0, 1.0, 3.0, 4.0, 1.0], end=[1.0, 3.0, 4.0, 6.0, 2.0])
    )  # fmt: skip
    measured = pd.DataFrame(
        dict(worker=[0, 0, 0, 0, 1, 1], stage=[0, 0, 0, 0, 1, 1], microbatch=[0, 0, -1, -1, 0, 0],
             kind=["F", "B", "STEP", "STEP", "F", "send_act"], start=[0.0, 5.0, 9.0, 12.0, 3.0, 7.0],
             end=[2.0, 9.0, 11.0, 16.0, 7.0, 50.0])
    )  # fmt: skip
    overall, by_worker = tl.compute_stretch(measured, modeled)
    assert by_worker[0] == pytest.approx(2.0) and by_worker[1] == pytest.approx(4.0)
    assert overall == pytest.approx((12 + 4) / (6 + 1))  # time-weighted, not the mean of the workers
    # an op the modeled timeline lacks has no stage cost to compare with: left out
    extra = pd.concat([measured, pd.DataFrame([dict(worker=1, stage=1, microbatch=5, kind="F", start=60.0, end=99.0)])])
    assert tl.compute_stretch(extra, modeled)[0] == pytest.approx(overall)
    why = tl._explain(0.25, 0.25, 0.3, 0.4, (3.5, 2.0, 4.0, 0.33), tl.Config())
    assert "3.50x" in why and "has bubble 0.330" in why and "accounts for +0.030" in why and "for +0.070" in why


def test_a_uniform_stretch_leaves_the_modeled_bubble_unchanged_an_uneven_one_does_not():
    """The replay behind ``bubble_modeled_stretched``: every timing of stage s times factor[s]."""
    from types import SimpleNamespace

    from workbench.calibrate import StageProfile
    from workbench.profiler import Profile

    layers = pd.DataFrame(dict(name=["a", "b"], fwd_ms=[1.0, 1.5], bwd_ms=[2.0, 2.5], act_bytes=[8.0, 8.0],
                               param_bytes=[4.0, 4.0]))  # fmt: skip
    costs = StageProfile(Profile(layers, {}), ((0, 0), (1, 1)), (0.3, 0.4), 8, 1, (1.0, 1.5), (2.0, 2.5))
    job = SimpleNamespace(schedule=tl.build_for("gpipe", 2, 4))
    base = tl.bubble_fraction(tl.modeled(job, costs, 2).timeline)
    twice = tl.stretched_costs(costs, pd.Series({0: 2.0, 1: 2.0}))
    assert twice.fwd_ms == (2.0, 3.0) and twice.step_ms == (0.6, 0.8) and twice.bwd_input_ms == ()
    assert tl.bubble_fraction(tl.modeled(job, twice, 2).timeline) == pytest.approx(base, abs=1e-12)
    uneven = tl.stretched_costs(costs, pd.Series({1: 3.0}))  # stage 0 absent: factor 1
    assert uneven.fwd_ms == (1.0, 4.5)
    assert tl.bubble_fraction(tl.modeled(job, uneven, 2).timeline) > base + 0.05


def test_bad_parameters_fail_with_one_clear_line():
    with pytest.raises(ValueError, match="unknown schedule"):
        tl.Config(schedules=("gpipe", "pipedream-3bw"))
    with pytest.raises(ValueError, match="workers >= 2"):
        tl.Config(workers=1)


@pytest.fixture(scope="module")
def out04(quick_run):
    """The 04_pipeline_timelines folder of the session's ``workbench reproduce --quick`` (tests/conftest.py)."""
    return Path(quick_run) / "04_pipeline_timelines"


def test_every_schedule_is_run_or_skipped_with_a_reason(out04):
    table = pd.read_csv(out04 / "bubbles.csv")
    skipped = pd.read_csv(out04 / "skipped.csv")
    assert set(table["schedule"]) | set(skipped["schedule"]) == set(tl.schedule_names())
    assert skipped["reason"].str.len().gt(10).all()
    page = (out04 / "timelines.html").read_text()
    assert page.count("plotly-graph-div") >= len(table)
    for name in table["schedule"]:
        assert f"{name}: " in page
        assert (out04 / "runs" / name / "timeline.csv").exists()
        assert not (out04 / "runs" / name / "checkpoints").exists()


def test_measured_and_modeled_bubbles_are_fractions_and_closed_forms_match_the_unit_simulation(out04):
    table = pd.read_csv(out04 / "bubbles.csv")
    for col in ("bubble_modeled", "bubble_measured"):
        assert table[col].between(0, 1).all(), table[["schedule", col]]
    known = table.dropna(subset=["closed_form"])
    assert np.allclose(known["closed_form"], known["bubble_unit_sim"], atol=1e-12)
    assert table["explanation"].str.len().gt(20).all()
    # 1F1B-family schedules keep more than one microbatch stashed on the first worker; model parallelism one
    peaks = table.set_index("schedule")["peak_stash_modeled"]
    assert peaks["model-parallel"] == 1 and peaks["gpipe"] > 1
    claims = pd.read_csv(out04 / "claims.csv")
    assert tuple(claims.columns) == CLAIM_COLUMNS and claims["label"].str.startswith("measured").all()


def test_every_row_quotes_its_measured_compute_stretch(out04):
    """The measured-vs-modeled gap's cause as a number: each row's compute ops over the same ops'
    stage costs timed alone, recomputed from the run's two timelines and quoted in its explanation."""
    table = pd.read_csv(out04 / "bubbles.csv")
    claims = pd.read_csv(out04 / "claims.csv").set_index("claim")["explanation"]
    for r in table.itertuples():
        run = out04 / "runs" / r.schedule
        want, by_worker = tl.compute_stretch(
            pd.read_csv(run / "timeline.csv"), pd.read_csv(run / "timeline_modeled.csv")
        )
        assert r.compute_stretch_measured == pytest.approx(want) and want > 0.5, r.schedule
        assert r.compute_stretch_worker_min <= want <= r.compute_stretch_worker_max
        assert f"took {want:.2f}x their stage costs" in r.explanation
        assert f"has bubble {r.bubble_modeled_stretched:.3f}" in r.explanation
    assert claims.str.contains("compute_stretch_measured").all()

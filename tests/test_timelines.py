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

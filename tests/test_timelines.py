"""Notebook 04 (pipeline timelines): closed forms vs the simulator, and the quick run's CSVs."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import workbench as wb
from repro import CLAIM_COLUMNS
from repro import timelines as tl
from repro.pages import TIME_DECIMALS

#: the most a time in a run folder's timeline CSVs moved when written (rounded to 0.1 µs, after every
#: number was computed from the full-precision timelines: repro.pages.rounded_times)
ROUNDED_MS = 0.5 * 10.0**-TIME_DECIMALS


def stretch_range(measured: pd.DataFrame, modeled: pd.DataFrame) -> tuple[float, float]:
    """The least and the most :func:`tl.compute_stretch` of the full-precision timelines that two
    rounded ones can come from: every duration within ``2 * ROUNDED_MS`` (the ratio of two sums of
    durations is monotone in each, so the extremes shift every measured and modeled one apart)."""
    d = 2 * ROUNDED_MS

    def shifted(t: pd.DataFrame, by: float) -> pd.DataFrame:
        return t.assign(end=t["end"] + by)

    lo = tl.compute_stretch(shifted(measured, -d), shifted(modeled, d))[0]
    hi = tl.compute_stretch(shifted(measured, d), shifted(modeled, -d))[0]
    return lo, hi


def bubble_slack(timeline: pd.DataFrame) -> float:
    """The most :func:`tl.bubble_fraction` of a rounded timeline can differ from the full-precision
    one's: per worker ``1 - busy / L`` with busy off by up to ``2 * ROUNDED_MS`` per op (n ops) and the
    makespan ``L`` by ``2 * ROUNDED_MS`` moves by at most ``2 * ROUNDED_MS * (n + 1) / L`` (busy <= L)."""
    comp = timeline[timeline["kind"].isin(tl.BUSY_KINDS)]
    span = comp["end"].max() - comp["start"].min()
    return 2 * ROUNDED_MS * (int(comp.groupby("worker").size().max()) + 1) / span + 1e-12


@pytest.mark.slow
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
    why = tl._explain(0.25, 0.25, 0.3, 0.4, (3.5, 2.0, 4.0, 0.33), cfg=tl.Config())
    assert "3.50x" in why and "has bubble 0.330" in why and "accounts for +0.030" in why and "for +0.070" in why


def test_a_uniform_stretch_leaves_the_modeled_bubble_unchanged_an_uneven_one_does_not():
    """The replay behind ``bubble_modeled_stretched``: every timing of stage s times factor[s]."""
    from types import SimpleNamespace

    from workbench.profiling.measure import Profile
    from workbench.runtime.calibration.machine import StageProfile

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
    for bad in (0.0, -5, math.inf, "20"):
        with pytest.raises(ValueError, match="timed_ms"):
            tl.Config(timed_ms=bad)
    with pytest.raises(ValueError, match="timed_steps"):
        tl.Config(timed_steps=0)


@pytest.mark.parametrize("workers", [2, 4])
def test_back_to_back_rounds_of_equal_costs_keep_each_closed_form(workers):
    """Why a timed run's bubble over R rounds compares with a one-round closed form: with F = t,
    B = 2t (BI = BW = t), STEP and communication free, R rounds back to back have exactly one round's
    bubble for every schedule with a claim (:func:`tl.compare_timed`'s ``bubble_unit_sim_timed``)."""
    from workbench.runtime.calibration.machine import repeat_rounds

    claimed = 0
    for name in tl.schedule_names():
        sched = tl.build_for(name, workers, 8, {"interleaved-1f1b": {"chunks": 2}}.get(name))
        if tl.has_closed_form(sched):
            sim = wb.simulate(repeat_rounds(sched, 3), fwd=20.0, bwd=40.0)
            assert tl.bubble_fraction(sim.timeline) == pytest.approx(tl.closed_form_bubble(sched)[0], abs=1e-12), name
            claimed += 1
    assert claimed >= 10


def _run_like(sim_timeline: pd.DataFrame, shift_ms: float = 0.0) -> pd.DataFrame:
    """A simulated timeline with the runtime's columns (no waits, no sends)."""
    t = sim_timeline[sim_timeline["lane"] == "compute"].drop(columns=["lane"])
    return t.assign(start=t["start"] + shift_ms, end=t["end"] + shift_ms, wait_ms=0.0, send_at=math.nan)


def test_replaying_a_timeline_with_its_own_op_times_gives_its_bubble():
    """:func:`tl.replay_costs` charges every op its stage's mean measured time: replaying a timeline
    whose ops are uneven by stage and split (ZB-H1: stage 0's BI 0, its BW the whole backward, as the
    runtime runs the timed model) reproduces that timeline's bubble, not the closed form's."""
    from workbench.profiling.measure import Profile
    from workbench.runtime.calibration.machine import repeat_rounds

    sched = tl.build_for("zb-h1", 4, 8)
    rows = [dict(name=f"s{s}", fwd_ms=20.0 + s, bwd_ms=40.0, bwd_input_ms=0.0 if s == 0 else 20.0,
                 bwd_weight_ms=40.0 if s == 0 else 20.0, act_bytes=0.0, param_bytes=0.0) for s in range(4)]  # fmt: skip
    plan = wb.Plan.from_boundaries([0, 1, 2, 3], [1, 1, 1, 1])
    kw = dict(profile=Profile(pd.DataFrame(rows), {}), plan=plan, step_ms=[0.5] * 4, microbatch_fraction=1.0)
    truth = wb.simulate(repeat_rounds(sched, 2), **kw).timeline
    got = wb.simulate(repeat_rounds(sched, 2), **tl.replay_costs(sched, _run_like(truth)))
    assert tl.bubble_fraction(got.timeline) == pytest.approx(tl.bubble_fraction(truth), abs=1e-9)
    assert tl.op_ms(_run_like(truth)).loc[0, "BI"] == 0.0 and tl.op_ms(_run_like(truth)).loc[3, "F"] == 23.0
    assert abs(tl.bubble_fraction(truth) - tl.closed_form_bubble(sched)[0]) > 1e-3


def test_message_latency_counts_only_messages_the_receiver_waited_for():
    """F(1, 0) waited from 10 for the activation F(0, 0) sent at 12 and started at 13.5 (latency 1.5);
    F(1, 1) found its activation there (it began waiting at 30, after the send at 25): not a latency;
    B(0, 0) waited for the gradient B(1, 0) sent at 40 and started at 40.5 (0.5); median 1.0. Between
    ops, outside them and their waits: worker 1's F(1, 1) after F(1, 0) ends at 29.9 (0.1)."""
    t = pd.DataFrame(
        dict(worker=[0, 0, 1, 1, 1, 0], stage=[0, 0, 1, 1, 1, 0], microbatch=[0, 1, 0, 1, 0, 0],
             kind=["F", "F", "F", "F", "B", "B"], start=[0.0, 13.0, 13.5, 30.0, 31.0, 40.5],
             end=[12.0, 25.0, 29.9, 31.0, 40.0, 50.0], wait_ms=[0.0, 0.0, 3.5, 0.01, 0.0, 15.5],
             send_at=[12.0, 25.0, math.nan, math.nan, 40.0, math.nan])
    )  # fmt: skip
    assert tl.message_latency_ms(t) == pytest.approx(1.0)
    assert tl.message_latency_ms(t.iloc[:2]) != tl.message_latency_ms(t.iloc[:2])  # no message: NaN
    # worker 0: F(0,1) 13.0 - 12.0 - 0 = 1.0, B(0,0) 40.5 - 25.0 - 15.5 = 0; worker 1: 0.09, 0.0
    assert tl.op_gap_ms(t) == pytest.approx(np.median([1.0, 0.0, 30.0 - 29.9 - 0.01, 0.0]))


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
    stage costs timed alone, recomputed from the run's two timelines and quoted in its explanation.
    The row's number comes from the full-precision timelines, the files keep times to 0.1 µs
    (``ROUNDED_MS``): the recomputation pins it to the interval that rounding allows
    (:func:`stretch_range`, rigorous) instead of ``pytest.approx``'s relative 1e-6, which a 0.1 µs
    rounding of sub-ms ops exceeds (1.3e-6 on the committed run's pp and lpp)."""
    table = pd.read_csv(out04 / "bubbles.csv")
    claims = pd.read_csv(out04 / "claims.csv").set_index("claim")["explanation"]
    for r in table.itertuples():
        run = out04 / "runs" / r.schedule
        measured, modeled = pd.read_csv(run / "timeline.csv"), pd.read_csv(run / "timeline_modeled.csv")
        want, _ = tl.compute_stretch(measured, modeled)
        lo, hi = stretch_range(measured, modeled)
        # a ratio of matched ops' times: positive and finite; its size depends on the load while the
        # costs and the run were timed (0.497 once on CI), so no bound on it is the code's to pass
        assert lo <= r.compute_stretch_measured <= hi and 0 < want < math.inf, r.schedule
        assert r.compute_stretch_worker_min <= r.compute_stretch_measured <= r.compute_stretch_worker_max
        assert f"took {r.compute_stretch_measured:.2f}x their stage costs" in r.explanation
        assert f"has bubble {r.bubble_modeled_stretched:.3f}" in r.explanation
    # the claims quote the timed runs' causes and point to the model's own explanation
    assert claims.str.contains("compute_stretch_timed").all() and claims.str.contains("bubble_measured").all()


def test_claims_come_from_the_timed_runs(out04):
    """Every schedule with a closed form has a claims row whose number is the bubble of its timed run
    (recomputed from that run's timeline to within what its 0.1 µs rounding allows, :func:`bubble_slack`,
    not ``pytest.approx``'s relative 1e-6, which that rounding can exceed), not of the model's run; the
    ops of the timed runs took their set times; the unit-cost simulation of the same rounds equals the
    closed form."""
    table = pd.read_csv(out04 / "bubbles.csv").set_index("schedule")
    claims = pd.read_csv(out04 / "claims.csv")
    t = float(pd.read_json(out04 / "config.json", typ="series")["timed_ms"])
    known = table[table["closed_form"] > 0]
    assert len(claims) == len(known) > 0
    for c in claims.itertuples():
        name = c.claim.split(" bubble fraction")[0]
        r = table.loc[name]
        run = tl.measured_timeline({"out": out04 / tl.TIMED_RUNS / name})
        assert c.ours == pytest.approx(r.bubble_measured_timed)
        assert tl.bubble_fraction(run) == pytest.approx(c.ours, rel=0, abs=bubble_slack(run))
        assert c.ours != pytest.approx(r.bubble_measured, abs=1e-9)
        assert f"sleep t = {t:g} ms" in c.label and c.fit == "none"
        assert r.bubble_unit_sim_timed == pytest.approx(r.closed_form, abs=1e-12)
        assert t <= r.timed_fwd_ms < 1.5 * t and 2 * t <= r.timed_bwd_ms < 1.5 * 2 * t, name
        # wall-time sleeps cannot beat the closed form by more than their noise; the replay with the
        # run's measured op times and message latency accounts for what the run adds
        assert r.bubble_measured_timed > r.closed_form - 0.02, name
        assert abs(r.bubble_measured_timed - r.bubble_timed_replayed_latency) < 0.05, name
        assert "replaying the run" in c.explanation
    assert table.loc[table["closed_form"].isna(), "bubble_measured_timed"].isna().all()

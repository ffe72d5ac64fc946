"""Notebook 04's run folders keep their timelines' times to 0.1 µs (:mod:`repro.pages`): every time
within half of that of the full-precision value, every other column as it was, the file shorter."""

import csv
import math

import numpy as np
import pandas as pd
import pytest

import workbench as wb
from repro import pages
from repro import timelines as tl

HALF_STEP_MS = 0.5e-4  # half of 0.1 µs, in ms: the most rounding to 4 decimals may move a time
RUNTIME_COLUMNS = ["worker", "stage", "microbatch", "kind", "start", "end", "version", "round", "wait_ms",
                   "send_ms", "data_ms", "send_at", "step"]  # fmt: skip


def modeled_timeline() -> pd.DataFrame:
    """A simulated timeline with costs whose sums print with full float repr (1/3 ms, 2/7 ms, ...)."""
    return wb.simulate(tl.build_for("gpipe", 2, 4), fwd=1 / 3, bwd=2 / 7, transfer=1 / 9).timeline


def measured_timeline(rng) -> pd.DataFrame:
    """A runtime-like timeline (the runtime's columns; ``send_at`` missing on some rows)."""
    n = 40
    start = np.cumsum(rng.uniform(0.1, 3.0, n)) + rng.uniform(0, 1e-3)
    send_at = start + rng.uniform(0.05, 2.0, n)
    send_at[::3] = math.nan
    return pd.DataFrame(
        dict(worker=np.arange(n) % 2, stage=np.arange(n) % 2, microbatch=np.arange(n) // 2 - 1, kind="F",
             start=start, end=start + rng.uniform(0.05, 2.0, n), version=0, round=np.arange(n) // 10,
             wait_ms=rng.uniform(0, 0.5, n) * (np.arange(n) % 2), send_ms=rng.uniform(0, 0.1, n),
             data_ms=rng.uniform(0, 2.0, n), send_at=send_at, step=np.arange(n) // 10)
    )[RUNTIME_COLUMNS]  # fmt: skip


def write_like_the_runtime(df: pd.DataFrame, path) -> None:
    """As the runtime writes ``timeline.csv``: :mod:`csv` (``\\r\\n`` line ends, missing values ``nan``)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(df.columns)
        w.writerows(df.itertuples(index=False))


def assert_rounded_copy(before: pd.DataFrame, after: pd.DataFrame) -> None:
    """``after`` is ``before`` with every time within HALF_STEP_MS, every other column equal."""
    assert list(after.columns) == list(before.columns) and (after.dtypes == before.dtypes).all()
    times = pages.time_columns(before)
    for c in before.columns:
        if c in times:
            assert after[c].isna().equals(before[c].isna()), c
            assert (after[c] - before[c]).abs().max() <= HALF_STEP_MS * (1 + 1e-9), c
        else:
            assert after[c].equals(before[c]), c


def test_time_columns_are_the_times_only():
    assert pages.time_columns(measured_timeline(np.random.default_rng(0))) == [
        "start", "end", "wait_ms", "send_ms", "data_ms", "send_at"
    ]  # fmt: skip
    assert pages.time_columns(modeled_timeline()) == ["start", "end"]  # not bytes, ids or counters


def test_rounded_times_moves_every_time_by_at_most_half_a_tenth_of_a_microsecond():
    for t in (modeled_timeline(), measured_timeline(np.random.default_rng(1))):
        r = pages.rounded_times(t)
        assert_rounded_copy(t, r)
        for c in pages.time_columns(t):
            assert np.allclose(r[c].dropna(), np.round(r[c].dropna(), 4), rtol=0, atol=1e-12), c
        assert not t.equals(r)  # a copy; the input keeps full precision
    assert pages.rounded_times(modeled_timeline())["start"].max() == pytest.approx(
        modeled_timeline()["start"].max(), abs=HALF_STEP_MS
    )


@pytest.mark.parametrize("writer", ["runtime", "pandas"])
def test_rounding_a_timeline_csv_keeps_its_values_and_shortens_it(tmp_path, writer):
    """The rewritten file reads back as the full-precision one to within HALF_STEP_MS per time, keeps
    the file's spelling of missing values and line ends, and is shorter by a fifth or more; every
    time in it has at most 4 decimals."""
    path = tmp_path / "timeline.csv"
    if writer == "runtime":
        full = measured_timeline(np.random.default_rng(2))
        write_like_the_runtime(full, path)
    else:
        full = modeled_timeline()
        full.to_csv(path, index=False)
    raw = path.read_bytes()
    before, after = pages.round_timeline_csv(path)
    new = path.read_bytes()
    assert (before, after) == (len(raw), len(new))
    assert after < 0.8 * before, (before, after)
    back = pd.read_csv(path)
    assert_rounded_copy(full, back)
    assert (b"\r\n" in new) == (b"\r\n" in raw) and (b",nan" in new) == (b",nan" in raw)
    header = new.decode().splitlines()[0].split(",")
    for line in new.decode().splitlines()[1:]:
        for name, field in zip(header, line.split(",")):
            if name in pages.time_columns(full) and "." in field:
                assert len(field.split(".")[1]) <= 4, (name, field)
    # rounding again changes nothing
    assert pages.round_timeline_csv(path) == (after, after) and path.read_bytes() == new


def test_every_run_folder_is_rounded_once_its_numbers_are_computed(tmp_path):
    """:func:`pages.round_run_timelines` rewrites the named files of every run folder and skips a
    missing one; a number computed from the full-precision timeline (its bubble) is recomputed from
    the file to within what the rounding allows."""
    rng = np.random.default_rng(3)
    runs = []
    for i in range(3):
        out = tmp_path / f"run{i}"
        out.mkdir()
        write_like_the_runtime(measured_timeline(rng), out / "timeline.csv")
        if i:
            modeled_timeline().to_csv(out / "timeline_modeled.csv", index=False)
        runs.append({"out": str(out)})
    full = {r["out"]: pd.read_csv(f"{r['out']}/timeline.csv") for r in runs}
    bubbles = {k: tl.bubble_fraction(v) for k, v in full.items()}
    before, after = pages.round_run_timelines(runs)
    assert 0 < after < 0.8 * before
    for out, t in full.items():
        back = pd.read_csv(f"{out}/timeline.csv")
        assert_rounded_copy(t, back)
        span = t["end"].max() - t["start"].min()
        slack = 2 * HALF_STEP_MS * (t.groupby("worker").size().max() + 1) / span
        assert abs(tl.bubble_fraction(back) - bubbles[out]) <= slack

"""Tests of the plotly timelines (structure of the figure, not pixels)."""

from __future__ import annotations

import pandas as pd
import pytest

from workbench.schedules.core import Op, Schedule
from workbench.simulation import simulate
from workbench.viz.plot import compare_figure, save_html, timeline_figure


def _pipeline(S=3, M=4) -> Schedule:
    """GPipe by hand: all forwards, then all backwards, then a STEP."""
    ops = [
        [Op("F", s, b) for b in range(M)] + [Op("B", s, b) for b in range(M)] + [Op("STEP", s, step=0)]
        for s in range(S)
    ]
    return Schedule("gpipe", S, S, M, ops, tuple((s,) for s in range(S)), microbatches_per_step=M)


@pytest.fixture(scope="module")
def timeline() -> pd.DataFrame:
    return simulate(_pipeline(), fwd=1, bwd=2, transfer=0.25).timeline


def test_one_trace_per_kind_and_lanes(timeline):
    fig = timeline_figure(timeline, title="gpipe")
    names = [t.name for t in fig.data]
    assert sorted(names) == sorted(timeline["kind"].unique())  # F, B, STEP, send_act, send_grad
    assert len(names) == len(set(names))
    for t in fig.data:  # every op drawn exactly once, in its kind's trace
        assert len(t.x) == (timeline["kind"] == t.name).sum()
    # transfers sit on the sender's comm lane: activations leave w0, w1; gradients leave w2, w1
    lanes = {t.name: set(t.y) for t in fig.data}
    assert lanes["send_act"] == {"w0 comm", "w1 comm"} and lanes["send_grad"] == {"w1 comm", "w2 comm"}
    assert all(not y.endswith("comm") for t in fig.data if t.name in ("F", "B") for y in t.y)
    # boxes start at op start and last for the op's duration
    f = next(t for t in fig.data if t.name == "F")
    rows = timeline[timeline["kind"] == "F"]
    assert list(f.base) == pytest.approx(list(rows["start"]))
    assert list(f.x) == pytest.approx(list(rows["end"] - rows["start"]))


def test_forward_and_backward_look_different(timeline):
    fig = timeline_figure(timeline)
    f = next(t for t in fig.data if t.name == "F")
    b = next(t for t in fig.data if t.name == "B")
    assert f.marker.pattern.shape != b.marker.pattern.shape
    assert b.marker.line.width > f.marker.line.width
    assert set(b.text) == {"B"} and f.text is None
    # colour follows the microbatch: F and B of the same microbatch share a colour
    fc = dict(zip(timeline.loc[timeline["kind"] == "F", "microbatch"], f.marker.color))
    bc = dict(zip(timeline.loc[timeline["kind"] == "B", "microbatch"], b.marker.color))
    assert fc == bc and len(set(fc.values())) == len(fc)
    assert "microbatch" in f.hovertemplate and "version" in f.hovertemplate


def test_html_is_standalone_and_mentions_op_count(timeline, tmp_path):
    fig = timeline_figure(timeline, title="gpipe")
    path = save_html(fig, tmp_path / "t.html")
    html = path.read_text()
    assert f"{len(timeline)} ops" in html
    assert 'src="https://cdn.plot.ly' not in html and len(html) > 1_000_000  # plotly.js embedded: offline


def test_compare_side_by_side_and_measured_schema(timeline):
    measured = timeline[timeline["lane"] == "compute"][["worker", "stage", "microbatch", "kind", "start", "end"]].copy()
    measured[["start", "end"]] *= 1.1
    fig = compare_figure({"modeled": timeline, "measured": measured})
    axes = {t.yaxis for t in fig.data}
    assert axes == {"y", "y2"}
    assert sum(t.showlegend is not False for t in fig.data) == timeline["kind"].nunique()


def test_large_timeline_is_capped_with_warning(timeline):
    with pytest.warns(UserWarning, match="drawing"):
        fig = timeline_figure(timeline, max_ops=10)
    assert sum(len(t.x) for t in fig.data) <= 12


def test_bad_timeline_is_rejected():
    with pytest.raises(ValueError, match="lacks columns"):
        timeline_figure(pd.DataFrame({"worker": [0], "start": [0.0]}))


def test_compare_aligns_each_timeline_to_zero():
    from workbench.viz.plot import compare_figure

    a = pd.DataFrame(dict(worker=[0], stage=[0], microbatch=[0], kind=["F"], start=[300.0], end=[301.0]))
    b = pd.DataFrame(dict(worker=[0], stage=[0], microbatch=[0], kind=["F"], start=[0.0], end=[2.0]))
    fig = compare_figure({"measured": a, "modeled": b})
    bases = sorted(float(x) for tr in fig.data for x in (tr.base if tr.base is not None else []))
    assert bases == [0.0, 0.0]
    unaligned = compare_figure({"measured": a, "modeled": b}, align=False)
    assert sorted(float(x) for tr in unaligned.data for x in (tr.base if tr.base is not None else [])) == [0.0, 300.0]


def test_save_html_uses_one_shared_plotlyjs_when_asked(tmp_path, monkeypatch):
    import plotly.graph_objects as go

    from workbench.viz.plot import SHARED_PLOTLYJS_ENV, save_html, write_shared_plotlyjs

    fig = go.Figure(go.Bar(x=[1, 2], y=[3, 4]))
    embedded = save_html(fig, tmp_path / "embedded.html")
    monkeypatch.setenv(SHARED_PLOTLYJS_ENV, str(write_shared_plotlyjs(tmp_path)))
    shared = save_html(fig, tmp_path / "nb" / "fig.html")
    assert 'src="../plotly.min.js"' in shared.read_text()
    assert shared.stat().st_size < embedded.stat().st_size / 100  # 4.8 MB of plotly.js not repeated


def test_multi_figure_pages_load_plotlyjs_once_from_the_shared_file(tmp_path, monkeypatch):
    """Notebooks 02-04 write several figures into one page: with a run's shared plotly.min.js the
    page references it (once) instead of embedding 4.8 MB, so a committed run stays small."""
    import plotly.graph_objects as go

    from repro.pages import save_page
    from workbench.viz.plot import SHARED_PLOTLYJS_ENV, write_shared_plotlyjs

    figs = {"a": go.Figure(go.Scatter(y=[1, 2])), "b": go.Figure(go.Bar(y=[3]))}
    embedded = save_page(figs, tmp_path / "embedded.html", "t")
    assert embedded.read_text().count("plotly.js v") == 1
    monkeypatch.setenv(SHARED_PLOTLYJS_ENV, str(write_shared_plotlyjs(tmp_path)))
    shared = save_page(figs, tmp_path / "nb" / "page.html", "t")
    assert shared.read_text().count('src="../plotly.min.js"') == 1
    assert shared.stat().st_size < embedded.stat().st_size / 100


def test_the_time_axis_names_its_unit(timeline):
    assert timeline_figure(timeline).layout.xaxis.title.text == "time (ms)"
    assert timeline_figure(timeline, unit="unit").layout.xaxis.title.text == "time (unit)"
    fig = compare_figure({"a": timeline, "b": timeline})
    assert [ax.title.text for ax in (fig.layout.xaxis, fig.layout.xaxis2) if ax.title.text] == ["time (ms)"]

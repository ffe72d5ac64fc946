"""Chrome / Perfetto traces of modeled and measured timelines (workbench.viz.trace), and the
measured breakdown (workbench.runtime.calibration.wall_time)."""

import json
from collections import Counter

import pandas as pd
import pytest
from runtime_checks import small_mlp_run

from workbench.runtime.calibration.wall_time import PARTS, breakdown
from workbench.schedules import build
from workbench.simulation import simulate
from workbench.viz.trace import to_chrome_trace, version_counts


def _check_structure(trace: dict, tl: pd.DataFrame) -> list[dict]:
    ev = trace["traceEvents"]
    assert {e["ph"] for e in ev} == {"M", "X", "s", "f", "C"}
    # flows pair up: one start and one finish per id, start not after finish, across two workers
    flows = {}
    for e in ev:
        if e["ph"] in "sf":
            flows.setdefault(e["id"], {})[e["ph"]] = e
    assert flows and all(set(f) == {"s", "f"} for f in flows.values())
    backwards = [f for f in flows.values() if not (f["s"]["ts"] <= f["f"]["ts"] and f["s"]["pid"] != f["f"]["pid"])]
    assert not backwards, backwards[:3]
    # every flow starts inside a compute slice of its producer and ends at the start of its consumer
    xs = [e for e in ev if e["ph"] == "X" and e["tid"] == 0]
    for f in flows.values():
        assert any(x["pid"] == f["s"]["pid"] and x["ts"] <= f["s"]["ts"] <= x["ts"] + x["dur"] for x in xs)
        assert any(x["pid"] == f["f"]["pid"] and x["ts"] == f["f"]["ts"] for x in xs)
    # compute slices: exactly the timeline's compute rows, durations equal in µs
    comp = tl[tl["lane"] == "compute"] if "lane" in tl else tl
    assert len(xs) == len(comp)
    want = sorted((r.end - r.start) * 1e3 for r in comp.itertuples())
    assert sorted(x["dur"] for x in xs) == pytest.approx(want, rel=1e-12, abs=1e-9)
    # counters never negative, back to zero when every stashed microbatch was released
    counters = [e for e in ev if e["ph"] == "C" and e["name"] == "stashed microbatches"]
    for w in {e["pid"] for e in counters}:
        vals = [e["args"]["stashed"] for e in counters if e["pid"] == w]
        assert min(vals) == 0 and vals[-1] == 0
    return ev


def test_modeled_trace_structure(tmp_path):
    sched = build("pipedream-flush", 3, 6)
    res = simulate(sched, fwd=[1.0, 1.5, 1.0], bwd=[2.0, 3.0, 2.0], transfer=0.5, step_ms=0.25)
    ev = _check_structure(to_chrome_trace(res.timeline, tmp_path / "trace.json", label="test"), res.timeline)
    loaded = json.loads((tmp_path / "trace.json").read_text())
    assert loaded["otherData"]["timeline"] == "modeled" and len(loaded["traceEvents"]) == len(ev)
    # communication lane: the simulator's transfers, with their modeled durations
    comm = res.timeline[res.timeline["lane"] == "comm"]
    assert len(comm) > 0
    assert sorted(e["dur"] for e in ev if e["ph"] == "X" and e["tid"] == 1) == pytest.approx(
        sorted((comm.end - comm.start) * 1e3)
    )
    # one flow per microbatch per boundary and direction: 2 boundaries x 2 directions x 6
    assert Counter(e["name"] for e in ev if e["ph"] == "s") == {"activation": 12, "gradient": 12}
    # the stash counter's peak is the simulator's own peak_activations (1F1B: S - w on worker w)
    for w in range(3):
        peak = max(e["args"]["stashed"] for e in ev if e["name"] == "stashed microbatches" and e["pid"] == w)
        assert peak == res.metrics["peak_activations"][w] == 3 - w


def test_split_backward_releases_at_bw(tmp_path):
    res = simulate(build("zb-h1", 2, 4), fwd=1.0, bwd=2.0)
    ev = _check_structure(to_chrome_trace(res.timeline), res.timeline)
    assert (
        max(e["args"]["stashed"] for e in ev if e["name"] == "stashed microbatches" and e["pid"] == 0)
        == res.metrics["peak_activations"][0]
    )


@pytest.mark.parametrize(
    "name,workers,microbatches,options",
    [
        ("pipedream", 4, 8, {}),
        ("pipedream", 3, 6, {"weights": "vertical-sync"}),
        ("pipedream", 3, 6, {"weights": "no-stash"}),
        ("pipedream-2bw", 3, 6, {}),
        ("pipedream-2bw", 3, 12, {"microbatches_per_step": 3}),
        ("pipedream-flush", 3, 6, {}),
        ("gpipe", 2, 4, {}),
        ("zb-h1", 3, 6, {}),
        ("interleaved-1f1b", 2, 4, {}),
        ("dp-bsp", 2, 4, {}),
    ],
)
def test_weight_versions_counter_peaks_at_the_simulators_figure(name, workers, microbatches, options):
    """The modeled trace's ``weight versions`` counter, derived from the timeline's rows, peaks per
    stage at the simulator's ``weight_versions`` (its own rule, from the op lists): PipeDream's S - w
    stashed versions, vertical sync's, 2BW's two (the next version, read only in the next round,
    beside the one its forwards still read), one for the flush schedules."""
    res = simulate(build(name, workers, microbatches, **options), fwd=1.0, bwd=2.0, step_ms=0.3)
    vc = version_counts(res.timeline)
    per_worker = vc.groupby(["worker", "stage"]).versions.max().groupby("worker").max()
    assert per_worker.tolist() == res.metrics["weight_versions"]
    assert vc.versions.min() >= 1
    trace = to_chrome_trace(res.timeline)
    held = {
        w: max(e["args"]["versions"] for e in trace["traceEvents"] if e["name"] == "weight versions" and e["pid"] == w)
        for w in per_worker.index
    }
    # the trace sums a worker's stages (interleaved: two stages, one version each)
    stages = vc.groupby("worker").stage.nunique()
    assert all(per_worker[w] <= held[w] <= per_worker[w] * stages[w] for w in held)


def test_simulator_counts_the_next_version_2bw_reads_only_in_the_next_round():
    """2BW, 3 stages, 6 microbatches, an update every 3: the first update's version is read by no op
    of this round (the forwards read one version behind), yet the worker holds it beside version 0
    until the round's last backward (the runtime holds both too: the measured test below, 2BW on 2
    ranks, checks its peak_versions against the trace's count)."""
    res = simulate(build("pipedream-2bw", 3, 6), fwd=1.0, bwd=2.0)
    assert res.metrics["weight_versions"] == [2, 2, 2]


@pytest.mark.distributed
@pytest.mark.parametrize(
    "schedule,options,stream",
    [
        ("pipedream", {}, False),
        ("pipedream-2bw", {"microbatches_per_step": 2}, False),
        ("pipedream", {"weights": "vertical-sync"}, True),
    ],
)
def test_measured_weight_versions_counter_matches_the_runtime(tmp_path, schedule, options, stream):
    """A real 2-rank run: the measured trace's weight-version counts per stage peak at the versions
    the runtime itself held (``peak_versions``: its version table and the stashed graphs' versions)."""
    summary = small_mlp_run(
        schedule, tmp_path / "run", microbatches=4, steps=3, schedule_options=options, stream=stream
    )
    vc = version_counts(pd.read_csv(tmp_path / "run" / "timeline.csv"))
    got = vc.groupby(["worker", "stage"]).versions.max().to_dict()
    want = {(r["rank"], int(s)): m["peak_versions"] for r in summary["ranks"] for s, m in r["memory"].items()}
    assert got == want and max(want.values()) >= 2


def test_weight_versions_counter_skips_shared_weights():
    """Hogwild's ranks update one shared copy: a rank's STEPs create versions with gaps (the other
    ranks' updates between them), so the counter has no sequence to follow and shows nothing for it."""
    rows = [
        (0, 0, 0, "F", 0.0, 1.0, 0, 0),
        (0, 0, 0, "B", 1.0, 3.0, 0, 0),
        (0, 0, -1, "STEP", 3.0, 3.5, 2, 0),
        (0, 0, 1, "F", 3.5, 4.5, 3, 1),
        (0, 0, 1, "B", 4.5, 6.5, 4, 1),
        (0, 0, -1, "STEP", 6.5, 7.0, 5, 1),
    ]
    tl = pd.DataFrame(rows, columns=["worker", "stage", "microbatch", "kind", "start", "end", "version", "round"])
    assert version_counts(tl).empty
    assert not [e for e in to_chrome_trace(tl)["traceEvents"] if e.get("name") == "weight versions"]


def _measured_like() -> pd.DataFrame:
    """A hand-made 2-rank measured timeline (runtime columns): F0 | F1 B1 | B0 STEP, one round."""
    rows = [
        (0, 0, 0, "F", 0.0, 4.0, 0, 0, 0.0, 1.0, 0.5),
        (1, 1, 0, "F", 5.0, 8.0, 0, 0, 1.0, 0.0, 0.2),
        (1, 1, 0, "B", 8.5, 14.0, 0, 0, 0.0, 1.5, 0.0),
        (1, 1, -1, "STEP", 14.0, 15.0, 1, 0, 0.0, 0.0, 0.0),
        (0, 0, 0, "B", 15.0, 20.0, 0, 0, 3.0, 0.0, 0.0),
        (0, 0, -1, "STEP", 20.0, 21.0, 1, 0, 0.0, 0.0, 0.0),
    ]
    cols = [
        "worker",
        "stage",
        "microbatch",
        "kind",
        "start",
        "end",
        "version",
        "round",
        "wait_ms",
        "send_ms",
        "data_ms",
    ]
    nan = float("nan")
    send_at = [3.0, nan, 12.5, nan, nan, nan]  # where each op's send began (ms)
    return pd.DataFrame(rows, columns=cols).assign(send_at=send_at, step=lambda d: d["round"])


def test_measured_trace_comm_lane():
    tl = _measured_like()
    ev = _check_structure(to_chrome_trace(tl), tl)
    comm = sorted((e["name"], e["ts"], e["dur"]) for e in ev if e["ph"] == "X" and e["tid"] == 1)
    assert comm == [
        ("recv wait s0 mb0", 12000.0, 3000.0),
        ("recv wait s1 mb0", 4000.0, 1000.0),
        ("send s0 mb0", 3000.0, 1000.0),
        ("send s1 mb0", 12500.0, 1500.0),
    ]


def test_breakdown_adds_up_to_the_step():
    bd = breakdown(_measured_like())
    # window: 0 .. 21 ms, one round
    assert bd["step_ms"].tolist() == [21.0, 21.0]
    assert bd[PARTS].sum(axis=1).tolist() == pytest.approx([21.0, 21.0])
    w0, w1 = bd.loc[0], bd.loc[1]
    assert (w0.compute_ms, w0.recv_wait_ms, w0.send_ms, w0.data_ms, w0.optimizer_ms) == pytest.approx(
        (7.5, 3.0, 1.0, 0.5, 1.0)
    )
    assert (w1.compute_ms, w1.recv_wait_ms, w1.send_ms, w1.data_ms, w1.optimizer_ms) == pytest.approx(
        (6.8, 1.0, 1.5, 0.2, 1.0)
    )
    assert w1.overhead_ms == pytest.approx(21 - 6.8 - 1.0 - 1.5 - 0.2 - 1.0)
    with pytest.raises(ValueError, match="first round"):
        breakdown(_measured_like(), first_round=3)


def test_empty_timeline_is_a_clear_error():
    with pytest.raises(ValueError, match="no rows"):
        to_chrome_trace(_measured_like().iloc[:0])


@pytest.mark.slow
def test_train_writes_a_measured_trace(tmp_path):
    """A real 2-rank run: the CLI's drawing step writes trace.json beside timeline.html; its compute
    slices are the measured timeline's ops, the recv-wait slices its wait_ms."""
    from workbench.cli.train import draw_timeline

    summary = small_mlp_run("pipedream-flush", tmp_path / "run", microbatches=2, steps=2)
    draw_timeline(summary)
    tl = pd.read_csv(tmp_path / "run" / "timeline.csv")
    trace = json.loads((tmp_path / "run" / "trace.json").read_text())
    assert trace["otherData"]["timeline"] == "measured"
    ev = _check_structure(trace, tl)
    waits = sorted(e["dur"] for e in ev if e["ph"] == "X" and e["cat"] == "recv wait")
    assert waits == pytest.approx(sorted(tl.wait_ms[tl.wait_ms > 0] * 1e3))
    sends = sorted((e["ts"], e["dur"]) for e in ev if e["ph"] == "X" and e["cat"] == "send")
    sent = tl[tl.send_at.notna()].sort_values("send_at")
    assert len(sends) == len(sent) > 0
    assert [v for e in sends for v in e] == pytest.approx(
        [v for e in zip(sent.send_at * 1e3, sent.send_ms * 1e3) for v in e]
    )
    bd = breakdown(tl)
    assert bd[PARTS].sum(axis=1).to_numpy() == pytest.approx(bd.step_ms.to_numpy())
    assert (bd[PARTS[:-1]] >= 0).all().all() and (bd.compute_ms > 0).all()

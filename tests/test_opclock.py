"""The measured timeline's device clock (workbench.runtime.executors.opclock): the mapping of event times onto
a rank's time axis, and the executor's bookkeeping run end to end with host events on CPU ranks
(CUDA events need a GPU; the code path between the events and the timeline is the same)."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from runtime_checks import small_mlp_run

from workbench.runtime.calibration.wall_time import PARTS, breakdown
from workbench.runtime.executors.opclock import EventClock, for_device


class _Gpu:
    """A device clock the test sets: events record its current time (seconds)."""

    def __init__(self):
        self.now = 0.0


class _Event:
    def __init__(self, gpu: _Gpu):
        self.gpu, self.t, self.synced = gpu, None, False

    def record(self):
        self.t = self.gpu.now

    def synchronize(self):
        self.synced = True

    def elapsed_time(self, end):
        return (end.t - self.t) * 1e3


def test_resolve_maps_device_times_onto_the_rank_axis():
    """Rows get the device's start / end (base event = its host time), the compute stream's idle
    time before the op as its wait, no send / data time, the send event as send_at; ends per round."""
    gpu = _Gpu()
    gpu.now = 100.0  # the device clock's origin is not the host's
    made = []
    clock = EventClock(lambda: made.append(_Event(gpu)) or made[-1])
    import time

    t0 = time.perf_counter()
    clock.begin(t0)
    b = clock.base_ms
    assert 0 <= b < 50 and made[0].synced
    clock.begin(t0)  # once per run
    assert len(made) == 1
    nan = float("nan")
    timeline = [
        (0, 0, 0, "F", 1.0, 2.0, 0, 7, 0.5, 0.3, 0.2, 1.5),
        (0, 0, -1, "STEP", 3.0, 4.0, 1, 7, 0.0, 0.0, 0.0, nan),
    ]
    # op 1: device idle from 100.002 (pre) to 100.005 (its receive), computes until 100.009, sends at 100.008
    gpu.now = 100.002
    pre = clock.mark()
    gpu.now = 100.005
    start = clock.mark()
    gpu.now = 100.008
    clock.on_send()
    gpu.now = 100.009
    clock.add(0, pre, start, clock.mark())
    # op 2: nothing to receive (start is pre), no send
    gpu.now = 100.010
    pre2 = clock.mark()
    gpu.now = 100.012
    clock.add(1, pre2, pre2, clock.mark())
    ends = [0.0]
    clock.resolve(timeline, 7, ends)
    f, step = timeline
    assert f[4:6] == pytest.approx((b + 5.0, b + 9.0)) and f[8:11] == pytest.approx((3.0, 0.0, 0.0))
    assert f[11] == pytest.approx(b + 8.0)
    assert step[4:6] == pytest.approx((b + 10.0, b + 12.0)) and step[8] == 0.0 and math.isnan(step[11])
    assert ends == pytest.approx([b + 12.0]) and made[-1].synced and clock.pending == []
    clock.resolve(timeline, 7, ends)  # nothing pending: unchanged
    assert timeline[0][4] == pytest.approx(b + 5.0)


def test_clock_per_device(monkeypatch):
    monkeypatch.delenv("WORKBENCH_EVENT_CLOCK", raising=False)
    assert for_device("cpu") is None  # the host's clock around each op
    monkeypatch.setenv("WORKBENCH_EVENT_CLOCK", "host")
    assert isinstance(for_device("cpu"), EventClock)


def host_and_event_clock_runs(tmp_path, monkeypatch, schedule: str, **options):
    """Two 3-step runs of ``schedule`` (:func:`small_mlp_run`, weights returned) into ``tmp_path``'s
    ``host`` and ``events``: timed by the host clock, then by the event clock (host events)."""
    monkeypatch.delenv("WORKBENCH_EVENT_CLOCK", raising=False)
    host = small_mlp_run(schedule, tmp_path / "host", steps=3, return_weights=True, **options)
    monkeypatch.setenv("WORKBENCH_EVENT_CLOCK", "host")
    return host, small_mlp_run(schedule, tmp_path / "events", steps=3, return_weights=True, **options)


@pytest.mark.distributed
@pytest.mark.parametrize("transport,stream", [("gloo", False), ("shm", True)])
def test_event_clock_run_gives_a_consistent_timeline_and_the_same_weights(tmp_path, monkeypatch, transport, stream):
    """CPU ranks timed through the event clock (host events): the weights are bit for bit those of
    the host-clock run; every row was rewritten (no send / data time); per rank the ops follow one
    another without overlap; receive waits are recorded; the breakdown adds up; the trace's flows run
    forwards; a stream's per-minibatch ends (metrics) increase."""
    from workbench.cli.train import draw_timeline

    schedule = "pipedream" if stream else "pipedream-flush"
    host, events = host_and_event_clock_runs(
        tmp_path, monkeypatch, schedule, microbatches=4, transport=transport, stream=stream
    )
    assert [r["timeline_clock"] for r in host["ranks"]] == ["host"] * 2
    assert [r["timeline_clock"] for r in events["ranks"]] == ["host-events"] * 2
    a, b = host["weights"], events["weights"]
    assert len(a) == len(b) == 2 and all((a[s][n] == b[s][n]).all() for s in range(2) for n in a[s])
    tl = pd.read_csv(tmp_path / "events" / "timeline.csv")
    assert (tl.send_ms == 0).all() and (tl.data_ms == 0).all() and (tl.wait_ms >= 0).all()
    assert (tl.end >= tl.start).all() and tl.start.min() >= 0
    for _, r in tl.sort_values("start").groupby("worker"):
        assert (r.start.to_numpy()[1:] >= r.end.to_numpy()[:-1] - 1e-9).all()  # one compute stream per rank
    assert tl[tl.worker == 1].wait_ms.sum() > 0  # the second stage waits for its first activation of every round
    sent = tl[tl.send_at.notna()]
    assert len(sent) > 0 and ((sent.send_at >= sent.start) & (sent.send_at <= sent.end)).all()
    bd = breakdown(tl)
    assert bd[PARTS].sum(axis=1).to_numpy() == pytest.approx(bd.step_ms.to_numpy())
    draw_timeline(events)
    trace = json.loads((tmp_path / "events" / "trace.json").read_text())
    flows = {}
    for e in trace["traceEvents"]:
        if e["ph"] in "sf":
            flows.setdefault(e["id"], {})[e["ph"]] = e["ts"]
    assert flows and all(f["s"] <= f["f"] for f in flows.values())
    wall = pd.read_csv(tmp_path / "events" / "metrics.csv").wall_ms
    assert (wall.diff().dropna() > 0).all()


@pytest.mark.distributed
def test_event_clock_ddp_run(tmp_path, monkeypatch):
    """dp-bsp (DistributedDataParallel) timed through the event clock: the same weights as the
    host-clock run, one op after another per rank, no receive waits (it receives nothing)."""
    host, events = host_and_event_clock_runs(tmp_path, monkeypatch, "dp-bsp", microbatches=2)
    assert [r["timeline_clock"] for r in events["ranks"]] == ["host-events"] * 2
    a, b = host["weights"], events["weights"]
    assert all((a[s][n] == b[s][n]).all() for s in range(len(a)) for n in a[s])
    tl = pd.read_csv(tmp_path / "events" / "timeline.csv")
    assert len(tl) > 0 and (tl.end >= tl.start).all() and (tl.wait_ms == 0).all()
    for _, r in tl.groupby("worker"):  # in op order
        assert (r.start.to_numpy()[1:] >= r.end.to_numpy()[:-1] - 1e-9).all()

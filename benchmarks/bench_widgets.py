"""Latency of one PartitionTuner update: re-partition, rebuild, simulate, redraw (goal: < 200 ms).

    python benchmarks/bench_widgets.py [--repeats 15] [--out results/bench/widgets.csv]

A 50-layer profile (random but seeded layer costs: fwd 0.5-3 ms, bwd 1-6 ms, activations 0.1-4 MB,
parameters 0.01-8 MB) on 8 workers, flat (8 @ 1 GB/s: a 4-stage replicated pipeline) and two-level (4 @ 12 GB/s x 2 @ 1.25 GB/s),
pipedream and gpipe schedules with 16 microbatches. Each row times the pieces separately
(``core.optimize``, ``core.build_schedule``, ``simulate``, the in-place redraw of the existing
FigureWidgets and HTML) and the whole update as a user triggers it (changing a control fires the
observer that re-partitions and redraws), plus, for comparison in the same run, building a fresh
timeline FigureWidget (what the widget avoids). Median and best of ``--repeats``; the machine's
load average is written beside the numbers (timings on a shared machine are noisy).
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench import Profile, Topology, simulate
from workbench.viz.plot import timeline_figure
from workbench.viz.widgets import PartitionTuner, core

CASES = [("flat 8 @ 1 GB/s", ((8, 1e9),)), ("4 @ 12 GB/s x 2 @ 1.25 GB/s", ((4, 12e9), (2, 1.25e9)))]


def profile_50(seed: int = 0) -> Profile:
    rng = np.random.default_rng(seed)
    n = 50
    df = pd.DataFrame(
        {
            "name": [f"layer{i}" for i in range(n)],
            "fwd_ms": rng.uniform(0.5, 3, n),
            "bwd_ms": rng.uniform(1, 6, n),
            "act_bytes": rng.uniform(1e5, 4e6, n),
            "param_bytes": rng.uniform(1e4, 8e6, n),
        }
    )
    return Profile.from_frame(df, kind="synthetic", model="synthetic50", batch_size=32)


def timed(fn, repeats: int) -> tuple[float, float]:
    """(median, best) wall ms of ``fn()`` over ``repeats`` calls."""
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts), min(ts)


def bench_case(prof: Profile, name: str, levels, schedule: str, repeats: int) -> dict:
    tuner = PartitionTuner(prof, Topology(levels), schedule=schedule, microbatches=16, out_dir="/tmp/bench_widgets")
    st = tuner.settings()
    plan = core.optimize(prof, st)
    sched = core.build_schedule(plan, st)
    sim = simulate(sched, profile=prof, plan=plan, topology=st.topology)
    out = core.Outcome(plan, plan, sched, sim, False)
    bw = tuner.levels[0][1]
    values = itertools.cycle([bw.value * 0.5, bw.value])

    def whole():  # what a user does: change a bandwidth; the observer re-partitions and redraws
        bw.value = next(values)
        assert tuner.outcome is not None and "✓" in tuner.status.value, tuner.status.value

    row = {
        "case": name,
        "schedule": schedule,
        "layers": len(prof),
        "workers": st.topology.num_workers,
        "stages": plan.num_stages,
        "ops": sched.num_ops,
    }
    for key, fn in (
        ("partition_ms", lambda: core.optimize(prof, st)),
        ("schedule_ms", lambda: core.build_schedule(plan, st)),
        ("simulate_ms", lambda: simulate(sched, profile=prof, plan=plan, topology=st.topology)),
        ("redraw_ms", lambda: tuner._draw(out, st)),
        ("update_ms", whole),
        ("fresh_figure_ms", lambda: go.FigureWidget(timeline_figure(sim.timeline))),
    ):
        med, best = timed(fn, repeats)
        row[key] = round(med, 2)
        row[key.replace("_ms", "_best_ms")] = round(best, 2)
    return row


def main(argv=None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument(
        "--out",
        default=None,
        help="CSV to write (none by default: a run to look at the numbers leaves the checkout unchanged; the committed one is results/bench/widgets.csv)",
    )
    args = ap.parse_args(argv)
    prof = profile_50()
    load0 = os.getloadavg()[0]
    rows = [
        bench_case(prof, name, levels, schedule, args.repeats)
        for name, levels in CASES
        for schedule in ("pipedream", "gpipe")
    ]
    load1 = os.getloadavg()[0]
    df = pd.DataFrame(rows)
    df["load_1min"] = f"{load0:.1f}-{load1:.1f}"
    df["cpus"] = os.cpu_count()
    df["python"] = platform.python_version()
    from workbench.runtime.launch.outputs import atomic_text

    out = Path(args.out) if args.out else "nothing (pass --out)"
    if args.out:  # the current result replaces the previous one (earlier runs: git history)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        atomic_text(df.to_csv(index=False), Path(args.out))
    cols = [
        "case",
        "schedule",
        "stages",
        "ops",
        "partition_ms",
        "schedule_ms",
        "simulate_ms",
        "redraw_ms",
        "update_ms",
        "update_best_ms",
        "fresh_figure_ms",
    ]
    print(df[cols].to_string(index=False))
    print(
        f"median of {args.repeats} (ms); goal: update_ms < 200; load average {load0:.1f} -> {load1:.1f} "
        f"on {os.cpu_count()} CPUs; wrote {out}"
    )
    return df


if __name__ == "__main__":
    main()

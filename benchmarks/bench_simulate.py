"""Speed of the discrete-event simulator on 1F1B (PipeDream) schedules.

    python benchmarks/bench_simulate.py [--repeats 3] [--out results/bench/simulate.csv]

For each (stages, microbatches) the 1F1B schedule is built by ``workbench.schedules.build``
("pipedream": 2 S M compute ops plus S M STEP ops) when available, else by hand; the table reports
the best of ``--repeats`` wall-clock times of ``simulate(schedule)`` (unit costs) and ops/s over all
ops and over the compute ops alone. Building the schedule (best of ``--repeats``, validation
included) is the column ``build_seconds``; ``build_plus_simulate_s`` adds the two (issue 8's target:
under 1 s for 64 stages x 1024 microbatches); ``load_1min`` is the machine's load when measured.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import pandas as pd

from workbench.runtime.launch.outputs import atomic_text
from workbench.schedules.core import Op, Schedule
from workbench.simulation import simulate

SIZES = [(8, 64), (16, 256), (64, 1024)]


def one_f_one_b(S: int, M: int) -> Schedule:
    """1F1B by hand (weight stashing, a STEP after every backward), as a fallback."""
    ops = []
    for s in range(S):
        lst, steps, fv = [], 0, {}
        warm = min(S - s, M)
        order = [("F", b) for b in range(warm)]
        for b in range(warm, M):
            order += [("B", b - warm), ("F", b)]
        order += [("B", b) for b in range(M - warm, M)]
        for kind, b in order:
            if kind == "F":
                fv[b] = steps
                lst.append(Op("F", s, b, version=steps))
            else:
                lst += [Op("B", s, b, version=fv[b]), Op("STEP", s, step=steps)]
                steps += 1
        ops.append(lst)
    return Schedule("pipedream", S, S, M, ops, tuple((s,) for s in range(S)), update="stash")


def make(S: int, M: int) -> tuple[Schedule, str]:
    try:
        from workbench.schedules import build

        return build("pipedream", S, M), "build"
    except ImportError:
        return one_f_one_b(S, M), "by hand"


def main(argv=None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--out",
        default=None,
        help="CSV to write (none by default: a run to look at the numbers leaves the checkout unchanged; the committed one is results/bench/simulate.csv)",
    )
    args = ap.parse_args(argv)
    rows = []
    for S, M in SIZES:
        build_s = float("inf")  # building the schedule (generation, versions, validate): best of the repeats
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            sched, how = make(S, M)
            build_s = min(build_s, time.perf_counter() - t0)
        best = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            res = simulate(sched, fwd=1.0, bwd=2.0)
            best = min(best, time.perf_counter() - t0)
        compute_ops = int((res.timeline["kind"].isin(["F", "B", "BI", "BW"])).sum())
        rows.append(
            {
                "stages": S,
                "microbatches": M,
                "ops": sched.num_ops,
                "compute_ops": compute_ops,
                "seconds": round(best, 4),
                "ops_per_s": round(sched.num_ops / best),
                "compute_ops_per_s": round(compute_ops / best),
                "build_seconds": round(build_s, 3),
                "build_plus_simulate_s": round(build_s + best, 3),
                "load_1min": round(os.getloadavg()[0], 1),
                "schedule_from": how,
                "makespan": res.makespan,
                "python": platform.python_version(),
                "machine": platform.machine(),
            }
        )
    df = pd.DataFrame(rows)
    if args.out:  # the current result replaces the previous one (earlier runs: git history)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        atomic_text(df.to_csv(index=False), Path(args.out))
    print(
        df[
            [
                "stages",
                "microbatches",
                "ops",
                "compute_ops",
                "seconds",
                "ops_per_s",
                "compute_ops_per_s",
                "build_seconds",
                "build_plus_simulate_s",
                "load_1min",
                "schedule_from",
            ]
        ].to_string(index=False)
    )
    print(f"wrote {args.out}" if args.out else "(no CSV written: pass --out)")
    return df


if __name__ == "__main__":
    main()

"""Time the PipeDream DP on synthetic profiles: N in (100, 250, 500, 1000) layers on flat 8,
flat 64 and a 2-level 8x8 topology. Writes results/bench/partition.csv and prints the table.

Synthetic profile (seed 0): a VGG-like network cut into N layers, with totals that do not depend
on N (the same model at a finer granularity), so that the optimal plans pipeline:

* compute: fwd ~ U(0.5, 5) * 50/N ms (about 140 ms in all), bwd = 2 fwd;
* activations ~ U(1, 50) MB * (1 - 0.95 d) at depth d = (l + 1/2)/N (feature maps shrink);
* parameters: "conv" layers U(0.1, 4) MB * (1 + 4 d) * 50/N (about 300 MB in all); the last 5%
  of the layers (at least one) are "FC" layers that hold most of the weights, U(0.5, 1.5) * 4 GB
  / (their count), with activations ~ U(10, 100) kB.

The plans replicate the early layers and pipeline the FC tail (see the ``stages`` column). Two
timings side by side: ``dp_seconds`` (``partition(refine=False)``: the dynamic program and the cost
model's closed form) and ``seconds`` (the default ``refine=True``: plus the simulations of the 1F1B
schedules of the DP's best candidates at NOAM's and at the communication-aware warm-up). Each cell is the best of ``--repeat`` runs (wall clock, time.perf_counter; and CPU time of this
process, time.process_time, which other load disturbs less); the 1-minute load average of the
machine is recorded beside it (the benchmark is not a test: it does not fail when slow).
The paper's DP is O(N^2 M^2) per level (O(N^3 M_1^2) for an inner level that needs every
sub-range); see workbench/partition.py for how it is vectorised.

    python benchmarks/bench_partition.py [--sizes 100 250 500 1000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import os
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.partition import partition
from workbench.profiler import Profile
from workbench.runtime.outputs import atomic_text
from workbench.topology import Topology

TOPOLOGIES = {
    "flat8": Topology.flat(8, 12e9),
    "flat64": Topology.flat(64, 3.125e9),
    "8x8": Topology([(8, 25e9), (8, 3.125e9)]),
}


MB = 1e6


def synthetic(n: int, seed: int = 0) -> Profile:
    """The VGG-like profile of the module docstring, N = ``n`` layers."""
    rng = np.random.default_rng(seed)
    depth = (np.arange(n) + 0.5) / n
    scale = 50 / n
    fwd = rng.uniform(0.5, 5, n) * scale
    act = rng.uniform(1, 50, n) * MB * (1 - 0.95 * depth)
    par = rng.uniform(0.1, 4, n) * MB * (1 + 4 * depth) * scale
    nfc = max(1, n // 20)
    par[-nfc:] = rng.uniform(0.5, 1.5, nfc) * 4e9 / nfc
    act[-nfc:] = rng.uniform(0.01, 0.1, nfc) * MB
    return Profile.from_frame(pd.DataFrame(dict(
        name=[f"layer{i}" for i in range(n)], fwd_ms=fwd, bwd_ms=2 * fwd,
        act_bytes=act, param_bytes=par)), kind="synthetic")


def main(argv=None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 250, 500, 1000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default="results/bench/partition.csv")
    a = ap.parse_args(argv)
    rows = []
    for name, topo in TOPOLOGIES.items():
        for n in a.sizes:
            p = synthetic(n)
            best, best_cpu, best_dp, best_dp_cpu, plan = (float("inf"),) * 4 + (None,)
            for _ in range(a.repeat):
                t0, c0 = time.perf_counter(), time.process_time()
                partition(p, topo, refine=False)
                best_dp = min(best_dp, time.perf_counter() - t0)
                best_dp_cpu = min(best_dp_cpu, time.process_time() - c0)
                t0, c0 = time.perf_counter(), time.process_time()
                plan = partition(p, topo)
                best = min(best, time.perf_counter() - t0)
                best_cpu = min(best_cpu, time.process_time() - c0)
            load1 = os.getloadavg()[0]
            rows.append(dict(topology=name, workers=topo.num_workers, levels=topo.num_levels, layers=n,
                             seconds=best, cpu_seconds=best_cpu, dp_seconds=best_dp, dp_cpu_seconds=best_dp_cpu,
                             stages=plan.num_stages,
                             bottleneck_ms=plan.bottleneck_ms, predicted_ms=plan.predicted_ms,
                             simulated_ms=plan.simulated_ms, in_flight=plan.in_flight_count,
                             speedup_vs_single=plan.speedup_over_single,
                             speedup_vs_data_parallel=plan.speedup_over_data_parallel,
                             load1=load1, cpus=os.cpu_count(), machine=platform.node()))
            print(f"{name:>7} N={n:>5}: {best:7.3f} s refined, {best_dp:.3f} s DP only (cpu {best_cpu:.3f} s and "
                  f"{best_dp_cpu:.3f} s; "
                  f"{plan.num_stages} stages, DP {plan.bottleneck_ms:.2f} ms, predicted {plan.predicted_ms:.2f} ms, "
                  f"simulated {plan.simulated_ms:.2f} ms, {plan.speedup_over_data_parallel:.2f}x over data "
                  f"parallel; load {load1:.2f})", flush=True)
    df = pd.DataFrame(rows)
    out = Path(a.out)  # the current result replaces the previous one (earlier runs: git history)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_text(df.to_csv(index=False), out)
    table = df.pivot(index="layers", columns="topology", values="seconds")
    print("\nseconds per partition (wall clock, best of", a.repeat, "runs):")
    print(table.to_string(float_format=lambda x: f"{x:.3f}"))
    cpu = df.pivot(index="layers", columns="topology", values="cpu_seconds")
    print("CPU seconds of this process (best of", a.repeat, "runs; less sensitive to other load):")
    print(cpu.to_string(float_format=lambda x: f"{x:.3f}"))
    if len(table) > 1:
        n = table.index.to_numpy(dtype=float)
        print("scaling exponent in N (log-log slope, last two sizes):")
        for c in table.columns:
            t = table[c].to_numpy()
            print(f"  {c}: {np.log(t[-1] / t[-2]) / np.log(n[-1] / n[-2]):.2f}")
    if 1000 in table.index and "8x8" in table.columns:
        t = table.loc[1000, "8x8"]
        print(f"1000 layers on 8x8 with refinement: {t:.2f} s -> {'OK' if t < 2 else 'OVER'} the 2 s target "
              f"(DP only {df.set_index(['layers', 'topology']).loc[(1000, '8x8'), 'dp_seconds']:.2f} s)")
    print(f"wrote {out}")
    return df


if __name__ == "__main__":
    main()

"""Time the PipeDream DP on synthetic profiles: N in (100, 250, 500, 1000) layers on flat 8,
flat 64 and a 2-level 8x8 topology. Writes results/bench/partition.csv and prints the table.

Synthetic profile (seed 0): fwd ~ U(0.5, 5) ms, bwd = 2 fwd, activations ~ U(1, 50) MB,
parameters ~ U(0, 20) MB. Each cell is the best of ``--repeat`` runs (wall clock,
time.perf_counter). The paper's DP is O(N^2 M^2) per level (O(N^3 M_1^2) for an inner level
that needs every sub-range); see workbench/partition.py for how it is vectorised.

    python benchmarks/bench_partition.py [--sizes 100 250 500 1000] [--repeat 2]
"""
from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.partition import partition
from workbench.profiler import Profile
from workbench.topology import Topology

TOPOLOGIES = {
    "flat8": Topology.flat(8, 12e9),
    "flat64": Topology.flat(64, 3.125e9),
    "8x8": Topology([(8, 25e9), (8, 3.125e9)]),
}


def synthetic(n: int, seed: int = 0) -> Profile:
    rng = np.random.default_rng(seed)
    fwd = rng.uniform(0.5, 5, n)
    return Profile.from_frame(pd.DataFrame(dict(
        name=[f"layer{i}" for i in range(n)], fwd_ms=fwd, bwd_ms=2 * fwd,
        act_bytes=rng.uniform(1e6, 5e7, n), param_bytes=rng.uniform(0, 2e7, n))), kind="synthetic")


def main(argv=None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 250, 500, 1000])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--out", default="results/bench/partition.csv")
    a = ap.parse_args(argv)
    rows = []
    for name, topo in TOPOLOGIES.items():
        for n in a.sizes:
            p = synthetic(n)
            best, plan = float("inf"), None
            for _ in range(a.repeat):
                t0 = time.perf_counter()
                plan = partition(p, topo)
                best = min(best, time.perf_counter() - t0)
            rows.append(dict(topology=name, workers=topo.num_workers, levels=topo.num_levels, layers=n,
                             seconds=best, stages=plan.num_stages, bottleneck_ms=plan.bottleneck_ms,
                             speedup_vs_single=plan.speedup_over_single, machine=platform.node()))
            print(f"{name:>7} N={n:>5}: {best:7.3f} s  ({plan.num_stages} stages, "
                  f"bottleneck {plan.bottleneck_ms:.2f} ms)", flush=True)
    df = pd.DataFrame(rows)
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(out, index=False)
    table = df.pivot(index="layers", columns="topology", values="seconds")
    print("\nseconds per partition (best of", a.repeat, "runs):")
    print(table.to_string(float_format=lambda x: f"{x:.3f}"))
    if len(table) > 1:
        n = table.index.to_numpy(dtype=float)
        print("scaling exponent in N (log-log slope, last two sizes):")
        for c in table.columns:
            t = table[c].to_numpy()
            print(f"  {c}: {np.log(t[-1] / t[-2]) / np.log(n[-1] / n[-2]):.2f}")
    if 1000 in table.index and "8x8" in table.columns:
        t = table.loc[1000, "8x8"]
        print(f"1000 layers on 8x8: {t:.2f} s -> {'OK' if t < 2 else 'OVER'} the 2 s target")
    print(f"wrote {out}")
    return df


if __name__ == "__main__":
    main()

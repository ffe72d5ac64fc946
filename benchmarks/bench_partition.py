"""Time the PipeDream DP on synthetic profiles: N in (100, 250, 500, 1000) layers on flat 8,
flat 64 and a 2-level 8x8 topology. Prints the table; writes a CSV only with ``--out`` (the
committed results/bench/partition.csv is refreshed on purpose with ``--out results/bench/partition.csv``,
so that a run to look at the numbers leaves the checkout unchanged).

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
sub-range); see workbench/partitioning/crossing.py for how level 1 is vectorised.

    python benchmarks/bench_partition.py [--sizes 100 250 500 1000] [--repeat 3]

How far the worker count goes (``--flat W ...``: flat topologies of W workers on 25 Gbps instead of
the three above; the measurement behind the partitioner's ``MAX_WORKERS``, committed as
results/bench/partition_workers.csv):

    python benchmarks/bench_partition.py --flat 64 128 256 512 1024 --refine-max 512 --sizes 100 --repeat 1 \
        --out results/bench/partition_workers.csv

Side by side with PipeDream's own optimizer (``--vs-pipedream``): for every recording in
tests/data/pipedream_optimizer (scripts/record_pipedream_optimizer.py: its wall time measured here
when recorded, or ``--live`` to run it again now from ``--pipedream-repo``), time
``partition(cost="pipedream")`` on the same profile and topology (the antichain states included;
best of ``--repeat``) and check its answer: the time per stage relative to PipeDream's, the
configuration with our candidate order and with PipeDream's replayed. Writes
results/bench/partition_vs_pipedream.csv. Profiles that do not ship with the workbench are read
from ``--pipedream-repo`` (a fetched msr-fiddle/pipedream work tree or bare git directory).

    python benchmarks/bench_partition.py --vs-pipedream [--pipedream-repo PATH] [--live] [--repeat 3]
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from workbench.cost.topology import Topology
from workbench.partitioning.search import partition
from workbench.profiling.measure import Profile
from workbench.runtime.launch.outputs import atomic_text

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
    return Profile.from_frame(
        pd.DataFrame(
            dict(name=[f"layer{i}" for i in range(n)], fwd_ms=fwd, bwd_ms=2 * fwd, act_bytes=act, param_bytes=par)
        ),
        kind="synthetic",
    )


def main(argv=None) -> pd.DataFrame:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[100, 250, 500, 1000])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--flat", type=int, nargs="+", metavar="W", help="flat W-worker topologies instead of the three")
    ap.add_argument(
        "--refine-max", type=int, default=None, metavar="W", help="time the DP alone above W workers (refined: NaN)"
    )
    ap.add_argument(
        "--out",
        default=None,
        help="CSV to write (none by default; the committed ones: results/bench/partition.csv, with "
        "--vs-pipedream results/bench/partition_vs_pipedream.csv)",
    )
    ap.add_argument("--vs-pipedream", action="store_true", help="time cost='pipedream' against PipeDream's optimizer")
    ap.add_argument("--pipedream-repo", type=Path, help="fetched msr-fiddle/pipedream, for the profiles not shipped")
    ap.add_argument("--live", action="store_true", help="run PipeDream's optimizer again now (else: its recorded time)")
    ap.add_argument("--profiles", nargs="+", help="--vs-pipedream: only these profiles")
    a = ap.parse_args(argv)
    if a.vs_pipedream:
        return vs_pipedream(a)
    rows = []
    topologies = {f"flat{w}": Topology.flat(w, 3.125e9) for w in a.flat} if a.flat else TOPOLOGIES
    for name, topo in topologies.items():
        for n in a.sizes:
            p = synthetic(n)
            best, best_cpu, best_dp, best_dp_cpu, plan = (float("inf"),) * 4 + (None,)
            refine = a.refine_max is None or topo.num_workers <= a.refine_max
            for _ in range(a.repeat):
                t0, c0 = time.perf_counter(), time.process_time()
                plan = partition(p, topo, refine=False)
                best_dp = min(best_dp, time.perf_counter() - t0)
                best_dp_cpu = min(best_dp_cpu, time.process_time() - c0)
                if not refine:
                    best = best_cpu = math.nan
                    continue
                t0, c0 = time.perf_counter(), time.process_time()
                plan = partition(p, topo)
                best = min(best, time.perf_counter() - t0)
                best_cpu = min(best_cpu, time.process_time() - c0)
            load1 = os.getloadavg()[0]
            rows.append(
                dict(
                    topology=name,
                    workers=topo.num_workers,
                    levels=topo.num_levels,
                    layers=n,
                    seconds=best,
                    cpu_seconds=best_cpu,
                    dp_seconds=best_dp,
                    dp_cpu_seconds=best_dp_cpu,
                    stages=plan.num_stages,
                    bottleneck_ms=plan.bottleneck_ms,
                    predicted_ms=plan.predicted_ms,
                    simulated_ms=plan.simulated_ms,
                    in_flight=plan.in_flight_count,
                    speedup_vs_single=plan.speedup_over_single,
                    speedup_vs_data_parallel=plan.speedup_over_data_parallel,
                    load1=load1,
                    cpus=os.cpu_count(),
                    machine=platform.node(),
                )
            )
            print(
                f"{name:>7} N={n:>5}: {best:7.3f} s refined, {best_dp:.3f} s DP only (cpu {best_cpu:.3f} s and "
                f"{best_dp_cpu:.3f} s; "
                f"{plan.num_stages} stages, DP {plan.bottleneck_ms:.2f} ms, predicted {plan.predicted_ms:.2f} ms, "
                f"simulated {plan.simulated_ms:.2f} ms, {plan.speedup_over_data_parallel:.2f}x over data "
                f"parallel; load {load1:.2f})",
                flush=True,
            )
    df = pd.DataFrame(rows)
    if a.out:  # the current result replaces the previous one (earlier runs: git history)
        out = Path(a.out)
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
        print(
            f"1000 layers on 8x8 with refinement: {t:.2f} s -> {'OK' if t < 2 else 'OVER'} the 2 s target "
            f"(DP only {df.set_index(['layers', 'topology']).loc[(1000, '8x8'), 'dp_seconds']:.2f} s)"
        )
    if a.out:
        print(f"wrote {a.out}")
    return df


# ---- side by side with PipeDream's own optimizer ------------------------------------------------
RECORDED = Path(__file__).resolve().parent.parent / "tests" / "data" / "pipedream_optimizer"


def _options(rec: dict):
    from workbench.partitioning.pipedream_optimizer import Options

    f = rec["flags"]
    mem = float(f[f.index("--memory_size") + 1]) if "--use_memory_constraint" in f else None
    return Options("--straight_pipeline" in f, "--use_fewer_machines" in f, mem, rec["activation_compression_ratio"])


def _ours(prof: Profile, rec: dict, repeat: int):
    """Best-of-``repeat`` wall and CPU seconds of cost='pipedream' (states included), and its result."""
    from workbench.partitioning.pipedream_optimizer import optimize_states, profile_states

    best, best_cpu, res = float("inf"), float("inf"), None
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        st = profile_states(prof)
        res = optimize_states(st, rec["machines"], rec["bandwidths"], _options(rec))
        best, best_cpu = min(best, time.perf_counter() - t0), min(best_cpu, time.process_time() - c0)
    return best, best_cpu, st, res


def _same_config(res, rec) -> bool:
    nodes = [sorted(n, key=lambda v: int(v[4:])) for n in res.stage_nodes]
    return [x["nodes"] for x in rec["stages"]] == nodes and [x["replicas"] for x in rec["stages"]] == [
        r for *_, r in res.stages
    ]


def _replayed(st, rec) -> bool:
    """The configuration with PipeDream's candidate order and cumulative sums replayed."""
    from dataclasses import replace

    from workbench.partitioning.pipedream_optimizer import optimize_states

    sums = {
        "compute_s": "state_compute_s",
        "activation": "state_activation",
        "parameters": "state_parameters",
        "output_activation": "state_output_activation",
    }
    st = replace(st, **{k: np.array(rec[v], dtype=float) for k, v in sums.items()})
    return _same_config(
        optimize_states(st, rec["machines"], rec["bandwidths"], _options(rec), candidate_order=rec["candidate_order"]),
        rec,
    )


def vs_pipedream(a) -> pd.DataFrame:
    from workbench.profiling.pipedream import SHIPPED, read_graph, shipped

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import record_pipedream_optimizer as recorder

    repo = None
    if a.pipedream_repo is not None or a.live:
        if a.pipedream_repo is None:
            raise SystemExit("--live needs --pipedream-repo")
        tmp = Path(tempfile.mkdtemp(prefix="pipedream-"))
        repo = recorder.checkout(a.pipedream_repo.resolve(), tmp)
    profiles: dict = {}
    rows = []
    for path in sorted(RECORDED.glob("*.json*")):
        rec = recorder.read(path)
        name = rec["profile"]
        if a.profiles and name not in a.profiles:
            continue
        if name not in profiles:
            profiles[name] = (
                shipped(name)
                if name in SHIPPED
                else (read_graph(repo / recorder.PROFILES[name], label=name) if repo is not None else None)
            )
        prof = profiles[name]
        if a.live:
            helpers = Path(tempfile.mkdtemp(prefix="helpers-"))
            (helpers / "graphviz.py").write_text(recorder._STUB)
            (helpers / "driver.py").write_text(recorder._DRIVER)
            rec = recorder.run_one(repo, name, rec["config"], 600.0, helpers)
        row = dict(
            profile=name,
            config=rec["config"],
            machines="x".join(map(str, rec["machines"])),
            flags=" ".join(rec["flags"]),
            theirs="live" if a.live else f"recorded ({path.name})",
            theirs_finished=rec["finished"],
            theirs_seconds=rec.get("wall_s", rec.get("timeout_s")),
            theirs_cpu_seconds=rec.get("cpu_s"),
            theirs_load1=rec.get("load1"),
            theirs_states=rec.get("states"),
            theirs_pipeline_ms=rec.get("pipeline_s", math.nan) * 1e3,
        )
        if prof is not None:
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                sec, cpu, st, res = _ours(prof, rec, a.repeat)
            except ValueError as e:  # too many antichain states: refused with a message
                row |= dict(
                    ours_seconds=time.perf_counter() - t0,
                    ours_cpu_seconds=time.process_time() - c0,
                    ours_error=str(e).split(":")[0],
                )
                rows.append(row | dict(load1=os.getloadavg()[0], cpus=os.cpu_count(), machine=platform.node()))
                print(
                    f"{name:>14} {rec['config']:>15}: ours refused ({row['ours_error']}) after "
                    f"{row['ours_seconds']:.1f} s",
                    flush=True,
                )
                continue
            row |= dict(
                ours_seconds=sec,
                ours_cpu_seconds=cpu,
                ours_states=len(st),
                ours_pipeline_ms=res.pipeline_s * 1e3,
                ours_stages="-".join(str(r) for *_, r in res.stages),
            )
            if rec["finished"]:
                row |= dict(
                    time_rel_diff=abs(res.pipeline_s / rec["pipeline_s"] - 1),
                    config_equal=_same_config(res, rec),
                    config_equal_replayed=_replayed(st, rec),
                    speedup=rec["wall_s"] / sec,
                )
        row |= dict(load1=os.getloadavg()[0], cpus=os.cpu_count(), machine=platform.node())
        rows.append(row)
        print(
            f"{name:>14} {rec['config']:>15}: ours {row.get('ours_seconds', math.nan):7.3f} s, theirs "
            f"{row['theirs_seconds'] if row['theirs_seconds'] is not None else math.nan:8.2f} s"
            f"{'' if rec['finished'] else ' (did not finish)'}; rel diff {row.get('time_rel_diff', math.nan):.1e}, "
            f"config {row.get('config_equal')}, replayed {row.get('config_equal_replayed')}",
            flush=True,
        )
    df = pd.DataFrame(rows)
    print(markdown(df))
    if a.out:  # the one current CSV of this benchmark (history: git)
        out = Path(a.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_text(df.to_csv(index=False), out)
        print(f"wrote {out}")
    return df


def markdown(df: pd.DataFrame) -> str:
    """The parity table of docs/pipedream-optimizer.md from a --vs-pipedream CSV."""

    def same(ours, replayed) -> str:
        """ "yes"; "tie": another optimum of equal time (PipeDream's order replayed gives its own); "NO"."""
        if pd.isna(replayed):
            return ""
        if bool(ours):
            return "yes"
        return "tie" if bool(replayed) else "NO"

    head = (
        "| profile | config | states | same configuration (our order / PipeDream's replayed) | PipeDream "
        "ms/stage | ours ms/stage | PipeDream s wall (CPU) | ours s wall (CPU) |"
    )
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in df.itertuples():
        theirs = f"{r.theirs_pipeline_ms:.4f}" if r.theirs_finished else "did not finish"
        cpu = getattr(r, "theirs_cpu_seconds", None)
        tsec = (
            f"{r.theirs_seconds:.1f} ({cpu:.1f})"
            if r.theirs_finished and cpu == cpu and cpu is not None
            else (f"{r.theirs_seconds:.1f}" if r.theirs_finished else f"> {r.theirs_seconds:.0f}")
        )
        rep = getattr(r, "config_equal_replayed", None)
        same_txt = f"{same(getattr(r, 'config_equal', None), rep)} / {'' if pd.isna(rep) else ('yes' if rep else 'NO')}"
        err = getattr(r, "ours_error", None)
        ours_ms = (
            f"{getattr(r, 'ours_pipeline_ms', float('nan')):.4f}" if not isinstance(err, str) else "refused: " + err
        )
        states = getattr(r, "ours_states", "")
        states = "" if pd.isna(states) else int(states)
        lines.append(
            f"| {r.profile} | {r.config} | {states} | {same_txt} | {theirs} | {ours_ms} | {tsec} | "
            f"{getattr(r, 'ours_seconds', float('nan')):.2f} ({getattr(r, 'ours_cpu_seconds', float('nan')):.2f}) |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()

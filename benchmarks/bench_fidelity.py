"""Simulator fidelity: modeled vs measured time per step, the model built only from separate measurements.

Setting (as ``bench_runtime.py``): zoo ``mlp`` (8 x 512), batch 256 in 8 microbatches of 32, 2 gloo
ranks with one torch thread each, split 4 + 4 layers (``dp-bsp``: both ranks hold all 8 layers).

Nothing the prediction uses comes from the run it predicts. Per repetition, interleaved with the runs:

1. link: :func:`workbench.runtime.calibration.machine.measure_link` (2-process gloo ping-pong, fit ``α + n / β``),
   idle (median one-way time) and loaded (``busy=True``: each process keeps its core busy computing
   and sends through the runtime's send path, mean one-way time, and the compute time each message
   takes from its core); the predictions charge :func:`workbench.runtime.calibration.machine.runtime_link`: the idle
   transit and the loaded CPU per message (the ``loaded transit`` column charges the loaded transit
   too, for comparison); the overhead calibration of step 3 (whose cores stay idle) the idle link;
   ``--idle-link`` predicts with the idle link alone; ``--transport shm``: the ping-pong, the overhead
   calibration's run and the measured pipeline runs send through the runtime's shared-memory
   transport instead of gloo (``dp-bsp`` all-reduces over gloo either way);
   all-reduce: :func:`workbench.runtime.calibration.machine.measure_allreduce` (2-process gloo ``all_reduce``, the
   ring's bus bandwidth and per-step latency: gloo's all-reduce runs far below its ping-pong rate);
2. compute: :func:`workbench.runtime.calibration.machine.stage_profile` at microbatch 32, 1 thread, in 2 fresh
   processes at once (as many busy processes as the run has ranks), process ``r`` pinned to rank
   ``r``'s core; each stage's timings from its rank's process (``dp-bsp``, whose one stage runs
   on both ranks: the slower; :func:`workbench.runtime.calibration.machine.on_ranks`; the mean of the two processes
   is the ``core mean`` column): stage-level
   fwd/bwd through the runtime's own stage functions, per-layer profile, optimizer step per stage
   (in place, and into new tensors for the steps that keep a stashed version);
3. per-op overhead ``o`` of each of the runtime's two executors: a runtime run of a *different*
   model (``mlp`` of width 16, compute almost nil) with ``gpipe`` (the schedule interpreter, used
   by every pipeline schedule) and with ``dp-bsp`` (DistributedDataParallel); ``o`` is the per-op
   cost that makes its simulation match its measured step (:func:`workbench.runtime.calibration.machine.solve_overhead`),
   with its own stage profile and the link above; the run takes ``--overhead-steps`` (64) steps,
   as its 5-10 ms steps are the noisiest of the benchmark;
4. the five measured runs (``workbench.runtime.train``, same options as ``bench_runtime.py``):
   steady-state ms per step = median spacing of the step starts after ``--skip`` steps. Their
   order rotates from one repetition to the next (the run right after the calibration was slower
   more often), and the page cache is written back (``os.sync``) before each.

Modeled = :func:`workbench.runtime.calibration.machine.modeled_step_ms` (the schedule repeated over 6 rounds, the
same statistic). The all-reduce runs after the backward (``--overlap-allreduce`` to overlap them):
with one core per rank, gloo's all-reduce needs the cores the backward computes on (measured: DDP's
backward takes about the sum of the backward and the all-reduce timed apart). Reported: medians over ``--repeat`` repetitions; error = modeled / measured - 1.
Also shown: the model without the per-op overhead, with the per-layer (instead of stage-level)
profile, with the messages' transit at the loaded link's latency and bandwidth (``loaded
transit``), and with every stage at the mean of the two processes' profiles (``core mean``).
``comp/prof`` (``compute_ratio``): the
measured run's compute ops (span less send and data time) over the profile's time for the same
ops. Writes ``results/bench/fidelity.csv`` (``--transport shm``: ``results/bench/fidelity_shm.csv``),
replacing the previous run (earlier runs live in git history).

    python benchmarks/bench_fidelity.py [--steps 14] [--skip 4] [--repeat 5] [--overhead-steps 64] [--transport gloo|shm]
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import pandas as pd

from workbench.runtime.executors.ddp import DDP_BUCKETS  # the DDP executor's gradient buckets

M, P, BATCH, LR = 8, 2, 256, 0.01
MB = BATCH // M
LINK_SIZES = (4, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20)
SCHEDULES = ("gpipe", "pipedream-flush", "zb-h1", "pipedream", "pipedream+stream", "dp-bsp")
STREAM_ROUNDS = 6  # a "+stream" schedule (train(stream=True)) is modeled as the schedule over this many minibatches
DP_RANKS = [list(range(P))]  # dp-bsp: its one stage runs on every rank
TINY = dict(width=16, in_features=16)  # the overhead-calibration model: same depth, ~no compute


def _profile_in_child(model_options: dict, bounds: list, threads: int, index: int = 0, of: int = P):
    """Runs in a fresh spawned process (the ``index``-th of ``of``, pinned to a core as the runtime
    pins its ranks): the stage profile of ``mlp(**model_options)``."""
    import torch

    from workbench.models import build
    from workbench.runtime.calibration.machine import stage_profile
    from workbench.runtime.launch.affinity import place_rank

    place_rank(index, of, threads)
    torch.manual_seed(0)
    return stage_profile(build("mlp", seed=0, **model_options), bounds, MB, threads=threads)


def profile_separately(
    model_options: dict, bounds: list, threads: int = 1, concurrent: int = P, stage_ranks: list | None = None
):
    """The stage profile measured in ``concurrent`` fresh processes at once, process ``r`` pinned
    where rank ``r`` runs (so the compute sees the same number of busy processes sharing cores, caches
    and memory bandwidth); each stage's timings from the process of the rank that runs it
    (``stage_ranks[s]``, default: stage ``s`` on rank ``s``; a replicated stage: its slowest replica,
    :func:`workbench.runtime.calibration.machine.on_ranks`)."""
    from workbench.runtime.calibration.machine import on_ranks

    with ProcessPoolExecutor(max_workers=concurrent, mp_context=get_context("spawn")) as ex:
        futs = [ex.submit(_profile_in_child, model_options, bounds, threads, i, concurrent) for i in range(concurrent)]
        sps = [f.result(timeout=300) for f in futs]
    sp = on_ranks(sps, stage_ranks or [[s] for s in range(len(bounds))])
    sp.meta["concurrent"] = concurrent
    sp.meta["core_mean"] = core_mean(sps)
    return sp


def core_mean(sps: list):
    """The profiles' mean over the processes (every stage at the mean of the cores), a column beside
    the per-rank profile."""
    from workbench.runtime.calibration.machine import on_ranks

    return on_ranks(sps, [list(range(len(sps)))] * len(sps[0].bounds), combine=statistics.fmean)


def run_measured(schedule: str, steps: int, skip: int, transport: str = "gloo", **model_options) -> tuple:
    """Steady-state ms per step of a runtime run, and its timeline after ``skip`` steps;
    ``transport`` for the pipeline schedules (``dp-bsp``
    has no point-to-point messages: always gloo). More than 16 steps: a synthetic set of 64 steps
    per epoch, so no epoch end falls among them."""
    from workbench.runtime import train
    from workbench.runtime.calibration.machine import measured_step_ms

    out = Path(tempfile.mkdtemp(prefix="bench_fid_")) / schedule
    data = dict(dataset_options={"num_train": 64 * BATCH}) if steps > 16 else {}
    name, _, stream = schedule.partition("+")
    train(
        "mlp",
        name,
        workers=P,
        microbatches=M,
        steps=steps,
        batch_size=BATCH,
        lr=LR,
        out=out,
        threads=1,
        progress=False,
        device="cpu",
        evaluate=False,
        transport="gloo" if schedule == "dp-bsp" else transport,
        stream=stream == "stream",
        model_options=model_options,
        **data,
    )
    tl = pd.read_csv(out / "timeline.csv")
    return measured_step_ms(tl, skip=skip), tl[tl["round"] >= skip]


PROFILE_OF = {"F": "fwd_ms", "B": "bwd_ms", "BI": "bwd_input_ms", "BW": "bwd_weight_ms"}


def compute_ratio(tl: pd.DataFrame, sp) -> float:
    """The compute ops' time in the run (each op's span less its send and data time) over what the
    stage profile gives the same ops: how much slower the runtime's ranks computed than the
    separately measured profile (``nan`` for the DDP executor, whose backward holds the all-reduce)."""
    ops = tl[tl["kind"].isin(list(PROFILE_OF))]
    if ops.empty or ops["send_ms"].isna().all():  # no ops, or DDP's (its backward holds the all-reduce)
        return float("nan")
    comp = (ops["end"] - ops["start"] - ops["send_ms"] - ops["data_ms"]).sum()
    prof = sum(getattr(sp, PROFILE_OF[k])[s] for s, k in zip(ops["stage"], ops["kind"]))
    return float(comp / prof)


def schedule_of(name: str):
    """The schedule a run executes per round (a stream: over STREAM_ROUNDS minibatches) and the
    keyword arguments of modeled_step_ms that say so."""
    from workbench.schedules import build

    if name.endswith("+stream"):
        return build(name.removesuffix("+stream"), P, M * STREAM_ROUNDS), dict(rounds=1, microbatches=M)
    return (build(name, 1, M, workers=P) if name == "dp-bsp" else build(name, P, M)), {}


def main(argv=None) -> int:
    from workbench.runtime.calibration.machine import (
        measure_allreduce,
        measure_link,
        modeled_step_ms,
        runtime_link,
        solve_overhead,
    )
    from workbench.runtime.transport.shm import TRANSPORTS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=14, help="steps per measured run (at most 64)")
    ap.add_argument("--skip", type=int, default=4, help="first steps left out of the steady state")
    ap.add_argument(
        "--repeat",
        type=int,
        default=5,
        help="repetitions (a calibration, then every run); medians reported. On the shared 2-core machine "
        "one repetition's error spreads over several percent (see error_pct_per_repeat): the "
        "median of 3 left gpipe outside 10%% in 3 of 7 runs of the same code family",
    )
    ap.add_argument("--schedules", default=",".join(SCHEDULES))
    ap.add_argument(
        "--out",
        default=None,
        help="CSV to write (none by default; the committed ones: results/bench/fidelity.csv, fidelity_shm.csv)",
    )
    ap.add_argument(
        "--overhead-width",
        type=int,
        default=16,
        help="width of the mlp whose runs calibrate the per-op overheads (default 16: almost no compute)",
    )
    ap.add_argument(
        "--overhead-steps",
        type=int,
        default=64,
        help="steps of each overhead-calibration run (default 64; its steps take 5-10 ms, and over 14 steps "
        "the measured step of 5 runs in a row spread 1.5-1.95x, over 64 steps 1.24-1.27x)",
    )
    ap.add_argument(
        "--idle-link",
        action="store_true",
        help="calibrate the link with idle processes (default: loaded, each core busy computing, as in a run)",
    )
    ap.add_argument(
        "--transport",
        choices=TRANSPORTS,
        default="gloo",
        help="the pipeline schedules' messages, in the runs and in the link calibration: gloo (default) "
        "or the runtime's shared-memory transport (dp-bsp all-reduces over gloo either way)",
    )
    ap.add_argument(
        "--overlap-allreduce",
        action="store_true",
        help="model the all-reduce as overlapping the backward (default off: on a CPU with one core per "
        "rank, gloo's all-reduce needs the cores the backward computes on)",
    )
    a = ap.parse_args(argv)
    ovl = dict(overlap_comm=a.overlap_allreduce)
    names = a.schedules.split(",")
    pipe_bounds, dp_bounds = [(0, 3), (4, 7)], [(0, 7)]
    rows: dict[str, list[dict]] = {n: [] for n in names}
    cal: list[dict] = []
    loads: list[float] = []
    for r in range(a.repeat):
        t = time.time()
        idle = measure_link("gloo", sizes=LINK_SIZES, repeats=30, transport=a.transport)
        link = (
            idle
            if a.idle_link
            else measure_link("gloo", sizes=LINK_SIZES, repeats=100, busy=True, transport=a.transport)
        )
        ar = measure_allreduce("gloo", world_size=P, repeats=30)
        # what the model charges a runtime message: idle transit, loaded CPU per message
        rlink = idle if a.idle_link else runtime_link(idle, link)
        loads.append(os.getloadavg()[0])
        sp = {
            "pipe": profile_separately({}, pipe_bounds),
            "dp": profile_separately({}, dp_bounds, stage_ranks=DP_RANKS),
        }
        # per-op overhead of each of the runtime's executors, from a width-16 run (no compute to speak of):
        # the schedule interpreter (gpipe) and DistributedDataParallel (dp-bsp)
        o, tiny = {}, {}
        for ex, tn, bounds in (("pipeline", "gpipe", pipe_bounds), ("ddp", "dp-bsp", dp_bounds)):
            cal_model = dict(width=a.overhead_width, in_features=a.overhead_width)
            tsp = profile_separately(cal_model, bounds, stage_ranks=DP_RANKS if tn == "dp-bsp" else None)
            tiny[ex] = run_measured(tn, a.overhead_steps, a.skip, a.transport, **cal_model)[0]
            ts, _ = schedule_of(tn)
            # the width-16 run leaves its cores idle: its messages travel as on the idle link
            o[ex] = solve_overhead(
                lambda x: modeled_step_ms(
                    ts, tsp, idle, x, allreduce=ar, allreduce_buckets=DDP_BUCKETS if tn == "dp-bsp" else None, **ovl
                ),
                tiny[ex],
            )
        cal.append(
            dict(
                latency_ms=link["latency_ms"],
                bandwidth=link["bandwidth_bytes_per_s"],
                message_cpu_ms=link.get("message_cpu_ms", 0.0),
                idle_latency_ms=idle["latency_ms"],
                idle_bandwidth=idle["bandwidth_bytes_per_s"],
                op_overhead_ms=o["pipeline"],
                ddp_op_overhead_ms=o["ddp"],
                tiny_ms=tiny["pipeline"],
                tiny_ddp_ms=tiny["ddp"],
                ar_latency_ms=ar["latency_ms"],
                ar_bandwidth=ar["bandwidth_bytes_per_s"],
            )
        )
        for n in names[r % len(names) :] + names[: r % len(names)]:  # rotated: no schedule always runs first
            loads.append(os.getloadavg()[0])
            os.sync()  # the earlier runs' files written back now, not by a kernel thread during this run
            meas, tl = run_measured(n, a.steps, a.skip, a.transport)
            sched, kw = schedule_of(n)
            s = sp["dp"] if n == "dp-bsp" else sp["pipe"]
            kw.update(
                allreduce=ar, overlap_comm=a.overlap_allreduce, allreduce_buckets=DDP_BUCKETS if n == "dp-bsp" else None
            )
            on = o["ddp" if n == "dp-bsp" else "pipeline"]
            rows[n].append(
                dict(
                    measured=meas,
                    modeled=modeled_step_ms(sched, s, rlink, on, **kw),
                    no_overhead=modeled_step_ms(sched, s, rlink, 0.0, **kw),
                    layer_level=modeled_step_ms(sched, s, rlink, on, level="layer", **kw),
                    loaded_transit=modeled_step_ms(sched, s, link, on, **kw),
                    core_mean=modeled_step_ms(sched, s.meta["core_mean"], rlink, on, **kw),
                    compute_ratio=compute_ratio(tl, s),
                )
            )
        print(
            f"repetition {r + 1}/{a.repeat}: link α={link['latency_ms']:.3f} ms β={link['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s "
            f"o_msg={link.get('message_cpu_ms', 0.0):.3f} ms (idle α={idle['latency_ms']:.3f} ms), "
            f"all-reduce α={ar['latency_ms']:.3f} ms B_bus={ar['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s, overhead "
            f"{o['pipeline']:.3f} / {o['ddp']:.3f} ms/op (tiny gpipe {tiny['pipeline']:.1f} ms, tiny dp-bsp "
            f"{tiny['ddp']:.1f} ms), load {loads[-1]:.2f}, {time.time() - t:.0f} s",
            flush=True,
        )
    med = lambda xs: statistics.median(xs)  # noqa: E731
    c = {k: med([x[k] for x in cal]) for k in cal[0]}
    from workbench.runtime.launch.outputs import atomic_text

    if a.out:  # the current result replaces the previous one
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    cols = [
        "schedule",
        "step_ms_modeled",
        "step_ms_measured",
        "error_pct",
        "step_ms_modeled_no_overhead",
        "step_ms_modeled_layer_profile",
        "step_ms_modeled_loaded_transit",
        "error_pct_loaded_transit",
        "step_ms_modeled_core_mean",
        "error_pct_core_mean",
        "compute_ratio",
        "measured_min",
        "measured_max",
        "error_pct_per_repeat",
        "latency_ms",
        "bandwidth_bytes_per_s",
        "op_overhead_ms",
        "message_cpu_ms",
        "idle_latency_ms",
        "idle_bandwidth_bytes_per_s",
        "allreduce_latency_ms",
        "allreduce_bus_bandwidth_bytes_per_s",
        "overlap_allreduce",
        "transport",
        "repeats",
        "load_avg_1min_median",
        "load_avg_1min_max",
        "cores",
    ]
    out_rows = []
    for n in names:
        mod, mea = med([x["modeled"] for x in rows[n]]), med([x["measured"] for x in rows[n]])
        out_rows.append(
            dict(
                schedule=n,
                step_ms_modeled=mod,
                step_ms_measured=mea,
                error_pct=100 * (mod / mea - 1),
                step_ms_modeled_no_overhead=med([x["no_overhead"] for x in rows[n]]),
                step_ms_modeled_layer_profile=med([x["layer_level"] for x in rows[n]]),
                step_ms_modeled_loaded_transit=med([x["loaded_transit"] for x in rows[n]]),
                error_pct_loaded_transit=100 * (med([x["loaded_transit"] for x in rows[n]]) / mea - 1),
                step_ms_modeled_core_mean=med([x["core_mean"] for x in rows[n]]),
                compute_ratio=med([x["compute_ratio"] for x in rows[n]]),
                error_pct_core_mean=100 * (med([x["core_mean"] for x in rows[n]]) / mea - 1),
                measured_min=min(x["measured"] for x in rows[n]),
                measured_max=max(x["measured"] for x in rows[n]),
                error_pct_per_repeat=" ".join(f"{100 * (x['modeled'] / x['measured'] - 1):+.1f}" for x in rows[n]),
                latency_ms=c["latency_ms"],
                bandwidth_bytes_per_s=c["bandwidth"],
                op_overhead_ms=c["ddp_op_overhead_ms" if n == "dp-bsp" else "op_overhead_ms"],
                message_cpu_ms=c["message_cpu_ms"],
                idle_latency_ms=c["idle_latency_ms"],
                idle_bandwidth_bytes_per_s=c["idle_bandwidth"],
                allreduce_latency_ms=c["ar_latency_ms"],
                allreduce_bus_bandwidth_bytes_per_s=c["ar_bandwidth"],
                overlap_allreduce=a.overlap_allreduce,
                transport="gloo" if n == "dp-bsp" else a.transport,
                repeats=a.repeat,
                load_avg_1min_median=med(loads),
                load_avg_1min_max=max(loads),
                cores=len(os.sched_getaffinity(0)),
            )
        )
    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    for row in out_rows:
        w.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items()})
    if a.out:
        atomic_text(text.getvalue(), Path(a.out))
    print(
        f"{'schedule':<18}{'modeled':>10}{'measured':>10}{'error %':>9}{'no ovh':>9}{'layer prof':>11}{'loaded trans':>13}{'core mean':>10}{'comp/prof':>10}"
        f"{'meas range':>16}  error % per repetition"
    )
    for x in out_rows:
        print(
            f"{x['schedule']:<18}{x['step_ms_modeled']:>10.1f}{x['step_ms_measured']:>10.1f}{x['error_pct']:>9.1f}"
            f"{x['step_ms_modeled_no_overhead']:>9.1f}{x['step_ms_modeled_layer_profile']:>11.1f}"
            f"{x['step_ms_modeled_loaded_transit']:>13.1f}{x['step_ms_modeled_core_mean']:>10.1f}{x['compute_ratio']:>10.2f}"
            f"{x['measured_min']:>8.1f}-{x['measured_max']:<7.1f}  {x['error_pct_per_repeat']}"
        )
    print(
        f"link ({a.transport}, {'idle' if a.idle_link else 'loaded'}): latency {c['latency_ms']:.3f} ms, bandwidth "
        f"{c['bandwidth'] / 1e9:.2f} GB/s, CPU per message {c['message_cpu_ms']:.3f} ms (idle link: "
        f"{c['idle_latency_ms']:.3f} ms, {c['idle_bandwidth'] / 1e9:.2f} GB/s); all-reduce: "
        f"{c['ar_latency_ms']:.3f} ms per ring step, bus bandwidth {c['ar_bandwidth'] / 1e9:.2f} GB/s "
        f"({'overlapping' if a.overlap_allreduce else 'after'} the backward); per-op overhead "
        f"{c['op_overhead_ms']:.3f} ms (width-16 gpipe run, {c['tiny_ms']:.1f} ms/step), DDP "
        f"{c['ddp_op_overhead_ms']:.3f} ms (width-16 dp-bsp run, {c['tiny_ddp_ms']:.1f} ms/step); load avg (1 min) "
        f"median {med(loads):.2f}, max {max(loads):.2f} on {len(os.sched_getaffinity(0))} cores"
    )
    print(
        f"wrote {a.out}"
        if a.out
        else "(no CSV written: pass --out results/bench/fidelity.csv to refresh the committed one)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

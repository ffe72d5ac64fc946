"""Runtime throughput vs torch.distributed.pipelining on the same split, microbatches and machine.

Model: the zoo ``mlp`` (8 layers of 512, 512 inputs, 10 classes), batch 256 in 8 microbatches, split
4+4 layers over 2 gloo ranks with one torch thread each. Rows:

* ``single``: one process, one thread, the same 8 microbatches with gradient accumulation, SGD step
* ``ideal``: ``2 * single * m / (m + p - 1)`` (fill-drain bubble, no communication cost)
* ``torch-gpipe`` / ``torch-1f1b``: ``torch.distributed.pipelining`` ScheduleGPipe / Schedule1F1B + SGD
* ``workbench-<schedule>``: :func:`workbench.runtime.train` running that schedule, with the per-epoch
  test-set evaluation off (``evaluate=False``: the torch rows evaluate nothing either; it cost ~100 ms
  per epoch end on rank 0, ~9% of the timed window). Its per-epoch checkpoints stay on.

Throughput = samples/s over the steps after ``--warmup``: total wall time of the timed steps for
every row (for the runtime from its ``metrics.csv``). Writes ``results/bench/runtime.csv``.

    python benchmarks/bench_runtime.py [--steps 30] [--warmup 5] [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

M, P, BATCH, LR = 8, 2, 256, 0.01


def _model():
    from workbench.models import build
    return build("mlp", seed=0)


def _data(steps: int, device="cpu"):
    g = torch.Generator().manual_seed(0)
    xs = torch.randn(steps, BATCH, 512, generator=g)
    ys = torch.randint(0, 10, (steps, BATCH), generator=g)
    return xs.to(device), ys.to(device)


def bench_single(steps: int, warmup: int, device="cpu") -> float:
    torch.set_num_threads(1)
    model = _model().to(device)
    net = torch.nn.Sequential(*model.layers)
    xs, ys = _data(steps + warmup, device)
    t = None
    for i in range(steps + warmup):
        if i == warmup:
            if device != "cpu":
                torch.cuda.synchronize()
            t = time.perf_counter()
        for x, y in zip(xs[i].chunk(M), ys[i].chunk(M)):
            (model.loss(net(x), y) / M).backward()
        with torch.no_grad():
            for p in net.parameters():
                p -= LR * p.grad
                p.grad = None
    if device != "cpu":
        torch.cuda.synchronize()
    return steps * BATCH / (time.perf_counter() - t)


def _torch_pp_worker(rank, world, port, kind, steps, warmup, device, q):
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    torch.set_num_threads(1)
    dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    if device == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            rank=rank, world_size=world)
    model = _model()
    L = len(model.layers)
    half = torch.nn.Sequential(*model.layers[:L // 2] if rank == 0 else model.layers[L // 2:]).to(dev)
    mb_in = torch.empty(BATCH // M, 512, device=dev) if rank == 0 else torch.empty(BATCH // M, 512, device=dev)
    stage = PipelineStage(half, rank, world, dev, input_args=(mb_in,))
    cls = ScheduleGPipe if kind == "gpipe" else Schedule1F1B
    sched = cls(stage, n_microbatches=M, loss_fn=model.loss)
    xs, ys = _data(steps + warmup, dev)
    t = None
    for i in range(steps + warmup):
        if i == warmup:
            dist.barrier()
            t = time.perf_counter()
        if rank == 0:
            sched.step(xs[i])
        else:
            sched.step(target=ys[i], losses=[])
        with torch.no_grad():
            for p in half.parameters():
                p -= LR * p.grad
                p.grad = None
    dist.barrier()
    if rank == 0:
        q.put(steps * BATCH / (time.perf_counter() - t))
    dist.destroy_process_group()


def bench_torch_pipelining(kind: str, steps: int, warmup: int, device="cpu") -> float:
    import torch.multiprocessing as mp

    from workbench.runtime.launch import free_port
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(_torch_pp_worker, args=(P, free_port(), kind, steps, warmup, device, q), nprocs=P,
                       start_method="spawn")
    return q.get()


def bench_workbench(schedule: str, steps: int, warmup: int, device="cpu") -> tuple[float, dict]:
    from workbench.runtime import train
    out = Path(tempfile.mkdtemp(prefix="bench_rt_")) / schedule
    s = train("mlp", schedule, workers=P, microbatches=M, steps=steps + warmup, batch_size=BATCH, lr=LR, out=out,
              threads=1, progress=False, device=device, evaluate=False)
    with open(out / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    timed = rows[warmup:]
    span = float(timed[-1]["wall_ms"]) - float(rows[warmup - 1]["wall_ms"])
    return len(timed) * BATCH / span * 1e3, s


def fidelity(out: Path, schedule: str, warmup: int) -> dict:
    """Modeled vs measured time per step: simulate the schedule with the per-stage F/B/STEP durations
    measured in the run's own timeline (mean over the timed steps), communication free."""
    import pandas as pd

    from workbench.schedules import build
    from workbench.simulate import simulate
    sched = build(schedule, P, M)
    tl = pd.read_csv(out / "timeline.csv")
    tl = tl[tl.step >= warmup]
    tl = tl.assign(dur=tl.end - tl.start)
    mean = tl.groupby(["kind", "stage"]).dur.mean()
    fwd = [float(mean[("F", s)]) for s in range(P)]
    bwd = [float(mean[("B", s)]) if ("B", s) in mean.index else float(mean[("BI", s)] + mean[("BW", s)])
           for s in range(P)]  # split backward: the simulator charges BI = BW = bwd / 2
    step_ms = float(tl[tl.kind == "STEP"].dur.mean())
    sim = simulate(sched, fwd=fwd, bwd=bwd, step_ms=step_ms)
    modeled = sim.metrics["makespan"]
    steps = tl.step.nunique()
    measured = (tl.end.max() - tl.start.min()) / steps
    return dict(modeled_ms=modeled, measured_ms=measured, error=modeled / measured - 1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--schedules", default="gpipe,pipedream-flush,zb-h1,pipedream")
    ap.add_argument("--repeat", type=int, default=3, help="rounds over all configurations; medians are reported")
    ap.add_argument("--out", default="results/bench/runtime.csv")
    a = ap.parse_args(argv)
    results: dict[str, list] = {}
    fids: dict[str, list] = {}
    for _ in range(a.repeat):  # interleaved repetitions: slow phases of a shared machine hit every row alike
        results.setdefault("single", []).append(bench_single(a.steps, a.warmup, a.device))
        for kind in ("gpipe", "1f1b"):
            results.setdefault(f"torch-{kind}", []).append(bench_torch_pipelining(kind, a.steps, a.warmup, a.device))
        for sch in a.schedules.split(","):
            v, summary = bench_workbench(sch, a.steps, a.warmup, a.device)
            results.setdefault(f"workbench-{sch}", []).append(v)
            fids.setdefault(f"workbench-{sch}", []).append(fidelity(Path(summary["out"]), sch, a.warmup))
    med = {k: statistics.median(v) for k, v in results.items()}
    single = med["single"]
    ideal = P * single * M / (M + P - 1)
    rows = [("single", single), ("ideal", ideal)] + [(k, v) for k, v in med.items() if k != "single"]
    fid = {k: {m: statistics.median(f[m] for f in v) for m in ("modeled_ms", "measured_ms")} for k, v in fids.items()}
    torch_best = max(v for k, v in rows if k.startswith("torch-"))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    with open(a.out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "samples_per_s", "of_ideal", "of_single", "vs_best_torch", "step_ms_modeled",
                    "step_ms_measured", "device", "cores", "load_avg_1min"])
        for k, v in rows:
            f = fid.get(k, {})
            w.writerow([k, f"{v:.1f}", f"{v / ideal:.3f}", f"{v / single:.3f}", f"{v / torch_best:.3f}",
                        f"{f['modeled_ms']:.2f}" if f else "", f"{f['measured_ms']:.2f}" if f else "", a.device,
                        len(os.sched_getaffinity(0)), f"{os.getloadavg()[0]:.2f}"])
    print(f"{'name':<26}{'samples/s':>12}{'of ideal':>10}{'x single':>10}{'vs torch':>10}{'model ms':>10}{'meas ms':>10}")
    for k, v in rows:
        f = fid.get(k)
        extra = f"{f['modeled_ms']:>10.1f}{f['measured_ms']:>10.1f}" if f else ""
        print(f"{k:<26}{v:>12.1f}{v / ideal:>10.2f}{v / single:>10.2f}{v / torch_best:>10.2f}{extra}")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

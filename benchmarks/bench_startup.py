"""What a short real run costs to start: a one-step job on 2 and 4 CPU ranks, timed from the caller,
the first call and the later calls in one process.

Rows (``method``):

* ``workbench-warm``: :func:`workbench.runtime.train` as a user calls it (the zoo ``mlp``, ``gpipe``,
  as many microbatches as ranks, one step, the per-epoch evaluation and checkpoint included), its
  ranks forked by the warm server (:mod:`workbench.runtime.launch.warm`); the first call starts the
  server;
* ``workbench-cold``: the same with ``WORKBENCH_WARM=0`` (every rank a new interpreter, ``spawn``);
* ``bare-spawn``: ``torch.multiprocessing.spawn`` of ranks that only join a gloo process group and
  pass a barrier;
* ``torch-pipelining``: ``torch.multiprocessing.spawn`` of ranks that join a gloo group and run the
  same step with ``torch.distributed.pipelining`` (the same MLP split in as many stages as ranks,
  ``ScheduleGPipe``, as many microbatches as ranks, an SGD update).

``call``: ``first`` (the first call of that method in this process) or ``later`` (``--repeat`` more,
interleaved with the other methods' so that a slow phase of a shared machine hits every row alike:
median, min, max). ``bare_spawn_over_this``: the ``bare-spawn`` median of the same ranks and call
over the row's (above 1: faster than bare spawn). ``server_starts``: warm servers started during the
row's calls (the first call's start, and a restart whenever a ``.py`` file of the workbench changed
meanwhile: another engineer's edit on a shared checkout). ``load_start`` / ``load_end``: the
machine's 1-minute load average (``os.getloadavg``) when the run started and ended.

    .venv/bin/python benchmarks/bench_startup.py            # writes results/bench/startup.csv
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from workbench.models import build
from workbench.runtime import train
from workbench.runtime.launch import warm
from workbench.runtime.launch.ports import free_port

OUT = Path(__file__).resolve().parents[1] / "results" / "bench" / "startup.csv"
METHODS = ("workbench-warm", "workbench-cold", "bare-spawn", "torch-pipelining")
BATCH = 64  # the zoo mlp's default batch size in the workbench's train()


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _join(rank: int, world: int, port: int) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=120)
    )


def _bare_rank(rank: int, world: int, port: int) -> None:
    _join(rank, world, port)
    dist.barrier()
    dist.destroy_process_group()


def _pipelining_rank(rank: int, world: int, port: int) -> None:
    """One GPipe step of the zoo mlp's layers, stage ``rank`` of ``world``, with torch's pipelining."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    torch.set_num_threads(1)
    _join(rank, world, port)
    model = build("mlp", seed=0)
    layers = list(model.layers)
    per = -(-len(layers) // world)
    stage_mod = nn.Sequential(*layers[rank * per : (rank + 1) * per])
    stage = PipelineStage(stage_mod, rank, world, torch.device("cpu"))
    sched = ScheduleGPipe(stage, n_microbatches=world, loss_fn=nn.functional.cross_entropy)
    x = torch.randn(BATCH, model.config["in_features"])
    y = torch.randint(0, model.config.get("num_classes", 10), (BATCH,))
    if rank == 0:
        sched.step(x)
    elif rank == world - 1:
        sched.step(target=y, losses=[])
    else:
        sched.step()
    with torch.no_grad():
        for p in stage_mod.parameters():
            if p.grad is not None:
                p -= 0.01 * p.grad
    dist.barrier()
    dist.destroy_process_group()


def _spawned(fn, world: int) -> None:
    mp.spawn(fn, args=(world, free_port()), nprocs=world, join=True)


def _workbench(world: int, folder: Path, cold: bool) -> None:
    out = Path(tempfile.mkdtemp(prefix="run-", dir=folder))
    with mock.patch.dict(os.environ, {"WORKBENCH_WARM": "0"} if cold else {}):
        train(
            "mlp",
            "gpipe",
            workers=world,
            microbatches=world,
            steps=1,
            out=out,
            progress=False,
            allow_oversubscribe=world > _cores(),
        )


def one_call(method: str, world: int, folder: Path) -> float:
    """Seconds of one call of ``method`` on ``world`` ranks, from the caller."""
    t = time.perf_counter()
    if method in ("workbench-warm", "workbench-cold"):
        _workbench(world, folder, cold=method == "workbench-cold")
    else:
        _spawned(_bare_rank if method == "bare-spawn" else _pipelining_rank, world)
    return time.perf_counter() - t


def measure(worlds: list[int], repeat: int, folder: Path) -> list[dict]:
    """``{(method, world, call): [seconds], server starts}``: first calls, then ``repeat``
    interleaved rounds of later calls."""
    times: dict = {}
    starts: dict = {}
    for call, rounds in (("first", 1), ("later", repeat)):
        for _ in range(rounds):
            for world in worlds:
                for method in METHODS:
                    before = warm.starts()
                    times.setdefault((method, world, call), []).append(one_call(method, world, folder))
                    starts[(method, world, call)] = starts.get((method, world, call), 0) + warm.starts() - before
    return _rows(times, starts)


def _rows(times: dict, starts: dict) -> list[dict]:
    rows = []
    for (method, world, call), ts in times.items():
        bare = statistics.median(times[("bare-spawn", world, call)])
        med = statistics.median(ts)
        rows.append(
            dict(
                method=method,
                world=world,
                call=call,
                calls=len(ts),
                median_s=round(med, 3),
                min_s=round(min(ts), 3),
                max_s=round(max(ts), 3),
                bare_spawn_over_this=round(bare / med, 2),
                server_starts=starts[(method, world, call)] if method == "workbench-warm" else "",
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4], help="rank counts (default 2 4)")
    ap.add_argument("--repeat", type=int, default=5, help="later calls per row (default 5)")
    ap.add_argument("--out", type=Path, default=OUT, help=f"the CSV to write (default {OUT})")
    args = ap.parse_args(argv)
    if args.repeat < 1 or any(w < 2 for w in args.worlds):
        ap.error("--repeat must be >= 1 and every --worlds entry >= 2")
    load_start = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="bench_startup_") as folder:
        rows = measure(args.worlds, args.repeat, Path(folder))
    load_end = os.getloadavg()[0]
    facts = dict(
        load_start=round(load_start, 2),
        load_end=round(load_end, 2),
        cores=_cores(),
        torch=torch.__version__,
        python=platform.python_version(),
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=[*rows[0], *facts])
        w.writeheader()
        w.writerows({**r, **facts} for r in rows)
    for r in rows:
        print(
            f"{r['method']:17s} {r['world']} ranks {r['call']:5s}: median {r['median_s']:.3f} s "
            f"(min {r['min_s']:.3f}, max {r['max_s']:.3f}; bare spawn / this {r['bare_spawn_over_this']})"
        )
    print(f"load {load_start:.2f} -> {load_end:.2f} on {facts['cores']} cores; wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

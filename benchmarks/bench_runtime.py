"""Runtime throughput vs torch.distributed.pipelining on the same split, microbatches and machine.

Two models, 2 gloo ranks with one torch thread each, 8 microbatches per minibatch:

* ``mlp``: the zoo ``mlp`` (8 layers of 512, 512 inputs, 10 classes), batch 256, split 4+4 layers;
* ``gpt``: the zoo mini ``gpt`` (embedding, 12 blocks of 64, decoder; context 64), batch 32, split in
  2 stages (1F1B rows) or 4 stages, 2 per rank (interleaved rows), :func:`even_bounds` for both.

Rows per model:

* ``single``: one process, one thread, the same 8 microbatches with gradient accumulation, SGD step
* ``ideal``: ``2 * single * m / (m + p - 1)`` (the fill-drain / 1F1B bubble of p = 2 stages, no
  communication cost; interleaved schedules have a smaller bubble and may exceed it, streams have none)
* ``ideal-stream``: ``2 * single`` (no bubble, no communication): the bound of the ``+stream`` rows,
  ``m / (m + p - 1)`` above ``ideal``
* ``single-update-per-microbatch`` / ``ideal-update-per-microbatch``: ``single`` with an SGD update
  after every microbatch (8 per minibatch, PipeDream's weight rule: the schedule's optimizer work,
  not its stashed copies, which are pipeline overhead), and the ideal from it. Its throughput is
  ``single`` over the step-time ratio of the two loops, measured by alternating them minibatch by
  minibatch in one process (200 pairs for the MLP, 40 for the GPT; median, quartiles in ``options``),
  because two separate throughput runs differ by more than the effect (the host drifts 10-15%).
  ``of_ideal_same_updates`` (``same upd`` in the table): a row's throughput relative to the ideal of
  its own update count (``updates_per_step`` from the run's summary: ``ideal-update-per-microbatch``
  for the PipeDream rows, ``ideal`` for the others, where it equals ``of_ideal``): the part of
  ``of_ideal`` that is the pipeline's and not the weight rule's
* paired columns (``paired``, ``p.same``, ``p.torch`` in the table): this host's speed drifts by
  10-15% within seconds (the compute of one configuration in consecutive repetitions), so a ratio
  of medians taken minutes apart carries that drift. Every torch and workbench run is therefore
  preceded by a ``single`` run; ``of_ideal_paired`` is the median over the repetitions of the run's
  throughput over the ideal from the single run just before it; ``of_ideal_same_updates_paired``
  scales it by the step-time ratio of ``single-update-per-microbatch`` to ``single`` (PipeDream rows);
  ``vs_torch_1f1b_paired`` = ``of_ideal_paired`` of the row / that of ``torch-1f1b``;
  ``paired_min`` / ``paired_max`` (``p.min`` / ``p.max``): the spread of the repetitions' ratios
* ``of_ideal_zero_overhead`` (``0-ovh``; workbench rows): ``of_ideal_paired`` with the row's message
  latency and time between ops free: each run's paired ratio times its ``measured_ms / modeled_ms``
  (``modeled_ms`` simulates the schedule with the per-stage mean F/B/STEP durations measured in the
  run's own timeline, their send hand-over and data copy included, messages arriving at once, no time
  between ops), median. Between it and 1 lies the ops' own time: both cores computing at once
  (``ideal-concurrent``), the stages' imbalance (the split cannot be finer than a layer), the weight
  rule's work (stashed copies), the sends' and data copies' CPU time; between it and
  ``of_ideal_paired``, the latency and the time between ops the runtime adds.
  ``vs_torch_1f1b_zero_overhead`` (``0-ovh.t``): the same over torch 1F1B's ``of_ideal_paired``
* ``single-concurrent`` / ``ideal-concurrent`` (CPU): ``single`` in 2 processes at once, each pinned
  to its own core (per-process throughput), and the ideal from it: what 2 ranks can reach when both
  cores compute at once (they share memory bandwidth and caches); ``of_ideal_concurrent`` (``of
  ideal*`` in the table) is relative to it. All multi-process rows pin one rank per core.
* ``torch-gpipe`` / ``torch-1f1b`` / ``torch-interleaved-1f1b``: ``torch.distributed.pipelining``
  ScheduleGPipe / Schedule1F1B / ScheduleInterleaved1F1B + SGD
* ``workbench-<schedule>``: :func:`workbench.runtime.train` running that schedule as a user gets it
  (its default transport ``"auto"``: shared memory on a CPU machine with a core per rank, else gloo;
  the ``options`` column says which ran), with the per-epoch test-set evaluation off (``evaluate=False``: the torch rows evaluate nothing either). Its per-epoch
  checkpoints stay on, but no epoch ends within the timed steps (the mlp's synthetic set holds 64
  steps per epoch here; an epoch end costs 15-25 ms on this machine; the torch rows have none). Its measured timeline gives the breakdown columns (ms per step, mean over the
  ranks, :func:`workbench.runtime.calibration.wall_time.breakdown`): compute, recv wait, send, data copy,
  optimizer, all-reduce, overhead (between ops). ``workbench-pipedream-flush+warmup``: the same
  schedule with the warm-up the workbench's planner gives this split on this machine
  (:func:`plan_warmup`: ``Plan.in_flight``, which counts the messages' latency; NOAM, torch's
  order, counts none), ``options`` column. ``workbench-<schedule>+gloo``: activations and gradients
  through torch.distributed's gloo (``transport="gloo"``) instead of
  the runtime's shared-memory transport (:mod:`workbench.runtime.transport.shm`); the torch rows use gloo
  (torch.distributed has no shared-memory point-to-point).
  ``workbench-<schedule>+stream``: the epoch's minibatches flow through the pipeline as one stream
  (``train(stream=True)``, schedules without a flush: PipeDream 1F1B, PipeDream-2BW), drained once at
  the epoch end instead of a fill and a drain per minibatch; ``pipedream-2bw`` rows accumulate over
  the whole minibatch (``microbatches_per_step`` = 8: one update per minibatch, as the torch rows).
  ``workbench-<schedule>+default-malloc``: the ranks keep glibc's malloc defaults instead of the
  runtime's (:mod:`workbench.runtime.launch.allocator`: freed memory kept, no page faults per op); every
  other row, the single and torch processes included, runs with the runtime's settings.

The single / torch rows feed random inputs of the model's shape (``mlp``: N(0, 1) features; ``gpt``:
uniform tokens); the workbench rows read the model's own data set (synthetic / pydocs) through its data
loader, same shapes and FLOPs.

Throughput = samples/s over the steps after ``--warmup``: total wall time of the timed steps for
every row (for the runtime from its ``metrics.csv``). Repetitions are interleaved (every row once per
repetition) and medians reported: on a shared machine only ratios within one run mean anything.
Writes ``results/bench/runtime.csv`` with the 1-minute load average beside every row.

    python benchmarks/bench_runtime.py [--models mlp,gpt] [--steps N] [--warmup 5] [--repeat 3] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from unittest import mock

import torch

M, P, LR = 8, 2, 0.01
SINGLE_M, IDEAL_M = "single-update-per-microbatch", "ideal-update-per-microbatch"
UPDATE_PAIRS = {"mlp": 200, "gpt": 40}  # alternated minibatch pairs of _SingleLoop.update_cost (about 20 s each)
CONFIGS = {  # model -> batch, default timed steps, workbench schedules, torch schedules
    "mlp": dict(
        batch=256,
        steps=30,
        schedules=[
            "gpipe",
            "pipedream-flush",
            "pipedream-flush+warmup",
            "zb-h1",
            "pipedream",
            "pipedream+stream+warmup",
            "pipedream-2bw+stream+warmup",
            "gpipe+gloo",
            "pipedream-flush+gloo",
            "zb-h1+gloo",
            "pipedream+gloo",
            "pipedream+stream+warmup+gloo",
            "pipedream-2bw+stream+warmup+gloo",
            "pipedream-flush+default-malloc",
            "pipedream+default-malloc",
        ],
        torch=["gpipe", "1f1b"],
    ),
    "gpt": dict(
        batch=32,
        steps=10,
        schedules=[
            "pipedream-flush",
            "pipedream-flush+warmup",
            "interleaved-1f1b",
            "pipedream",
            "pipedream+stream+warmup",
            "pipedream-2bw+stream+warmup",
            "pipedream-flush+gloo",
            "interleaved-1f1b+gloo",
            "pipedream-2bw+stream+warmup+gloo",
        ],
        torch=["1f1b", "interleaved-1f1b"],
    ),
}
# A row runs the runtime as a user gets it (transport "auto": the shared-memory transport on this machine, where
# every rank has a core of its own), and the suffixes of its name change one thing:
# "+warmup" = the 1F1B warm-up from the cost model (plan_warmup); "+stream" = the minibatches of the epoch flow
# through the pipeline as one stream, no drain between them (train(stream=True); schedules without a flush only);
# ablations: "+gloo" = activations and gradients through torch.distributed's gloo instead (transport="gloo");
# "+default-malloc" = the ranks keep glibc's malloc defaults (WORKBENCH_MALLOC=0).
# pipedream-2bw rows accumulate over the whole minibatch (microbatches_per_step = M: one update per minibatch, as
# torch's rows and pipedream-flush)


def plan_warmup(name: str) -> list[int]:
    """The 1F1B warm-up the workbench's planner gives this split on this machine
    (:func:`workbench.runtime.calibration.machine.in_flight`, :meth:`CostModel.in_flight`, the figure ``Plan.in_flight``
    reports): the stage compute measured at the microbatch size, one thread, and the link the cost
    model charges a runtime message (:func:`workbench.runtime.calibration.machine.runtime_link`: the idle gloo
    ping-pong's latency and bandwidth, the CPU per message of the loaded one)."""
    from workbench.runtime.calibration.machine import in_flight, measure_link, runtime_link, stage_profile
    from workbench.runtime.semantics.stages import even_bounds

    model = _model(name)
    bounds = even_bounds(len(model.layers), P)
    sizes = (4, 16 << 10, 64 << 10, 256 << 10, 1 << 20)
    link = runtime_link(
        measure_link("gloo", sizes=sizes, repeats=30), measure_link("gloo", sizes=sizes, repeats=60, busy=True)
    )
    sp = stage_profile(model, bounds, CONFIGS[name]["batch"] // M, threads=1, iterations=10, warmup=3)
    k = in_flight(sp, link)
    print(
        f"{name}: planner warm-up {k} (stage F {[round(x, 2) for x in sp.fwd_ms]} ms, B "
        f"{[round(x, 2) for x in sp.bwd_ms]} ms; link {link['latency_ms']:.3f} ms + n / "
        f"{link['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s, {link.get('message_cpu_ms', 0.0):.3f} ms CPU per message, "
        f"loaded latency {link['loaded_latency_ms']:.3f} ms)",
        flush=True,
    )
    return k


def _model(name: str):
    from workbench.models import build

    return build(name, seed=0)


def _data(name: str, steps: int, device="cpu"):
    g = torch.Generator().manual_seed(0)
    batch = CONFIGS[name]["batch"]
    if name == "gpt":
        cfg = _model(name).config
        xs = torch.randint(0, cfg["vocab_size"], (steps, batch, cfg["seq_len"]), generator=g)
        ys = torch.randint(0, cfg["vocab_size"], (steps, batch, cfg["seq_len"]), generator=g)
    else:
        xs = torch.randn(steps, batch, 512, generator=g)
        ys = torch.randint(0, 10, (steps, batch), generator=g)
    return xs.to(device), ys.to(device)


def sgd_step(params: list) -> None:
    """The single and torch rows' SGD step: the runtime's STEP (:func:`workbench.runtime.semantics.stages.sgd_update`
    in place, ``W - LR * grad``), then the gradients dropped (the next backward's become them)."""
    from workbench.runtime.semantics.stages import sgd_update

    sgd_update(dict(enumerate(params)), {i: p.grad for i, p in enumerate(params)}, LR, in_place=True)
    for p in params:
        p.grad = None


def bench_single(name: str, steps: int, warmup: int, device="cpu") -> float:
    """Samples/s of the whole model in this process, one thread: the M microbatches with gradient
    accumulation and one SGD step per minibatch."""
    return _SingleLoop(name, steps + warmup, device).throughput(steps, warmup)


class _SingleLoop:
    """The ``single`` row's training loop: minibatch ``i`` of random inputs of the model's shape, M
    microbatches, SGD with the runtime's update (:func:`sgd_step`)."""

    def __init__(self, name: str, n: int, device="cpu"):
        from workbench.runtime.launch.allocator import retain_freed_memory

        torch.set_num_threads(1)
        retain_freed_memory()  # every process of the benchmark uses the runtime ranks' malloc settings
        self.device = device
        self.model = _model(name).to(device)
        self.net = torch.nn.Sequential(*self.model.layers)
        self.params = list(self.net.parameters())
        self.xs, self.ys = _data(name, n, device)

    def step(self, i: int, updates: int = 1) -> None:
        """Minibatch ``i``: ``updates`` = 1 (gradients accumulated over the microbatches, one update)
        or M (an update after every microbatch, each its own mean loss: PipeDream's weight rule)."""
        for x, y in zip(self.xs[i].chunk(M), self.ys[i].chunk(M)):
            if updates == M:
                self.model.loss(self.net(x), y).backward()
                sgd_step(self.params)
            else:
                (self.model.loss(self.net(x), y) / M).backward()
        if updates != M:
            sgd_step(self.params)

    def _sync(self) -> None:
        if self.device != "cpu":
            torch.cuda.synchronize()

    def throughput(self, steps: int, warmup: int) -> float:
        for i in range(warmup):
            self.step(i)
        self._sync()
        t = time.perf_counter()
        for i in range(warmup, warmup + steps):
            self.step(i)
        self._sync()
        return steps * self.xs.shape[1] / (time.perf_counter() - t)

    def update_cost(self, pairs: int) -> tuple[float, float, float]:
        """Time of a minibatch with M updates over one with a single update, alternated step by step
        in this process (each pair seconds apart at most, so the host's drift cancels): quartiles of
        the ``pairs`` ratios."""
        n = self.xs.shape[0]

        def timed(i, u):
            self._sync()
            t = time.perf_counter()
            self.step(i % n, u)
            self._sync()
            return time.perf_counter() - t

        for i in range(4):
            timed(i, 1), timed(i, M)
        r = [timed(i, M) / timed(i, 1) for i in range(pairs)]
        return tuple(statistics.quantiles(r, n=4))


def _single_worker(rank, world, name, steps, warmup, device, q):
    from workbench.runtime.launch.affinity import pin_rank

    pin_rank(rank, world, 1, device)
    q.put(bench_single(name, steps, warmup, device))


def bench_single_concurrent(name: str, steps: int, warmup: int, device="cpu") -> float:
    """``single`` run in ``P`` processes at once, each pinned to its own core as the runtime's ranks
    are: the per-process throughput when every core computes (memory bandwidth and caches shared)."""
    import torch.multiprocessing as mp

    q = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_single_worker, args=(P, name, steps, warmup, device, q), nprocs=P, start_method="spawn")
    return statistics.fmean(q.get() for _ in range(P))


def _torch_pp_worker(rank, world, port, name, kind, steps, warmup, device, q):
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    from workbench.runtime.launch.affinity import place_rank
    from workbench.runtime.semantics.stages import even_bounds, stage_module

    torch.set_num_threads(1)
    place_rank(rank, world, 1, device)  # set up as the workbench's runtime sets up its ranks
    dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    if device == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(
        "nccl" if device == "cuda" else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    model = _model(name)
    per_rank = 2 if kind == "interleaved-1f1b" else 1
    S = world * per_rank
    bounds = even_bounds(len(model.layers), S)
    xs, ys = _data(name, steps + warmup, dev)
    mods, stages = [], []
    for s in range(rank, S, world):  # stage s on rank s mod world (the workbench's interleaved placement)
        mod = stage_module(model.layers, *bounds[s]).to(dev)
        mods.append(mod)
        stages.append(PipelineStage(mod, s, S, dev))
    if kind == "interleaved-1f1b":
        sched = ScheduleInterleaved1F1B(stages, n_microbatches=M, loss_fn=model.loss)
    else:
        sched = (ScheduleGPipe if kind == "gpipe" else Schedule1F1B)(stages[0], n_microbatches=M, loss_fn=model.loss)
    first, last = rank == 0, rank == (S - 1) % world
    t = None
    for i in range(steps + warmup):
        if i == warmup:
            dist.barrier()
            t = time.perf_counter()
        kw = dict(target=ys[i], losses=[]) if last else {}
        sched.step(xs[i], **kw) if first else sched.step(**kw)
        sgd_step([p for mod in mods for p in mod.parameters()])
    dist.barrier()
    if rank == 0:
        q.put(steps * xs.shape[1] / (time.perf_counter() - t))
    dist.destroy_process_group()


def bench_torch_pipelining(name: str, kind: str, steps: int, warmup: int, device="cpu") -> float:
    import torch.multiprocessing as mp

    from workbench.runtime.launch.driver import free_port

    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(
        _torch_pp_worker, args=(P, free_port(), name, kind, steps, warmup, device, q), nprocs=P, start_method="spawn"
    )
    return q.get()


def bench_workbench(
    name: str,
    schedule: str,
    steps: int,
    warmup: int,
    device="cpu",
    options: dict | None = None,
    transport: str = "auto",
    stream: bool = False,
) -> tuple[float, Path]:
    from workbench.runtime import train

    batch = CONFIGS[name]["batch"]
    out = Path(tempfile.mkdtemp(prefix="bench_rt_")) / schedule
    # mlp: a synthetic set of 64 steps per epoch, so the timed steps hold no epoch end (its checkpoint and
    # CSV writes, 15-25 ms each on this machine, are not in the torch rows either); gpt: 15 steps < an epoch
    data = dict(dataset_options={"num_train": 64 * batch}) if name == "mlp" else {}
    train(
        name,
        schedule,
        workers=P,
        microbatches=M,
        steps=steps + warmup,
        batch_size=batch,
        lr=LR,
        out=out,
        threads=1,
        progress=False,
        device=device,
        evaluate=False,
        schedule_options=options or {},
        transport=transport,
        stream=stream,
        **data,
    )
    with open(out / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    if len({r["epoch"] for r in rows[warmup - 1 :]}) > 1:
        raise RuntimeError(f"{name} {schedule}: the timed steps cross an epoch end; use fewer --steps")
    timed = rows[warmup:]
    span = float(timed[-1]["wall_ms"]) - float(rows[warmup - 1]["wall_ms"])
    return len(timed) * batch / span * 1e3, out


def where_time_goes(out: Path, warmup: int) -> dict:
    """Mean over the ranks of the measured breakdown, ms per step (see workbench.runtime.calibration.wall_time)."""
    import pandas as pd

    from workbench.runtime.calibration.wall_time import breakdown

    return breakdown(pd.read_csv(out / "timeline.csv"), warmup).mean().to_dict()


def fidelity(out: Path, schedule: str, warmup: int, options: dict | None = None, stream: bool = False) -> dict:
    """Modeled vs measured time per step: simulate the schedule with the per-stage F/B/STEP durations
    measured in the run's own timeline (mean over the timed steps), communication free. A stream is
    simulated as the schedule over the timed steps' microbatches (one fill and one drain), per step."""
    import pandas as pd

    from workbench.runtime.launch.driver import schedule_for_workers
    from workbench.simulation import simulate

    tl = pd.read_csv(out / "timeline.csv")
    tl = tl[tl.step >= warmup]
    rounds = tl.step.nunique() if stream else 1
    sched = schedule_for_workers(schedule, P, None, M * rounds, dict(options or {}))
    S = sched.num_stages
    tl = tl.assign(dur=tl.end - tl.start)
    mean = tl.groupby(["kind", "stage"]).dur.mean()
    fwd = [float(mean[("F", s)]) for s in range(S)]
    bwd = [
        float(mean[("B", s)]) if ("B", s) in mean.index else float(mean[("BI", s)] + mean[("BW", s)]) for s in range(S)
    ]  # split backward: the simulator charges BI = BW = bwd / 2
    step_ms = float(tl[tl.kind == "STEP"].dur.mean())
    sim = simulate(sched, fwd=fwd, bwd=bwd, step_ms=step_ms)
    modeled = sim.metrics["makespan"] / rounds
    steps = tl.step.nunique()
    measured = (tl.end.max() - tl.start.min()) / steps
    return dict(modeled_ms=modeled, measured_ms=measured, error=modeled / measured - 1)


def run_model(name: str, steps: int, warmup: int, repeat: int, device: str) -> list[dict]:
    """Every row of one model, ``repeat`` interleaved rounds; one dict per row (medians)."""
    cfg = CONFIGS[name]
    runs: dict[str, list] = {}
    warm: dict[str, list[int]] = {}  # the planner's warm-up, calibrated once per model and run
    for _ in range(repeat):  # interleaved repetitions: slow phases of a shared machine hit every row alike
        runs.setdefault("single", []).append(dict(v=bench_single(name, steps, warmup, device)))
        if device == "cpu":
            runs.setdefault("single-concurrent", []).append(
                dict(v=bench_single_concurrent(name, steps, warmup, device))
            )
        for kind in cfg["torch"]:
            ref = bench_single(name, steps, warmup, device)  # paired: the single run just before this row
            runs.setdefault(f"torch-{kind}", []).append(
                dict(v=bench_torch_pipelining(name, kind, steps, warmup, device), ref=ref)
            )
        for sch in cfg["schedules"]:
            if device != "cpu" and "+gloo" in sch:
                continue  # on GPUs the default is NCCL: no shared-memory twin to compare
            base, *suffixes = sch.split("+")
            opts = {"microbatches_per_step": M} if base == "pipedream-2bw" else {}
            if "warmup" in suffixes:
                if name not in warm:
                    warm[name] = plan_warmup(name)
                opts["warmup"] = warm[name]
            transport = "gloo" if "gloo" in suffixes else "auto"
            malloc = "default" if "default-malloc" in suffixes else "retain"
            stream = "stream" in suffixes
            ref = bench_single(name, steps, warmup, device)
            # read by the spawned ranks; restored afterwards
            with mock.patch.dict(os.environ, WORKBENCH_MALLOC="0" if malloc == "default" else "1"):
                v, out = bench_workbench(name, base, steps, warmup, device, opts, transport, stream)
            summary = json.loads((out / "summary.json").read_text())
            used = summary["transport"]  # what "auto" resolved to
            label = ";".join(
                [f"{k}={','.join(map(str, x)) if isinstance(x, list) else x}" for k, x in opts.items()]
                + [f"transport={used}", f"malloc={malloc}"]
                + (["stream"] if stream else [])
            )
            runs.setdefault(f"workbench-{sch}", []).append(
                dict(
                    v=v,
                    ref=ref,
                    updates_per_step=summary["updates_per_step"],
                    **fidelity(out, base, warmup, opts, stream),
                    **where_time_goes(out, warmup),
                    options=label,
                )
            )
    single = statistics.median(r["v"] for r in runs["single"])
    ideal = P * single * M / (M + P - 1)
    torch_1f1b = statistics.median(r["v"] for r in runs["torch-1f1b"])
    # PipeDream's weight rule in one process: M updates per minibatch instead of one (and no accumulation)
    q1, upd_ratio, q3 = _SingleLoop(name, 4, device).update_cost(UPDATE_PAIRS[name])
    single_m = single / upd_ratio
    ideal_m = P * single_m * M / (M + P - 1)  # the same bubble, the optimizer work of M updates per minibatch
    conc = statistics.median(r["v"] for r in runs["single-concurrent"]) if "single-concurrent" in runs else None
    ideal_conc = P * conc * M / (M + P - 1) if conc else None
    rows = [
        dict(model=name, name="single", samples_per_s=single),
        dict(model=name, name="ideal", samples_per_s=ideal),
        dict(model=name, name="ideal-stream", samples_per_s=P * single),
        dict(
            model=name,
            name=SINGLE_M,
            samples_per_s=single_m,
            updates_per_step=M,
            options=f"step time ratio to single {upd_ratio:.4f} (quartiles {q1:.4f}-{q3:.4f})",
        ),
        dict(model=name, name=IDEAL_M, samples_per_s=ideal_m, updates_per_step=M),
    ]
    if conc:
        rows += [
            dict(model=name, name="single-concurrent", samples_per_s=conc),
            dict(model=name, name="ideal-concurrent", samples_per_s=ideal_conc),
        ]
    for k, rs in runs.items():
        if k in ("single", "single-concurrent"):
            continue
        row = dict(model=name, name=k, samples_per_s=statistics.median(r["v"] for r in rs))
        if "ref" in rs[0]:  # each run over the ideal of the single run just before it; median over repetitions
            paired = [r["v"] / (P * r["ref"] * M / (M + P - 1)) for r in rs]
            row["of_ideal_paired"] = statistics.median(paired)
            row["paired_min"], row["paired_max"] = min(paired), max(paired)
            if "modeled_ms" in rs[0]:  # the same runs with their communication and overhead free
                row["of_ideal_zero_overhead"] = statistics.median(
                    x * r["measured_ms"] / r["modeled_ms"] for x, r in zip(paired, rs)
                )
        for col in [c for c in rs[0] if c not in ("v", "ref")]:
            row[col] = rs[0][col] if isinstance(rs[0][col], str) else statistics.median(r[col] for r in rs)
        rows.append(row)
    torch_paired = next(r["of_ideal_paired"] for r in rows if r["name"] == "torch-1f1b")
    for r in rows:
        if "of_ideal_paired" in r:
            same = upd_ratio if r.get("updates_per_step") == M else 1.0
            r.update(
                of_ideal_same_updates_paired=r["of_ideal_paired"] * same,
                vs_torch_1f1b_paired=r["of_ideal_paired"] / torch_paired,
            )
            if "of_ideal_zero_overhead" in r:
                r["vs_torch_1f1b_zero_overhead"] = r["of_ideal_zero_overhead"] / torch_paired
        r.update(
            of_ideal=r["samples_per_s"] / ideal,
            of_single=r["samples_per_s"] / single,
            of_ideal_concurrent=r["samples_per_s"] / ideal_conc if ideal_conc else float("nan"),
            of_ideal_same_updates=r["samples_per_s"] / (ideal_m if r.get("updates_per_step") == M else ideal),
            vs_torch_1f1b=r["samples_per_s"] / torch_1f1b,
            steps=steps,
            repeat=repeat,
            device=device,
            cores=len(os.sched_getaffinity(0)),
            load_avg_1min=round(os.getloadavg()[0], 2),
        )
    return rows


COLUMNS = [
    "model",
    "name",
    "options",
    "updates_per_step",
    "samples_per_s",
    "of_ideal",
    "of_ideal_same_updates",
    "of_ideal_concurrent",
    "of_single",
    "vs_torch_1f1b",
    "of_ideal_paired",
    "of_ideal_same_updates_paired",
    "vs_torch_1f1b_paired",
    "paired_min",
    "paired_max",
    "of_ideal_zero_overhead",
    "vs_torch_1f1b_zero_overhead",
    "modeled_ms",
    "measured_ms",
    "step_ms",
    "compute_ms",
    "recv_wait_ms",
    "send_ms",
    "data_ms",
    "optimizer_ms",
    "allreduce_ms",
    "overhead_ms",
    "steps",
    "repeat",
    "device",
    "cores",
    "load_avg_1min",
]


def print_tables(rows: list[dict]) -> None:
    cols = [
        ("samples/s", "samples_per_s", 11, 1),
        ("of ideal", "of_ideal", 9, 2),
        ("same upd", "of_ideal_same_updates", 9, 2),
        ("of ideal*", "of_ideal_concurrent", 10, 2),
        ("vs torch", "vs_torch_1f1b", 9, 2),
        ("paired", "of_ideal_paired", 8, 2),
        ("p.same", "of_ideal_same_updates_paired", 8, 2),
        ("p.torch", "vs_torch_1f1b_paired", 8, 2),
        ("p.min", "paired_min", 7, 2),
        ("p.max", "paired_max", 7, 2),
        ("0-ovh", "of_ideal_zero_overhead", 7, 2),
        ("0-ovh.t", "vs_torch_1f1b_zero_overhead", 8, 2),
        ("model ms", "modeled_ms", 9, 1),
        ("meas ms", "measured_ms", 9, 1),
        ("load", "load_avg_1min", 6, 1),
    ]
    print(f"{'model':<6}{'name':<44}" + "".join(f"{h:>{w}}" for h, _, w, _ in cols))
    for r in rows:
        print(
            f"{r['model']:<6}{r['name']:<44}"
            + "".join(f"{r[k]:>{w}.{d}f}" if k in r else " " * w for _, k, w, d in cols)
        )
    parts = COLUMNS[COLUMNS.index("step_ms") : COLUMNS.index("overhead_ms") + 1]
    print("\nwhere the time goes (measured, ms per step, mean over the ranks):")
    print(f"{'model':<6}{'name':<44}" + "".join(f"{p.removesuffix('_ms'):>10}" for p in parts))
    for r in rows:
        if "step_ms" in r:
            print(f"{r['model']:<6}{r['name']:<44}" + "".join(f"{r[p]:>10.2f}" for p in parts))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="mlp,gpt")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default: 30 for mlp, 10 for gpt)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeat", type=int, default=3, help="rounds over all configurations; medians are reported")
    ap.add_argument(
        "--out",
        default=None,
        help="CSV to write (none by default: a run to look at the numbers leaves the checkout unchanged; the committed one is results/bench/runtime.csv)",
    )
    a = ap.parse_args(argv)
    rows = []
    for name in a.models.split(","):
        if name not in CONFIGS:
            ap.error(f"unknown model {name!r}; choose from {', '.join(CONFIGS)}")
        rows += run_model(name, a.steps or CONFIGS[name]["steps"], a.warmup, a.repeat, a.device)
    print_tables(rows)
    from workbench.runtime.launch.outputs import atomic_text

    if not a.out:
        print("(no CSV written: pass --out results/bench/runtime.csv to refresh the committed one)")
        return 0
    out = Path(a.out)  # the current result replaces the previous one (earlier runs: git history)
    out.parent.mkdir(parents=True, exist_ok=True)
    text = io.StringIO()
    w = csv.DictWriter(text, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in r.items()} for r in rows)
    atomic_text(text.getvalue(), out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

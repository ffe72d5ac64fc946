"""The program of one rank: join the process group, build its executor, run the epochs.

Per epoch: post the epoch's receive plan, run the rounds (one minibatch each; fault injection at the
start of a round), flush the sends, let every stage replica write its checkpoint, evaluate on the
test split (rank 0), gather metrics and timeline rows on rank 0, which appends them to the CSVs and
marks the checkpoint complete (the gather is the only synchronization: the other ranks go on). How
a rank starts, reports a failure and stops (signals, its launcher's death) is
:mod:`workbench.runtime.launch.lifetime`'s; each round tells it the step the rank reached.
"""

from __future__ import annotations

import functools
import gc
import os
import socket
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from workbench.runtime.executors.ddp import DDPExecutor
from workbench.runtime.executors.hogwild import HogwildExecutor
from workbench.runtime.executors.pipeline import PipelineExecutor
from workbench.runtime.executors.segment_executor import SegmentExecutor
from workbench.runtime.executors.tied import make_groups as tied_groups
from workbench.runtime.executors.tied import tied_weights
from workbench.runtime.launch.affinity import place_rank
from workbench.runtime.launch.job import Job, RankContext
from workbench.runtime.launch.lifetime import reached
from workbench.runtime.launch.outputs import (
    append_outputs,
    atomic_save,
    jsonable,
    latest_checkpoint,
    load_stage,
    peak_rss,
    write_summary,
)
from workbench.runtime.semantics.stages import DataOrder, as_tuple, microbatch, run_stage, stage_module, stage_params
from workbench.runtime.transport.comm_plan import channels
from workbench.schedules import executor_of


def _init_dist(rank: int, world: int, job: Job, addr: str | None, port: int | None):

    kw: dict[str, Any] = dict(
        backend=job.run.backend, rank=rank, world_size=world, timeout=timedelta(seconds=job.run.timeout_s)
    )
    if addr is None:
        dist.init_process_group(init_method="env://", **kw)
    else:
        dist.init_process_group(init_method=f"tcp://{addr}:{port}", **kw)
    return dist


def _make_groups(dist, rank: int, job: Job) -> dict:
    """One process group per distinct replica set of a stage, plus one per point-to-point
    communicator of :func:`~workbench.runtime.transport.comm_plan.channels` (activations and gradients per
    kind and ordered pair of ranks, the master family's fetches and pushes per stage and direction),
    created in the same order on all ranks."""
    groups: dict[Any, Any] = {}
    if executor_of(job.schedule) == "pipeline":
        scheds = [job.schedule] + ([job.stream(2 * job.schedule.microbatches)] if job.stream is not None else [])
        for name, ranks in channels(scheds):
            g = dist.new_group(list(ranks), timeout=timedelta(seconds=job.run.timeout_s))
            if rank in ranks:
                groups[name] = g
    for ws in sorted({tuple(w) for w in job.schedule.stage_workers if len(w) > 1}):
        g = dist.new_group(list(ws), timeout=timedelta(seconds=job.run.timeout_s))
        if rank in ws:
            groups[ws] = g
    return groups


def _boundary_specs(model, bounds, x) -> tuple[list, list]:
    """Shapes/dtypes of every stage output for one microbatch, by running the model once."""
    specs, like = [], []
    with torch.no_grad():
        for a, z in bounds:
            like.append(isinstance(x, tuple))
            x = run_stage(
                stage_module(model.layers, a, z), dict(stage_module(model.layers, a, z).named_parameters()), x
            )
            specs.append([(tuple(t.shape), t.dtype) for t in as_tuple(x)])
    return specs, like


def _warm_up_compute(model, bounds, x, y) -> None:
    """One forward and backward of the whole model on copies of the weights: the first backward of a
    process pays one-off lazy initialisation (imports, ~1 s on CPU here) that would otherwise land in step 0."""
    leaves = []
    for a, z in bounds:
        m = stage_module(model.layers, a, z)
        params = {n: p.detach().clone().requires_grad_(True) for n, p in m.named_parameters()}
        leaves += list(params.values())
        x = run_stage(m, params, x)
    if leaves:
        torch.autograd.grad(model.loss(x, y), leaves, allow_unused=True)
    a = torch.ones(2, requires_grad=True)  # a VJP with explicit cotangents lazily imports sympy (~1 s)
    torch.autograd.grad([a * 2], [a], [torch.ones(2)])


def worker_main(rank: int, world: int, jobs: list[Job], addr: str | None, port: int | None, *, shareds=None) -> None:
    """Entry of one rank: join the process group, then run the jobs one after the other."""
    job = jobs[0]
    threads, on = job.run.threads, job.run.device
    assert threads is not None and on is not None, "launch.build_job resolves a job's threads and device"
    torch.set_num_threads(max(1, threads))
    # pinned to its cores, freed memory kept (no page faults per op: runtime.launch.allocator)
    place_rank(
        int(os.environ.get("LOCAL_RANK", rank)),
        int(os.environ.get("LOCAL_WORLD_SIZE", world)),
        threads,
        "cuda" if on.startswith("cuda") else "cpu",
    )
    device = torch.device("cpu")
    if on.startswith("cuda"):
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist = _init_dist(rank, world, job, addr, port)
    for i, job in enumerate(jobs):
        groups = _make_groups(dist, rank, job)
        _train_rank(rank, world, job, dist, groups, device=device, shared=shareds[i] if shareds else None)
    dist.destroy_process_group()  # a rank that failed ends at once instead (lifetime): the kernel closes its sockets


def _shared_t0(dist, t0: float) -> float:
    """The origin of this rank's timeline. ``time.perf_counter`` is CLOCK_MONOTONIC, one clock per
    machine: ranks on rank 0's host take rank 0's ``t0``, so their timelines share one time axis
    exactly (a send's start precedes its receive's end); a rank on another host keeps its own, taken
    when the barrier released it (skewed by the barrier's exit latency)."""
    obj = [(socket.gethostname(), t0)]
    dist.broadcast_object_list(obj, src=0)
    host, t0_rank0 = obj[0]
    return t0_rank0 if host == socket.gethostname() else t0


@dataclass(frozen=True)
class _Feed:
    """This rank's view of the training data: microbatch ``b`` of minibatch ``k`` of an epoch's
    permutation, on ``device`` in ``dtype``; only the first stage's ranks read the inputs
    (``reads_inputs``), the last stage's the targets."""

    dataset: Any
    order: DataOrder
    device: torch.device
    dtype: torch.dtype | None
    reads_inputs: bool

    def batch(self, perm, k: int, b: int):
        return microbatch(
            self.dataset, self.order.indices(perm, k, b), self.device, self.dtype, inputs=self.reads_inputs
        )


@dataclass(frozen=True)
class _Epoch:
    """The minibatches ``rounds`` (indices within ``epoch``) a rank trains before its next epoch end,
    the epoch's sample permutation, and the metrics ``rows`` and ``timeline`` records they leave."""

    epoch: int
    rounds: list[int]
    perm: Any
    rows: list = field(default_factory=list)
    timeline: list = field(default_factory=list)


def _train_rank(rank, world, job: Job, dist, groups, *, device, shared) -> None:
    """One job on this rank: restore the newest complete checkpoint (``resume``), build the executor
    of the schedule, start the common clock, train epoch after epoch, then gather the summary."""
    sched = job.schedule
    model = job.model_fn()
    model.to(device)
    model.train()
    groups.update(tied_groups(dist, sched, tied_weights(model, job.bounds), rank, job.run.timeout_s))
    dataset = job.dataset_fn()
    order = DataOrder(len(dataset), job.optim.batch_size, sched.microbatches, job.optim.seed)
    my_stages = sorted({op.stage for op in sched.ops[rank]})
    feed = _Feed(dataset, order, device, getattr(torch, job.dtype) if job.dtype else None, 0 in my_stages)
    init = [stage_params(stage_module(model.layers, a, z)) for a, z in job.bounds]
    start_round, opt_state = _restore(job, rank, my_stages, init, device)
    ctx = RankContext(
        rank,
        world,
        device,
        job.optim,
        job.run,
        start_round=start_round,
        shm_token=job.shm_token,
        rounds_per_epoch=order.rounds_per_epoch,
    )
    x0, y0 = microbatch(dataset, order.indices(order.permutation(0), 0, 0), device, feed.dtype)
    ctx.specs, ctx.like_tuple = _boundary_specs(model, job.bounds, x0)
    _warm_up_compute(model, job.bounds, x0, y0)
    executor = _make_executor(ctx, job, model, init, groups, shared=shared)
    if opt_state and job.optim.momentum:
        executor.load_optimizer_state(opt_state)
    if hasattr(executor, "comm"):
        executor.warm_up()
    ctx.t0 = _start_together(dist, job, executor)
    wall0 = time.time()
    bar = None
    if rank == 0 and job.run.progress:
        from tqdm.auto import tqdm

        # a thread lock, not tqdm's default multiprocessing one: that semaphore is never released by a
        # rank that is stopped, and the resource tracker then warns of it after the stop message
        tqdm.set_lock(threading.RLock())
        bar = tqdm(
            total=job.rounds_total, initial=start_round, desc=f"{sched.name} train", unit="step", file=sys.stderr
        )
    R, samples_done, truncate_from = start_round, 0, start_round
    while R < job.rounds_total:
        R, samples = _train_epoch(ctx, job, dist, executor, model, feed=feed, R=R, truncate_from=truncate_from, bar=bar)
        samples_done += samples
        truncate_from = -1  # only the first write after a resume truncates
    if bar is not None:
        bar.close()
    if hasattr(getattr(executor, "comm", None), "close"):
        executor.comm.close()
    _gather_summary(ctx, job, dist, executor, my_stages, wall_s=time.time() - wall0, samples=samples_done)


def _restore(job: Job, rank: int, my_stages: list[int], init: list[dict], device) -> tuple[int, dict]:
    """With ``resume``, this rank's stages' weights (into ``init``) and momentum buffers from the
    newest complete checkpoint: (the minibatch to start at, {stage: momentum buffers})."""
    ckpt = latest_checkpoint(Path(job.run.out)) if job.run.resume else None
    if ckpt is None:
        return 0, {}
    sched, opt_state = job.schedule, {}
    for s in my_stages:
        rep = sched.stage_workers[s].index(rank) if rank in sched.stage_workers[s] else 0
        saved = load_stage(ckpt, s, rep)
        init[s] = {n: t.to(device) for n, t in saved["weights"].items()}
        opt_state[s] = {n: t.to(device) for n, t in saved["optimizer"].get("momentum_buffer", {}).items()}
    return int(ckpt.name[len("round") :]), opt_state


def _make_executor(ctx: RankContext, job: Job, model, init: list[dict], groups: dict, *, shared) -> Any:
    """The executor the schedule's registration names (Hogwild, DDP, or the pipeline executor; the
    segment executor for a schedule with segments). The four share the step loop's duck-typed
    interface (:mod:`~workbench.runtime.executors.pipeline`'s docstring)."""

    sched, kind = job.schedule, executor_of(job.schedule)
    if kind == "hogwild":
        weights, counters = shared
        return HogwildExecutor(ctx, sched, model, job.bounds, weights, counters=counters)
    if kind == "ddp":
        return DDPExecutor(ctx, sched, model, job.bounds, init, groups=groups)
    if sched.num_segments > 1:  # Seq1F1B: (microbatch, segment) units
        return SegmentExecutor(ctx, sched, model, job.bounds, init, groups=groups)
    return PipelineExecutor(ctx, sched, model, job.bounds, init, groups=groups, stream=job.stream)


def _start_together(dist, job: Job, executor) -> float:
    """Every rank passes one barrier, then takes the timeline's origin ``t0`` (:func:`_shared_t0`)."""
    barrier = (
        functools.partial(dist.monitored_barrier, timeout=timedelta(seconds=job.run.timeout_s))
        if job.run.backend == "gloo"
        else dist.barrier
    )
    gc.collect()  # before the barrier: its duration differs between ranks and would skew their clocks
    gc.freeze()  # long-lived objects (torch & co.) are no longer scanned by the collector during the steps
    barrier()
    if hasattr(getattr(executor, "comm", None), "unlink"):
        executor.comm.unlink()  # every rank has mapped its channels: no file outlives the job, however it ends
    return _shared_t0(dist, time.perf_counter())


def _train_epoch(
    ctx: RankContext, job: Job, dist, executor, model, *, feed: _Feed, R: int, truncate_from: int, bar
) -> tuple[int, int]:
    """The rounds of the epoch of global minibatch ``R`` from ``R`` on (up to ``rounds_total``), round
    by round or as one stream; then flush the sends, write the checkpoint, evaluate, and gather the
    metrics and timeline rows on rank 0, which appends them to the CSVs and marks the checkpoint
    complete. Returns (the next minibatch, samples trained)."""
    rank, rpe = ctx.rank, ctx.rounds_per_epoch
    epoch, first = divmod(R, rpe)
    rounds = list(range(first, min(rpe, first + job.rounds_total - R)))
    ep = _Epoch(epoch, rounds, feed.order.permutation(epoch))
    if hasattr(executor, "comm"):
        executor.begin_epoch(rounds)
    run = _run_stream if job.stream is not None else _run_rounds  # a stream: drained at the epoch end only
    samples = run(ctx, executor, job, feed, ep, bar=bar)
    if hasattr(executor, "flush"):
        executor.flush()
    elif hasattr(executor, "comm"):
        executor.comm.flush()
    R = epoch * rpe + rounds[-1] + 1
    out = Path(job.run.out)
    ck = _write_checkpoint(out, R, epoch, executor, job, rank=rank)
    evaluation = (
        _evaluate(rank, ctx.world, job, dist, executor, model=model, device=feed.device, dtype=feed.dtype)
        if job.optim.evaluate
        else None
    )
    if evaluation is not None and rank == 0:
        ep.rows[-1].update(evaluation._asdict())
    gathered = [None] * ctx.world if rank == 0 else None
    # every rank writes its checkpoint before it joins the gather, so once rank 0 has the
    # gathered rows every part of the checkpoint is on disk: rank 0 marks it complete after the
    # outputs, and the other ranks go on without waiting for rank 0's writes (no barrier)
    dist.gather_object((ep.rows, ep.timeline), gathered, dst=0)
    if rank == 0:
        append_outputs(out, gathered, job, truncate_from)
        (ck / "COMPLETE").write_text("ok\n")
    return R, samples


def _run_rounds(ctx: RankContext, executor, job: Job, feed: _Feed, ep: _Epoch, *, bar) -> int:
    """The rounds of one epoch, one pass of the schedule each: one metrics row per minibatch, ending
    where this rank's last op of it ended. Returns the samples trained."""
    for k in ep.rounds:
        Rg = ep.epoch * ctx.rounds_per_epoch + k
        _start_step(job, ctx.rank, Rg)
        cache: dict = {}

        def data(b, k=k, cache=cache):
            if b not in cache:
                cache[b] = feed.batch(ep.perm, k, b)
            return cache[b]

        metrics = {"loss": 0.0, "n": 0, "correct": 0, "samples": 0}
        executor.run_round(k, Rg, data, ep.timeline, metrics)
        ep.rows.append(dict(step=Rg, epoch=ep.epoch, end_ms=(time.perf_counter() - ctx.t0) * 1e3, **metrics))
        if bar is not None:
            bar.update(1)
    return job.optim.batch_size * len(ep.rounds)


def _gather_summary(
    ctx: RankContext, job: Job, dist, executor, my_stages: list[int], *, wall_s: float, samples: int
) -> None:
    """Every rank's memory, traffic and timing facts (and, with ``return_weights``, its weights)
    gathered on rank 0, which writes ``summary.json``."""
    device = ctx.device
    comm = getattr(executor, "comm", None)
    info = dict(
        rank=ctx.rank,
        stages=my_stages,
        memory=jsonable(executor.memory()),
        peak_rss_bytes=peak_rss(),
        cuda_max_memory_allocated=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
        # what timed the measured timeline: the host's clock around each op, or device events (opclock)
        timeline_clock=getattr(getattr(executor, "clock", None), "name", "host"),
        bytes_sent=getattr(comm, "bytes_sent", 0),
        receive_post_ms=getattr(comm, "post_ms", 0.0),
        wall_s=wall_s,
        samples=samples,
        start_round=ctx.start_round,
        **(asdict(executor.remote.stats) if getattr(executor, "remote", None) else {}),
    )
    weights = executor.weights() if job.run.return_weights else None
    gathered = [None] * ctx.world if ctx.rank == 0 else None
    dist.gather_object((info, weights), gathered, dst=0)
    if ctx.rank == 0:
        write_summary(Path(job.run.out), job, gathered)


def _run_stream(ctx: RankContext, executor, job: Job, feed: _Feed, ep: _Epoch, *, bar) -> int:
    """The rounds of one epoch as one stream (:meth:`PipelineExecutor.run_stream`): one metrics row per
    minibatch, ending where this rank's last op of that minibatch ended. Returns the samples trained."""
    rounds = ep.rounds
    R0 = ep.epoch * ctx.rounds_per_epoch + rounds[0]
    caches: dict[int, dict] = {}

    def data(j, b):
        if j not in caches:  # earlier rounds are no longer read (a miss would only recompute the same slice)
            for old in [i for i in caches if i < j - 1]:
                del caches[old]
            caches[j] = {}
        c = caches[j]
        if b not in c:
            c[b] = feed.batch(ep.perm, rounds[j], b)
        return c[b]

    def on_round(Rg):
        _start_step(job, ctx.rank, Rg)
        if bar is not None and Rg > R0:
            bar.update(1)  # a new minibatch entered the pipeline on rank 0: count the one before

    metrics = [{"loss": 0.0, "n": 0, "correct": 0, "samples": 0} for _ in rounds]
    ends = executor.run_stream(rounds, R0, data, ep.timeline, metrics, on_round=on_round)
    if bar is not None:
        bar.update(1)
    ep.rows.extend(dict(step=R0 + j, epoch=ep.epoch, end_ms=ends[j], **metrics[j]) for j in range(len(rounds)))
    return job.optim.batch_size * len(rounds)


def _start_step(job: Job, rank: int, step: int) -> None:
    """This rank starts ``step``: tell the launcher (:func:`~workbench.runtime.launch.lifetime.reached`) and
    inject the job's fault if it is this rank's and this step's."""
    reached(step)
    if job.run.fail_rank == rank and job.run.fail_at_step == step:
        raise RuntimeError(f"injected fault at step {step}")


def _write_checkpoint(out: Path, R: int, epoch: int, executor, job: Job, *, rank: int) -> Path:
    """Every stage replica on this rank writes ``stage{s}_replica{r}.pt`` (weights, optimizer state,
    step, rng) into ``checkpoints/round{R}``; rank 0 marks it ``COMPLETE`` once all ranks are done."""
    ck = out / "checkpoints" / f"round{R:06d}"
    ck.mkdir(parents=True, exist_ok=True)
    opt = executor.optimizer_state()
    for s, w in executor.weights().items():
        rep = job.schedule.stage_workers[s].index(rank)
        atomic_save(
            dict(
                weights=w,
                step=R,
                epoch=epoch,
                stage=s,
                replica=rep,
                schedule=job.schedule.name,
                optimizer=dict(kind="sgd", lr=job.optim.lr, momentum=job.optim.momentum, momentum_buffer=opt[s]),
                rng=torch.get_rng_state(),
            ),
            ck / f"stage{s}_replica{rep}.pt",
        )
    return ck


class Evaluation(NamedTuple):
    """The test split's mean loss per sample and accuracy (hits / targets), the epoch end's
    ``test_loss`` / ``test_accuracy`` of ``metrics.csv``."""

    test_loss: float
    test_accuracy: float


def _evaluate(rank, world, job: Job, dist, executor, *, model, device, dtype) -> Evaluation | None:
    """Test loss/accuracy of the newest weights: replica 0 of every stage sends its weights to rank 0,
    which runs the whole model over the test split (mean loss over samples, argmax accuracy)."""
    sched = job.schedule
    mine = {
        s: {n: t.cpu() for n, t in w.items()}
        for s, w in executor.weights().items()
        if sched.stage_workers[s][0] == rank
    }
    gathered: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    if gathered is None:
        return None
    weights = {s: w for g in gathered for s, w in g.items()}
    try:
        test = job.dataset_fn(split="test")
    except (ValueError, TypeError, OSError):
        return None
    mods = [stage_module(model.layers, a, z) for a, z in job.bounds]
    total, correct, n, targets = 0.0, 0, len(test), 0
    with torch.no_grad():
        for i in range(0, n, job.optim.batch_size):
            x, y = microbatch(test, torch.arange(i, min(n, i + job.optim.batch_size)), device, dtype)
            for s, m in enumerate(mods):
                x = run_stage(m, {k: v.to(device) for k, v in weights[s].items()}, x)
            total += float(model.loss(x, y)) * int(y.shape[0])
            correct += model.correct(x, y)
            targets += y.numel()  # a language model scores every token: accuracy = hits / tokens
    return Evaluation(test_loss=total / n, test_accuracy=correct / max(targets, 1))

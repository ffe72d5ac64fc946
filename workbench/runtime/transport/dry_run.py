"""Every rank's real executor run in one process on a dry world, its ``torch.distributed`` calls recorded.

:func:`record` prepares the job of a schedule as :func:`~workbench.runtime.launch.driver.prepare`
does (a tiny float64 model with a layer or more per stage: the toy MLP, or the zoo's segment GPT for
schedules that cut sequences), then, rank after rank, does what a rank of the runtime does around
its executor (:mod:`~workbench.runtime.launch.rank`): it creates the process groups in the runtime's
order (:func:`~workbench.runtime.transport.comm_plan.channels`, the replica sets, the tied weights'
combines), builds the executor the runtime would (pipeline or segment), warms it up, passes the
start barrier, and runs ``rounds`` minibatches of one epoch, flush and epoch-end gather included.
The executor runs unchanged, configured as on NCCL (backend ``"nccl"``: receives posted when their
op needs them, no sender thread), with tags on (every message its own tag). The
:class:`~workbench.runtime.transport.trace.Recorder` is installed in dry mode: nothing is sent,
receives read zeros, a wait returns at once (a work not waited on reports itself incomplete, so
every send is waited on at the flush); the issue order does not depend on values or
timing, so each rank's list of calls is the order its code issues them in on a real backend.

:func:`problems` is that recording checked by :func:`~workbench.runtime.transport.nccl_model.check_nccl`.
"""

from __future__ import annotations

import dataclasses
import tempfile
import time
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.runtime.executors.pipeline import PipelineExecutor
from workbench.runtime.executors.segment_executor import SegmentExecutor
from workbench.runtime.executors.tied import make_groups as tied_groups
from workbench.runtime.executors.tied import tied_weights
from workbench.runtime.launch.driver import prepare
from workbench.runtime.launch.job import Job, RankContext
from workbench.runtime.semantics.stages import DataOrder, as_tuple, microbatch, run_stage, stage_module, stage_params
from workbench.runtime.transport.comm_plan import channels
from workbench.runtime.transport.nccl_model import check_nccl
from workbench.runtime.transport.trace import Call, Recorder
from workbench.schedules.core import Schedule

TIMEOUT_S = 60.0


@dataclass
class Recording:
    """The ranks' recorded calls (``traces[r]``, in issue order) and the one-line errors of ranks
    whose run raised (a call the real backend would refuse, a missing group, ...)."""

    traces: list[list[Call]]
    errors: list[str] = field(default_factory=list)


def dry_job(schedule: Schedule, out: str, *, rounds: int = 2, tied: bool = False) -> Job:
    """The job the dry run executes: ``schedule`` on a float64 model with at least one layer per
    stage, configured as on NCCL (module docstring), ``rounds`` minibatches of one sample per
    microbatch. ``tied``: the zoo's GPT with its output projection tied to the token embedding (a
    weight of the first and the last stage, combined at every update)."""
    S, M = schedule.num_stages, schedule.microbatches
    common: dict[str, Any] = dict(
        workers=schedule.num_workers,
        microbatches=M,
        steps=rounds,
        batch_size=M,
        device="cpu",
        backend="nccl",
        transport="gloo",
        dtype="float64",
        timeout_s=TIMEOUT_S,
        allow_oversubscribe=True,
        progress=False,
        evaluate=False,
        out=out,
    )
    if schedule.num_segments > 1 or tied:
        seq = sum(schedule.segment_tokens) if schedule.num_segments > 1 else 8
        model_options = dict(num_layers=max(1, S - 2), dim=8, heads=1, seq_len=seq, context=seq)
        if tied:
            model_options["tie_weights"] = True
        return prepare(
            "gpt",
            schedule,
            model_options=model_options,
            dataset_options={"seq_len": seq, "max_chars": 20_000},
            **common,
        )
    return prepare("toy-mlp", schedule, model_options={"widths": (8,) + (8,) * (S - 1) + (4,)}, **common)


def _specs(model, bounds, x) -> tuple[list, list]:
    """Every stage output's ``[(shape, dtype)]`` and whether each stage's input is a tuple (the
    runtime's boundary specs, from one forward of the model)."""
    specs, like = [], []
    with torch.no_grad():
        for a, z in bounds:
            like.append(isinstance(x, tuple))
            m = stage_module(model.layers, a, z)
            x = run_stage(m, dict(m.named_parameters()), x)
            specs.append([(tuple(t.shape), t.dtype) for t in as_tuple(x)])
    return specs, like


def _dtype(job: Job) -> torch.dtype | None:
    return getattr(torch, job.dtype) if job.dtype else None


def _groups(rec: Recorder, job: Job, model, rank: int) -> dict:
    """The runtime's process groups, created in its order on the dry world."""
    sched = job.schedule
    groups: dict[Hashable, Any] = {}
    scheds = [sched] + ([job.stream(2 * sched.microbatches)] if job.stream is not None else [])
    for name, ranks in channels(scheds):
        g = rec.new_group(list(ranks))
        if rank in ranks:
            groups[name] = g
    for ws in sorted({tuple(w) for w in sched.stage_workers if len(w) > 1}):
        g = rec.new_group(list(ws))
        if rank in ws:
            groups[ws] = g
    groups.update(tied_groups(rec, sched, tied_weights(model, job.bounds), rank, TIMEOUT_S))
    for key, g in groups.items():
        rec.name(key, g)
    return groups


def _executor(job: Job, rank: int, model, groups: dict, *, order: DataOrder, dataset):
    sched = job.schedule
    ctx = RankContext(rank, sched.num_workers, torch.device("cpu"), job.optim, job.run)
    ctx.rounds_per_epoch = order.rounds_per_epoch
    x0, _ = microbatch(dataset, order.indices(order.permutation(0), 0, 0), "cpu", _dtype(job))
    ctx.specs, ctx.like_tuple = _specs(model, job.bounds, x0)
    ctx.t0 = time.perf_counter()
    init = [stage_params(stage_module(model.layers, a, z)) for a, z in job.bounds]
    if sched.num_segments > 1:
        return SegmentExecutor(ctx, sched, model, job.bounds, init, groups=groups)
    return PipelineExecutor(ctx, sched, model, job.bounds, init, groups=groups, stream=job.stream)


def _run_rank(rec: Recorder, job: Job, rank: int, rounds: int, dataset) -> None:
    """What a rank of the runtime issues, around its executor, in one epoch of ``rounds`` minibatches."""
    model = job.model_fn()
    groups = _groups(rec, job, model, rank)
    order = DataOrder(len(dataset), job.optim.batch_size, job.schedule.microbatches, job.optim.seed)
    executor = _executor(job, rank, model, groups, order=order, dataset=dataset)
    if hasattr(executor, "comm"):
        executor.warm_up()
    rec.collective("barrier")  # rank.py's start: barrier, then the clock's broadcast
    rec.collective("broadcast")
    perm, ks = order.permutation(0), list(range(rounds))
    if hasattr(executor, "comm"):
        executor.begin_epoch(ks)
    timeline: list = []
    metrics = {"loss": 0.0, "n": 0, "correct": 0, "samples": 0}

    def data_of(k):
        return lambda b: microbatch(dataset, order.indices(perm, k, b), "cpu", _dtype(job))

    if job.stream is not None:
        executor.run_stream(ks, 0, lambda j, b: data_of(j)(b), timeline, [dict(metrics) for _ in ks])
    else:
        for k in ks:
            executor.run_round(k, k, data_of(k), timeline, metrics)
    executor.flush()
    rec.collective("gather")  # the epoch end's gather of metrics and timeline rows
    rec.collective("gather")  # the summary's


def record(schedule: Schedule, *, rounds: int = 2, tied: bool = False) -> Recording:
    """Every rank's calls in an epoch of ``rounds`` minibatches of ``schedule`` (module docstring);
    ``tied``: on a model whose first and last stage share a weight (:func:`dry_job`)."""
    if rounds < 1:
        raise ValueError(f"rounds must be a positive int, got {rounds!r}")
    with tempfile.TemporaryDirectory() as tmp:
        return record_job(dry_job(schedule, tmp, rounds=rounds, tied=tied), rounds=rounds)


def record_job(job: Job, *, rounds: int = 2) -> Recording:
    """Every rank's calls in the first epoch (``rounds`` minibatches) of a prepared ``job``, run as
    on NCCL (backend ``"nccl"``, tags on) whatever the job's own backend."""
    job = dataclasses.replace(job, run=dataclasses.replace(job.run, backend="nccl", one_tag=False, transport="gloo"))
    out, threads = Recording([]), torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: more threads only contend (several times slower on a busy machine)
    dataset = job.dataset_fn()
    for rank in range(job.schedule.num_workers):
        rec = Recorder(rank, job.schedule.num_workers, {}, dry=True).install()
        try:
            _run_rank(rec, job, rank, rounds, dataset)
        except (RuntimeError, ValueError, KeyError) as e:
            out.errors.append(f"rank {rank} failed: {str(e).splitlines()[0] if str(e) else type(e).__name__}")
        finally:
            rec.uninstall()
        out.traces.append(rec.calls)
    torch.set_num_threads(threads)
    return out


def problems(schedule: Schedule, *, rounds: int = 2, per_pair: bool = True) -> list[str]:
    """What NCCL would meet running ``schedule`` on the runtime: the dry run's errors, then
    :func:`~workbench.runtime.transport.nccl_model.check_nccl` of its recorded calls (``[]``: none)."""
    rec = record(schedule, rounds=rounds)
    return rec.errors + check_nccl(rec.traces, per_pair=per_pair)


__all__ = ["Recording", "dry_job", "problems", "record", "record_job"]

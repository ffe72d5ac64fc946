"""Launch real training: one process per worker (forked by the warm server of
:mod:`workbench.runtime.launch.warm`; started by ``spawn`` with ``WORKBENCH_WARM=0``) or join a
``torchrun`` rendezvous (``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` set), then every rank runs
:func:`workbench.runtime.launch.rank.worker_main`. Outputs are described in :mod:`workbench.runtime.launch.outputs`;
a folder holding a finished run is never overwritten.
"""

from __future__ import annotations

import csv
import functools
import json
import math
import multiprocessing as mp
import os
import pickle
import time
import warnings
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from workbench.runtime.executors.fetch import check_remote
from workbench.runtime.executors.segment_executor import check_segments, sequence_options
from workbench.runtime.executors.tied import check_tied, defer_steps, tied_weights
from workbench.runtime.launch import warm as warm_start
from workbench.runtime.launch.job import (
    Job,
    as_dataset,
    as_layer_model,
    build_dataset,
    build_model,
    copy_model,
    load_object,
    user_dataset,
)
from workbench.runtime.launch.jobspec import STAGE_LR_RULES, TRAIN_TRANSPORTS, JobSpec, OptimSpec, PipelineSpec, RunSpec
from workbench.runtime.launch.lifetime import JobStopped, RankFailed, run_rank, spawn
from workbench.runtime.launch.outputs import RunResult, latest_checkpoint, load_stage, record_options, resume_notes
from workbench.runtime.launch.ports import JOIN_HOSTED_STORE, free_port, hosted_store
from workbench.runtime.launch.rank import worker_main
from workbench.runtime.semantics.randomness import unseeded_random_layers
from workbench.runtime.semantics.reference import updates_per_round
from workbench.runtime.semantics.stages import (
    Bounds,
    DataOrder,
    as_tuple,
    even_bounds,
    microbatch,
    plan_bounds,
    stage_module,
    stage_params,
)
from workbench.runtime.transport.shm import (
    auto_transport,
    check_transport,
    remove_channels,
    remove_stale_channels,
    ring_channels,
)
from workbench.runtime.transport.shm import new_token as new_shm_token
from workbench.schedules import REGISTRY, build_for_workers, executor_of, spec, worker_options
from workbench.schedules.core import Schedule, validate


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


def _under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def schedule_for_workers(name: str, workers: int, plan, microbatches: int, options: dict) -> Schedule:
    """Schedule ``name`` on ``workers`` ranks, shaped by the registry (no special cases by name): a
    schedule taking ``workers`` (data parallel, master family) gets it; without a plan the stage count
    is ``spec.stages_for(workers, options)`` (k stages per worker; 1 for data parallel)."""

    options.update(worker_options(name, workers, options))  # the caller keeps the typed options
    return build_for_workers(name, workers, microbatches, plan, options)


def prepare(model="mlp", schedule="pipedream", workers: int = 2, microbatches: int = 4, **keywords) -> Job:
    """Validate the arguments of :func:`train` and build the picklable :class:`Job`: the keywords
    are those of :class:`~workbench.runtime.launch.jobspec.JobSpec`'s groups (any other is a ``TypeError``); :func:`build_job` does the work."""
    return build_job(JobSpec.from_keywords(model, schedule, workers, microbatches, **keywords))


def build_job(spec: JobSpec) -> Job:
    """The checked :class:`Job` of ``spec``: where the ranks run, the model and data recipes, the
    schedule (built for the worker count, validated), the transport, the stage bounds (plan or
    even) with tied weights, and the number of minibatches. Bad input raises one ``ValueError`` line."""
    m, p, o, r = spec.model, spec.pipeline, spec.optim, spec.run
    torchrun = _under_torchrun()
    _check_numbers(
        workers=p.workers,
        microbatches=p.microbatches,
        batch_size=o.batch_size,
        lr=o.lr,
        momentum=o.momentum,
        timeout_s=r.timeout_s,
    )
    if o.stage_lr not in STAGE_LR_RULES:
        raise ValueError(f"stage_lr must be one of {', '.join(map(repr, STAGE_LR_RULES))}, got {o.stage_lr!r}")
    workers, device, backend = _placement(p, r, torchrun)
    _check_dtype(m.dtype)
    mseed = o.seed if m.model_seed is None else m.model_seed
    model_options = dict(m.model_options)
    the_model, model_fn, dataset_fn, label = _model_and_data(
        m.model, m.dataset, m.dtype, mseed, model_options, dopts=dict(m.dataset_options or {})
    )
    out = _out_folder(r, p.schedule, label, workers)
    sched, sopts = _job_schedule(p, workers, the_model, label, torchrun)
    transport = _transport(r.transport, sched, workers, device, backend, torchrun=torchrun)
    stream_fn = _stream_builder(p.schedule, workers, p.plan, p.schedule_options, sched) if p.stream else None
    if sched.num_workers != workers:
        raise ValueError(
            f"schedule {sched.name!r} uses {sched.num_workers} workers but workers={workers}; "
            f"run it with --workers {sched.num_workers} (workers={sched.num_workers})"
        )
    bounds = _stage_bounds(p.plan, sched, len(the_model.layers))
    ties = tied_weights(the_model, bounds)  # weights shared by stages: combined at each update (tied.py)
    sched = defer_steps(sched, ties)
    check_tied(sched, ties)
    if ties and stream_fn is not None:  # the stream's schedule combines them too
        check_tied(stream_fn(2 * sched.microbatches), ties)
    train_set = dataset_fn()
    _check_takes_data(the_model, train_set, m.dtype, label)
    for line in unseeded_random_layers(the_model.layers):  # one line each, before any rank starts
        warnings.warn(
            f"{line}: its random draws are not seeded per microbatch, so ranks differ from one process", stacklevel=3
        )
    rounds_total = _rounds_total(o, len(train_set), sched.microbatches)
    if r.fail_rank is not None and not 0 <= r.fail_rank < workers:
        raise ValueError(f"fail_rank {r.fail_rank} is not a rank of {workers} workers")
    run = replace(
        r,
        out=str(out),
        device=device,
        backend=backend,
        threads=r.threads or max(1, _cores() // workers),
        transport=transport,
    )
    return Job(
        model_fn=model_fn,
        dataset_fn=dataset_fn,
        schedule=sched,
        bounds=bounds,
        rounds_total=rounds_total,
        optim=o,
        run=run,
        dtype=m.dtype,
        shm_token=new_shm_token() if transport == "shm" else "",
        stream=stream_fn,
        options=dict(
            model=label,
            model_options=model_options,
            schedule_options=sopts,
            targets_per_sample=int(train_set.tensors[-1][0].numel()),
        ),
    )


def _placement(p: PipelineSpec, r: RunSpec, torchrun: bool) -> tuple[int, str, str]:
    """(workers, device, backend): torchrun's world size wins; the device defaults to one GPU per
    worker where there are enough, else CPU; NCCL on GPUs, gloo on CPUs. More workers than cores
    (CPU) or GPUs needs ``allow_oversubscribe``; Hogwild runs on CPU shared memory only."""
    workers = int(os.environ["WORLD_SIZE"]) if torchrun else p.workers
    device = r.device
    if device is None:
        device = "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= workers else "cpu"
    schedule = p.schedule
    hogwild = (spec(schedule).executor if isinstance(schedule, str) else executor_of(schedule)) == "hogwild"
    if device.startswith("cuda") and hogwild:
        raise ValueError(
            f"{getattr(schedule, 'name', schedule)} runs Hogwild on shared CPU memory; use --device cpu for it"
        )
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but no GPU is visible; use --device cpu")
    backend = r.backend or ("nccl" if device.startswith("cuda") else "gloo")
    if not torchrun:
        if device == "cpu" and workers > _cores() and not r.allow_oversubscribe:
            raise ValueError(
                f"{workers} workers on {_cores()} CPU cores; use fewer workers or allow_oversubscribe=True "
                "(--allow-oversubscribe)"
            )
        if device.startswith("cuda") and workers > torch.cuda.device_count() and not r.allow_oversubscribe:
            raise ValueError(
                f"{workers} workers on {torch.cuda.device_count()} GPUs; use fewer workers or allow_oversubscribe"
            )
    return workers, device, backend


def _out_folder(r: RunSpec, schedule, label: str, workers: int) -> Path:
    """``r.out``, or a fresh ``results/train/<model>-<schedule>-w<workers>-<time>-<pid>``; a folder
    holding a finished run is refused unless resumed."""
    out = r.out
    if out is None:
        name = schedule if isinstance(schedule, str) else schedule.name
        out = Path("results") / "train" / f"{label}-{name}-w{workers}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    out = Path(out)
    if (out / "summary.json").exists() and not r.resume:
        raise ValueError(f"{out} already holds a finished run; choose a new --out folder (or --resume to continue it)")
    if r.resume and latest_checkpoint(out) is None:
        raise ValueError(f"resume: {out} holds no complete checkpoint to continue from; drop --resume to start afresh")
    return out


def _check_dtype(dtype) -> None:
    """``dtype``: None or the name of a torch floating-point dtype (``"float64"``)."""
    if dtype is None:
        return
    dt = getattr(torch, dtype, None) if isinstance(dtype, str) else None
    if not (isinstance(dt, torch.dtype) and dt.is_floating_point):
        raise ValueError(
            f"dtype must name a torch floating-point dtype (float32, float64, bfloat16, ...), got {dtype!r}"
        )


def _job_schedule(p: PipelineSpec, workers: int, the_model, label: str, torchrun: bool) -> tuple[Schedule, dict]:
    """(the validated schedule, its options): a plan must cover the model's layers (and, under
    torchrun, its machines' layout); a registry name is built for ``workers`` (a schedule with
    segments reads the model's sequence length); remote weights and segments are checked."""
    plan, L = p.plan, len(the_model.layers)
    if torchrun and plan is not None:
        _check_torchrun_layout(plan)
    if plan is not None and plan.num_layers != L:
        raise ValueError(
            f"the plan covers {plan.num_layers} layers but model {label!r} has {L}; "
            "partition this model's profile again"
        )
    sopts = dict(p.schedule_options or {})
    if isinstance(p.schedule, Schedule):
        sched = p.schedule
    else:  # a schedule with segments (Seq1F1B) reads the model's sequence length and FLOP estimate
        sopts = sequence_options(sopts, _schedule_option_names(p.schedule), the_model)
        sched = schedule_for_workers(p.schedule, workers, plan, p.microbatches, sopts)
    validate(sched)
    check_remote(sched)  # master family: remote weights are fetched from their owner (fetch.py)
    if sched.num_segments > 1:  # runs on the segment executor (segment_executor.py)
        check_segments(sched, the_model)
    return sched, sopts


def _transport(transport: str, sched: Schedule, workers: int, device: str, backend: str, *, torchrun: bool) -> str:
    """The transport of activations and gradients: ``"auto"`` picks shared memory where it runs and
    pays (one rank per core, CPU, this machine, bounded ring channels: ``shm.channel_sizes``), else
    gloo; ``"shm"`` needs spawned CPU gloo ranks and a pipeline schedule (messages to carry)."""
    check_transport(transport, TRAIN_TRANSPORTS)
    if transport == "auto":
        transport = auto_transport(
            workers,
            _cores(),
            spawned=not torchrun,
            device=device,
            backend=backend,
            messages=executor_of(sched) == "pipeline" and ring_channels(sched),
        )
    if transport == "shm":
        if torchrun or not device == "cpu" or backend != "gloo":
            raise ValueError(
                "transport='shm' needs CPU ranks spawned by train() on one machine (no torchrun, device cpu, gloo)"
            )
        if executor_of(sched) != "pipeline":
            raise ValueError(
                f"transport='shm' carries pipeline messages; {sched.name} has none (it all-reduces or shares memory)"
            )
    return transport


def _stage_bounds(plan, sched: Schedule, num_layers: int) -> Bounds:
    """The (first, last) layers of every stage: the plan's, else an even split of the layers."""
    if plan is not None and plan.num_stages == sched.num_stages:
        return plan_bounds(plan)
    if plan is not None:
        raise ValueError(f"the plan has {plan.num_stages} stages but schedule {sched.name!r} has {sched.num_stages}")
    return even_bounds(num_layers, sched.num_stages)


def _rounds_total(o: OptimSpec, samples: int, microbatches: int) -> int:
    """Minibatches to train: ``steps``, else ``epochs`` times the minibatches of an epoch."""
    order = DataOrder(samples, o.batch_size, microbatches, o.seed)
    rounds_total = o.steps if o.steps is not None else o.epochs * order.rounds_per_epoch
    if rounds_total < 1:
        raise ValueError("nothing to train: steps/epochs must be >= 1")
    return rounds_total


def stream_schedule(name: str, workers: int, plan, options: dict, microbatches: int) -> Schedule:
    """Schedule ``name`` over ``microbatches`` microbatches: the stream of several minibatches."""
    return schedule_for_workers(name, workers, plan, microbatches, dict(options))


def _schedule_option_names(name: str) -> set[str]:

    return {o.name for o in spec(name).options}


def _stream_builder(schedule, workers: int, plan, options: Mapping | None, sched: Schedule):
    """``stream(n)`` for ``train(stream=True)``: the schedule over the n microbatches of several
    minibatches. Only for pipelines whose microbatch count is a stream, not one flush (the registry's
    ``microbatches="in total"``: model-parallel, pipedream, pipedream-2bw), whose weight rule then
    reads the same over two minibatches as over one (the updates per minibatch are checked)."""

    if not isinstance(schedule, str):
        raise ValueError("stream=True builds the schedule over each epoch's microbatches: give the schedule by name")
    sp = spec(schedule)
    if sp.family != "pipeline" or sp.microbatches != "in total":
        ok = ", ".join(
            sorted(n for n, x in REGISTRY.items() if x.family == "pipeline" and x.microbatches == "in total")
        )
        why = (
            "flushes the pipeline at every minibatch (its update rule needs it)"
            if sp.family == "pipeline"
            else f"is not a pipeline ({sp.family})"
        )
        raise ValueError(f"{schedule} {why}; stream=True (--stream) is for pipeline schedules without a flush: {ok}")
    fn = functools.partial(stream_schedule, schedule, workers, plan, dict(options or {}))

    two, one = updates_per_round(fn(2 * sched.microbatches)), updates_per_round(sched)
    if two != [2 * u for u in one]:
        raise ValueError(
            f"{schedule}: updates per minibatch {one} do not repeat over two minibatches ({two}) with "
            f"{sched.microbatches} microbatches; make --microbatches a multiple of the microbatches per update"
        )
    return fn


def _check_torchrun_layout(plan) -> None:
    """A plan partitioned for machines (a topology of two or more levels, ``plan.meta["topology"]``,
    innermost first) runs under torchrun only with as many ranks per node as its innermost level
    has workers per machine: torchrun numbers ranks node by node, as the topology numbers workers,
    so worker w lands on machine w // per_machine for both. Otherwise a stage's replicas, or the
    cut the partitioner placed on the slow link, would fall across other links than planned."""
    levels = (plan.meta or {}).get("topology") or []
    local = int(os.environ.get("LOCAL_WORLD_SIZE", 0))
    if len(levels) >= 2 and local and int(levels[0][0]) != local:
        raise ValueError(
            f"the plan was partitioned for {int(levels[0][0])} workers per machine (topology "
            f"{[int(c) for c, _ in levels]}, innermost first) but torchrun started {local} per node; "
            f"run torchrun with --nproc_per_node {int(levels[0][0])} or partition for this layout"
        )


def _check_not_bootstrapping() -> None:
    """A spawned rank re-imports the parent's ``__main__`` script; a script that calls ``train`` at
    module level would start training again in every rank. Say so instead of multiprocessing's
    bootstrapping error."""

    if mp.parent_process() is not None and getattr(mp.current_process(), "_inheriting", False):
        raise RuntimeError(
            "workbench.runtime.train was called while a spawned rank imported your script: put the "
            "training code under `if __name__ == \"__main__\":` (see the README, 'Your own model')"
        )


def _check_numbers(**values) -> None:
    """One line per bad number: counts >= 1, lr finite and > 0, momentum in [0, 1), timeout > 0."""
    for k in ("workers", "microbatches", "batch_size"):
        v = values[k]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{k} must be an integer >= 1, got {v!r}")
    lr, mu, t = values["lr"], values["momentum"], values["timeout_s"]
    if not (isinstance(lr, (int, float)) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite number > 0, got {lr!r}")
    if not (isinstance(mu, (int, float)) and math.isfinite(mu) and 0 <= mu < 1):
        raise ValueError(f"momentum must be in [0, 1), got {mu!r}")
    if not (isinstance(t, (int, float)) and t > 0):
        raise ValueError(f"timeout must be > 0 seconds, got {t!r}")


def _check_takes_data(model, train_set, dtype: str | None, label: str) -> None:
    """One line before any rank starts when the model cannot take the data set's samples (else
    every rank fails on its first microbatch with the layer's own error). The model runs once in
    eval mode on two samples, without gradients, and goes back to its mode: no buffer (BatchNorm's
    running statistics) and no random state changes."""
    x, y = microbatch(train_set, torch.arange(min(2, len(train_set))), "cpu", getattr(torch, dtype) if dtype else None)
    module = stage_module(model.layers, 0, len(model.layers) - 1)
    modes = [(m, m.training) for m in module.modules()]
    try:
        module.eval()
        with torch.no_grad():
            out = module(x)
    except (RuntimeError, TypeError, ValueError, IndexError) as e:
        shapes = [tuple(t.shape) for t in as_tuple(x)]
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ValueError(
            f"model {label!r} cannot take the data set's samples (inputs of shape {shapes}): {first}; choose a data "
            "set the model takes (`workbench models` lists them) or size the model to it (e.g. --model-option "
            "in_features=...)"
        ) from None
    finally:
        for m, mode in modes:
            m.training = mode
    _check_scores(model, out, y, label)


def _check_scores(model, out, y, label: str) -> None:
    """One line when the loss or the accuracy metric cannot score the model's output against the targets."""
    try:
        model.loss(out, y)
        model.correct(out, y)
    except (RuntimeError, ValueError, IndexError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        shape = tuple(out.shape) if torch.is_tensor(out) else type(out).__name__
        raise ValueError(
            f"model {label!r}'s output (shape {shape}) does not fit its targets (shape {tuple(y.shape)}): {first}"
        ) from None


def _model_and_data(model, dataset, dtype, mseed: int, model_options: dict, *, dopts: dict):
    """(model, picklable model recipe, picklable data set recipe, label) for a zoo name or a user model.

    Zoo names rebuild the model in every rank from ``(name, seed, options)``; a user's model (an
    ``nn.Module``, a factory, ``"package.module:function"``, a LayerModel) is traced once here
    (:func:`workbench.profiling.layering.split`) and the traced copy travels to the ranks by pickling."""

    def data_recipe(default_name: str | None, model_name: str = "user"):
        if dataset is None and default_name is None:
            raise ValueError(
                "a user model needs a data set (dataset= / --dataset): a TensorDataset(inputs..., targets), a pair "
                "(train, test), a built-in name (`workbench models` lists them) or package.module:function"
            )
        if dataset is None or (isinstance(dataset, str) and ":" not in dataset):
            name = dataset or default_name
            assert name is not None  # refused above
            return functools.partial(build_dataset, model_name, name, **dopts)
        train, test = as_dataset(dataset)
        return functools.partial(user_dataset, train, test)

    if isinstance(model, str) and ":" not in model:  # the zoo (or toy-mlp)
        model_fn = functools.partial(build_model, model, dtype, mseed, **model_options)
        the_model = model_fn()
        if dataset is None and the_model.dataset == "synthetic" and "in_features" in the_model.config:
            dopts.setdefault("in_features", the_model.config["in_features"])  # match the model's input
            dopts.setdefault("num_classes", the_model.config.get("num_classes", 10))
        return the_model, model_fn, data_recipe(the_model.dataset, model), model
    if model_options:
        raise ValueError(
            f"model options {sorted(model_options)} apply to zoo models only; configure your model in its factory"
        )
    if isinstance(model, str):
        model = load_object(model)  # package.module:function: fail on a bad name before loading data
    dataset_fn = data_recipe(None)
    train_set = dataset_fn()
    if not isinstance(train_set, TensorDataset):
        raise ValueError(f"the data set must be a TensorDataset, got {type(train_set).__name__}")
    the_model = as_layer_model(model, train_set, mseed, dtype)
    model_fn = functools.partial(copy_model, the_model, dtype)
    try:
        pickle.dumps(model_fn)
    except Exception as e:  # noqa: BLE001
        raise ValueError(
            f"model {the_model.name} cannot be pickled for the spawned ranks ({type(e).__name__}: "
            f"{str(e)[:200]}); define its loss and factory in an importable module"
        ) from None
    return the_model, model_fn, dataset_fn, the_model.name


def shared_weights(job: Job):
    """Shared-memory weights per stage and per-(stage, replica) update counters for the async executor."""
    model = job.model_fn()
    ws = [stage_params(stage_module(model.layers, a, z)) for a, z in job.bounds]
    ck = latest_checkpoint(Path(job.run.out)) if job.run.resume else None
    if ck is not None:
        ws = [dict(load_stage(ck, s, 0)["weights"]) for s in range(len(ws))]
    for w in ws:
        for t in w.values():
            t.share_memory_()
    counters = torch.zeros(job.schedule.num_stages, job.schedule.num_workers, dtype=torch.int64).share_memory_()
    return ws, counters


def run_job(job: Job, port: int | None = None) -> dict:
    """Run a prepared job (spawn, or this process's rank under torchrun); returns the summary (rank 0)."""
    return run_jobs([job], port)[0]


def run_jobs(jobs: list[Job], port: int | None = None) -> list[dict]:
    """Run several prepared jobs with the same worker count in one set of processes (one spawn: much
    cheaper than one per job); returns their summaries."""
    world = jobs[0].schedule.num_workers
    for job in jobs:
        if job.schedule.num_workers != world or (job.run.backend, job.run.device) != (
            jobs[0].run.backend,
            jobs[0].run.device,
        ):
            raise ValueError("jobs run together must share the worker count, backend and device")
        out = Path(job.run.out)
        out.mkdir(parents=True, exist_ok=True)
        if job.run.resume:
            for line in resume_notes(out, job):  # a changed option is refused here, a changed length stated
                warnings.warn(line, stacklevel=2)
            (out / "summary.json").unlink(missing_ok=True)
        record_options(out, job)
        (out / "weights.pt").unlink(missing_ok=True)
    if _under_torchrun():
        if any(j.schedule.update == "async" for j in jobs):
            raise ValueError("dp-asp (Hogwild on shared memory) needs one machine: launch it without torchrun")
        rank = int(os.environ["RANK"])  # this process is a rank of torchrun's: it stops with torchrun (lifetime.py)
        run_rank(rank, worker_main, rank, world, jobs, None, None)
        return [_read_summary(Path(j.run.out), j) if rank == 0 else {} for j in jobs]
    store = None
    if any(j.shm_token for j in jobs):
        remove_stale_channels()  # files of earlier launchers that were killed before they could remove them
    shareds = [shared_weights(j) if j.schedule.update == "async" else None for j in jobs]
    # every tensor storage of the ranks' arguments (Hogwild's shared weights, a user's model and data set
    # sent by value) reaches a rank as one file descriptor: past the server's limit the ranks are spawned
    warm = warm_start.enabled() and warm_start.fits((world, jobs, shareds))
    try:
        # warm ranks join a store the launcher serves (none waits for rank 0's), dropped when the job ends
        if warm:  # bound here and held: no other process can take the port before the ranks join
            port, store = hosted_store(port, world, max(j.run.timeout_s for j in jobs))
        else:
            port = free_port(port)
        spawn(
            functools.partial(worker_main, shareds=shareds),
            (world, jobs, "127.0.0.1", port),
            world,
            what="training",
            warm=warm,
            env=JOIN_HOSTED_STORE if warm else None,
        )
    except (RankFailed, JobStopped) as e:
        e.args = (f"{e.args[0]}; the job was stopped{_resume_hint(jobs)}",)
        raise
    finally:
        del store  # its port is free again
        for j in jobs:
            if j.shm_token:
                remove_channels(j.shm_token)  # the shared-memory channel files, however the job ended
    return [_read_summary(Path(j.run.out), j) for j in jobs]


def _resume_hint(jobs: list[Job]) -> str:
    """Where a stopped job can continue: its last complete checkpoint (``--resume``), if any."""
    done = [(j.run.out, latest_checkpoint(Path(j.run.out))) for j in jobs]
    return "".join(
        f"; last complete checkpoint {ck} (--resume --out {out} continues from it)"
        for out, ck in done
        if ck is not None
    )


class DivergedWarning(RuntimeWarning):
    """The training loss became non-finite (nan or inf): the run's weights are garbage from there on."""


def warn_if_diverged(out: Path, lr: float) -> None:
    """A :class:`DivergedWarning` naming the first step whose logged loss is not finite, if any."""
    metrics = out / "metrics.csv"
    if not metrics.exists():
        return
    with open(metrics) as f:
        for row in csv.DictReader(f):
            try:
                loss = float(row.get("loss") or "nan")
            except ValueError:
                continue
            if not math.isfinite(loss):
                warnings.warn(
                    f"the training loss became {loss} at step {row.get('step')} (lr {lr:g}): the run diverged; "
                    "try a smaller --lr",
                    DivergedWarning,
                    stacklevel=3,
                )
                return


def _read_summary(out: Path, job: Job) -> dict:
    summary = RunResult(json.loads((out / "summary.json").read_text()))
    summary["out"] = str(out)
    warn_if_diverged(out, job.optim.lr)
    if job.run.return_weights:
        summary["weights"] = torch.load(out / "weights.pt", weights_only=False)
    return summary


def train(model="mlp", schedule="pipedream", workers: int = 2, microbatches: int = 4, **keywords) -> dict:
    """Train ``model`` with ``schedule`` on ``workers`` processes; returns the run summary
    (:class:`~workbench.runtime.launch.outputs.RunResult`, a dict with a Jupyter card).

    ``model``: a zoo name; or your own model: an ``nn.Module``, a factory returning one (called under
    ``torch.manual_seed(seed)``), ``"package.module:function"``, or a LayerModel such as
    :func:`workbench.profiling.layering.split` returns. An ``nn.Module`` is traced once here into layers and the
    traced copy (ATen graphs and tensors only) is pickled into the ranks, so a model class defined in
    a notebook works; from a *script*, call ``train`` under ``if __name__ == "__main__":`` (spawned
    ranks re-import the script). ``dataset`` (needed for your own model; default for the zoo: its own):
    a ``TensorDataset(inputs..., targets)``, a pair ``(train, test)``, a built-in name, or
    ``"package.module:function"``.

    ``schedule`` is a name for :func:`workbench.schedules.build` or a :class:`Schedule`. One *step* is
    one minibatch of ``batch_size`` samples split into ``microbatches`` microbatches of
    ``batch_size / microbatches`` samples: one pass of the schedule, whatever the schedule (the
    number of optimizer updates in a pass is the schedule's rule: ``updates_per_step`` in the
    summary; words and units: :mod:`workbench.runtime.launch.outputs`).
    ``steps`` (total minibatches) overrides ``epochs``. The keywords are the fields of
    :class:`~workbench.runtime.launch.jobspec.JobSpec`'s groups (model, pipeline, optimizer, run); any other
    is a ``TypeError`` naming the closest. Other options: ``allow_oversubscribe``, ``threads`` (per worker), ``progress``, ``return_weights`` (final weights per stage in the
    summary), ``dtype`` (e.g. ``"float64"``), ``schedule_options`` (e.g. ``{"weights": "vertical-sync"}``),
    ``dataset_options``, ``lookahead`` (receives posted ahead), ``momentum`` (SGD heavy ball, default 0),
    ``evaluate`` (test loss/accuracy at each epoch end, default True), ``transport`` (``"gloo"``, or
    ``"shm"``: activations and gradients through shared memory between CPU ranks of this machine,
    :mod:`workbench.runtime.transport.shm`; default ``"auto"``: shm where it runs and pays, CPU ranks spawned
    here with a core each and a pipeline schedule, else gloo: :func:`~workbench.runtime.transport.shm.auto_transport`),
    ``stream`` (schedules without a flush: pipedream, pipedream-2bw,
    model-parallel; an epoch's minibatches flow through the pipeline as one stream of microbatches,
    drained at the epoch end only, instead of a fill and a drain per minibatch: the weight rule is
    that schedule's over the epoch's microbatches, :meth:`PipelineExecutor.run_stream`),
    ``model_options`` (a zoo model's options, e.g. ``{"depth": 3}``) and ``port`` (the spawned ranks'
    rendezvous port; default: a free one; unused under torchrun, whose rendezvous the ranks join).

    A stop signal (SIGINT, SIGTERM, SIGHUP) or a rank's death stops every rank and raises
    :class:`~workbench.runtime.launch.lifetime.JobStopped` / :class:`~workbench.runtime.launch.lifetime.RankFailed`,
    whose one-line message names the cause and the last complete checkpoint (``resume=True``
    continues from it): :mod:`workbench.runtime.launch.lifetime`.
    """
    _check_not_bootstrapping()
    port = keywords.get("port")
    if port is not None and not _under_torchrun():  # under torchrun, torchrun's rendezvous is used
        free_port(port)
    job = prepare(model, schedule, workers, microbatches, **keywords)
    return run_job(job, port)

"""Launch real training: one process per worker (``torch.multiprocessing.spawn``) or join a
``torchrun`` rendezvous (``RANK``/``WORLD_SIZE``/``MASTER_ADDR`` set), then execute the schedule.

Outputs in ``out`` (the run folder; a folder holding a finished run is never overwritten):

* ``metrics.csv``  one row per minibatch (``step``): loss, accuracy (training microbatches), samples/s, wall ms
* ``timeline.csv`` measured ops ``worker, stage, microbatch, kind, start, end, version, step, wait_ms``
  (ms since a barrier-synchronised t0), merged from all ranks on rank 0
* ``checkpoints/round{R}/stage{s}_replica{r}.pt`` written by each stage replica itself at the end of
  every epoch (and of the run); ``COMPLETE`` marks a checkpoint all ranks finished
* ``summary.json`` throughput, wall time, final loss/accuracy, per-rank peak memory and stash depth

Every file is written to a temporary name and renamed into place, so a failed run leaves its earlier
complete checkpoints and never a half-written file.
"""
from __future__ import annotations

import csv
import functools
import json
import os
import shutil
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch

from ..schedules.core import Schedule, validate
from .stages import DataOrder, as_tuple, even_bounds, microbatch, plan_bounds, run_stage, stage_module, stage_params

TIMELINE_COLUMNS = ["worker", "stage", "microbatch", "kind", "start", "end", "version", "step", "wait_ms"]
METRIC_COLUMNS = ["step", "epoch", "loss", "accuracy", "samples", "samples_per_s", "wall_ms"]


# ---------------------------------------------------------------------------------------------
# models and data (rebuilt identically in every process from picklable recipes)
def build_model(name: str, dtype: str | None = None, seed: int = 0, **options):
    """A LayerModel from the zoo (``workbench.models.build``), or ``toy-mlp`` from :mod:`.toy`."""
    if name == "toy-mlp":
        from .toy import toy_mlp
        model = toy_mlp(seed=seed, **options)
    else:
        try:
            from workbench.models import build
        except ImportError as e:
            raise ValueError(f"model zoo unavailable ({e}); use model='toy-mlp'") from None
        model = build(name, seed=seed, **options)
    if dtype is not None:
        for layer in model.layers:
            layer.to(getattr(torch, dtype))
    return model


def build_dataset(model_name: str, dataset: str, **options):
    if model_name == "toy-mlp" or dataset == "toy":
        from .toy import toy_dataset
        return toy_dataset(**options)
    from workbench.models.data import load_dataset
    return load_dataset(dataset, "train")


@dataclass
class Job:
    """Everything a rank needs; picklable (recipes, not objects, for the model and data)."""

    model_fn: Callable
    dataset_fn: Callable
    schedule: Schedule
    bounds: list
    batch_size: int
    lr: float
    seed: int
    rounds_total: int
    out: str
    dtype: str | None = None
    resume: bool = False
    fail_rank: int | None = None
    fail_at_step: int | None = None
    timeout_s: float = 60.0
    device: str = "cpu"
    backend: str = "gloo"
    threads: int = 1
    progress: bool = True
    return_weights: bool = False
    lookahead: int = 4
    options: dict = field(default_factory=dict)


@dataclass
class RankContext:
    rank: int
    world: int
    device: torch.device
    lr: float
    timeout_s: float
    t0: float = 0.0
    start_round: int = 0  # global minibatch index this process starts at (> 0 when resuming)
    specs: list = field(default_factory=list)
    like_tuple: list = field(default_factory=list)


# ---------------------------------------------------------------------------------------------
# checkpoints
def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _atomic_text(text: str, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def latest_checkpoint(out: Path) -> Path | None:
    """The newest checkpoint folder every rank finished (``COMPLETE`` present)."""
    root = Path(out) / "checkpoints"
    done = sorted(p for p in root.glob("round*") if (p / "COMPLETE").exists()) if root.exists() else []
    return done[-1] if done else None


def load_stage(ckpt: Path, stage: int, replica: int) -> dict:
    path = ckpt / f"stage{stage}_replica{replica}.pt"
    if not path.exists():
        path = ckpt / f"stage{stage}_replica0.pt"
    return torch.load(path, weights_only=False)


# ---------------------------------------------------------------------------------------------
# the per-rank program
def _init_dist(rank: int, world: int, job: Job, addr: str | None, port: int | None):
    import torch.distributed as dist
    kw = dict(backend=job.backend, rank=rank, world_size=world, timeout=timedelta(seconds=job.timeout_s))
    if addr is None:
        dist.init_process_group(init_method="env://", **kw)
    else:
        dist.init_process_group(init_method=f"tcp://{addr}:{port}", **kw)
    return dist


def _make_groups(dist, rank: int, job: Job) -> dict:
    """One process group per distinct replica set of a stage (created in the same order on all ranks)."""
    groups = {}
    for ws in sorted({tuple(w) for w in job.schedule.stage_workers if len(w) > 1}):
        g = dist.new_group(list(ws), timeout=timedelta(seconds=job.timeout_s))
        if rank in ws:
            groups[ws] = g
    return groups


def _boundary_specs(model, bounds, x) -> tuple[list, list]:
    """Shapes/dtypes of every stage output for one microbatch, by running the model once."""
    specs, like = [], []
    with torch.no_grad():
        for a, z in bounds:
            like.append(isinstance(x, tuple))
            x = run_stage(stage_module(model.layers, a, z), dict(stage_module(model.layers, a, z).named_parameters()), x)
            specs.append([(tuple(t.shape), t.dtype) for t in as_tuple(x)])
    return specs, like


def _worker_main(rank: int, world: int, jobs: list[Job], addr: str | None, port: int | None, shareds=None) -> None:
    """Entry of one rank: join the process group, then run the jobs one after the other."""
    job = jobs[0]
    torch.set_num_threads(max(1, job.threads))
    device = torch.device("cpu")
    if job.device.startswith("cuda"):
        device = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    dist = _init_dist(rank, world, job, addr, port)
    try:
        for i, job in enumerate(jobs):
            groups = _make_groups(dist, rank, job)
            _train_rank(rank, world, job, dist, groups, device, shareds[i] if shareds else None)
    finally:
        dist.destroy_process_group()


def _train_rank(rank, world, job: Job, dist, groups, device, shared):
    from .worker import DDPExecutor, HogwildExecutor, PipelineExecutor
    sched = job.schedule
    model = job.model_fn()
    model.to(device)
    model.train()
    dataset = job.dataset_fn()
    dtype = getattr(torch, job.dtype) if job.dtype else None
    order = DataOrder(len(dataset), job.batch_size, sched.microbatches, job.seed)
    rpe = order.rounds_per_epoch
    out = Path(job.out)
    my_stages = sorted({op.stage for op in sched.ops[rank]})
    modules = [stage_module(model.layers, a, z) for a, z in job.bounds]
    init = [stage_params(m) for m in modules]
    start_round = 0
    ckpt = latest_checkpoint(out) if job.resume else None
    if ckpt is not None:
        for s in my_stages:
            rep = sched.stage_workers[s].index(rank) if rank in sched.stage_workers[s] else 0
            init[s] = {n: t.to(device) for n, t in load_stage(ckpt, s, rep)["weights"].items()}
        start_round = int(ckpt.name[len("round"):])
    ctx = RankContext(rank, world, device, job.lr, job.timeout_s, start_round=start_round)
    x0, _ = microbatch(dataset, order.indices(order.permutation(0), 0, 0), device, dtype)
    ctx.specs, ctx.like_tuple = _boundary_specs(model, job.bounds, x0)
    if sched.update == "async":
        executor = HogwildExecutor(ctx, sched, model, job.bounds, *shared)
    elif sched.name == "dp-bsp":
        executor = DDPExecutor(ctx, sched, model, job.bounds, init, groups)
    else:
        executor = PipelineExecutor(ctx, sched, model, job.bounds, init, groups)
    executor.comm_lookahead = job.lookahead
    if hasattr(executor, "comm"):
        executor.comm.lookahead = job.lookahead
    barrier = functools.partial(dist.monitored_barrier, timeout=timedelta(seconds=job.timeout_s)) \
        if job.backend == "gloo" else dist.barrier
    barrier()
    ctx.t0 = time.perf_counter()
    wall0 = time.time()
    bar = None
    if rank == 0 and job.progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=job.rounds_total, initial=start_round, desc=f"{sched.name} train", unit="step", file=sys.stderr)
    R = start_round
    samples_done = 0
    while R < job.rounds_total:
        epoch, first = divmod(R, rpe)
        rounds = list(range(first, min(rpe, first + job.rounds_total - R)))
        perm = order.permutation(epoch)
        executor_plan = executor.receive_plan(rounds)
        if hasattr(executor, "comm"):
            executor.comm.set_plan(executor_plan)
        timeline, rows = [], []
        for k in rounds:
            Rg = epoch * rpe + k
            if job.fail_rank == rank and job.fail_at_step == Rg:
                raise RuntimeError(f"injected fault at step {Rg}")
            cache = {}

            def data(b, k=k, cache=cache):
                if b not in cache:
                    cache[b] = microbatch(dataset, order.indices(perm, k, b), device, dtype)
                return cache[b]

            metrics = {"loss": 0.0, "n": 0, "correct": 0, "samples": 0}
            executor.run_round(k, Rg, data, timeline, metrics)
            rows.append(dict(step=Rg, epoch=epoch, end_ms=(time.perf_counter() - ctx.t0) * 1e3, **metrics))
            samples_done += job.batch_size
            if bar is not None:
                bar.update(1)
        if hasattr(executor, "comm"):
            executor.comm.flush()
        R = epoch * rpe + rounds[-1] + 1
        # checkpoint: every stage replica writes its own file
        ck = out / "checkpoints" / f"round{R:06d}"
        ck.mkdir(parents=True, exist_ok=True)
        for s, w in executor.weights().items():
            rep = sched.stage_workers[s].index(rank)
            _atomic_save(dict(weights=w, step=R, epoch=epoch, stage=s, replica=rep, schedule=sched.name,
                              optimizer=dict(kind="sgd", lr=job.lr), rng=torch.get_rng_state()),
                         ck / f"stage{s}_replica{rep}.pt")
        gathered = [None] * world if rank == 0 else None
        dist.gather_object((rows, timeline), gathered, dst=0)
        if rank == 0:
            _append_outputs(out, gathered, job, start_round)
            start_round = -1  # only the first write after a resume truncates
        barrier()
        if rank == 0:
            (ck / "COMPLETE").write_text("ok\n")
    if bar is not None:
        bar.close()
    wall_s = time.time() - wall0
    info = dict(rank=rank, stages=my_stages, memory=_jsonable(executor.memory()), peak_rss_bytes=_peak_rss(),
                cuda_max_memory_allocated=torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None,
                bytes_sent=getattr(getattr(executor, "comm", None), "bytes_sent", 0), wall_s=wall_s,
                samples=samples_done)
    weights = executor.weights() if job.return_weights else None
    gathered = [None] * world if rank == 0 else None
    dist.gather_object((info, weights), gathered, dst=0)
    if rank == 0:
        _write_summary(out, job, gathered)
    return None


def _jsonable(d):
    return json.loads(json.dumps(d, default=str))


def _peak_rss() -> int:
    import resource
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def _append_outputs(out: Path, gathered, job: Job, truncate_from: int) -> None:
    """Merge the ranks' per-step rows and timeline rows and append them to the CSVs (rank 0)."""
    steps: dict[int, dict] = {}
    timeline = []
    for rows, tl in gathered:
        timeline.extend(tl)
        for r in rows:
            acc = steps.setdefault(r["step"], dict(step=r["step"], epoch=r["epoch"], loss=0.0, n=0, correct=0,
                                                   samples=0, end_ms=0.0))
            for k in ("loss", "n", "correct", "samples"):
                acc[k] += r[k]
            acc["end_ms"] = max(acc["end_ms"], r["end_ms"])
    metrics_path = out / "metrics.csv"
    old = []
    if metrics_path.exists():
        with open(metrics_path) as f:
            old = [r for r in csv.DictReader(f) if truncate_from < 0 or int(r["step"]) < truncate_from]
    prev_end = float(old[-1]["wall_ms"]) if old and truncate_from < 0 else 0.0
    new = []
    for st in sorted(steps):
        a = steps[st]
        dt = max(a["end_ms"] - prev_end, 1e-9)
        new.append(dict(step=st, epoch=a["epoch"], loss=a["loss"] / max(a["n"], 1),
                        accuracy=a["correct"] / max(a["samples"], 1), samples=job.batch_size,
                        samples_per_s=job.batch_size / dt * 1e3, wall_ms=a["end_ms"]))
        prev_end = a["end_ms"]
    _write_csv(metrics_path, METRIC_COLUMNS, old + new)
    tl_path = out / "timeline.csv"
    old_tl = []
    if tl_path.exists():
        with open(tl_path) as f:
            old_tl = [r for r in csv.DictReader(f) if truncate_from < 0 or int(r["step"]) < truncate_from]
    timeline.sort(key=lambda r: (r[4], r[0]))
    _write_csv(tl_path, TIMELINE_COLUMNS, old_tl + [dict(zip(TIMELINE_COLUMNS, r)) for r in timeline])


def _write_csv(path: Path, columns, rows) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


def _write_summary(out: Path, job: Job, gathered) -> None:
    infos = [g[0] for g in gathered]
    rows = []
    if (out / "metrics.csv").exists():
        with open(out / "metrics.csv") as f:
            rows = list(csv.DictReader(f))
    wall_s = max(i["wall_s"] for i in infos)
    samples = max(i["samples"] for i in infos)
    summary = dict(
        schedule=job.schedule.name, update=job.schedule.update, workers=job.schedule.num_workers,
        stages=job.schedule.num_stages, microbatches=job.schedule.microbatches, batch_size=job.batch_size,
        lr=job.lr, seed=job.seed, steps=len(rows), bounds=[list(b) for b in job.bounds], backend=job.backend,
        device=job.device, wall_s=wall_s, samples_per_s=samples / wall_s if wall_s > 0 else None,
        final_loss=float(rows[-1]["loss"]) if rows else None,
        final_accuracy=float(rows[-1]["accuracy"]) if rows else None,
        ranks=infos, options=_jsonable(job.options),
    )
    if job.schedule.update == "async":
        st = [m for i in infos for m in i["memory"].values()]
        n = sum(s["updates"] for s in st)
        summary["staleness_mean"] = sum(s["staleness_mean"] * s["updates"] for s in st) / max(n, 1)
        summary["staleness_max"] = max(s["staleness_max"] for s in st)
    _atomic_text(json.dumps(summary, indent=2, default=str), out / "summary.json")
    if job.return_weights:
        weights = {}
        for _, w in gathered:
            for s, ws in (w or {}).items():
                weights.setdefault(s, ws)
        _atomic_save(weights, out / "weights.pt")


# ---------------------------------------------------------------------------------------------
# the parent: validate, spawn, collect
DEFAULT_LR = 0.05


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


def free_port(port: int | None = None, host: str = "127.0.0.1") -> int:
    """``port`` if it can be bound (ValueError if in use), else a free ephemeral port."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port or 0))
        except OSError:
            raise ValueError(f"port {port} is in use; pick another --port or leave it out to choose a free one") from None
        return s.getsockname()[1]


def _under_torchrun() -> bool:
    return all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR"))


def make_schedule(schedule, plan_or_stages, microbatches: int, **options) -> Schedule:
    if isinstance(schedule, Schedule):
        return schedule
    try:
        from workbench.schedules import build
    except ImportError as e:
        raise ValueError(f"schedule generators unavailable ({e}); pass a Schedule object") from None
    return build(schedule, plan_or_stages, microbatches, **options)


_DATA_PARALLEL = ("dp-bsp", "dp-asp")
_MASTER = ("ddp", "fsdp", "pp", "lpp", "fslpp")


def prepare(model: str = "mlp", schedule="pipedream", workers: int = 2, microbatches: int = 4, steps: int | None = None,
            epochs: int = 1, batch_size: int = 64, lr: float = DEFAULT_LR, seed: int = 0, out=None, plan=None,
            device: str | None = None, backend: str | None = None, resume: bool = False, fail_rank: int | None = None,
            fail_at_step: int | None = None, timeout_s: float = 60.0, allow_oversubscribe: bool = False,
            threads: int | None = None, progress: bool = True, return_weights: bool = False, dtype: str | None = None,
            schedule_options: dict | None = None, dataset_options: dict | None = None, lookahead: int = 4,
            **model_options) -> Job:
    """Validate the arguments of :func:`train` and build the picklable :class:`Job`."""
    torchrun = _under_torchrun()
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    if torchrun and int(os.environ["WORLD_SIZE"]) != workers:
        workers = int(os.environ["WORLD_SIZE"])
    if device is None:
        device = "cuda" if torch.cuda.is_available() and torch.cuda.device_count() >= workers else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError("device 'cuda' requested but no GPU is visible; use --device cpu")
    backend = backend or ("nccl" if device.startswith("cuda") else "gloo")
    if not torchrun:
        if device == "cpu" and workers > _cores() and not allow_oversubscribe:
            raise ValueError(f"{workers} workers on {_cores()} CPU cores; use fewer workers or allow_oversubscribe=True "
                             "(--allow-oversubscribe)")
        if device.startswith("cuda") and workers > torch.cuda.device_count() and not allow_oversubscribe:
            raise ValueError(f"{workers} workers on {torch.cuda.device_count()} GPUs; use fewer workers or allow_oversubscribe")
    if out is None:
        raise ValueError("give an output folder (out=...)")
    out = Path(out)
    if (out / "summary.json").exists() and not resume:
        raise ValueError(f"{out} already holds a finished run; choose a new --out folder (or --resume to continue it)")
    mseed = model_options.pop("model_seed", seed)
    model_fn = functools.partial(build_model, model, dtype, mseed, **model_options)
    the_model = model_fn()
    L = len(the_model.layers)
    if plan is not None and plan.num_layers != L:
        raise ValueError(f"the plan covers {plan.num_layers} layers but model {model!r} has {L}; "
                         "partition this model's profile again")
    sopts = dict(schedule_options or {})
    if isinstance(schedule, Schedule):
        sched = schedule
    else:
        if schedule in _DATA_PARALLEL + _MASTER:
            sopts.setdefault("workers", workers)
        if plan is not None:
            sched = make_schedule(schedule, plan, microbatches, **sopts)
        elif schedule in _DATA_PARALLEL:
            sched = make_schedule(schedule, 1, microbatches, **sopts)
        elif schedule == "interleaved-1f1b":
            sched = make_schedule(schedule, workers * sopts.get("chunks", 2), microbatches, **sopts)
        else:
            sched = make_schedule(schedule, workers, microbatches, **sopts)
    validate(sched)
    for w, op in sched:
        if op.weights_worker is not None and op.weights_worker != w:
            raise ValueError(f"schedule {sched.name!r} runs ops on weights owned by another worker ({op} on worker {w}, "
                             f"weights on {op.weights_worker}); this runtime does not fetch remote weights (FSDP-style)")
    if sched.num_workers != workers:
        raise ValueError(f"schedule {sched.name!r} uses {sched.num_workers} workers but workers={workers}")
    if sched.microbatches != microbatches:
        microbatches = sched.microbatches
    if plan is not None and plan.num_stages == sched.num_stages:
        bounds = plan_bounds(plan)
    elif plan is not None:
        raise ValueError(f"the plan has {plan.num_stages} stages but schedule {sched.name!r} has {sched.num_stages}")
    else:
        bounds = even_bounds(L, sched.num_stages)
    dataset_fn = functools.partial(build_dataset, model, the_model.dataset, **(dataset_options or {}))
    n = len(dataset_fn())
    order = DataOrder(n, batch_size, microbatches, seed)
    rounds_total = steps if steps is not None else epochs * order.rounds_per_epoch
    if rounds_total < 1:
        raise ValueError("nothing to train: steps/epochs must be >= 1")
    if fail_rank is not None and not 0 <= fail_rank < workers:
        raise ValueError(f"fail_rank {fail_rank} is not a rank of {workers} workers")
    threads = threads or max(1, _cores() // workers)
    return Job(model_fn=model_fn, dataset_fn=dataset_fn, schedule=sched, bounds=bounds, batch_size=batch_size, lr=lr,
               seed=seed, rounds_total=rounds_total, out=str(out), dtype=dtype, resume=resume, fail_rank=fail_rank,
               fail_at_step=fail_at_step, timeout_s=timeout_s, device=device, backend=backend, threads=threads,
               progress=progress, return_weights=return_weights, lookahead=lookahead,
               options=dict(model=model, model_options=model_options, schedule_options=sopts))


def _shared_weights(job: Job):
    """Shared-memory weights per stage and per-(stage, replica) update counters for the async executor."""
    model = job.model_fn()
    ws = [stage_params(stage_module(model.layers, a, z)) for a, z in job.bounds]
    ck = latest_checkpoint(Path(job.out)) if job.resume else None
    if ck is not None:
        ws = [dict(load_stage(ck, s, 0)["weights"]) for s in range(len(ws))]
    for w in ws:
        for t in w.values():
            t.share_memory_()
    counters = torch.zeros(job.schedule.num_stages, job.schedule.num_workers, dtype=torch.int64).share_memory_()
    return ws, counters


def _spawn_entry(rank, world, jobs, addr, port, shareds):
    _worker_main(rank, world, jobs, addr, port, shareds)


def run_job(job: Job, port: int | None = None) -> dict:
    """Run a prepared job (spawn, or this process's rank under torchrun); returns the summary (rank 0)."""
    return run_jobs([job], port)[0]


def run_jobs(jobs: list[Job], port: int | None = None) -> list[dict]:
    """Run several prepared jobs with the same worker count in one set of processes (one spawn: much
    cheaper than one per job); returns their summaries."""
    world = jobs[0].schedule.num_workers
    for job in jobs:
        if job.schedule.num_workers != world or (job.backend, job.device) != (jobs[0].backend, jobs[0].device):
            raise ValueError("jobs run together must share the worker count, backend and device")
        out = Path(job.out)
        out.mkdir(parents=True, exist_ok=True)
        if job.resume:
            (out / "summary.json").unlink(missing_ok=True)
        (out / "weights.pt").unlink(missing_ok=True)
    if _under_torchrun():
        if any(j.schedule.update == "async" for j in jobs):
            raise ValueError("dp-asp (Hogwild on shared memory) needs one machine: launch it without torchrun")
        rank = int(os.environ["RANK"])
        _worker_main(rank, world, jobs, None, None, None)
        return [_read_summary(Path(j.out), j) if rank == 0 else {} for j in jobs]
    port = free_port(port)
    shareds = [_shared_weights(j) if j.schedule.update == "async" else None for j in jobs]
    import torch.multiprocessing as mp
    t = time.time()
    try:
        mp.start_processes(_spawn_entry, args=(world, jobs, "127.0.0.1", port, shareds), nprocs=world, join=True,
                           start_method="spawn")
    except mp.ProcessRaisedException as e:
        lines = [ln for ln in str(e).strip().splitlines() if ln.strip()]
        raise RuntimeError(f"rank {e.error_index} failed after {time.time() - t:.1f} s: {lines[-1].strip()}") from None
    except mp.ProcessExitedException as e:
        raise RuntimeError(f"rank {e.error_index} exited with code {e.exit_code} (signal {e.signal_name})") from None
    return [_read_summary(Path(j.out), j) for j in jobs]


def _read_summary(out: Path, job: Job) -> dict:
    summary = json.loads((out / "summary.json").read_text())
    summary["out"] = str(out)
    if job.return_weights:
        summary["weights"] = torch.load(out / "weights.pt", weights_only=False)
    return summary


def train(model: str = "mlp", schedule="pipedream", workers: int = 2, microbatches: int = 4, steps: int | None = None,
          epochs: int = 1, batch_size: int = 64, lr: float = DEFAULT_LR, seed: int = 0, out=None, plan=None,
          device: str | None = None, backend: str | None = None, resume: bool = False, fail_rank: int | None = None,
          fail_at_step: int | None = None, timeout_s: float = 60.0, port: int | None = None, **options) -> dict:
    """Train ``model`` with ``schedule`` on ``workers`` processes; returns the run summary (dict).

    ``schedule`` is a name for :func:`workbench.schedules.build` or a :class:`Schedule`. One *step* is
    one minibatch of ``batch_size`` samples split into ``microbatches``: one pass of the schedule.
    ``steps`` (total minibatches) overrides ``epochs``. Other options: ``allow_oversubscribe``,
    ``threads`` (per worker), ``progress``, ``return_weights`` (final weights per stage in the
    summary), ``dtype`` (e.g. ``"float64"``), ``schedule_options`` (e.g. ``{"weights": "vertical-sync"}``),
    ``dataset_options``, ``lookahead`` (receives posted ahead), and model options for the zoo.
    """
    if port is not None:
        free_port(port)
    job = prepare(model, schedule, workers, microbatches, steps, epochs, batch_size, lr, seed, out, plan, device,
                  backend, resume, fail_rank, fail_at_step, timeout_s, **options)
    return run_job(job, port)

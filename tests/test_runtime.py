"""Tests of the real runtime (workbench.runtime) against independent derivations of each weight rule.

Layout: fast single-process tests check the semantic reference against rules derived here from the
papers' formulas (not from the generators); spawned tests (2-3 gloo ranks on CPU, float64 toy MLPs)
check the runtime's final weights against plain SGD (sync rules) or the reference (the others).
Spawning costs ~10 s per process set on 2 cores, so many runs share one spawn (``run_jobs``).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import socket
import time
from pathlib import Path

import pytest
import torch
from runtime_checks import TOY_MLP, initial_weights, job_reference, job_sgd, max_diff, minibatch_sgd

from workbench.cost.plan import Plan
from workbench.runtime import prepare, reference_train, run_job, run_jobs, train
from workbench.runtime.launch.lifetime import RankFailed
from workbench.runtime.launch.outputs import latest_checkpoint
from workbench.runtime.semantics.stages import DataOrder, microbatch, run_stage, stage_lrs, stage_module, stage_params
from workbench.schedules import build, from_placement, worker_stats

BATCH, LR = 16, 0.1
COMMON = TOY_MLP | dict(  # TOY_MLP oversubscribes: 2 ranks must run on a 1-core CI machine too
    batch_size=BATCH,
    lr=LR,
    timeout_s=30,
    transport="gloo",
)  # the shm twins (SHM_RUNS) compare against gloo; "auto" would pick shm here


def stop_bound_s() -> float:
    """How long a stopped job may take to end, from the fault: 5 s, scaled by the load per core
    above 2 (a loaded machine schedules the launcher late; the stop itself needs little CPU)."""
    return 5.0 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1) / 2)


def toy():
    job = prepare("toy-mlp", build("gpipe", 2, 4), workers=2, microbatches=4, steps=1, out="/nonexistent/x", **COMMON)
    return job.model_fn, job.dataset_fn()


# ---- independent oracles ---------------------------------------------------------------------
def versioned_sgd(model_fn, ds, bounds, versions, groups):
    """``W(t+1) = W(t) - lr * mean_{b in groups[t]} grad f(W_1^(v_1(b)), ..., W_n^(v_n(b)); b)`` on the whole
    model, keeping the history of every stage; ``versions(t, k)`` = version stage k reads in update t."""
    model = model_fn()
    mods = [stage_module(model.layers, a, z) for a, z in bounds]
    hist = [[stage_params(m)] for m in mods]
    order = DataOrder(len(ds), BATCH, sum(len(g) for g in groups), 0)
    perm = order.permutation(0)
    for t, mbs in enumerate(groups):
        total = None
        for b in mbs:
            x, y = microbatch(ds, order.indices(perm, 0, b))
            ws = [
                {n: p.clone().requires_grad_(True) for n, p in hist[k][versions(t, k)].items()}
                for k in range(len(mods))
            ]
            for k, m in enumerate(mods):
                x = run_stage(m, ws[k], x)
            leaves = [p for w in ws for p in w.values()]
            g = torch.autograd.grad(model.loss(x, y), leaves)
            total = g if total is None else [a + c for a, c in zip(total, g)]
        it = iter(total)
        for k in range(len(mods)):
            hist[k].append({n: p - LR * next(it) / len(mbs) for n, p in hist[k][-1].items()})
    return [h[-1] for h in hist]


def bounds_of(n_stages, layers=7):
    from workbench.runtime.semantics.stages import even_bounds

    return even_bounds(layers, n_stages)


# ---- the reference against the rules (single process) --------------------------------------------
@pytest.mark.slow
def test_reference_sync_rules_are_minibatch_sgd():
    model_fn, ds = toy()
    for name in ("gpipe", "pipedream-flush", "zb-h1"):
        sched = build(name, 3, 4)
        b = bounds_of(3)
        ref = reference_train(sched, model_fn(), b, ds, batch_size=BATCH, lr=LR, rounds=3)
        assert max_diff(ref, minibatch_sgd(model_fn, ds, b, 3, 4, batch_size=BATCH, lr=LR)) < 1e-12, name


def pipedream_version(t, k, n):
    """PipeDream weight stashing: update t (= microbatch t) reads w_k^(t-n+1+k), clamped at 0 (warm-up)."""
    return max(0, t - (n - 1 - k))


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3])
def test_reference_pipedream_stash_rule(n):
    model_fn, ds = toy()
    M = 8
    sched = build("pipedream", n, M)
    for _, op in sched:  # the generator's versions are the paper's
        if op.kind in ("F", "B"):
            assert op.version == pipedream_version(op.microbatch, op.stage, n), op
    b = bounds_of(n)
    ref = reference_train(sched, model_fn(), b, ds, batch_size=BATCH, lr=LR, rounds=1)
    want = versioned_sgd(model_fn, ds, b, lambda t, k: pipedream_version(t, k, n), [[t] for t in range(M)])
    assert max_diff(ref, want) < 1e-12
    # no stashing reads newer weights in the backward: a different (wrong) trajectory
    ns = reference_train(build("pipedream", n, M, weights="no-stash"), model_fn(), b, ds, batch_size=BATCH, lr=LR)
    assert max_diff(ns, want) > 1e-6


def test_reference_vertical_sync_and_2bw_rules():
    model_fn, ds = toy()
    n, M = 3, 8
    b = bounds_of(n)
    vs = reference_train(build("pipedream", n, M, weights="vertical-sync"), model_fn(), b, ds, batch_size=BATCH, lr=LR)
    want = versioned_sgd(model_fn, ds, b, lambda t, k: max(0, t - n + 1), [[t] for t in range(M)])
    assert max_diff(vs, want) < 1e-12
    # 2BW: batches of m microbatches, W(t+1) = W(t) - lr * grad f(W(t-1)) for every stage
    M2, b2 = 8, bounds_of(2)
    sched = build("pipedream-2bw", 2, M2)
    m = sched.microbatches_per_step
    bw = reference_train(sched, model_fn(), b2, ds, batch_size=BATCH, lr=LR)
    want = versioned_sgd(
        model_fn, ds, b2, lambda t, k: max(0, t - 1), [list(range(t * m, t * m + m)) for t in range(M2 // m)]
    )
    assert max_diff(bw, want) < 1e-12


@pytest.mark.slow
@pytest.mark.parametrize("model,first,last", [("toy-mlp", 2, 6), ("gpt", 2, 5)])
def test_layerwise_split_backward_equals_one_vjp(model, first, last):
    """Zero bubble's BI then BW, layer by layer (the cotangent of every layer's output kept by BI, each
    weight gradient taken from its own layer's outputs in BW), against one VJP of the whole stage: the
    same input gradient and the same weight gradients added to a non-empty update buffer, for
    single-op layers (MLP) and blocks of many ops with residual paths (mini GPT). A stage with a weight
    tied across two of its layers is not split (its gradient would be counted twice)."""
    from workbench.models import build as build_model
    from workbench.runtime.semantics.stages import (
        as_leaves,
        run_stage_layers,
        split_input_grad,
        split_weight_grad,
        stage_roots,
        vjp,
    )

    torch.manual_seed(0)
    net = toy()[0]() if model == "toy-mlp" else build_model(model, seed=0)
    mod = stage_module(net.layers, first, last).double()
    params = {n: p.detach().clone().requires_grad_(True) for n, p in mod.named_parameters()}
    if model == "gpt":  # the blocks' input: embedded tokens
        x = net.layers[0].double()(torch.randint(0, 128, (3, 16))).detach()
    else:
        x = torch.randn(5, 16, dtype=torch.float64)
    xl = as_leaves(x, requires_grad=True)
    y, layers = run_stage_layers(mod, params, xl[0])
    assert layers is not None and len(layers) == last - first + 1
    cot = [torch.randn_like(y)]
    roots, grads = stage_roots(y, cot=cot)
    dx, cots = split_input_grad(layers, xl, roots, grads)
    buf = {n: torch.ones_like(p) for n, p in params.items()}
    split_weight_grad(layers, cots, roots, grads, params, into=buf)
    want_dx, want_dw, _ = vjp(mod, params, as_leaves(x, True), False, cot=cot)
    assert (dx[0] - want_dx[0]).abs().max() < 1e-12
    assert max((buf[n] - 1 - want_dw[n]).abs().max().item() for n in params) < 1e-12
    tied = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))
    tied[2].weight = tied[0].weight
    assert run_stage_layers(tied, dict(tied.named_parameters()), torch.randn(2, 4))[1] is None


# ---- the runtime (spawned gloo ranks) --------------------------------------------------------
SYNC_RUNS = {  # name -> (schedule, options, microbatches): expected to equal minibatch SGD
    "gpipe": ("gpipe", {}, 4),
    "flush": ("pipedream-flush", {}, 4),
    "zb-h1": ("zb-h1", {}, 4),
    "interleaved": ("interleaved-1f1b", {}, 4),
    "dp-bsp": ("dp-bsp", {}, 2),  # one microbatch per replica: one update per minibatch
    "fsdp": ("fsdp", {}, 4),  # master family: stage s's weights on worker s, fetched by the other worker
}
RULE_RUNS = {  # expected to equal the (separately tested) reference
    "stash": ("pipedream", {}, 4),
    "vertical-sync": ("pipedream", {"weights": "vertical-sync"}, 4),
    "no-stash": ("pipedream", {"weights": "no-stash"}, 4),
    "2bw": ("pipedream-2bw", {}, 4),
}
STEPS = 3
MU = 0.5  # momentum of the runs that also check the optimizer state (resume, DDP)
STREAM_RUNS = {  # train(stream=True): an epoch's minibatches as one pipeline; name -> (schedule, options, train kw)
    "stream": ("pipedream", {}, dict(epochs=2, momentum=MU)),  # two epochs (a drain at each end), momentum
    "stream-2bw": ("pipedream-2bw", {"microbatches_per_step": 4, "warmup": [3, 1]}, dict(steps=STEPS + 4)),
    "stream-vs": ("pipedream", {"weights": "vertical-sync", "warmup": [3, 1]}, dict(steps=STEPS + 4)),
    "stream-ns": ("pipedream", {"weights": "no-stash"}, dict(steps=STEPS + 4)),
}
SHM_RUNS = {
    "flush-shm": "flush",
    "zb-h1-shm": "zb-h1",
    "interleaved-shm": "interleaved",
    "fsdp-shm": "fsdp",
    "stash-shm": "stash",
    "full-shm": "full",
    "stream-shm": "stream",
}  # transport="shm" twins: the same weights


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("rt")
    jobs, names = [], []
    lookahead = {"flush": 0, "zb-h1": 1}  # just-in-time receives (NCCL's mode) and a short window; others: all ahead
    for key, (name, opts, m) in {**SYNC_RUNS, **RULE_RUNS}.items():
        jobs.append(
            prepare(
                "toy-mlp",
                name,
                workers=2,
                microbatches=m,
                steps=STEPS,
                out=root / key,
                schedule_options=opts,
                lookahead=lookahead.get(key),
                **COMMON,
            )
        )
        names.append(key)
    jobs.append(prepare("toy-mlp", "dp-asp", workers=2, microbatches=4, steps=12, out=root / "asp", **COMMON))
    names.append("asp")
    jobs.append(
        prepare("toy-mlp", "pipedream", workers=2, microbatches=4, epochs=2, out=root / "full", momentum=MU, **COMMON)
    )
    names.append("full")
    jobs.append(
        prepare(
            "toy-mlp", "dp-bsp", workers=2, microbatches=2, steps=STEPS, out=root / "bsp-mom", momentum=MU, **COMMON
        )
    )
    names.append("bsp-mom")
    zoo = dict(COMMON, dtype=None)  # the zoo's MLP on the offline digits set, float32
    zoo.pop("model_options")
    jobs.append(
        prepare(
            "mlp",
            "pipedream-flush",
            workers=2,
            microbatches=4,
            epochs=2,
            out=root / "zoo",
            model_options={"depth": 4, "width": 32, "in_features": 64},
            **zoo,
        )
    )
    names.append("zoo")
    for key, (name, opts, kw) in STREAM_RUNS.items():
        jobs.append(
            prepare(
                "toy-mlp",
                name,
                workers=2,
                microbatches=4,
                out=root / key,
                schedule_options=opts,
                stream=True,
                **kw,
                **COMMON,
            )
        )
        names.append(key)
    for key, base in SHM_RUNS.items():
        twin = jobs[names.index(base)]
        jobs.append(
            dataclasses.replace(
                twin,
                run=dataclasses.replace(twin.run, out=str(root / key), transport="shm"),
                shm_token=f"test{os.getpid()}{key}",
            )
        )
        names.append(key)
    t = time.time()
    os.environ["WORKBENCH_SHM_SLOTS"] = "2"  # shm rings of 2 slots: wrapped many times, messages held back
    try:
        res = run_jobs(jobs)
    finally:
        del os.environ["WORKBENCH_SHM_SLOTS"]
    return dict(zip(names, zip(jobs, res))), root, time.time() - t


@pytest.mark.distributed
@pytest.mark.parametrize("key", list(SHM_RUNS))
def test_shared_memory_transport_gives_the_same_weights(runs, key):
    """Every message carried through /dev/shm instead of gloo: the weights are bit for bit the same
    (pipeline schedules, split backward, two stages per rank, the master family's fetches beside it,
    weight stashing, two epochs with momentum: the channels' slots reused across epochs), and the
    channel files are gone afterwards."""
    job, summary = runs[0][key]
    assert job.run.transport == "shm"
    assert max_diff(summary["weights"], runs[0][SHM_RUNS[key]][1]["weights"]) == 0.0
    assert not list(Path("/dev/shm").glob(f"workbench-{job.shm_token}-*"))
    tl = list(csv.DictReader(open(Path(job.run.out) / "timeline.csv")))
    assert len(tl) == job.rounds_total * job.schedule.num_ops


def stream_reference(job, rounds: int, passes: int = 1):
    """The reference of a stream: the schedule over all the microbatches of ``rounds`` minibatches as
    ONE minibatch of ``rounds * BATCH`` samples (the same samples in the same order: DataOrder's slices
    are contiguous), ``passes`` times (one per epoch when ``rounds`` is the epoch)."""
    return reference_train(
        job.stream(rounds * job.schedule.microbatches),
        job.model_fn(),
        job.bounds,
        job.dataset_fn(),
        batch_size=rounds * BATCH,
        lr=LR,
        rounds=passes,
        momentum=job.optim.momentum,
    )


@pytest.mark.distributed
@pytest.mark.parametrize("key", list(STREAM_RUNS))
def test_stream_runs_an_epoch_as_one_pipeline_with_its_weight_rule(runs, key):
    """stream=True: the weights are those of the schedule over all the epoch's microbatches (reference
    to 1e-12: versions, stashing, 2BW's delay, vertical sync, momentum over two epochs, a last partial
    epoch), not those of one pipeline per minibatch; one metrics row per minibatch; and the pipeline
    does not drain between minibatches: a forward of minibatch k+1 runs before the last backward of
    minibatch k on the first rank."""
    job, summary = runs[0][key]
    rpe = len(job.dataset_fn()) // BATCH
    if key == "stream":  # two full epochs, momentum carried across the epoch end
        ref = stream_reference(job, rpe, passes=2)
    else:  # a part of one epoch: one stream
        ref = stream_reference(job, job.rounds_total)
    assert max_diff(summary["weights"], ref) < 1e-12
    per_minibatch = job_reference(job, job.rounds_total, momentum=job.optim.momentum)
    assert max_diff(summary["weights"], per_minibatch) > 1e-4  # a different rule at every minibatch boundary
    rows = list(csv.DictReader(open(Path(job.run.out) / "metrics.csv")))
    assert [int(r["step"]) for r in rows] == list(range(job.rounds_total))
    assert all(float(r["wall_ms"]) > 0 and float(r["loss"]) > 0 for r in rows)
    tl = list(csv.DictReader(open(Path(job.run.out) / "timeline.csv")))
    assert len(tl) == job.rounds_total * job.schedule.num_ops  # the same ops, in another order
    r0 = sorted((r for r in tl if r["worker"] == "0"), key=lambda r: float(r["start"]))
    pos = {(r["kind"], int(r["microbatch"])): i for i, r in enumerate(r0)}
    M = job.schedule.microbatches
    overlapped = [k for k in range(job.rounds_total - 1) if pos[("F", (k + 1) * M)] < pos[("B", k * M + M - 1)]]
    assert len(overlapped) >= job.rounds_total - 2  # every minibatch boundary but an epoch end's


def pipedream_two_epochs(out, **options):
    """``train`` of PipeDream on the toy MLP, 2 ranks, 2 epochs with momentum: the runs that fail
    and resume (``options``: fault injection, ``resume``, ``stream``)."""
    return train("toy-mlp", "pipedream", workers=2, microbatches=4, epochs=2, out=out, momentum=MU, **options, **COMMON)


@pytest.mark.distributed
def test_stream_resumes_bit_exactly_after_a_fault(runs, tmp_path):
    """A stream that fails in its second epoch restarts from the first epoch's checkpoint (the
    pipeline drained there) and ends with the uninterrupted run's weights."""
    job, full = runs[0]["stream"]
    rpe = len(job.dataset_fn()) // BATCH
    out = tmp_path / "faulty"
    with pytest.raises(RuntimeError, match=r"rank 0 .*injected fault at step"):
        pipedream_two_epochs(out, fail_rank=0, fail_at_step=rpe + 2, stream=True)
    assert latest_checkpoint(out).name == f"round{rpe:06d}"
    resumed = pipedream_two_epochs(out, resume=True, stream=True)
    assert max_diff(resumed["weights"], full["weights"]) < 1e-12


def test_stream_refuses_schedules_with_a_flush(tmp_path):
    kw = dict(COMMON, out=tmp_path / "x")
    with pytest.raises(
        ValueError, match="flushes the pipeline at every minibatch.*model-parallel, pipedream, pipedream-2bw"
    ):
        prepare("toy-mlp", "gpipe", workers=2, microbatches=4, stream=True, **kw)
    with pytest.raises(ValueError, match="give the schedule by name"):
        prepare("toy-mlp", build("pipedream", 2, 4), workers=2, microbatches=4, stream=True, **kw)
    with pytest.raises(
        ValueError, match="do not repeat over two minibatches"
    ):  # 3 microbatches per update, 4 per minibatch
        prepare(
            "toy-mlp",
            "pipedream-2bw",
            workers=2,
            microbatches=4,
            stream=True,
            schedule_options={"microbatches_per_step": 3},
            **kw,
        )


@pytest.mark.distributed
@pytest.mark.parametrize("key", list(SYNC_RUNS))
def test_sync_schedules_match_minibatch_sgd(runs, key):
    job, summary = runs[0][key]
    assert max_diff(summary["weights"], job_sgd(job, STEPS)) < 1e-5
    assert max_diff(summary["weights"], initial_weights(job)) > 1e-3


@pytest.mark.distributed
@pytest.mark.parametrize("key", list(RULE_RUNS))
def test_pipedream_rules_match_reference(runs, key):
    job, summary = runs[0][key]
    assert max_diff(summary["weights"], job_reference(job, STEPS)) < 1e-5
    if key == "no-stash":
        stash = runs[0]["stash"][1]["weights"]
        assert max_diff(summary["weights"], stash) > 1e-6  # the failure mode: a different trajectory
    if key == "stash":  # stashing keeps a second weight version on the input stage, freed afterwards
        mem = summary["ranks"][0]["memory"]["0"]
        assert mem["peak_versions"] == 2 and mem["peak_live_microbatches"] == 2


@pytest.mark.distributed
def test_asynchronous_dp_is_hogwild_with_real_staleness(runs):
    job, summary = runs[0]["asp"]
    assert summary["staleness_max"] >= 1  # the other replica wrote between a read and a write
    rows = list(csv.DictReader(open(runs[1] / "asp" / "metrics.csv")))
    assert len(rows) == 12 and all(float(r["loss"]) == float(r["loss"]) for r in rows)


def test_hogwild_update_computes_its_gradient_on_the_weights_it_pulled(tmp_path, monkeypatch):
    """ASP as an asynchronous parameter-server worker runs it: an update's forwards and backwards all
    use the weights it pulled, even when another replica writes the shared weights in between. Here a
    write lands between the forward and the backward (injected in process); the update must move the
    shared weights by exactly what it moves them without that write (the same gradient)."""
    from types import SimpleNamespace

    from workbench.runtime.executors import hogwild
    from workbench.runtime.launch.driver import shared_weights

    job = prepare("toy-mlp", "dp-asp", workers=2, microbatches=2, steps=1, out=tmp_path / "asp", **COMMON)
    x, y = job.dataset_fn().tensors
    mb = BATCH // 2

    def one_update(other_write: float) -> list[dict]:
        shared, counters = shared_weights(job)
        ctx = SimpleNamespace(
            rank=0, device=torch.device("cpu"), t0=0.0, optim=SimpleNamespace(momentum=0.0, lr=LR, seed=0)
        )
        ex = hogwild.HogwildExecutor(ctx, job.schedule, job.model_fn(), job.bounds, shared, counters=counters)
        real_vjp = hogwild.vjp

        def late_vjp(*args, **kw):  # another replica's update, after this replica's forward
            for t in shared[0].values():
                t.data.add_(other_write)
            return real_vjp(*args, **kw)

        monkeypatch.setattr(hogwild, "vjp", late_vjp)
        metrics = dict(loss=0.0, n=0, correct=0, samples=0)
        ex.run_round(0, 0, lambda b: (x[b * mb : (b + 1) * mb], y[b * mb : (b + 1) * mb]), [], metrics)
        return [{n: t.clone() for n, t in w.items()} for w in shared]

    writes = sum(1 for op in hogwild.RankProgram(job.schedule, 0).ops if op.kind in ("B", "BW"))
    alone, overwritten = one_update(0.0), one_update(0.01)
    assert writes >= 1
    assert max_diff(alone, [{n: t - 0.01 * writes for n, t in w.items()} for w in overwritten]) < 1e-12


@pytest.mark.distributed
def test_outputs_written(runs):
    job, summary = runs[0]["full"]
    out = runs[1] / "full"
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    rpe = len(job.dataset_fn()) // BATCH
    assert [int(r["step"]) for r in rows] == list(range(2 * rpe))
    assert float(rows[-1]["loss"]) < float(rows[0]["loss"])
    tl = list(csv.DictReader(open(out / "timeline.csv")))
    assert {"worker", "stage", "microbatch", "kind", "start", "end", "version"} <= set(tl[0])
    assert len(tl) == 2 * rpe * job.schedule.num_ops
    assert all(float(r["end"]) >= float(r["start"]) >= 0 for r in tl)
    ck = latest_checkpoint(out)
    assert ck.name == f"round{2 * rpe:06d}" and sorted(p.name for p in ck.glob("*.pt")) == [
        "stage0_replica0.pt",
        "stage1_replica0.pt",
    ]
    s = json.loads((out / "summary.json").read_text())
    assert s["steps"] == 2 * rpe and s["samples_per_s"] > 0 and all(r["peak_rss_bytes"] > 0 for r in s["ranks"])
    with pytest.raises(ValueError, match="already holds a finished run"):
        prepare("toy-mlp", "pipedream", workers=2, microbatches=4, epochs=2, out=out, **COMMON)


@pytest.mark.distributed
def test_fault_stops_job_then_resume_matches_uninterrupted(runs):
    full_job, full = runs[0]["full"]
    out = runs[1] / "faulty"
    rpe = len(full_job.dataset_fn()) // BATCH
    with pytest.raises(RankFailed, match=r"rank 1 .*injected fault at step") as e:
        pipedream_two_epochs(out, fail_rank=1, fail_at_step=rpe + 1)
    assert time.time() - e.value.at < stop_bound_s()  # from the fault, not from the job's start
    assert e.value.rank == 1 and e.value.step == rpe + 1 and "injected fault" in e.value.traceback
    psutil = pytest.importorskip("psutil")
    left = [p for p in psutil.Process().children(recursive=True) if "resource_tracker" not in " ".join(p.cmdline())]
    assert [p for p in left if p.status() != psutil.STATUS_ZOMBIE] == []  # the launcher joined its ranks
    assert latest_checkpoint(out).name == f"round{rpe:06d}"  # epoch 1's checkpoint survived
    resumed = pipedream_two_epochs(out, resume=True)
    assert max_diff(resumed["weights"], full["weights"]) < 1e-12
    rows = list(csv.DictReader(open(out / "metrics.csv")))
    assert [int(r["step"]) for r in rows] == list(range(2 * rpe))


@pytest.mark.distributed
@pytest.mark.parametrize("stage_lr", ["same", "replicas"])
def test_replicated_stage_round_robin_matches_reference(tmp_path, stage_lr):
    plan = Plan.from_boundaries([2, 6], [2, 1])  # stage 0 on workers 0,1; stage 1 on worker 2
    job = prepare(
        "toy-mlp",
        "pipedream",
        workers=3,
        microbatches=4,
        steps=2,
        out=tmp_path / "r",
        plan=plan,
        stage_lr=stage_lr,
        **COMMON,
    )
    (summary,) = run_jobs([job])
    assert max_diff(summary["weights"], job_reference(job, 2, stage_lr=stage_lr)) < 1e-5
    other = job_reference(job, 2, stage_lr="replicas" if stage_lr == "same" else "same")
    assert max_diff(summary["weights"], other) > 1e-3  # stage 1 steps at lr x 1/2 under "replicas"
    assert summary["stage_lr"] == stage_lr


@pytest.mark.distributed
def test_momentum_runs_match_reference_and_torch_sgd(runs):
    job, summary = runs[0]["full"]  # PipeDream stash with momentum over two epochs
    rounds = 2 * (len(job.dataset_fn()) // BATCH)
    assert max_diff(summary["weights"], job_reference(job, rounds, momentum=MU)) < 1e-5
    job, summary = runs[0]["bsp-mom"]  # DDP with momentum against torch.optim.SGD on the whole model
    model = job.model_fn()
    net = torch.nn.Sequential(*model.layers)
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MU)
    ds = job.dataset_fn()
    order = DataOrder(len(ds), BATCH, 2, 0)
    for r in range(STEPS):
        x, y = microbatch(ds, torch.cat([order.indices(order.permutation(0), r, b) for b in range(2)]))
        opt.zero_grad()
        model.loss(net(x), y).backward()
        opt.step()
    assert max_diff(summary["weights"], [stage_params(stage_module(model.layers, a, z)) for a, z in job.bounds]) < 1e-5


@pytest.mark.distributed
def test_zoo_model_learns_digits(runs):
    job, summary = runs[0]["zoo"]
    rows = list(csv.DictReader(open(runs[1] / "zoo" / "metrics.csv")))
    evaluated = [r for r in rows if r["test_accuracy"]]
    assert len(evaluated) == 2  # one evaluation per epoch
    assert float(evaluated[-1]["test_accuracy"]) > 0.5  # 10 classes: chance is 0.1
    assert summary["final_test_accuracy"] == pytest.approx(float(evaluated[-1]["test_accuracy"]))


def test_stage_lrs_scale_a_stage_by_its_replicas_over_the_first_stages():
    """PipeDream's runtime (get_adjusted_learning_rate): lr x R_s / R_0, the same step per sample."""
    assert stage_lrs(((0,), (1,), (2, 3)), 0.3, "replicas") == pytest.approx([0.3, 0.3, 0.6])
    assert stage_lrs(((0, 1), (2,), (3,)), 0.3, "replicas") == pytest.approx([0.3, 0.15, 0.15])
    assert stage_lrs(((0, 1), (2,), (3,)), 0.3, "same") == [0.3, 0.3, 0.3]
    assert stage_lrs(((0, 1, 2, 3),), 0.3, "replicas") == [0.3]  # data parallelism: unchanged
    assert stage_lrs(((0,), (1,)), 0.3, "replicas") == [0.3, 0.3]  # a straight pipeline: unchanged
    with pytest.raises(ValueError, match="stage_lr must be 'same' or 'replicas', got 'linear'"):
        stage_lrs(((0,),), 0.3, "linear")


# ---- bad input ---------------------------------------------------------------------------
def test_bad_inputs_raise_one_line_value_errors(tmp_path):
    kw = dict(COMMON, out=tmp_path / "x")
    kw.pop("allow_oversubscribe"), kw.pop("transport")
    with pytest.raises(ValueError, match="plan covers 3 layers"):
        prepare("toy-mlp", "gpipe", workers=2, microbatches=4, plan=Plan.from_boundaries([1, 2]), **kw)
    with pytest.raises(ValueError, match="CPU cores"):
        prepare("toy-mlp", "gpipe", workers=512, microbatches=4, **kw)
    with pytest.raises(ValueError, match="not divisible"):
        prepare("toy-mlp", "gpipe", workers=2, microbatches=5, **kw)
    with pytest.raises(ValueError, match="remote weights|another worker"):  # forward and backward read different owners
        prepare(
            "toy-mlp",
            from_placement(lambda s, b, d: (b % 2, 0 if d == "forward" else 1), 2, 2, 2),
            workers=2,
            microbatches=2,
            **kw,
        )
    kw["allow_oversubscribe"] = True
    with pytest.raises(ValueError, match="transport must be 'auto' or 'gloo' or 'shm'"):
        prepare("toy-mlp", "gpipe", workers=2, microbatches=4, transport="tcp", **kw)
    with pytest.raises(ValueError, match="dp-bsp has none"):
        prepare("toy-mlp", "dp-bsp", workers=2, microbatches=2, transport="shm", **kw)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ValueError, match=f"port {port} is in use"):
            train("toy-mlp", "gpipe", workers=2, microbatches=4, steps=1, port=port, **kw)


def test_port_is_not_checked_under_torchrun(tmp_path, monkeypatch):
    """Under torchrun the ranks join torchrun's rendezvous: a ``port`` given beside it is not theirs
    to bind, and a busy one (torchrun's own store may hold it) is no error."""
    from workbench.runtime.launch import driver as launch

    ran = []
    monkeypatch.setattr(launch, "run_job", lambda job, port=None: ran.append(port) or {})
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "127.0.0.1")):
        monkeypatch.setenv(k, v)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        launch.train("toy-mlp", "gpipe", workers=2, microbatches=4, steps=1, port=port, out=str(tmp_path / "o"))
    assert ran == [port]


def test_cli_bad_input_exits_2(tmp_path, capsys):
    import argparse

    from workbench.cli.train import add_train_arguments, run_train

    p = argparse.ArgumentParser()
    add_train_arguments(p)
    args = p.parse_args(["--model", "toy-mlp", "--workers", "512", "--out", str(tmp_path / "o"), "--no-progress"])
    assert run_train(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "CPU cores" in err[0]


# ---- master family: weights fetched from their owner, gradients pushed back ---------------------
def replicated_owner_placement(s, b, d):
    """4 workers, 2 stages: compute on b mod 4; stage s's weights on {2s, 2s+1} (two holders: AR), read from
    2s + (b+1) mod 2. Covers a holder reading the other holder's weights (its gradient stays local) and
    non-holders pushing gradients to either holder."""
    return b % 4, 2 * s + (b + 1) % 2


MASTER4_RUNS = {  # 4 ranks on 2 cores (oversubscribed); name -> (schedule or name, options, microbatches, momentum)
    "fslpp": ("fslpp", {"group_size": 2}, 4, 0.0),  # W = G R = 4, 4 stages: compute h(s,b), weights h(s,s)
    "placement": (from_placement(replicated_owner_placement, 2, 4, 4), {}, 4, MU),
}


@pytest.fixture(scope="module")
def runs4(tmp_path_factory):
    root = tmp_path_factory.mktemp("rt4")
    jobs = [
        prepare(
            "toy-mlp",
            name,
            workers=4,
            microbatches=m,
            steps=STEPS,
            out=root / key,
            schedule_options=opts,
            momentum=mu,
            **COMMON,
        )
        for key, (name, opts, m, mu) in MASTER4_RUNS.items()
    ]
    return dict(zip(MASTER4_RUNS, zip(jobs, run_jobs(jobs))))


def pushes_expected(schedule):
    """Gradient pushes per worker and round, derived from the placement: one per (stage, owner) that a
    worker holding no replica of the stage computes backwards for (its microbatch gradients are summed)."""
    out = []
    for w, ops in enumerate(schedule.ops):
        out.append(
            len(
                {
                    (op.stage, op.weights_worker)
                    for op in ops
                    if op.kind in ("B", "BW")
                    and op.weights_worker not in (None, w)
                    and w not in schedule.stage_workers[op.stage]
                }
            )
        )
    return out


def check_master_run(job, summary, sgd: bool):
    assert max_diff(summary["weights"], job_reference(job, STEPS, momentum=job.optim.momentum)) < 1e-5
    if sgd:  # synchronous: plain minibatch SGD on the whole model
        assert max_diff(summary["weights"], job_sgd(job, STEPS)) < 1e-5
    assert max_diff(summary["weights"], initial_weights(job)) > 1e-3
    stats = worker_stats(job.schedule)
    fetched = [r["weight_fetches"] for r in summary["ranks"]]
    assert sum(fetched) > 0  # the schedule really reads remote weights
    assert fetched == [STEPS * int(n) for n in stats["weight_transfers"]]  # one fetch per (stage, microbatch) and step
    assert sum(r["weight_sends"] for r in summary["ranks"]) == sum(fetched)
    assert [r["gradient_pushes"] for r in summary["ranks"]] == [STEPS * n for n in pushes_expected(job.schedule)]
    stage_bytes = [sum(p.numel() * p.element_size() for p in w.values()) for w in summary["weights"].values()]
    assert sum(r["weight_fetch_bytes"] for r in summary["ranks"]) == STEPS * sum(
        stage_bytes[op.stage] for w, op in job.schedule if op.kind == "F" and op.weights_worker not in (None, w)
    )


@pytest.mark.distributed
def test_fsdp_fetches_weights_and_matches_minibatch_sgd(runs):
    job, summary = runs[0]["fsdp"]
    check_master_run(job, summary, sgd=True)


@pytest.mark.distributed
@pytest.mark.parametrize("key", list(MASTER4_RUNS))
def test_master_schedules_on_four_ranks(runs4, key):
    job, summary = runs4[key]
    check_master_run(job, summary, sgd=job.optim.momentum == 0)
    if key == "placement":  # two holders per stage: their weights agree after the all-reduced steps
        assert all(len(ws) == 2 for ws in job.schedule.stage_workers)


@pytest.mark.slow
def test_reference_master_schedules_are_minibatch_sgd():
    model_fn, ds = toy()
    for sched in (
        build("fsdp", 3, 4, workers=2),
        build("fslpp", 4, 4, workers=4, group_size=2),
        from_placement(replicated_owner_placement, 2, 4, 4),
    ):
        b = bounds_of(sched.num_stages)
        ref = reference_train(sched, model_fn(), b, ds, batch_size=BATCH, lr=LR, rounds=3)
        assert max_diff(ref, minibatch_sgd(model_fn, ds, b, 3, 4, batch_size=BATCH, lr=LR)) < 1e-12, sched.name


def test_epoch_outputs_are_appended_and_a_resume_drops_a_torn_line(tmp_path):
    """append_outputs adds each epoch's rows without rewriting the earlier ones (their bytes stay);
    the first write after a resume rewrites without the steps >= the resume point and without a
    line a crash cut short."""
    from types import SimpleNamespace

    from workbench.runtime.launch.outputs import append_outputs

    job = SimpleNamespace(options={}, optim=SimpleNamespace(batch_size=8))

    def epoch(e):  # one rank, two steps of one F op each
        rows = [
            dict(step=2 * e + k, epoch=e, loss=1.0, n=8, correct=4, samples=8, end_ms=10.0 * (2 * e + k + 1))
            for k in range(2)
        ]
        tl = [
            (0, 0, 2 * e + k, "F", 10.0 * (2 * e + k), 10.0 * (2 * e + k) + 5, 0, 2 * e + k, 0.0, 0.0, 0.0, 0.0)
            for k in range(2)
        ]
        return [(rows, tl)]

    append_outputs(tmp_path, epoch(0), job, -1)
    first = {n: ((tmp_path / n).read_bytes(), (tmp_path / n).stat().st_ino) for n in ("metrics.csv", "timeline.csv")}
    append_outputs(tmp_path, epoch(1), job, -1)
    for n, (b, ino) in first.items():  # the same file (not replaced), the old bytes first
        now = (tmp_path / n).read_bytes()
        assert now.startswith(b) and len(now) > len(b) and (tmp_path / n).stat().st_ino == ino
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [int(r["step"]) for r in rows] == [0, 1, 2, 3]
    # samples/s of the first appended step is measured from the last step already written
    assert float(rows[2]["samples_per_s"]) == pytest.approx(8 / 10.0 * 1e3)
    assert [int(r["round"]) for r in csv.DictReader(open(tmp_path / "timeline.csv"))] == [0, 1, 2, 3]
    with open(tmp_path / "timeline.csv", "a") as f:
        f.write("0,0,9,F,90")  # a write a crash cut short
    append_outputs(tmp_path, epoch(1), job, 2)  # resumed at step 2: epoch 1 again
    assert [int(r["step"]) for r in csv.DictReader(open(tmp_path / "metrics.csv"))] == [0, 1, 2, 3]
    tl = list(csv.DictReader(open(tmp_path / "timeline.csv")))
    assert [int(r["round"]) for r in tl] == [0, 1, 2, 3] and all(None not in r.values() for r in tl)


@pytest.mark.distributed
def test_shared_memory_fault_stops_the_job_and_leaves_no_channel(tmp_path):
    """A rank that fails while its peer polls a shared-memory slot: the job stops quickly with the
    failing rank named, no process and no channel file is left."""
    job = prepare(
        "toy-mlp",
        "pipedream-flush",
        workers=2,
        microbatches=4,
        steps=4,
        out=tmp_path / "f",
        fail_rank=1,
        fail_at_step=2,
        **dict(COMMON, transport="shm"),
    )
    assert job.shm_token.split(".")[1] == str(os.getpid())  # the token names this launcher
    with pytest.raises(RankFailed, match=r"rank 1 .*injected fault at step 2") as e:
        run_job(job)
    assert time.time() - e.value.at < stop_bound_s()  # from the fault, not from the job's start
    assert not list(Path("/dev/shm").glob(f"workbench-{job.shm_token}-*"))  # this job's only: others may run


@pytest.mark.slow
def test_shm_stale_channel_files_of_dead_launchers_are_removed(tmp_path, monkeypatch):
    """A launcher killed with SIGKILL cannot remove its channel files: the next shm job removes the
    files whose token names a process that no longer runs, and leaves the live ones."""
    import subprocess
    import sys

    from workbench.runtime.transport import shm

    monkeypatch.setattr(shm, "SHM_DIR", tmp_path)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = shm.new_token()
    ns = shm.pid_namespace()
    assert live.startswith(f"{ns}.{os.getpid()}.")
    stale = f"{ns}.{dead.pid}.abc"
    elsewhere = f"{ns}1.{dead.pid}.abc"  # the same pid in another namespace: maybe a live process there
    files = {tok: shm.channel_path(tok, 0, 1) for tok in (stale, live, elsewhere)}
    for p in files.values():
        p.write_bytes(b"0")
    other = tmp_path / "workbench-notapid-0-1"  # not a token this module made: left alone
    other.write_bytes(b"0")
    assert shm.remove_stale_channels() == [files[stale]]
    assert not files[stale].exists() and files[live].exists() and files[elsewhere].exists() and other.exists()


def test_shm_channel_numbers_messages_and_times_out(tmp_path, monkeypatch):
    """One channel, both ends in this process: messages land in slot q mod slots and come out in any
    order; a slot is reused only after its message was read; waiting for a message that never
    comes raises a TimeoutError naming it."""
    from workbench.runtime.transport import shm

    monkeypatch.setattr(shm, "SHM_DIR", tmp_path)
    path = shm.channel_path("t", 0, 1)
    tx, rx = shm.Channel(path, 2, 16, timeout_s=0.05), shm.Channel(path, 2, 16, timeout_s=0.05)
    a, b = torch.arange(4, dtype=torch.float32), torch.tensor([7, 8], dtype=torch.int64)
    tx.put(0, [a], "m0")
    tx.put(1, [b], "m1")
    (got_b,), _ = rx.get(1, [((2,), torch.int64)], "m1")  # out of order
    (got_a,), _ = rx.get(0, [((4,), torch.float32)], "m0")
    assert torch.equal(got_a, a) and torch.equal(got_b, b)
    tx.put(2, [a + 1], "m2")  # slot 0 again, its message 0 was read
    with pytest.raises(TimeoutError, match="message 1 still unread|slot of m4"):
        tx.put(4, [a], "m4")  # slot 0 holds message 2, unread
    with pytest.raises(TimeoutError, match="m3 did not happen"):
        rx.get(3, [((4,), torch.float32)], "m3")
    (got,), _ = rx.get(2, [((4,), torch.float32)], "m2")
    assert torch.equal(got, a + 1)
    with pytest.raises(ValueError, match="exceed the channel's slot"):
        tx.put(3, [torch.zeros(32)], "big")
    tx.close(), rx.close()


def test_shm_sender_holds_messages_back_instead_of_waiting(tmp_path, monkeypatch):
    """A ring of 2 slots and 7 messages: the sender never blocks (the ones whose slot still holds an
    unread message are held back and written at its next send, while it waits for a receive, or at
    flush), and the receiver gets all of them, in its order, with their contents."""
    import threading

    from workbench.runtime.transport import shm
    from workbench.runtime.transport.comm import ShmP2P

    monkeypatch.setattr(shm, "SHM_DIR", tmp_path)
    spec = [((3,), torch.float64)]
    chans = [shm.Channel(shm.channel_path("h", 0, 1), 2, 24, timeout_s=5) for _ in range(2)]
    back = [shm.Channel(shm.channel_path("h", 1, 0), 2, 24, timeout_s=5) for _ in range(2)]
    tx = ShmP2P(0, 2, "cpu", 5, inbound={1: back[0]}, outbound={1: chans[0]})
    rx = ShmP2P(1, 2, "cpu", 5, inbound={0: chans[1]}, outbound={0: back[1]})
    keys = [(0, 0, g) for g in range(7)]
    plan = [(k, 0, spec) for k in keys]
    rx.set_plan(plan)
    tx.set_send_plan({1: plan})
    tx.set_plan([((1, 0, 0), 1, spec)])  # rank 0 waits for one gradient from rank 1 at the end
    rx.set_send_plan({0: [((1, 0, 0), 1, spec)]})
    t = time.perf_counter()
    for g, k in enumerate(keys):
        tx.send(k, [torch.full((3,), float(g), dtype=torch.float64)], 1)
    assert time.perf_counter() - t < 1 and len(tx.held[1]) == 5  # 2 written, 5 held, none waited for
    got = []

    def receive():
        got.extend(float(rx.recv(k)[0][0][0]) for k in keys)
        rx.send((1, 0, 0), [torch.ones(3, dtype=torch.float64)], 0)

    th = threading.Thread(target=receive)
    th.start()
    (grad,), _ = tx.recv((1, 0, 0))  # writes the held messages while it waits
    th.join(5)
    tx.flush()
    assert got == [float(g) for g in range(7)] and torch.equal(grad, torch.ones(3, dtype=torch.float64))
    assert not tx.held[1]
    for c in chans + back:
        c.close()


def test_auto_transport_picks_shared_memory_only_where_it_runs_and_pays(tmp_path, monkeypatch):
    """transport="auto" (the default): shm for CPU ranks spawned here with a core each and pipeline
    messages only, gloo otherwise (torchrun, GPUs, more ranks than cores, no point-to-point messages,
    all-reduces or weight fetches within an epoch, a /dev/shm too small for the channels)."""
    from workbench.runtime.launch import driver as launch
    from workbench.runtime.transport import shm

    if shm.available():
        pytest.skip(shm.available())

    class Room:  # /dev/shm as statvfs reports it: plenty of room, or 40 KiB
        f_bavail, f_frsize = 1 << 20, 4096

    monkeypatch.setattr(shm.os, "statvfs", lambda _: Room)
    monkeypatch.setattr(launch, "_cores", lambda: 2)
    ok = dict(spawned=True, device="cpu", backend="gloo", messages=True)
    assert shm.auto_transport(2, 2, **ok) == "shm"
    assert shm.auto_transport(4, 2, **ok) == "gloo"  # sharing cores: a polling rank would take a computing rank's time
    assert shm.auto_transport(1, 2, **ok) == "gloo"
    for bad in (dict(spawned=False), dict(device="cuda"), dict(backend="nccl"), dict(messages=False)):
        assert shm.auto_transport(2, 2, **(ok | bad)) == "gloo"
    auto = {k: v for k, v in COMMON.items() if k != "transport"}
    expect = {"pipedream": "shm", "zb-h1": "shm", "dp-bsp": "gloo", "fsdp": "gloo"}  # fsdp: weight fetches over gloo
    for name, want in expect.items():
        job = prepare("toy-mlp", name, workers=2, microbatches=4, out=tmp_path / name, **auto)
        assert job.run.transport == want and bool(job.shm_token) == (want == "shm"), name
    Room.f_bavail = 10
    assert shm.auto_transport(2, 2, **ok) == "gloo"
    assert (
        prepare("toy-mlp", "pipedream", workers=2, microbatches=4, out=tmp_path / "full", **auto).run.transport
        == "gloo"
    )


@pytest.mark.distributed
def test_a_resume_refuses_a_changed_option_states_a_changed_length_and_reports_its_own_steps(tmp_path):
    """One epoch, then --resume with two: the length change is stated, the summary counts the steps this
    invocation trained (resumed at the first epoch's checkpoint); a changed lr is refused before any rank."""
    out = tmp_path / "r"
    one = train("toy-mlp", "pipedream", workers=2, microbatches=4, epochs=1, out=out, **COMMON)
    rpe = one["steps"]
    assert one["steps_trained"] == rpe and one["resumed_at"] is None
    assert json.loads((out / "options.json").read_text())["minibatches"] == rpe
    with pytest.raises(ValueError, match=r"^resume: lr changed since the run in .* \(0\.1, now 0\.2\)"):
        train(
            "toy-mlp", "pipedream", workers=2, microbatches=4, epochs=2, out=out, resume=True, **(COMMON | {"lr": 0.2})
        )
    assert (out / "summary.json").exists()  # the refusal left the run as it was
    with pytest.warns(UserWarning, match=rf"resume: the run now trains {2 * rpe} minibatches in all, not the {rpe}"):
        two = train("toy-mlp", "pipedream", workers=2, microbatches=4, epochs=2, out=out, resume=True, **COMMON)
    assert (two["steps"], two["steps_trained"], two["resumed_at"]) == (2 * rpe, rpe, rpe)

"""The runtime as on NCCL, over gloo: ``one_tag`` (every message carries tag 0, so gloo matches a
pair's messages on a communicator by their order alone, as NCCL does), each receive posted when its
op needs it (``lookahead=0``) and every send posted by the op itself (no sender thread), as the
runtime does with NCCL. Every registered schedule trains 2, 3 and 4 gloo ranks to the single-process
reference's weights in this mode, and the calls each rank really issued (recorded live,
``$WORKBENCH_COMM_TRACE``) are, call for call and in order, those the dry run records from the same
job: what the NCCL check reads (test_comm_plan)."""

from __future__ import annotations

import os

import pytest
import torch
from runtime_checks import TOY_MLP, initial_weights, job_reference, max_diff

from workbench.runtime import prepare, run_jobs
from workbench.runtime.transport import dry_run, trace
from workbench.schedules import REGISTRY

STEPS = 2
WORKERS = (2, 3, 4)
# the toy MLP with 9 layers: enough for two stages per rank at 4 ranks (interleaved, V shapes)
MLP = TOY_MLP | dict(model_options={"widths": (8, 16, 16, 16, 16, 4)})
COMMON = MLP | dict(lr=0.1, timeout_s=60, transport="gloo", one_tag=True, lookahead=0)
SEGMENTED = dict(  # the seq1f1b family runs on the zoo's causal transformer
    dtype="float64",
    lr=0.05,
    progress=False,
    return_weights=True,
    allow_oversubscribe=True,
    evaluate=False,
    timeout_s=120,
    transport="gloo",
    one_tag=True,
    lookahead=0,
)
# dp-asp (Hogwild) exchanges nothing point to point (shared memory) and its result depends on timing
NAMES = sorted(n for n, sp in REGISTRY.items() if sp.executor != "hogwild")


def _job(name, W, root):
    sp = REGISTRY[name]
    out = root / f"{name}-w{W}"
    if "segments" in {o.name for o in sp.options}:  # 2 stages per rank at most: 2W - 2 blocks + embedding + head
        opts = {"num_layers": 2 * W - 2, "dim": 16, "heads": 2}
        return prepare(
            "gpt",
            name,
            workers=W,
            microbatches=W,
            batch_size=2 * W,
            steps=STEPS,
            out=out,
            model_options=opts,
            **SEGMENTED,
        )
    m = W if name == "dp-bsp" else 2 * W  # dp-bsp: one microbatch per replica
    return prepare("toy-mlp", name, workers=W, microbatches=m, batch_size=4 * m, steps=STEPS, out=out, **COMMON)


@pytest.fixture(scope="module")
def one_tag_runs(tmp_path_factory):
    """{(name, W): (job, summary, live traces)} of every schedule that builds at W ranks."""
    root = tmp_path_factory.mktemp("one-tag")
    traces = root / "traces"
    runs = {}
    os.environ[trace.ENV] = str(traces)
    os.environ["WORKBENCH_SEND_THREAD"] = "0"  # sends posted by the op, as with NCCL (comm.uses_send_thread)
    try:
        for W in WORKERS:
            jobs = {}
            for n in NAMES:
                try:
                    jobs[n] = _job(n, W, root)
                except ValueError:
                    continue  # a shape the schedule refuses (e.g. odd workers for a V shape)
            assert all(job.run.one_tag for job in jobs.values())
            for (n, job), summary in zip(jobs.items(), run_jobs(list(jobs.values()))):
                live = trace.load(traces, job.run.out, W) if REGISTRY[n].executor == "pipeline" else None
                runs[(n, W)] = (job, summary, live)
    finally:
        del os.environ[trace.ENV], os.environ["WORKBENCH_SEND_THREAD"]
    return runs


CASES = [(n, W) for W in WORKERS for n in NAMES]


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("name", "W"), CASES)
def test_every_schedule_matches_the_reference_with_one_tag(one_tag_runs, name, W):
    if (name, W) not in one_tag_runs:
        pytest.skip(f"{name} does not build at {W} workers")
    job, summary, _ = one_tag_runs[(name, W)]
    ref = job_reference(job, STEPS, dtype=torch.float64)
    assert max_diff(summary["weights"], ref) < 1e-9, name
    assert max_diff(summary["weights"], initial_weights(job)) > 1e-4, name  # it did train


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize(("name", "W"), [c for c in CASES if REGISTRY[c[0]].executor == "pipeline"])
def test_the_live_calls_are_the_dry_runs(one_tag_runs, name, W):
    """Each rank's live gloo calls (sends, receives, all-reduces, waits; tags are all 0 here, so
    compared without them) are the dry run's, in the same order; communicator by communicator too."""
    if (name, W) not in one_tag_runs:
        pytest.skip(f"{name} does not build at {W} workers")
    job, _, live = one_tag_runs[(name, W)]
    dry = dry_run.record_job(job, rounds=STEPS)
    assert dry.errors == []
    for r in range(W):
        assert trace.sequence(live[r], tags=False) == trace.sequence(dry.traces[r], tags=False), f"{name} W={W} {r}"
        got = trace.per_communicator(live[r], r, tags=False)
        assert got == trace.per_communicator(dry.traces[r], r, tags=False), f"{name} W={W} rank {r}"
    assert any(live), f"{name} W={W}: nothing recorded"

"""The runtime with ``one_tag``: every message carries tag 0, so gloo matches a pair's messages on a
communicator by their order alone, as NCCL does. Every registered schedule trains 2 gloo ranks to
the single-process reference's weights in this mode (test_comm_plan proves the orders on paper;
this runs them)."""

from __future__ import annotations

import pytest
import torch
from runtime_checks import TOY_MLP, initial_weights, job_reference, max_diff

from workbench.runtime import prepare, run_jobs
from workbench.schedules import REGISTRY

STEPS = 2
COMMON = TOY_MLP | dict(batch_size=16, lr=0.1, timeout_s=60, transport="gloo", one_tag=True)
SEGMENTED = dict(  # the seq1f1b family runs on the zoo's causal transformer
    dtype="float64",
    model_options={"num_layers": 2},
    batch_size=8,
    lr=0.05,
    progress=False,
    return_weights=True,
    allow_oversubscribe=True,
    evaluate=False,
    timeout_s=120,
    transport="gloo",
    one_tag=True,
)
# dp-asp (Hogwild) exchanges nothing point to point (shared memory) and its result depends on timing
NAMES = sorted(n for n, sp in REGISTRY.items() if sp.executor != "hogwild")


def _job(name, root):
    sp = REGISTRY[name]
    if "segments" in {o.name for o in sp.options}:
        return prepare("gpt", name, workers=2, microbatches=2, steps=STEPS, out=root / name, **SEGMENTED)
    m = 2 if name == "dp-bsp" else 4  # dp-bsp: one microbatch per replica
    return prepare("toy-mlp", name, workers=2, microbatches=m, steps=STEPS, out=root / name, **COMMON)


@pytest.fixture(scope="module")
def one_tag_runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("one-tag")
    jobs = [_job(n, root) for n in NAMES]
    assert all(job.run.one_tag for job in jobs)
    return dict(zip(NAMES, zip(jobs, run_jobs(jobs))))


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", NAMES)
def test_every_schedule_matches_the_reference_with_one_tag(one_tag_runs, name):
    job, summary = one_tag_runs[name]
    ref = job_reference(job, STEPS, dtype=torch.float64)
    assert max_diff(summary["weights"], ref) < 1e-9, name
    assert max_diff(summary["weights"], initial_weights(job)) > 1e-4, name  # it did train

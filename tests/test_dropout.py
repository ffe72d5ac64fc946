"""Randomness inside layers (dropout) is drawn per (seed, global microbatch, layer): a run on several
ranks equals the single-process semantic reference and itself, for every executor kind
(workbench/runtime/semantics/randomness.py)."""

from __future__ import annotations

import pytest
import torch
from runtime_checks import initial_weights, job_reference, max_diff
from torch import nn

from workbench.runtime import prepare, run_jobs
from workbench.runtime.semantics.randomness import microbatch_rng, number_layers, splitmix64
from workbench.schedules import build

STEPS = 3


def dropout_mlp(p: float = 0.3) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(8, 16), nn.ReLU(), nn.Dropout(p), nn.Linear(16, 16), nn.ReLU(), nn.Dropout(p), nn.Linear(16, 4)
    ).double()


def dataset(n: int = 64) -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(n, 8, generator=g, dtype=torch.float64)
    return torch.utils.data.TensorDataset(x, (x[:, :4] * 3).argmax(dim=1))


def test_a_layer_draws_by_its_key_and_leaves_the_process_generator_alone():
    layer = nn.Dropout(0.5)
    number_layers([nn.Identity(), layer])  # layer index 1
    x = torch.ones(1000)
    torch.manual_seed(123)
    with microbatch_rng(7, 3):
        a = layer(x)
    after = torch.rand(4)
    torch.manual_seed(123)
    with microbatch_rng(7, 3):
        b = layer(x)
    assert torch.equal(a, b)  # the same key, the same mask
    torch.manual_seed(123)
    with microbatch_rng(7, 3):
        layer(x)
    assert torch.equal(torch.rand(4), after)  # the process's own stream continues as if untouched
    with microbatch_rng(7, 4):
        c = layer(x)
    with microbatch_rng(8, 3):
        d = layer(x)
    assert not torch.equal(a, c) and not torch.equal(a, d)  # another microbatch or seed: another mask
    torch.manual_seed(5)
    e = layer(x)
    torch.manual_seed(5)
    assert torch.equal(e, layer(x))  # outside a microbatch: the global generator, as before


def test_the_seed_mixes_every_input():
    seeds = {splitmix64(s, g, layer) for s in range(3) for g in range(5) for layer in range(4)}
    assert len(seeds) == 60 and all(0 <= v < 2**63 for v in seeds)


def test_the_reference_with_dropout_is_a_function_of_the_seed():
    ds = dataset()
    job = prepare(dropout_mlp(), "gpipe", workers=2, microbatches=4, steps=STEPS, dataset=ds, dtype="float64")
    a, b = job_reference(job, STEPS), job_reference(job, STEPS)
    assert max_diff(a, b) == 0.0
    other = job_reference(job, STEPS, seed=1)  # another data order and other masks
    assert max_diff(a, other) > 1e-6
    job0 = prepare(dropout_mlp(0.0), "gpipe", workers=2, microbatches=4, steps=STEPS, dataset=ds, dtype="float64")
    assert max_diff(a, job_reference(job0, STEPS)) > 1e-6  # the masks do act


#: executor kinds: the pipeline (stashing; flush; split backward; re-materialization), DDP, remote weights
SCHEDULES = {
    "pipedream": ("pipedream", {}),
    "gpipe-recompute": (build("gpipe", 2, 4, recompute=True), {}),
    "zb-h1": ("zb-h1", {}),
    "dp-bsp": ("dp-bsp", {}),
    "fsdp": ("fsdp", {}),
}


#: the zoo's GPT on every executor kind with a deterministic reference (Hogwild has none; segment-wise
#: models refuse dropout): stashing, flush, split backward, DDP, remote weights
GPT_SCHEDULES = ("pipedream", "pipedream-flush", "zb-h1", "dp-bsp", "fsdp")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root, ds, jobs = tmp_path_factory.mktemp("dropout"), dataset(), []
    for key, (name, opts) in SCHEDULES.items():
        for rep in range(2 if key == "pipedream" else 1):
            jobs.append(
                prepare(
                    dropout_mlp(),
                    name,
                    workers=2,
                    microbatches=4,
                    steps=STEPS,
                    dataset=ds,
                    dtype="float64",
                    schedule_options=opts,
                    out=root / f"{key}-{rep}",
                    progress=False,
                    evaluate=False,
                    return_weights=True,
                    allow_oversubscribe=True,
                )
            )
    # the zoo's GPT (mini size, 4 blocks) at GPT-2's dropout 0.1, its embedding tied to the output (fsdp refuses a tie)
    gpt = dict(num_layers=4, dropout=0.1, tie_weights=True)
    for name in GPT_SCHEDULES:
        jobs.append(
            prepare(
                "gpt",
                name,
                workers=2,
                microbatches=4,
                steps=STEPS,
                batch_size=8,
                model_options=gpt | ({"tie_weights": False} if name == "fsdp" else {}),  # remote weights: untied
                dtype="float64",
                out=root / f"gpt-{name}",
                progress=False,
                evaluate=False,
                return_weights=True,
                allow_oversubscribe=True,
            )
        )
    return jobs, run_jobs(jobs)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("key", list(SCHEDULES))
def test_two_ranks_with_dropout_equal_one_process(runs, key):
    jobs, summaries = runs
    i = list(SCHEDULES).index(key) + (1 if list(SCHEDULES).index(key) > 0 else 0)
    job, summary = jobs[i], summaries[i]
    assert max_diff(summary["weights"], job_reference(job, STEPS)) < 1e-10
    assert max_diff(summary["weights"], initial_weights(job)) > 1e-3


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("name", GPT_SCHEDULES)
def test_gpt_with_its_dropout_on_two_ranks_equals_one_process(runs, name):
    jobs, summaries = runs
    i = GPT_SCHEDULES.index(name) - len(GPT_SCHEDULES)
    assert max_diff(summaries[i]["weights"], job_reference(jobs[i], STEPS)) < 1e-10
    assert max_diff(summaries[i]["weights"], initial_weights(jobs[i])) > 1e-4


@pytest.mark.slow
@pytest.mark.distributed
def test_two_identical_runs_with_dropout_are_identical(runs):
    _, summaries = runs
    assert max_diff(summaries[0]["weights"], summaries[1]["weights"]) == 0.0


class OwnGenerator(nn.Module):
    """A layer that draws from a generator of its own: the runtime cannot seed it."""

    def __init__(self):
        super().__init__()
        self.lin, self.gen = nn.Linear(8, 4), torch.Generator().manual_seed(0)

    def forward(self, x):
        return self.lin(x) + 1e-3 * torch.rand(x.shape[0], 4, generator=self.gen, dtype=x.dtype)


def test_randomness_the_runtime_cannot_seed_is_said_in_one_line():
    model = nn.Sequential(nn.Linear(8, 8), OwnGenerator()).double()
    with pytest.warns(UserWarning, match=r"layer 1 \(OwnGenerator\) has its own torch.Generator: .* not seeded"):
        prepare(model, "gpipe", workers=2, microbatches=4, steps=1, dataset=dataset(), dtype="float64")

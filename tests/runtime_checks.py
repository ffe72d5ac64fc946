"""Oracles the runtime's tests share (imported by the test modules, not a test module itself).

* :func:`minibatch_sgd`: ``W <- W - lr * grad of the mean loss over each minibatch`` on the whole
  model in one process, split into the stages' weights afterwards;
* :func:`job_reference`: the single-process semantic reference (runtime/reference.py) of a prepared
  job: its schedule, model, stages, data, batch size and learning rate;
* :func:`initial_weights`, :func:`max_diff`, :func:`assert_weights_close`: per-stage weight lists
  (a list or a dict of ``{name: tensor}``, indexed by stage) and their comparison;
* :data:`TOY_MLP`: ``prepare``/``train`` keywords of a float64 toy-MLP run; :func:`small_mlp_run`:
  the zoo's MLP (2 layers of width 16) trained on 2 CPU ranks.
"""

from __future__ import annotations

import torch

from workbench.runtime import reference_train
from workbench.runtime.semantics.stages import DataOrder, microbatch, stage_module, stage_params


def minibatch_sgd(model_fn, ds, bounds, rounds, microbatches, *, batch_size, lr):
    """Minibatch SGD on the whole model over the first ``rounds`` minibatches in the
    runtime's data order (:class:`DataOrder`, seed 0); the final weights of every stage."""
    model = model_fn()
    net = torch.nn.Sequential(*model.layers)
    order = DataOrder(len(ds), batch_size, microbatches, 0)
    for R in range(rounds):
        e, r = divmod(R, order.rounds_per_epoch)
        perm = order.permutation(e)
        idx = torch.cat([order.indices(perm, r, b) for b in range(microbatches)])
        x, y = microbatch(ds, idx)
        net.zero_grad()
        model.loss(net(x), y).backward()
        with torch.no_grad():
            for p in net.parameters():
                p -= lr * p.grad
    return [stage_params(stage_module(model.layers, a, z)) for a, z in bounds]


def job_sgd(job, rounds: int):
    """:func:`minibatch_sgd` of a prepared job's first ``rounds`` minibatches."""
    return minibatch_sgd(
        job.model_fn,
        job.dataset_fn(),
        job.bounds,
        rounds,
        job.schedule.microbatches,
        batch_size=job.optim.batch_size,
        lr=job.optim.lr,
    )


def job_reference(job, rounds: int, **options):
    """The semantic reference's weights of a prepared job after ``rounds`` minibatches; ``options``:
    the other keywords of :func:`reference_train` (``momentum``, ``dtype``, ...)."""
    return reference_train(
        job.schedule,
        job.model_fn(),
        job.bounds,
        job.dataset_fn(),
        batch_size=job.optim.batch_size,
        lr=job.optim.lr,
        rounds=rounds,
        **options,
    )


def initial_weights(job):
    """Every stage's weights before training (to check that a run did train)."""
    return [stage_params(stage_module(job.model_fn().layers, a, z)) for a, z in job.bounds]


def max_diff(a, b) -> float:
    """Largest absolute difference between two per-stage weight lists (the names of ``a``)."""
    return max((a[s][n] - b[s][n]).abs().max().item() for s in range(len(a)) for n in a[s])


def assert_weights_close(got, want, label: str = "", **tolerance) -> None:
    """Every weight of ``want`` equals ``got``'s within ``tolerance`` (``rtol``, ``atol``)."""
    for s, w in enumerate(want):
        for n, t in w.items():
            torch.testing.assert_close(got[s][n], t, **tolerance, msg=f"{label}{n}")


#: the toy MLP (7 layers, Linear/ReLU alternating) in float64, weights returned, ranks that may share a core
TOY_MLP = dict(
    dtype="float64",
    model_options={"widths": (8, 16, 16, 16, 4)},
    progress=False,
    return_weights=True,
    allow_oversubscribe=True,
)

SMALL_MLP = dict(
    workers=2,
    batch_size=16,
    threads=1,
    progress=False,
    evaluate=False,
    model_options={"depth": 2, "width": 16, "in_features": 16},
)


def small_mlp_run(schedule: str, out, **options):
    """``train`` of the zoo's MLP (2 layers of width 16, 16 features) with ``schedule`` on 2 CPU
    ranks of one thread each, no evaluation, into ``out``; ``options`` add to or override those."""
    from workbench.runtime import train

    return train("mlp", schedule, out=out, **(SMALL_MLP | options))

"""What a run is: the picklable :class:`Job` every rank receives, and the model/data recipes in it.

Ranks rebuild the model and the data set from recipes (``functools.partial`` of :func:`build_model`
and :func:`build_dataset`) rather than receiving objects, so every process holds the same
deterministic weights and samples without any transfer.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.data import TensorDataset

from workbench.models import build
from workbench.models.base import LayerModel
from workbench.models.data import load_dataset
from workbench.profiling.layering import from_modules, split
from workbench.runtime.calibration.toy import toy_dataset, toy_mlp
from workbench.runtime.launch.jobspec import OptimSpec, RunSpec
from workbench.schedules.core import Schedule


def build_model(name: str, dtype: str | None = None, seed: int = 0, **options):
    """A LayerModel from the zoo (``workbench.models.build``), or ``toy-mlp`` from :mod:`~workbench.runtime.calibration.toy`."""
    if name == "toy-mlp":
        model = toy_mlp(seed=seed, **options)
    else:
        model = build(name, seed=seed, **options)
    if dtype is not None:
        for layer in model.layers:
            layer.to(getattr(torch, dtype))
    return model


def copy_model(model, dtype: str | None = None):
    """A fresh copy of a user's model (a LayerModel shipped to the ranks by pickling): every call
    returns the same initial weights."""
    model = copy.deepcopy(model)
    if dtype is not None:
        for layer in model.layers:
            layer.to(getattr(torch, dtype))
    return model


def user_dataset(train, test=None, split: str = "train"):
    """A user's TensorDataset(s): ``split="test"`` raises when no test set was given (no evaluation)."""
    if split == "train":
        return train
    if test is None:
        raise ValueError("no test set was given")
    return test


def load_object(spec: str):
    """``"package.module:function"`` -> the function (imported, not called)."""
    mod, _, attr = spec.partition(":")
    if not mod or not attr:
        raise ValueError(f"expected package.module:function, got {spec!r}")
    try:
        obj = importlib.import_module(mod)
    except ImportError as e:
        raise ValueError(f"cannot import {mod!r} for {spec!r} ({e}); is its folder on PYTHONPATH?") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"module {mod!r} has no {attr!r} (from {spec!r})")
        obj = getattr(obj, part)
    return obj


def as_dataset(dataset):
    """A data set argument -> ``(TensorDataset train, TensorDataset | None test)`` for a user model:
    a TensorDataset, a pair (train, test), or ``"package.module:function"`` returning either."""
    if isinstance(dataset, str):
        dataset = load_object(dataset)()
    train, test = dataset if isinstance(dataset, (tuple, list)) and len(dataset) == 2 else (dataset, None)
    for d in (train, test):
        if d is not None and not isinstance(d, TensorDataset):
            raise ValueError(
                f"a data set must be a torch.utils.data.TensorDataset(inputs..., targets) (or a pair "
                f"(train, test) of them), got {type(d).__name__}"
            )
    return train, test


def as_layer_model(model, train_set, seed: int = 0, dtype: str | None = None):
    """A user's model -> LayerModel: a LayerModel passes through, an ``nn.Module`` is traced by
    :func:`workbench.profiling.layering.split` on two samples of ``train_set``, a callable (factory, or
    ``"package.module:function"``) is called under ``torch.manual_seed(seed)`` first. A trace records
    dtypes (``x.to(torch.float32)`` in the model's code stays float32), so with ``dtype`` the module
    is converted and traced in that dtype."""
    if isinstance(model, str):
        model = load_object(model)
    if isinstance(model, LayerModel):  # a hand-built one (from_modules) is converted too, on a copy
        return model if dtype is None else copy_model(model, dtype)
    if not isinstance(model, nn.Module) and callable(model):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            built = model()
        if not isinstance(built, (nn.Module, LayerModel)):
            raise ValueError(
                f"model factory {getattr(model, '__name__', model)!r} returned {type(built).__name__}; "
                "it must return an nn.Module"
            )
        model = built
        if isinstance(model, LayerModel):
            return model if dtype is None else copy_model(model, dtype)
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"model must be a zoo name, an nn.Module, a LayerModel or a factory, got {type(model).__name__}"
        )
    if train_set is None:
        raise ValueError(f"training {type(model).__name__} needs a data set: dataset=TensorDataset(inputs..., targets)")
    *xs, _ = train_set.tensors
    example = tuple(x[:2] for x in xs)
    if dtype is not None:
        model = model.to(getattr(torch, dtype))
        example = tuple(x.to(getattr(torch, dtype)) if x.is_floating_point() else x for x in example)
    x = example[0] if len(example) == 1 else example
    try:
        return split(model, x)
    except ValueError:
        if not isinstance(model, nn.Sequential):
            raise
        return from_modules(list(model), x, name="Sequential")  # its children, chained, are the layers


def build_dataset(model_name: str, dataset: str, split: str = "train", **options):
    """The model's training (or test) set; ``options`` go to the loader (e.g. the synthetic set's sizes)."""
    if model_name == "toy-mlp" or dataset == "toy":
        return toy_dataset(split=split, **options)
    return load_dataset(dataset, split, **options)


@dataclass
class Job:
    """Everything a rank needs; picklable (recipes, not objects, for the model and data). The run
    options are the checked groups of the spec (:mod:`workbench.runtime.launch.jobspec`): ``optim`` as asked,
    ``run`` with every ``None`` resolved (out, device, backend, threads, transport)."""

    model_fn: Callable
    dataset_fn: Callable
    schedule: Schedule
    bounds: list
    rounds_total: int
    optim: OptimSpec
    run: RunSpec
    dtype: str | None = None
    shm_token: str = ""  # names the job's shared-memory channel files (transport "shm")
    options: dict = field(default_factory=dict)
    # stream(n) -> the schedule over n microbatches: an epoch's minibatches run as one pipeline, no
    # drain between them (schedules without a flush; launch.prepare(stream=True)); None: drain per minibatch
    stream: Callable | None = None


@dataclass
class RankContext:
    """One rank's view of its job while it runs: who it is, the job's option groups, and the state its
    executors share (clock origin, first round, boundary tensor specs)."""

    rank: int
    world: int
    device: torch.device
    optim: OptimSpec  # the job's (lr, momentum, ...)
    run: RunSpec  # the job's, resolved (timeout_s, backend, transport, lookahead, ...)
    t0: float = 0.0
    start_round: int = 0  # global minibatch index this process starts at (> 0 when resuming)
    shm_token: str = ""
    rounds_per_epoch: int = 0
    specs: list = field(default_factory=list)
    like_tuple: list = field(default_factory=list)

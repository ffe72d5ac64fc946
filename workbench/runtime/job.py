"""What a run is: the picklable :class:`Job` every rank receives, and the model/data recipes in it.

Ranks rebuild the model and the data set from recipes (``functools.partial`` of :func:`build_model`
and :func:`build_dataset`) rather than receiving objects, so every process holds the same
deterministic weights and samples without any transfer.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..schedules.core import Schedule

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


def build_dataset(model_name: str, dataset: str, split: str = "train", **options):
    """The model's training (or test) set; ``options`` go to the loader (e.g. the synthetic set's sizes)."""
    if model_name == "toy-mlp" or dataset == "toy":
        from .toy import toy_dataset
        return toy_dataset(split=split, **options)
    from workbench.models.data import load_dataset
    return load_dataset(dataset, split, **options)


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
    lookahead: int | None = None  # receives posted ahead; None: automatic (see comm.P2P)
    evaluate: bool = True
    momentum: float = 0.0
    options: dict = field(default_factory=dict)


@dataclass
class RankContext:
    rank: int
    world: int
    device: torch.device
    lr: float
    timeout_s: float
    momentum: float = 0.0
    lookahead: int | None = None
    backend: str = "gloo"
    t0: float = 0.0
    start_round: int = 0  # global minibatch index this process starts at (> 0 when resuming)
    specs: list = field(default_factory=list)
    like_tuple: list = field(default_factory=list)



"""The model zoo: ``build(name, size)`` -> :class:`LayerModel`, ``list_models()`` -> DataFrame.

Sizes: ``"paper"`` is the published architecture (for profiling and modeled experiments; build it
with ``device="meta"`` to allocate no memory); ``"mini"`` keeps the family and the layer structure
(same number of layers) but shrinks widths and inputs so that it trains on 2 CPU cores in minutes
on an offline data set from :mod:`workbench.models.data`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import pandas as pd
import torch

from workbench.io.keywords import did_you_mean, shown
from workbench.models import sequence, sleep_stages, vision
from workbench.models.base import LayerModel, TensorSpec

SIZES = ("paper", "mini")


@dataclass(frozen=True)
class Entry:
    builder: Callable[..., tuple[list, list]]
    task: str
    description: str
    paper: dict
    mini: dict
    datasets: dict  # size -> default data set name
    extra: tuple[str, ...] = ()  # config keys that shape the data, not the builder


ZOO: dict[str, Entry] = {
    "vgg16": Entry(
        vision.vgg16,
        "classification",
        "VGG-16 (config D): 13 conv + 3 FC layers; ImageNet 224x224x3, 1000 classes",
        dict(width=64, hidden=4096, image_size=224, in_channels=3, num_classes=1000, dropout=0.5),
        dict(width=8, hidden=64, image_size=8, in_channels=1, num_classes=10, dropout=0.0),
        {"paper": "imagenet", "mini": "digits"},
    ),
    "resnet50": Entry(
        vision.resnet50,
        "classification",
        "ResNet-50: stem + 16 bottleneck blocks + FC; ImageNet 224x224x3, 1000 classes",
        dict(width=64, image_size=224, in_channels=3, num_classes=1000),
        dict(width=8, image_size=8, in_channels=1, num_classes=10, small_input=True, zero_init_residual=True),
        {"paper": "imagenet", "mini": "digits"},
    ),
    "alexnet": Entry(
        vision.alexnet,
        "classification",
        "AlexNet (single tower): 5 conv + 3 FC layers; ImageNet 224x224x3, 1000 classes",
        dict(width=64, hidden=4096, image_size=224, in_channels=3, num_classes=1000, dropout=0.5),
        dict(width=8, hidden=64, image_size=8, in_channels=1, num_classes=10, dropout=0.0, small_input=True),
        {"paper": "imagenet", "mini": "digits"},
    ),
    "mlp": Entry(
        vision.mlp,
        "classification",
        "MLP: depth x (Linear+ReLU) of width units, output projection in the last layer",
        dict(depth=8, width=512, in_features=512, num_classes=10),
        dict(depth=8, width=512, in_features=512, num_classes=10),
        {"paper": "synthetic", "mini": "synthetic"},
    ),
    "timed": Entry(
        sleep_stages.timed,
        "classification",
        "timed stages: depth blocks tanh(x*w+b) whose forward, input gradient and weight gradient each sleep "
        "a set number of ms (the bubble microbenchmark; workbench.models.sleep_stages)",
        dict(depth=4, in_features=10, num_classes=10, fwd_ms=20.0, bwd_input_ms=20.0, bwd_weight_ms=20.0),
        dict(depth=4, in_features=10, num_classes=10, fwd_ms=20.0, bwd_input_ms=20.0, bwd_weight_ms=20.0),
        {"paper": "synthetic", "mini": "synthetic"},
    ),
    "cnn1d": Entry(
        vision.cnn1d,
        "classification",
        "small 1-D CNN: 3 Conv1d+ReLU (stride 2) + linear classifier; MNIST-1D (1 x 40), 10 classes",
        dict(channels=32, length=40, num_classes=10),
        dict(channels=32, length=40, num_classes=10),
        {"paper": "mnist1d", "mini": "mnist1d"},
    ),
    "gnmt": Entry(
        sequence.gnmt,
        "seq2seq",
        "GNMT-16-style LSTM encoder-decoder with attention: 8+8 LSTM layers of 1024, vocab 32k",
        dict(vocab_size=32000, hidden=1024, num_layers=8, seq_len=50),
        dict(vocab_size=32, hidden=64, num_layers=8, seq_len=12),
        {"paper": "wmt16-en-de", "mini": "reverse"},
        extra=("seq_len",),
    ),
    "awd-lstm": Entry(
        sequence.awd_lstm,
        "lm",
        "AWD-LSTM-style LM: embedding 400, 3 LSTM layers (1150 hidden), vocab 33,278",
        dict(vocab_size=33278, emb=400, hidden=1150, num_layers=3, dropout=0.4, seq_len=70),
        dict(vocab_size=128, emb=128, hidden=256, num_layers=3, dropout=0.0, seq_len=64),
        {"paper": "wikitext-2", "mini": "pydocs"},
        extra=("seq_len",),
    ),
    "gpt": Entry(
        sequence.gpt,
        "lm",
        "GPT-2-small-style transformer LM: 12 blocks x 768, 12 heads, context 1024, vocab 50,257",
        dict(vocab_size=50257, context=1024, dim=768, num_layers=12, heads=12, dropout=0.1, seq_len=1024),
        dict(vocab_size=128, context=64, dim=64, num_layers=12, heads=4, dropout=0.0, seq_len=64),
        {"paper": "openwebtext", "mini": "pydocs"},
        extra=("seq_len",),
    ),
}

ALIASES = {
    "awd": "awd-lstm",
    "awd_lstm": "awd-lstm",
    "awdlstm": "awd-lstm",
    "vgg": "vgg16",
    "vgg-16": "vgg16",
    "resnet": "resnet50",
    "resnet-50": "resnet50",
    "gpt2": "gpt",
    "gpt-2": "gpt",
}


def _resolve(name: str) -> str:
    key = str(name).lower().strip()
    key = ALIASES.get(key, key)
    if key not in ZOO:
        raise ValueError(
            f"unknown model {shown(name)}{did_you_mean(key, [*ZOO, *ALIASES])}; choose one of {sorted(ZOO)}, or give "
            "your own as an nn.Module (Python) or package.module:function (command line)"
        )
    return key


def config(name: str, size: str = "mini", **overrides) -> dict:
    """The configuration ``build`` would use: the size's defaults updated by ``overrides``."""
    key = _resolve(name)
    if size not in SIZES:
        raise ValueError(f"unknown size {size!r} for {key}; choose one of {SIZES}")
    entry = ZOO[key]
    cfg = dict(entry.paper if size == "paper" else entry.mini)
    allowed = set(entry.paper) | set(entry.mini) | _builder_args(entry.builder)
    bad = sorted(set(overrides) - allowed)
    if bad:
        raise ValueError(f"{key} has no option(s) {bad}; valid options: {sorted(allowed)}")
    for k, v in overrides.items():
        _check_option(key, k, v, cfg.get(k))
    cfg.update(overrides)
    return cfg


def _check_option(model: str, name: str, value, default) -> None:
    """An override of a number must be a number of the default's kind (an int for an int), at least 1
    where the default is an int of at least 1 (a size or a count), at least 0 where it is >= 0."""
    if default is None or isinstance(default, bool):
        return
    if isinstance(default, int) and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{model} option {name} must be an int (default {default}), got {value!r}")
    if isinstance(default, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError(f"{model} option {name} must be a number (default {default}), got {value!r}")
    if isinstance(default, (int, float)) and default >= 0:
        least = 1 if isinstance(default, int) and default >= 1 else 0  # a size or count of at least one
        if value < least:
            raise ValueError(f"{model} option {name} must be >= {least} (default {default}), got {value!r}")


def _builder_args(fn) -> set[str]:

    return set(inspect.signature(fn).parameters)


def build(name: str, size: str = "mini", seed: int = 0, device=None, **overrides) -> LayerModel:
    """Build model ``name`` at ``size`` ("paper" or "mini"), parameters initialised from ``seed``.

    ``device="meta"`` creates parameters without storage (shapes only, for FLOP and byte
    counts of paper-size models). The global RNG state is left untouched (forked)."""
    key = _resolve(name)
    entry = ZOO[key]
    cfg = config(key, size, **overrides)
    kwargs = {k: v for k, v in cfg.items() if k not in entry.extra}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        with torch.device(device if device is not None else "cpu"):
            try:
                layers, names = entry.builder(**kwargs)
            except (RuntimeError, ValueError, ZeroDivisionError) as e:
                first = (str(e).strip().splitlines() or [type(e).__name__])[0]
                given = ", ".join(f"{k}={v!r}" for k, v in overrides.items()) or "its defaults"
                raise ValueError(f"{key} cannot be built with {given}: {first}") from None
    inputs, target = _specs(key, entry.task, cfg)
    dataset = entry.datasets[size]
    if key == "mlp":
        dataset = {64: "digits", 40: "mnist1d"}.get(int(cfg["in_features"]), "synthetic")
    return LayerModel(
        name=key,
        size=size,
        layers=list(layers),
        names=list(names),
        dataset=dataset,
        task=entry.task,
        inputs=inputs,
        target=target,
        config=cfg,
        description=entry.description,
    )


def _specs(key: str, task: str, cfg: dict) -> tuple[tuple[TensorSpec, ...], TensorSpec]:
    if task == "classification":
        labels = TensorSpec((), torch.int64, cfg["num_classes"])
        if "in_features" in cfg:  # mlp, timed
            return (TensorSpec((int(cfg["in_features"]),)),), labels
        if key == "cnn1d":
            return (TensorSpec((1, int(cfg["length"]))),), labels
        s = int(cfg["image_size"])
        return (TensorSpec((int(cfg["in_channels"]), s, s)),), labels
    tokens = TensorSpec((int(cfg["seq_len"]),), torch.int64, int(cfg["vocab_size"]))
    if task == "lm":
        return (tokens,), tokens
    return (tokens, tokens), tokens  # seq2seq: (src, tgt_in) -> tgt_out


def list_models(sizes: tuple[str, ...] = SIZES) -> pd.DataFrame:
    """One row per (model, size): name, size, layers, params (unique, on the meta device),
    dataset, task, description."""
    rows = []
    for key, entry in ZOO.items():
        for size in sizes:
            m = build(key, size, device="meta")
            rows.append(
                dict(
                    name=key,
                    size=size,
                    layers=len(m),
                    params=m.num_parameters(),
                    dataset=m.dataset,
                    task=m.task,
                    description=entry.description
                    if size == "paper"
                    else f"mini {key}: " + ", ".join(f"{k}={v}" for k, v in m.config.items()),
                )
            )
    return pd.DataFrame(rows, columns=["name", "size", "layers", "params", "dataset", "task", "description"])

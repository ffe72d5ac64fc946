"""Tiny deterministic models and data for runtime tests (float64 so that tolerances can be tight).

``toy_mlp(widths)`` is a :class:`~workbench.models.base.LayerModel` whose layers are
``Linear(widths[0], widths[1]), ReLU, Linear(...), ReLU, ..., Linear(widths[-2], widths[-1])``;
``toy_dataset(n, widths[0], widths[-1])`` labels Gaussian inputs with the argmax of a fixed random
linear map, so the task is learnable. Both are pure functions of their seed.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset

from workbench.models.base import LayerModel, TensorSpec


def toy_mlp(widths=(8, 16, 16, 4), seed: int = 0, dtype: torch.dtype = torch.float64) -> LayerModel:
    """MLP with ``2 * (len(widths) - 1) - 1`` layers (Linear / ReLU alternating)."""
    g = torch.Generator().manual_seed(seed)
    layers: list[nn.Module] = []
    names: list[str] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        lin = nn.Linear(a, b).to(dtype)
        with torch.no_grad():
            lin.weight.copy_(torch.randn(b, a, generator=g, dtype=dtype) / a**0.5)
            lin.bias.copy_(0.1 * torch.randn(b, generator=g, dtype=dtype))
        layers.append(lin)
        names.append(f"fc{i}")
        if i < len(widths) - 2:
            layers.append(nn.ReLU())
            names.append(f"relu{i}")
    return LayerModel(
        name="toy-mlp",
        size="toy",
        layers=layers,
        names=names,
        dataset="toy",
        task="classification",
        inputs=(TensorSpec((widths[0],), dtype),),
        target=TensorSpec((), torch.int64, high=widths[-1]),
    )


def toy_dataset(
    n: int = 256,
    features: int = 8,
    classes: int = 4,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    *,
    split: str = "train",
) -> TensorDataset:
    """``n`` samples (``n // 4`` for ``split="test"``) of the task ``y = argmax(x @ w)``, ``w`` from ``seed``."""
    w = torch.randn(features, classes, generator=torch.Generator().manual_seed(10_000 + seed), dtype=dtype)
    g = torch.Generator().manual_seed(20_000 + seed + (0 if split == "train" else 1))
    x = torch.randn(n if split == "train" else max(1, n // 4), features, generator=g, dtype=dtype)
    return TensorDataset(x, (x @ w).argmax(dim=1))

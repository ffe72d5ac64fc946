"""``timed``: a layer-sequential model whose forward, input gradient and weight gradient each take a
set wall time: the microbenchmark of a schedule's bubble.

The papers state a schedule's bubble for equal stages whose forward takes ``F`` and whose backward
takes ``B = 2F``, which zero-bubble schedules split into the input gradient (``BI = F``) and the
weight gradient (``BW = F``). This model makes those costs real: the stage's work is sleeping, which
takes wall time but no CPU, so ranks that share few cores hardly slow each other down, and the
arithmetic on ``in_features`` numbers per sample is small beside the sleeps.

The model is ``depth`` blocks ``y = tanh(x * w + b)`` (``w``, ``b``: one number per feature), each
block two zoo layers:

* ``scale{k}``: ``h = x * w + b``. The input gradient ``g w`` is a plain product; the weight
  gradient ``dL/dw = sum_n g x``, ``dL/db = sum_n g`` comes from :class:`WeightGrad`, an autograd
  function whose backward sleeps ``bwd_weight_ms`` (its forward adds ``b``; ``x`` enters it
  detached, so it is not on the way from the loss to ``x``);
* ``sleep{k}``: ``y = tanh(h)`` by :class:`TimedTanh`, whose forward sleeps ``fwd_ms`` and whose
  backward ``g (1 - y^2)`` sleeps ``bwd_input_ms``.

The gradients are exact and the model trains (cross-entropy on the ``synthetic`` Gaussian mixture,
``in_features = num_classes``). The runtime (:mod:`workbench.runtime.executors.pipeline`) charges per block:

* ``F`` = ``fwd_ms``; a full backward ``B`` = ``bwd_input_ms + bwd_weight_ms`` (the tanh's backward
  lies on the way to ``w``, ``b``);
* the split backward of a stage ``s > 0`` (``BI`` differentiates the loss to the stage input and to
  the outputs of its layers, ``BW`` each layer's weights from its own output):
  ``BI = bwd_input_ms``, ``BW = bwd_weight_ms``;
* the first stage: its input needs no gradient, so the runtime's ``BI`` there computes nothing and
  its ``BW`` runs the whole backward: ``BI ~ 0``, ``BW = bwd_input_ms + bwd_weight_ms``.

Without a plan the runtime splits the layers into stages of equal layer count
(:func:`workbench.runtime.semantics.stages.even_bounds`), so ``depth`` = the schedule's number of stages
(``2 x workers`` for the interleaved and V schedules) gives every stage one block.
"""

from __future__ import annotations

import math
import time

import torch
from torch import nn


class WeightGrad(torch.autograd.Function):
    """``b`` broadcast over ``x``'s batch; backward: sleeps ``sleep_s``, then ``dL/dw = sum_n g x``,
    ``dL/db = sum_n g`` (``x`` is the detached input of ``x * w``)."""

    @staticmethod
    def forward(ctx, x, w, b, sleep_s: float):
        ctx.save_for_backward(x)
        ctx.sleep_s = sleep_s
        return b.expand_as(x).clone()

    @staticmethod
    def backward(ctx, g):
        time.sleep(ctx.sleep_s)
        (x,) = ctx.saved_tensors
        return None, (g * x).sum(0), g.sum(0), None


class TimedTanh(torch.autograd.Function):
    """``tanh(h)`` after sleeping ``fwd_s``; backward ``g (1 - y^2)`` after sleeping ``bwd_s``."""

    @staticmethod
    def forward(ctx, h, fwd_s: float, bwd_s: float):
        time.sleep(fwd_s)
        y = torch.tanh(h)
        ctx.save_for_backward(y)
        ctx.bwd_s = bwd_s
        return y

    @staticmethod
    def backward(ctx, g):
        time.sleep(ctx.bwd_s)
        (y,) = ctx.saved_tensors
        return g * (1 - y * y), None, None


class Scale(nn.Module):
    """``x * w + b``, the weight gradient through :class:`WeightGrad` (sleeps ``bwd_weight_ms``)."""

    def __init__(self, features: int, bwd_weight_ms: float):
        super().__init__()
        self.weight = nn.Parameter(1 + 0.1 * torch.randn(features))
        self.bias = nn.Parameter(0.1 * torch.randn(features))
        self.sleep_s = bwd_weight_ms / 1e3

    def forward(self, x):
        return x * self.weight.detach() + WeightGrad.apply(x.detach(), self.weight, self.bias, self.sleep_s)


class Sleep(nn.Module):
    """``tanh(h)`` through :class:`TimedTanh` (sleeps ``fwd_ms`` forward, ``bwd_input_ms`` backward)."""

    def __init__(self, fwd_ms: float, bwd_input_ms: float):
        super().__init__()
        self.fwd_s, self.bwd_s = fwd_ms / 1e3, bwd_input_ms / 1e3

    def forward(self, h):
        return TimedTanh.apply(h, self.fwd_s, self.bwd_s)


def timed(
    depth: int = 4,
    in_features: int = 10,
    num_classes: int = 10,
    fwd_ms: float = 20.0,
    bwd_input_ms: float = 20.0,
    *,
    bwd_weight_ms: float = 20.0,
):
    """``depth`` timed blocks as ``2 * depth`` layers ``scale0, sleep0, scale1, ...`` (module docstring)."""
    if depth < 1:
        raise ValueError(f"timed depth must be >= 1, got {depth}")
    if in_features != num_classes or in_features < 2:
        raise ValueError(
            f"timed keeps its width: in_features must equal num_classes (>= 2), got {in_features} and {num_classes}"
        )
    for name, ms in (("fwd_ms", fwd_ms), ("bwd_input_ms", bwd_input_ms), ("bwd_weight_ms", bwd_weight_ms)):
        if not (math.isfinite(ms) and ms >= 0):
            raise ValueError(f"timed {name} must be a number of ms >= 0, got {ms!r}")
    layers: list[nn.Module] = []
    names: list[str] = []
    for k in range(depth):
        layers += [Scale(in_features, bwd_weight_ms), Sleep(fwd_ms, bwd_input_ms)]
        names += [f"scale{k}", f"sleep{k}"]
    return layers, names

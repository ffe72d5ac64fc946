"""`LayerModel`: a model as an ordered list of layers, the unit PipeDream partitions.

A layer-sequential model computes ``y = f_{L-1}(... f_1(f_0(x)))``: layer ``i+1`` takes exactly
layer ``i``'s output as its one argument. Outputs may be a tensor or a tuple of tensors, so that
tensors needed later (a decoder's input tokens, an encoder's states) cross stage boundaries as
plain tensors. A stage ``first..last`` of a pipeline is ``layers[first:last+1]`` run in order.

Batches from :mod:`workbench.models.data` are ``(input_1, ..., input_k, target)``; the model input
is ``input_1`` when ``k == 1`` and the tuple ``(input_1, ..., input_k)`` otherwise
(:meth:`LayerModel.split_batch`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

TASKS = ("classification", "lm", "seq2seq")


@dataclass(frozen=True)
class TensorSpec:
    """Shape (without the batch dimension) and dtype of one input or target tensor.

    Integer tensors (token ids, class labels) are drawn uniformly from ``[0, high)``."""

    shape: tuple[int, ...]
    dtype: torch.dtype = torch.float32
    high: int | None = None

    def sample(self, batch_size: int, generator: torch.Generator | None, device) -> torch.Tensor:
        shape = (batch_size, *self.shape)
        if torch.device(device).type == "meta":
            return torch.empty(shape, dtype=self.dtype, device="meta")
        if self.dtype.is_floating_point:
            return torch.randn(shape, generator=generator, dtype=self.dtype).to(device)
        if self.high is None:
            raise ValueError(f"an integer TensorSpec needs high= (values are drawn from [0, high)), got {self!r}")
        return torch.randint(0, int(self.high), shape, generator=generator, dtype=self.dtype).to(device)


@dataclass
class LayerModel:
    """A layer-sequential model (see the module docstring) plus what training it needs.

    ``loss`` is the mean cross-entropy over the batch (over all tokens for ``lm``/``seq2seq``):
    ``L = -1/N sum_n log softmax(z_n)[y_n]``. ``correct`` counts argmax hits (samples or tokens).
    """

    name: str
    size: str
    layers: list[nn.Module]
    names: list[str]
    dataset: str
    task: str
    inputs: tuple[TensorSpec, ...]
    target: TensorSpec
    config: dict = field(default_factory=dict)
    description: str = ""

    def __post_init__(self):
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if len(self.names) != len(self.layers):
            raise ValueError(f"{len(self.names)} layer names for {len(self.layers)} layers")

    # ---- structure ----------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.layers)

    def layer_names(self) -> list[str]:
        return list(self.names)

    def sequential(self) -> nn.Sequential:
        """All layers in order as one module (shares the layer modules, no copy)."""
        return nn.Sequential(*self.layers)

    def parameters(self):
        """Unique parameters of all layers (a tied weight is yielded once)."""
        return self.sequential().parameters()

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    @property
    def device(self) -> torch.device:
        for p in self.parameters():
            return p.device
        return torch.device("cpu")

    def to(self, device) -> LayerModel:
        for layer in self.layers:
            layer.to(device)
        return self

    def train(self, mode: bool = True) -> LayerModel:
        for layer in self.layers:
            layer.train(mode)
        return self

    def eval(self) -> LayerModel:
        return self.train(False)

    # ---- data ---------------------------------------------------------------------------
    def example_input(self, batch_size: int, generator: torch.Generator | None = None):
        """Synthetic input of the right shape and dtype (a tensor, or a tuple for seq2seq)."""
        xs = tuple(s.sample(batch_size, generator, self.device) for s in self.inputs)
        return xs[0] if len(xs) == 1 else xs

    def example_target(self, batch_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
        return self.target.sample(batch_size, generator, self.device)

    @staticmethod
    def split_batch(batch):
        """``(x_1, ..., x_k, y)`` from a DataLoader -> ``(input, y)`` (input a tuple when k > 1)."""
        *xs, y = batch
        return (xs[0] if len(xs) == 1 else tuple(xs)), y

    # ---- objective ----------------------------------------------------------------------
    def loss(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        if self.task == "classification":
            return F.cross_entropy(output, target)
        return F.cross_entropy(output.reshape(-1, output.shape[-1]), target.reshape(-1))

    def correct(self, output: torch.Tensor, target: torch.Tensor) -> int:
        """Argmax hits over the class axis the loss reads: axis 1 for ``classification`` (``N x C x
        ...``, as ``F.cross_entropy`` takes it: per-position outputs score every position), the last
        axis for ``lm``/``seq2seq``. Class-probability targets (the output's shape) score by their
        own argmax. An output the targets do not fit is one ValueError naming both shapes."""
        axis = 1 if self.task == "classification" and output.dim() > 1 else -1
        if target.is_floating_point() and target.shape == output.shape:
            target = target.argmax(dim=axis)
        predicted = output.argmax(dim=axis)
        if predicted.shape != target.shape and predicted.numel() != target.numel():
            raise ValueError(
                f"the accuracy metric cannot score model {self.name!r}: its output has shape {tuple(output.shape)} "
                f"(class axis {axis}) and the targets {tuple(target.shape)}; targets must be the output's shape "
                "without its class axis"
            )
        return int((predicted.reshape(-1) == target.reshape(-1)).sum().item())

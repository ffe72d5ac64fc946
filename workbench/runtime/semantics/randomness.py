"""Random operations inside a layer, drawn the same on every rank and in the single-process reference.

A dropout mask drawn from the process's global generator depends on everything that process drew
before: which stages it holds, in which order its schedule runs the microbatches, whether a forward
is re-materialized. Two runs of one model then differ by the masks alone. Here every random
operation of layer ``l`` (its index in the whole model) in the forward of global microbatch ``g``
(``g = R * M + b``: microbatch ``b`` of minibatch ``R``) of a run with seed ``σ`` draws from the
generator seeded with

    seed(σ, g, l) = splitmix64(σ, g, l),

whatever rank, stage boundary, schedule or executor evaluates it, and however often (a re-run
forward, a re-materialization replays the same mask). The process's own generator is saved before
the layer and restored after it, so code outside the layers draws as it would without this.

How: :func:`number_layers` puts a forward pre-hook and a forward hook on every layer of a model,
which seed and restore the generators of the layer's device while a microbatch is *current*
(:func:`microbatch_rng`, set by the executors around each op and by the reference around each
microbatch); with none current a layer runs as before. Randomness the hooks cannot reach (a
generator of the layer's own, NumPy, Python's ``random``, randomness in the loss) is not seeded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from contextvars import ContextVar

import torch
from torch import nn

_MASK64 = (1 << 64) - 1
#: (run seed, global microbatch) of the op being computed, or None outside one
_CURRENT: ContextVar[tuple[int, int] | None] = ContextVar("workbench_microbatch_rng", default=None)


def splitmix64(*values: int) -> int:
    """A 63-bit seed mixed from ``values`` (SplitMix64's finalizer over each in turn; Steele et al.,
    OOPSLA 2014): nearby inputs give unrelated seeds, and the result is a valid ``manual_seed``."""
    z = 0x9E3779B97F4A7C15
    for v in values:
        z = (z + (int(v) & _MASK64) + 0x9E3779B97F4A7C15) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        z ^= z >> 31
    return z >> 1


@contextlib.contextmanager
def microbatch_rng(seed: int, microbatch: int) -> Iterator[None]:
    """While inside, the layers' random operations draw from ``seed(seed, microbatch, layer)``."""
    token = _CURRENT.set((int(seed), int(microbatch)))
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current() -> tuple[int, int] | None:
    """The (run seed, global microbatch) whose forward is being computed, or None."""
    return _CURRENT.get()


def _generators(args) -> list[torch.Generator]:
    """The CPU generator, and the CUDA generator of the first CUDA tensor among ``args``."""
    gens = [torch.random.default_generator]
    for a in args if isinstance(args, (tuple, list)) else (args,):
        for t in a if isinstance(a, (tuple, list)) else (a,):
            if torch.is_tensor(t) and t.is_cuda:
                gens.append(torch.cuda.default_generators[t.device.index or 0])
                return gens
    return gens


class _LayerSeed:
    """The pre-hook and the hook of layer ``index``: seed its device's generators, then restore them."""

    def __init__(self, index: int):
        self.index = index
        self.saved: list[list[tuple[torch.Generator, torch.Tensor]]] = []  # a stack: a layer inside a layer

    def before(self, module: nn.Module, args) -> None:
        key = _CURRENT.get()
        if key is None:
            self.saved.append([])
            return
        gens = _generators(args)
        self.saved.append([(g, g.get_state()) for g in gens])
        seed = splitmix64(key[0], key[1], self.index)
        for g in gens:
            g.manual_seed(seed)

    def after(self, module: nn.Module, args, output) -> None:
        for g, state in self.saved.pop():
            g.set_state(state)


def number_layers(layers: Sequence[nn.Module], first: int = 0) -> None:
    """Give ``layers[j]``, layer ``first + j`` of a model, the seeding hooks of that index (once per
    layer object: a layer keeps the index it was first given)."""
    for i, layer in enumerate(layers, start=first):
        if "_wb_layer_seed" in layer.__dict__:
            continue
        hooks = _LayerSeed(i)
        layer.__dict__["_wb_layer_seed"] = hooks
        layer.register_forward_pre_hook(hooks.before)
        layer.register_forward_hook(hooks.after, always_call=True)


def unseeded_random_layers(layers: Sequence[nn.Module]) -> list[str]:
    """Layers whose randomness the hooks cannot seed: those holding a ``torch.Generator`` of their
    own, whose draws ignore the seeded default generators."""
    out = []
    for i, layer in enumerate(layers):
        for name, m in layer.named_modules():
            if any(isinstance(v, torch.Generator) for v in vars(m).values()):
                out.append(
                    f"layer {i} ({type(layer).__name__}{'.' + name if name else ''}) has its own torch.Generator"
                )
    return out

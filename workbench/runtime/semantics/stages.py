"""Stages as pure functions of their weights, and the deterministic microbatch data every rank derives.

A stage ``s`` covers layers ``first..last`` of a layer-sequential model; as a function of its input
``x`` and its parameters ``W_s`` it is ``f_s(x; W_s) = layer_last(... layer_first(x))``. The runtime
and the semantic reference both evaluate it with :func:`torch.func.functional_call`, so that one
module structure can be run with any stored weight version ``W_s^(v)``.

Data: epoch ``e`` visits the training set in the order ``perm_e = randperm(n, seed, e)``; minibatch
``r`` of the epoch is ``perm_e[r*B : (r+1)*B]`` and its microbatch ``b`` the ``b``-th of ``M`` equal
slices. Every rank computes the same slices from ``(seed, e, r, b)``, so no data travels.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.func import functional_call

from workbench.cost.plan import Plan
from workbench.runtime.semantics.randomness import number_layers

Bounds = list[tuple[int, int]]


def even_bounds(num_layers: int, num_stages: int) -> Bounds:
    """The default split without a plan, :meth:`workbench.cost.plan.Plan.even` (the simulator's too):
    contiguous stages of near-equal layer count."""

    return plan_bounds(Plan.even(num_layers, num_stages))


def plan_bounds(plan) -> Bounds:
    return [(st.first, st.last) for st in plan.stages]


def stage_module(layers: list[nn.Module], first: int, last: int) -> nn.Sequential:
    """The layers of one stage as a module (shares the layer objects), each numbered by its index in
    the model so that its random draws are the same in any stage (:mod:`~workbench.runtime.semantics.randomness`)."""
    number_layers(layers[first : last + 1], first)
    return nn.Sequential(*layers[first : last + 1])


def stage_params(module: nn.Module) -> dict[str, torch.Tensor]:
    """Detached copies of a stage's parameters, keyed by name (tied weights appear once)."""
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def _slots(module: nn.Module) -> list[tuple[nn.Module, str, str]]:
    """(owning submodule, attribute, canonical parameter name) of every parameter slot; a tied
    weight has several slots and one name (its first). Cached on the module."""
    slots = module.__dict__.get("_wb_slots")
    if slots is None:
        if any(hasattr(m, "parametrizations") for m in module.modules()):
            slots = []  # parametrized modules: use functional_call
            module.__dict__["_wb_slots"] = slots
            return slots
        canon: dict[int, str] = {}
        slots = []
        for name, p in module.named_parameters(remove_duplicate=False):
            path, _, attr = name.rpartition(".")
            slots.append((module.get_submodule(path) if path else module, attr, canon.setdefault(id(p), name)))
        module.__dict__["_wb_slots"] = slots
    return slots


def run_stage(module: nn.Module, params: dict[str, torch.Tensor], x):
    """``f_s(x; W)``: the stage evaluated with the given parameter tensors (autograd sees them).

    Same result as :func:`torch.func.functional_call` (which the reference falls back to for
    modules with parametrizations); binding the tensors into the parameter slots directly and
    restoring them afterwards costs microseconds instead of ~0.1 ms per call."""
    slots = _slots(module)
    if not slots:
        return functional_call(module, params, (x,))
    saved = [m._parameters[a] for m, a, _ in slots]
    try:
        _bind(slots, [params[n] for _, _, n in slots])
        return module(x)
    finally:
        _bind(slots, saved)


def _bind(slots: list[tuple[nn.Module, str, str]], tensors: list) -> None:
    """Put ``tensors`` into the parameter slots (plain tensors, not Parameters: autograd sees them)."""
    for (m, a, _), t in zip(slots, tensors):
        m._parameters[a] = t


def as_tuple(x) -> tuple:
    return x if isinstance(x, tuple) else (x,)


def from_tuple(t: tuple, like_tuple: bool):
    return t if like_tuple else t[0]


@dataclass(frozen=True)
class DataOrder:
    """Which samples form microbatch ``b`` of minibatch ``r`` of epoch ``e`` (see module docstring)."""

    num_samples: int
    batch_size: int
    microbatches: int
    seed: int

    def __post_init__(self):
        if self.batch_size % self.microbatches:
            raise ValueError(
                f"batch size {self.batch_size} is not divisible by {self.microbatches} microbatches; "
                "pick a batch size that is a multiple of --microbatches"
            )
        if self.batch_size > self.num_samples:
            raise ValueError(f"batch size {self.batch_size} exceeds the {self.num_samples} training samples")

    @property
    def rounds_per_epoch(self) -> int:
        return self.num_samples // self.batch_size

    @property
    def microbatch_size(self) -> int:
        return self.batch_size // self.microbatches

    def permutation(self, epoch: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(int(self.seed) * 1_000_003 + int(epoch))
        return torch.randperm(self.num_samples, generator=g)

    def indices(self, perm: torch.Tensor, r: int, b: int) -> torch.Tensor:
        start = r * self.batch_size + b * self.microbatch_size
        return perm[start : start + self.microbatch_size]


def microbatch(dataset, idx: torch.Tensor, device="cpu", dtype: torch.dtype | None = None, inputs: bool = True):
    """``(input, target)`` of the samples ``idx``; floating inputs cast to ``dtype`` if given.
    ``inputs=False``: ``(None, target)``, for a rank that holds the last stage but not the first
    (it reads only the targets: no gather of inputs it would not use)."""
    if not inputs:
        return None, dataset.tensors[-1][idx].to(device)
    *xs, y = [t[idx] for t in dataset.tensors]
    if dtype is not None:
        xs = [x.to(dtype) if x.is_floating_point() else x for x in xs]
    xs = [x.to(device) for x in xs]
    return (xs[0] if len(xs) == 1 else tuple(xs)), y.to(device)


def stage_lrs(stage_workers: Sequence[Sequence[int]], lr: float, rule: str = "same") -> list[float]:
    """Each stage's learning rate, stage ``s`` held by the workers ``stage_workers[s]`` (``R_s`` of
    them, whose gradients its update averages): ``same``, ``lr`` on every stage; ``replicas``,
    ``lr * R_s / R_0``, as PipeDream's runtime sets it (``get_adjusted_learning_rate`` of
    msr-fiddle/pipedream), so that every stage takes the same step per sample it trains on. A
    pipeline without replicated stages, and data parallelism (one stage), are the same under both."""
    if rule == "same":
        return [float(lr)] * len(stage_workers)
    if rule == "replicas":
        first = len(stage_workers[0])
        return [float(lr) * len(w) / first for w in stage_workers]
    raise ValueError(f"stage_lr must be 'same' or 'replicas', got {rule!r}")


def sgd_update(weights: dict, direction: dict, lr: float, in_place: bool) -> dict:
    """``W - lr · d`` for every tensor of ``weights`` (the runtime's STEP, and what
    :func:`workbench.runtime.calibration.machine.stage_profile` times). ``in_place``: overwrite ``weights`` and return
    it (no other op reads the old version); else new tensors that require grad (the old version
    stays for the stashed microbatches that still read it)."""
    with torch.no_grad():
        if in_place:
            for n, w in weights.items():
                w.add_(direction[n], alpha=-lr)
            return weights
        return {n: torch.add(w, direction[n], alpha=-lr).requires_grad_(True) for n, w in weights.items()}


def sgd_step(weights: dict, grad: dict, momentum: dict, lr: float, mu: float, *, n: int, in_place: bool) -> dict:
    """One STEP from ``grad[name]``, the sum of ``n`` microbatches' gradients (a missing name: no
    contribution, zero): ``W - lr · d`` with ``d = grad / n``, or with ``mu > 0`` the heavy-ball
    direction ``d = mu · d_prev + grad / n`` kept in ``momentum`` (updated in place). ``in_place``:
    see :func:`sgd_update`."""
    with torch.no_grad():
        for nm, w in weights.items():
            if grad.get(nm) is None:  # parameters no contribution reached: a zero buffer
                grad[nm] = torch.zeros_like(w)
        if mu:
            for nm in weights:
                momentum[nm].mul_(mu).add_(grad[nm], alpha=1.0 / n)
            return sgd_update(weights, momentum, lr, in_place)
        # W - (lr / n) · buffer: one pass over the weights, no division pass over the buffer
        return sgd_update(weights, grad, lr / n, in_place)


def nbytes(ts) -> int:
    """Bytes held by the tensors of a sequence (non-tensors count 0)."""
    return sum(t.numel() * t.element_size() for t in ts if torch.is_tensor(t))


def spec_bytes(specs) -> int:
    """Bytes of a message of tensors ``[(shape, dtype)]`` (a receive plan's specs)."""
    return sum(math.prod(shape) * torch.empty((), dtype=dt).element_size() for shape, dt in specs)


def float_indices(t: tuple) -> list[int]:
    """Positions of the floating tensors of a boundary tuple: the ones that carry gradients."""
    return [i for i, v in enumerate(t) if torch.is_tensor(v) and v.is_floating_point()]


def as_leaves(x, requires_grad: bool) -> tuple:
    """Detached copies-by-reference of a stage input; floating ones become autograd leaves."""
    out = []
    for v in as_tuple(x):
        v = v.detach()
        if requires_grad and v.is_floating_point():
            v.requires_grad_(True)
        out.append(v)
    return tuple(out)


def vjp(
    module: nn.Module,
    params: dict[str, torch.Tensor],
    x_leaves: tuple,
    like_tuple: bool,
    y=None,
    *,
    loss_fn=None,
    target=None,
    cot=None,
    want_input: bool = True,
    want_weights: bool = True,
    retain_graph: bool = False,
    loss=None,
    into: dict[str, torch.Tensor] | None = None,
):
    """Vector-Jacobian product of stage ``f_s(x; W)`` at ``(x, W = params)``.

    Returns ``(dL/dx for the floating inputs, dL/dW per parameter, y)``. For the last stage
    ``L = loss_fn(y, target)`` (or the given ``loss``, already computed from this ``y``); otherwise
    ``L = <y, cot>`` with ``cot`` the gradient sent by the next stage (one tensor per floating output).
    ``y`` is an already computed output whose graph reaches ``params`` and ``x_leaves`` (reused, as a
    stashed forward); when None it is recomputed. Missing gradients (an input that does not influence
    the output) are zeros.

    ``into``: update buffers ``D[n]`` (one per parameter name, same shapes). When given, the weight
    gradients are not returned (``dL/dW`` is ``{}``) but added in place, ``D[n] += dL/dW_n``, by the
    autograd engine itself as each one is produced (the parameters' ``.grad`` point at the buffers
    during the pass): the same sum as ``D[n].add_(dL/dW_n)`` afterwards, without a second sweep over
    gradients that have already left the cache. A missing (or None) ``D[n]`` is an empty buffer:
    ``into[n]`` becomes the gradient tensor itself (``0 + g = g``, nothing to zero or copy); a
    parameter the output does not depend on leaves its buffer as it was.
    """
    if y is None:
        with torch.enable_grad():
            y = run_stage(module, params, from_tuple(x_leaves, like_tuple))
        loss = None  # a given loss belongs to another evaluation of the stage
    if loss_fn is not None and loss is None:
        loss = loss_fn(y, target)
    outs, grads = stage_roots(y, loss=loss, cot=cot)
    xin = [x_leaves[i] for i in float_indices(x_leaves)] if want_input else []
    xin = [v for v in xin if v.requires_grad]
    names = list(params) if want_weights else []
    if into is not None:
        return _vjp_into(outs, grads, xin, params, names, into=into, retain_graph=retain_graph), {}, y
    targets = xin + [params[n] for n in names]
    raw: Sequence[torch.Tensor | None] = (
        torch.autograd.grad(outs, targets, grads, allow_unused=True, retain_graph=retain_graph)
        if targets and outs
        else [None] * len(targets)
    )
    res = [torch.zeros_like(t) if r is None else r for t, r in zip(targets, raw)]
    dx = res[: len(xin)]
    dw = dict(zip(names, res[len(xin) :]))
    return dx, dw, y


def _vjp_into(outs, grads, xin: list, params: dict, names: list, *, into: dict, retain_graph: bool) -> list:
    """``dL/dx`` for ``xin``; ``into[n] += dL/dW_n`` in place (see :func:`vjp`)."""
    if not outs or not (xin or names):
        return [torch.zeros_like(x) for x in xin]
    weights = [params[n] for n in names]
    bufs = [into.get(n) for n in names]
    saved = [w.grad for w in weights] + [x.grad for x in xin]
    for w, d in zip(weights, bufs):
        w.grad = d  # the engine accumulates into an existing .grad in place (no_grad backward)
    for x in xin:
        x.grad = None
    try:
        torch.autograd.backward(outs, grads, retain_graph=retain_graph, inputs=xin + weights)
        for n, w, d in zip(names, weights, bufs):
            if d is None:
                if w.grad is not None:
                    into[n] = w.grad  # the first contribution: the gradient becomes the buffer
            elif w.grad is not d:  # the engine replaced the buffer (not expected): keep the sum in it
                d.copy_(w.grad)
        dx = [torch.zeros_like(x) if x.grad is None else x.grad for x in xin]
    finally:
        for t, g in zip(weights + xin, saved):
            t.grad = g
    return dx


def run_stage_layers(module: nn.Module, params: dict[str, torch.Tensor], x):
    """``f_s(x; W)`` as :func:`run_stage`, evaluated layer by layer, keeping each layer's output:
    ``(y, layers)`` with ``layers[j] = (outputs of layer j as a tuple, names of its parameters)``, or
    ``(y, None)`` when the stage cannot be split so (not an ``nn.Sequential``, parametrized, or a
    parameter tied across two of its layers, whose weight gradient a layer-wise pass would count
    twice). What :func:`split_input_grad` and :func:`split_weight_grad` differentiate."""
    names = _layer_names(module)
    if names is None:
        return run_stage(module, params, x), None
    assert isinstance(module, nn.Sequential)  # _layer_names splits Sequentials only
    slots = _slots(module)
    saved = [m._parameters[a] for m, a, _ in slots]
    layers = []
    try:
        _bind(slots, [params[n] for _, _, n in slots])
        for j, layer in enumerate(module):
            x = layer(x)
            layers.append((as_tuple(x), names[j]))
    finally:
        _bind(slots, saved)
    return x, layers


def _layer_names(module: nn.Module) -> list[list[str]] | None:
    """The parameter names of each layer of a stage, or None when :func:`run_stage_layers` cannot
    split it (its docstring). Cached on the module."""
    if "_wb_layer_names" not in module.__dict__:
        slots = _slots(module)
        names: list[list[str]] | None = None
        if slots and isinstance(module, nn.Sequential):
            layer_of: dict[int, int] = {}
            tied = False  # a module or a parameter in two layers
            for j, layer in enumerate(module):
                for m in layer.modules():
                    tied |= layer_of.setdefault(id(m), j) != j
            owner: dict[str, int] = {}
            for m, _, n in slots:
                j = layer_of.get(id(m), -1)
                tied |= j < 0 or owner.setdefault(n, j) != j
            if not tied:
                names = [[] for _ in module]
                for n, j in owner.items():
                    names[j].append(n)
        module.__dict__["_wb_layer_names"] = names
    return module.__dict__["_wb_layer_names"]


def _grad_tensors(t: tuple) -> list[int]:
    return [i for i in float_indices(t) if t[i].requires_grad]


def split_input_grad(layers: list, x_leaves: tuple, roots: list, grads, want_input: bool = True):
    """The input half of a split backward (zero bubble's ``BI``) of a stage run by
    :func:`run_stage_layers`: ``(dL/dx, cotangents)``, where ``cotangents[j]`` holds ``dL/dh`` for
    every output ``h`` of layer ``j`` below the last (``None``: it does not reach the loss). Only
    the activation-gradient chain is computed; the graph is kept for :func:`split_weight_grad`.
    ``roots``/``grads``: the loss, or the stage outputs with the next stage's gradient."""
    xin = [x_leaves[i] for i in float_indices(x_leaves) if x_leaves[i].requires_grad] if want_input else []
    inner = [[h[i] for i in _grad_tensors(h)] for h, _ in layers[:-1]]
    targets = xin + [t for ts in inner for t in ts]
    res = list(torch.autograd.grad(roots, targets, grads, retain_graph=True, allow_unused=True)) if targets else []
    dx = [torch.zeros_like(x) if g is None else g for x, g in zip(xin, res)]
    cots, k = [], len(xin)
    for ts in inner:
        cots.append(res[k : k + len(ts)])
        k += len(ts)
    return dx, cots


def split_weight_grad(layers: list, cotangents: list, roots: list, grads, params: dict, *, into: dict) -> None:
    """The weight half (zero bubble's ``BW``): for every layer ``j`` with parameters,
    ``into[n] += d<h_j, dL/dh_j>/dW_n`` from the layer's own outputs and the cotangents
    :func:`split_input_grad` kept (the last layer's: ``roots``/``grads``), so the activation
    gradients between layers are not computed again (a stage-wide pass would redo the whole input
    chain); inside a layer of several ops (a transformer block) the path from its outputs to its
    weights is differentiated a second time."""
    for j, (outs, names) in enumerate(layers):
        if not names:
            continue
        if j == len(layers) - 1:
            r, g = roots, grads
        else:
            pairs = [(outs[i], c) for i, c in zip(_grad_tensors(outs), cotangents[j]) if c is not None]
            r, g = [p[0] for p in pairs], [p[1] for p in pairs]
        if r:
            _vjp_into(r, g, [], params, names, into=into, retain_graph=True)


def stage_roots(y, loss=None, cot=None) -> tuple[list, list | None]:
    """The roots of a stage's backward: ``[loss]``, or its floating outputs that carry a gradient
    with the next stage's cotangents (as :func:`vjp` builds them)."""
    if loss is not None:
        return [loss], None
    yt = as_tuple(y)
    pairs = [(yt[i], c) for i, c in zip(float_indices(yt), cot) if yt[i].requires_grad]
    return [p[0] for p in pairs], [p[1] for p in pairs]


class MomentumState:
    """Checkpointing of per-stage momentum buffers ``self.momentum[s][name]`` (a mixin for the
    executors that keep their own SGD momentum)."""

    momentum: list

    def optimizer_state(self):
        return {s: {n: b.clone() for n, b in m.items()} for s, m in enumerate(self.momentum)}

    def load_optimizer_state(self, state):
        for s, bufs in state.items():
            for n, b in bufs.items():
                self.momentum[s][n].copy_(b)

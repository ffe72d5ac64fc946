"""The ``timed`` zoo model (workbench.models.sleep_stages): each op of the runtime's stage functions takes
its set wall time (F = fwd_ms, BI = bwd_input_ms, BW = bwd_weight_ms, B = both), its gradients are
exact, and it trains."""

from __future__ import annotations

import time

import pytest
import torch

from workbench.models import build
from workbench.runtime.semantics.stages import (
    run_stage,
    run_stage_layers,
    split_input_grad,
    split_weight_grad,
    stage_module,
    stage_roots,
    vjp,
)

T_MS = 40.0  # long enough that a doubled op (60 ms bound) stands out from the sleep's overshoot


def _fastest(fn, repeats: int = 3) -> float:
    """The least wall ms of ``repeats`` calls of ``fn()`` (wall time: the least is the least disturbed)."""
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, (time.perf_counter() - t) * 1e3)
    return best


def _stage(first: bool, t=T_MS, depth=2):
    """Stage 0 (``first``) or 1 of a two-block timed model as the runtime holds it: its module, its
    parameters as autograd leaves, and a microbatch input (a leaf needing a gradient unless first)."""
    m = build("timed", depth=depth, fwd_ms=t, bwd_input_ms=t, bwd_weight_ms=t)
    s = 0 if first else 1
    module = stage_module(m.layers, 2 * s, 2 * s + 1)
    params = {n: p.detach().clone().requires_grad_(True) for n, p in module.named_parameters()}
    x = torch.randn(8, m.config["in_features"], generator=torch.Generator().manual_seed(1))
    return module, params, (x.requires_grad_(not first),)


def _within(ms: float, want: float) -> bool:
    return want <= ms < want + max(20.0, 0.5 * want)


@pytest.mark.slow
def test_forward_and_split_backward_take_their_set_times():
    """Stage s > 0, as the runtime's zero-bubble executor runs it: F (layer by layer) ~ t,
    BI (the activation-gradient chain) ~ t, BW (each layer's weights from its own output) ~ t."""
    module, params, x = _stage(first=False)
    assert _within(_fastest(lambda: run_stage_layers(module, params, x[0])), T_MS)

    def split():
        y, layers = run_stage_layers(module, params, x[0])
        roots, grads = stage_roots(y, cot=[torch.ones_like(y)])
        t0 = time.perf_counter()
        dx, cots = split_input_grad(layers, x, roots, grads)
        t1 = time.perf_counter()
        into: dict = {}
        split_weight_grad(layers, cots, roots, grads, params, into=into)
        t2 = time.perf_counter()
        assert set(into) == set(params) and dx[0].shape == x[0].shape
        return (t1 - t0) * 1e3, (t2 - t1) * 1e3

    bi, bw = (min(v) for v in zip(*(split() for _ in range(3))))
    assert _within(bi, T_MS), bi
    assert _within(bw, T_MS), bw


@pytest.mark.slow
def test_full_backward_takes_both_halves_and_the_first_stage_has_no_input_half():
    """B (one pass to the input and the weights) ~ 2t on every stage; on the first stage, whose input
    needs no gradient, the runtime's BI computes nothing and its weight pass is the whole 2t."""

    def backward_ms(first: bool, want_input=True, want_weights=True) -> float:
        module, params, x = _stage(first)

        def once() -> float:
            y = run_stage(module, params, x[0])  # the forward's graph; the backward alone is timed
            t = time.perf_counter()
            vjp(module, params, x, False, y, cot=[torch.ones_like(y)], want_input=want_input,
                want_weights=want_weights, into={} if want_weights else None)  # fmt: skip
            return (time.perf_counter() - t) * 1e3

        return min(once() for _ in range(3))

    assert _within(backward_ms(first=False), 2 * T_MS)
    assert _within(backward_ms(first=True), 2 * T_MS)
    # first stage: BI (input gradient only) has no target, BW (weights only) runs both sleeps
    assert backward_ms(first=True, want_weights=False) < 5.0
    assert _within(backward_ms(first=True, want_input=False), 2 * T_MS)
    # a later stage: the input half alone is t (the weights' sleep is not on the way to x)
    assert _within(backward_ms(first=False, want_weights=False), T_MS)


@pytest.mark.slow
def test_gradients_are_exact_and_the_model_trains():
    """The blocks compute tanh(x * w + b) with autograd's own gradients of that function; SGD on the
    cross-entropy lowers it (sleeps set to 0)."""
    m = build("timed", depth=3, fwd_ms=0.0, bwd_input_ms=0.0, bwd_weight_ms=0.0, seed=2)
    g = torch.Generator().manual_seed(3)
    x, y = m.example_input(16, g).requires_grad_(True), m.example_target(16, g)
    loss = m.loss(m.sequential()(x), y)
    got = torch.autograd.grad(loss, [x, *m.parameters()])
    plain = [p.detach().clone().requires_grad_(True) for p in m.parameters()]
    xp = x.detach().clone().requires_grad_(True)
    h = xp
    for w, b in zip(plain[0::2], plain[1::2]):
        h = torch.tanh(h * w + b)
    want = torch.autograd.grad(m.loss(h, y), [xp, *plain])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    first = None
    for _ in range(30):
        opt.zero_grad()
        out = m.loss(m.sequential()(x.detach()), y)
        first = float(out.detach()) if first is None else first
        out.backward()
        opt.step()
    assert float(out.detach()) < first - 0.05


def test_bad_options_fail_with_one_line():
    with pytest.raises(ValueError, match="in_features must equal num_classes"):
        build("timed", in_features=8, num_classes=10)
    with pytest.raises(ValueError, match="depth must be >= 1"):
        build("timed", depth=0)
    with pytest.raises(ValueError, match="fwd_ms must be .*>= 0"):
        build("timed", fwd_ms=-1.0)

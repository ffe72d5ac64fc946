"""The runtime benchmark's single-process loops do the optimizer work their rows claim: one SGD
update per minibatch over the mean of the microbatches' gradients (``single``), or an update after
every microbatch (``single-update-per-microbatch``, PipeDream's weight rule)."""

import importlib.util
from pathlib import Path

import pytest
import torch

PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_runtime.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_runtime_under_test", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    threads = torch.get_num_threads()  # the loops set one thread, as the benchmark's processes run
    yield mod
    torch.set_num_threads(threads)


def _weights(loop):
    return [p.detach().clone() for p in loop.params]


def _grads(loop, x, y):
    for p in loop.params:
        p.grad = None
    loop.model.loss(loop.net(x), y).backward()
    return [p.grad.clone() for p in loop.params]


def _expected(loop, w0, xs, ys, rule: str, M: int, lr: float) -> list:
    """Hand-written reference of one minibatch from weights ``w0``: ``one`` = W - lr * mean of the
    microbatches' gradients; ``every`` = M sequential updates, each from the weights the last left."""

    def load(ws):
        with torch.no_grad():
            for p, w in zip(loop.params, ws):
                p.copy_(w)

    if rule == "one":
        load(w0)
        gs = [_grads(loop, x, y) for x, y in zip(xs, ys)]
        return [w - lr * sum(g[k] for g in gs) / M for k, w in enumerate(w0)]
    out = [w.clone() for w in w0]
    for x, y in zip(xs, ys):
        load(out)
        out = [w - lr * g for w, g in zip(out, _grads(loop, x, y))]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("updates", ["one", "every"])
def test_single_loop_updates(bench, updates):
    torch.manual_seed(0)
    loop = bench._SingleLoop("mlp", 1)
    M, lr = bench.M, bench.LR
    w0 = _weights(loop)
    xs, ys = loop.xs[0].chunk(M), loop.ys[0].chunk(M)
    want = {rule: _expected(loop, w0, xs, ys, rule, M, lr) for rule in ("one", "every")}
    # the two rules lead to different weights, so a loop running the other rule fails the check below
    assert max((a - b).abs().max().item() for a, b in zip(want["one"], want["every"])) > 1e-4
    with torch.no_grad():
        for p, w in zip(loop.params, w0):
            p.copy_(w)
            p.grad = None
    loop.step(0, 1 if updates == "one" else M)
    for p, e in zip(loop.params, want[updates]):
        torch.testing.assert_close(p.detach(), e, rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_update_cost_is_a_ratio_of_step_times(bench):
    q1, med, q3 = bench._SingleLoop("mlp", 2).update_cost(pairs=4)
    assert 0 < q1 <= med <= q3 and 0.3 < med < 3

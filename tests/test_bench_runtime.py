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


@pytest.mark.parametrize("updates", ["one", "every microbatch"])
def test_single_loop_updates(bench, updates):
    torch.manual_seed(0)
    loop = bench._SingleLoop("mlp", 1)
    M, lr = bench.M, bench.LR
    w0 = _weights(loop)
    xs, ys = loop.xs[0].chunk(M), loop.ys[0].chunk(M)
    expected = [w.clone() for w in w0]
    with torch.no_grad():
        for p, w in zip(loop.params, w0):
            p.copy_(w)
    if updates == "one":  # W - lr * mean over the microbatches of their mean-loss gradients
        gs = [_grads(loop, x, y) for x, y in zip(xs, ys)]
        expected = [w - lr * sum(g[k] for g in gs) / M for k, w in enumerate(w0)]
    else:  # M sequential updates, each from the weights the previous one left
        for x, y in zip(xs, ys):
            with torch.no_grad():
                for p, w in zip(loop.params, expected):
                    p.copy_(w)
            g = _grads(loop, x, y)
            expected = [w - lr * gk for w, gk in zip(expected, g)]
    with torch.no_grad():
        for p, w in zip(loop.params, w0):
            p.copy_(w)
            p.grad = None
    loop.step(0, 1 if updates == "one" else M)
    for p, e in zip(loop.params, expected):
        torch.testing.assert_close(p.detach(), e, rtol=1e-5, atol=1e-6)
    # the two rules differ: the test would catch one loop running the other's rule
    assert not all(torch.allclose(p.detach(), w) for p, w in zip(loop.params, w0))


def test_update_cost_is_a_ratio_of_step_times(bench):
    q1, med, q3 = bench._SingleLoop("mlp", 2).update_cost(pairs=4)
    assert 0 < q1 <= med <= q3 and 0.3 < med < 3

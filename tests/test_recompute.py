"""Activation re-materialization (GPipe): an option on any schedule. The simulator charges the
extra forward and keeps only stage inputs; the partitioner's memory limit accounts for it; the
runtime (torch.utils.checkpoint) keeps gradients exact and measurably saves activation memory."""

from __future__ import annotations

import pytest
import torch
from runtime_checks import TOY_MLP, job_reference, max_diff

from workbench.cost.topology import Topology
from workbench.partitioning.search import partition
from workbench.profiling.pipedream import shipped
from workbench.schedules import build, validate, with_recompute
from workbench.simulation import simulate


@pytest.mark.parametrize("name", ["gpipe", "pipedream-flush", "zb-h1", "interleaved-1f1b", "pipedream", "seq1f1b"])
def test_recompute_is_an_option_of_any_schedule(name):
    plain = build(name, 4, 8)
    re = build(name, 4, 8, recompute=True)
    validate(re)
    assert re.recompute and not plain.recompute and re.ops == plain.ops
    assert with_recompute(re, False) == plain


@pytest.mark.parametrize("name", ["gpipe", "pipedream-flush"])
def test_simulator_charges_one_extra_forward(name):
    """Flush schedules, S stages, M microbatches: makespan (M + S - 1)(F + B) becomes
    (M + S - 1)(2F + B): the backward starts by re-running the forward."""
    S, M, F, B = 4, 8, 1.0, 2.0
    plain = simulate(build(name, S, M), fwd=F, bwd=B)
    re = simulate(build(name, S, M, recompute=True), fwd=F, bwd=B)
    assert plain.makespan == pytest.approx((M + S - 1) * (F + B))
    assert re.makespan == pytest.approx((M + S - 1) * (2 * F + B))


@pytest.fixture(scope="module")
def vgg16():
    return shipped("vgg16")


def _stage_bytes(profile, plan, in_flight, recompute):
    """Per-stage bytes from the profile columns, as the partitioner's docstring states them."""
    df = profile.layers
    out = []
    for st, v in zip(plan.stages, in_flight):
        w = df["param_bytes"].iloc[st.first : st.last + 1].sum()
        A = df["act_bytes"].iloc[st.first : st.last + 1].sum()
        a_in = df["act_bytes"].iloc[st.first - 1] if st.first > 0 else 0.0
        out.append(v * (w + a_in) + A if recompute else v * (w + A))
    return out


def test_plan_that_does_not_fit_fits_with_recompute(vgg16):
    topo = Topology.flat(4, 10e9)
    free = partition(vgg16, topo, straight=True)
    K = [4, 3, 2, 1]  # 1F1B in flight per stage (NOAM)
    limit = 1.001 * max(_stage_bytes(vgg16, free, K, recompute=True))
    with pytest.raises(ValueError, match="recompute=True"):
        partition(vgg16, topo, straight=True, memory_bytes=limit)
    plan = partition(vgg16, topo, straight=True, memory_bytes=limit, recompute=True)
    assert plan.meta["recompute"] and plan.bottleneck_ms == pytest.approx(free.bottleneck_ms)
    assert max(_stage_bytes(vgg16, plan, K, recompute=True)) <= limit
    assert max(plan.stage_memory_bytes) <= limit  # the cost model's figures of the plan agree
    assert max(_stage_bytes(vgg16, plan, K, recompute=False)) > limit  # would not fit without it


def test_simulated_memory_saved_and_time_paid(vgg16):
    """vgg16 (PipeDream's published GPU profile), 4 stages, 1F1B-flush, 8 microbatches: with
    recompute worker w holds K_w stage inputs plus one stage's activations during a backward
    (without: K_w stages' activations; the stage input is not counted, as in the partitioner)."""
    topo = Topology.flat(4, 10e9)
    plan = partition(vgg16, topo, straight=True)
    kw = dict(profile=vgg16, plan=plan, topology=topo)
    plain = simulate(build("pipedream-flush", plan, 8), **kw)
    re = simulate(build("pipedream-flush", plan, 8, recompute=True), **kw)
    want = [b / 8 for b in _stage_bytes(vgg16, plan, [4, 3, 2, 1], recompute=True)]  # per microbatch: 1/8
    params = [
        vgg16.layers["param_bytes"].iloc[s.first : s.last + 1].sum() * k / 8 for s, k in zip(plan.stages, [4, 3, 2, 1])
    ]
    assert re.metrics["peak_activation_bytes"] == pytest.approx([w - p for w, p in zip(want, params)])
    r, p = re.metrics["peak_activation_bytes"], plain.metrics["peak_activation_bytes"]
    assert all(r[w] < p[w] for w in range(3))  # K_w >= 2 microbatches in flight: saved
    assert r[3] > p[3]  # the last stage holds one: recompute only adds its input (the model counts it)
    assert plain.makespan < re.makespan < plain.makespan * 1.5


@pytest.mark.distributed
def test_runtime_gradients_exact_and_memory_measured():
    """2 gloo ranks, float64, pydocs text, a 2-block causal transformer: recompute (checkpoint) and
    plain runs give the single-process reference gradients and weights after a step; the measured
    bytes autograd keeps for the backward drop."""
    from workbench.models.segmented import flop_model, segment_gpt
    from workbench.runtime.executors import segments as R

    n = 16
    x, y, vocab = R.pydocs_batch(4, n, seed=1)
    model = dict(vocab=vocab, context=n, dim=16, num_layers=2, heads=2, seed=3)
    P = flop_model(segment_gpt(**model))
    scheds = [
        build("pipedream-flush", 2, 2),
        build("pipedream-flush", 2, 2, recompute=True),
        build("zb-h1", 2, 2, recompute=True),
        build("seq1f1b", 2, 2, segments=2, seq_len=n, model=P, recompute=True),
    ]
    jobs = [R.SegmentJob(s, x, y, model=model, lr=0.5, timeout_s=120) for s in scheds]
    outs = R.run(jobs)
    for job, out in zip(jobs, outs):
        ref = R.reference(job)
        for s in ref["grads"]:
            for k in ref["grads"][s]:
                torch.testing.assert_close(out["grads"][s][k], ref["grads"][s][k], rtol=1e-10, atol=1e-12)
                torch.testing.assert_close(out["weights"][s][k], ref["weights"][s][k], rtol=1e-10, atol=1e-12)
    plain, re = outs[0]["peak_saved_bytes"], outs[1]["peak_saved_bytes"]
    assert all(r < p / 2 for r, p in zip(re, plain))


@pytest.mark.distributed
def test_layer_runtime_with_checkpoint_matches_reference(tmp_path):
    """The layer-sequential runtime (toy MLP, 2 gloo ranks, float64) runs a recompute schedule's
    stage forwards under torch.utils.checkpoint; weights after 2 steps equal the reference's."""
    from workbench.runtime import prepare, run_jobs

    common = TOY_MLP | dict(batch_size=16, lr=0.1, timeout_s=60)
    jobs = [
        prepare(
            "toy-mlp",
            build(name, 2, 4, steps=2, recompute=True),
            workers=2,
            microbatches=4,
            steps=2,
            out=tmp_path / name,
            **common,
        )
        for name in ("pipedream-flush", "zb-h1")
    ]
    for job, summary in zip(jobs, run_jobs(jobs)):
        assert max_diff(job_reference(job, 2), summary["weights"]) < 1e-12

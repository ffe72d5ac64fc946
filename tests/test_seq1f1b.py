"""Seq1F1B (Sun et al. 2024): segment splits, the schedules' orders and dependency rules, the
closed forms of its bubble and activation memory, and a real 2-rank run whose gradients equal the
whole-sequence single-process reference."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runtime_checks import job_reference

from workbench.schedules import Op, ScheduleError, build, validate
from workbench.schedules import sequence_split as q
from workbench.simulation import simulate

FAST = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GPT_SMALL = (85e6, 12, 768)  # (P, L, d): GPT-2 small's non-embedding parameters, layers, width


def compute(sched):
    return [
        [(op.kind, op.stage, op.microbatch, op.segment) for op in ops if op.kind in ("F", "B", "BI", "BW")]
        for ops in sched.ops
    ]


# ---- segment lengths -------------------------------------------------------------------------
def test_segment_flops_is_the_papers_estimate():
    P, L, d = 10.0, 2, 3
    assert q.segment_flops([4, 2], P, L, d) == [2 * 4 * P + 2 * L * 4 * 4 * d, 2 * 2 * P + 2 * L * 2 * 6 * d]


@pytest.mark.parametrize("k", [2, 4, 8])
def test_balanced_split_costs_flops_over_k_and_beats_equal_tokens(k):
    n = 4096
    df = q.segment_splits(n, k, *GPT_SMALL)
    assert df["equal_tokens"].sum() == df["balanced_tokens"].sum() == n and (df["balanced_tokens"] >= 1).all()
    assert df["equal_tokens"].nunique() == 1
    total = df["balanced_flops"].sum()
    one_token = q.segment_flops([1], *GPT_SMALL)[0] + 2 * GPT_SMALL[1] * n * GPT_SMALL[2]  # most a token can cost
    assert (df["balanced_flops"] - total / k).abs().max() <= one_token  # FLOPs(S)/k up to rounding
    assert list(df["balanced_tokens"]) == sorted(df["balanced_tokens"], reverse=True)  # later: more context

    def spread(c):
        return df[c].max() / df[c].min()

    assert spread("balanced_flops") < 1.01 < spread("equal_flops")
    assert df["balanced_share"].sum() == pytest.approx(1.0)


@pytest.mark.slow
@pytest.mark.parametrize("n, k, model", [(64, 4, (108288.0, 2, 64)), (18, 3, (1.0, 1, 1)), (24, 4, (1.0, 1, 1))])
def test_rounded_split_has_the_smallest_largest_segment_of_all_splits(n, k, model):
    """Boundaries rounded one by one to the nearest integer gave 16, 17, 15, 16 for the mini gpt's 64
    tokens (its largest segment costlier than with equal tokens). Brute force over every split into k
    positive lengths: none has a cheaper largest segment than balanced_tokens'."""
    import itertools

    cost = lambda toks: max(q.segment_flops(toks, *model))  # noqa: E731
    best = min(cost(np.diff([0, *cuts, n])) for cuts in itertools.combinations(range(1, n), k - 1))
    got = q.balanced_tokens(n, k, *model)
    assert cost(got) == best <= cost(q.equal_tokens(n, k))


def test_split_bad_input():
    with pytest.raises(ValueError, match="segments <= seq_len"):
        q.balanced_tokens(3, 4, *GPT_SMALL)
    with pytest.raises(ValueError, match="split must be"):
        q.seq1f1b(2, 2, segments=2, split="lines")


# ---- orders ----------------------------------------------------------------------------------
def test_input_stage_order_matches_the_paper():
    """S = 2, k = 2: K_0 = S + k - 1 = 3 warm-up units, then B(oldest unit, last segment first), F."""
    sched = q.seq1f1b(2, 3, segments=2)
    assert compute(sched)[0][:8] == [
        ("F", 0, 0, 0),
        ("F", 0, 0, 1),
        ("F", 0, 1, 0),
        ("B", 0, 0, 1),
        ("F", 0, 1, 1),
        ("B", 0, 0, 0),
        ("F", 0, 2, 0),
        ("B", 0, 1, 1),
    ]
    assert q.seq1f1b_warmup(4, 3) == [6, 5, 4, 3]


@pytest.mark.parametrize("S,M", [(2, 2), (3, 5), (4, 8), (4, 6)])
def test_one_segment_is_the_unsegmented_schedule(S, M):
    def strip(s):
        return [[(o.kind, o.stage, o.microbatch, o.step) for o in ops] for ops in s.ops]

    assert strip(q.seq1f1b(S, M, segments=1)) == strip(build("pipedream-flush", S, M))
    assert strip(q.seq1f1b_zb(S, M, segments=1)) == strip(build("zb-h1", S, M))
    assert strip(q.seq1f1b_interleaved(2 * S, M, segments=1, chunks=2)) == strip(
        build("interleaved-1f1b", 2 * S, M, chunks=2)
    )
    assert compute(q.seq1f1b_interleaved(S, M, segments=3, chunks=1)) == compute(q.seq1f1b(S, M, segments=3))


@FAST
@given(
    S=st.integers(1, 4),
    M=st.integers(1, 6),
    k=st.integers(1, 4),
    steps=st.integers(1, 2),
    name=st.sampled_from(["seq1f1b", "seq1f1b-zb", "seq1f1b-interleaved"]),
)
def test_every_variant_validates_and_respects_segment_order(S, M, k, steps, name):
    opts = {"segments": k, "steps": steps, "seq_len": 64}
    if name == "seq1f1b-interleaved":
        opts["chunks"] = 2
        S, M = 2 * S, S * M  # P = S workers; M * k a multiple of the rounds
    sched = build(name, S, M, **opts)
    validate(sched)
    assert sched.num_segments == k and sched.microbatches == M * steps
    for ops in compute(sched):
        pos = {key: i for i, key in enumerate(ops)}
        for (kind, s, b, j), i in pos.items():
            if kind == "F" and j > 0:
                assert pos[("F", s, b, j - 1)] < i  # keys/values of the segment before
            if kind in ("B", "BI") and j < k - 1:
                assert pos[(kind, s, b, j + 1)] < i  # their gradients from the segment after
    for s in range(sched.num_stages):
        assert sched.step_microbatches(s, 0) == list(range(M))  # each sequence counted once


def test_validator_rejects_wrong_segment_order():
    sched = q.seq1f1b(1, 1, segments=2)
    ops = list(sched.ops[0])
    swapped = [ops[1], ops[0]] + ops[2:]  # F(0, 0, 1) before F(0, 0, 0)
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(dataclasses.replace(sched, ops=(tuple(swapped),)))
    backward_first_segment_first = ops[:2] + [ops[3], ops[2]] + ops[4:]  # B(.,0) before B(.,1)
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(dataclasses.replace(sched, ops=(tuple(backward_first_segment_first),)))
    with pytest.raises(ScheduleError, match="needs a segment"):
        validate(dataclasses.replace(sched, ops=((Op("F", 0, 0),) + tuple(ops[1:]),)))


def test_bad_sizes_say_what_would_work():
    with pytest.raises(ValueError, match="units to be a multiple of 2"):
        q.seq1f1b_interleaved(8, 9, segments=1, chunks=2)  # torch's rounds: 9 units on 4 workers
    with pytest.raises(ValueError, match="straight pipeline"):
        from workbench.cost.plan import Plan

        q.seq1f1b(Plan.from_boundaries([0, 1], [2, 1]), 4)


# ---- simulated bubble and memory: closed forms -------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 4])
def test_bubble_and_memory_closed_forms(k):
    """Equal segments (FLOP shares 1/k), S = 4, M = 8, F = 1, B = 2: every unit costs (F + B)/k,
    so the flush makespan is (M + (S - 1)/k)(F + B) and the bubble ((S - 1)/k) / (M + (S - 1)/k);
    the input stage holds S + k - 1 units of 1/k sequence: (S + k - 1)/k sequences vs 1F1B's S."""
    S, M, F, B = 4, 8, 1.0, 2.0
    res = simulate(q.seq1f1b(S, M, segments=k, seq_len=4 * k), fwd=F, bwd=B)
    assert res.makespan == pytest.approx((M + (S - 1) / k) * (F + B))
    assert res.metrics["bubble_fraction"][0] == pytest.approx(((S - 1) / k) / (M + (S - 1) / k))
    assert res.metrics["peak_activation_share"] == pytest.approx([(S - s + k - 1) / k for s in range(S)])
    assert res.metrics["peak_activations"] == [S - s + k - 1 for s in range(S)]


def test_segment_flop_shares_are_charged():
    sched = q.seq1f1b(2, 2, segments=2, seq_len=1024, model=GPT_SMALL, split="tokens")
    res = simulate(sched, fwd=1.0, bwd=2.0)
    f = res.compute[(res.compute["kind"] == "F") & (res.compute["microbatch"] == 0) & (res.compute["worker"] == 0)]
    assert f["segment"].tolist() == [0, 1]  # the timeline's optional segment column
    dur = (f["end"] - f["start"]).tolist()
    assert dur == pytest.approx(list(sched.segment_flops)) and dur[1] > dur[0]  # equal tokens, unequal cost
    balanced = simulate(q.seq1f1b(2, 8, segments=2, seq_len=1024, model=GPT_SMALL), fwd=1.0, bwd=2.0)
    assert balanced.makespan < res.makespan * 4  # sanity: 4x the microbatches, less than 4x the time
    assert (
        balanced.makespan
        < simulate(
            q.seq1f1b(2, 8, segments=2, seq_len=1024, model=GPT_SMALL, split="tokens"), fwd=1.0, bwd=2.0
        ).makespan
    )


def test_seq1f1b_zb_fills_the_cool_down():
    S, M = 4, 8
    for k in (2, 4):
        plain = simulate(q.seq1f1b(S, M, segments=k), fwd=1.0, bwd=2.0)
        zb = simulate(q.seq1f1b_zb(S, M, segments=k), fwd=1.0, bwd=2.0)
        assert zb.makespan < plain.makespan
        assert max(zb.metrics["peak_activation_share"]) == pytest.approx((S + k - 1) / k)


# ---- real run: 2 gloo ranks vs the whole-sequence reference -----------------------------------
@pytest.mark.distributed
def test_runtime_gradients_equal_whole_sequence_reference():
    """pydocs text, float64, a 2-block causal transformer whose attention reads earlier segments'
    keys and values: Seq1F1B (unequal FLOP-balanced segments), its ZB and interleaved (4 stages on 2
    ranks) variants give the single-process whole-sequence gradients and weights after one step
    (two steps for the first);
    the measured activation bytes of the input rank are below 1F1B's (same microbatches)."""
    from workbench.runtime.executors import segments as R

    n = 18
    x, y, vocab = R.pydocs_batch(4, n, seed=0)
    model = dict(vocab=vocab, context=n, dim=16, num_layers=2, heads=2, seed=0)
    long_context = (1.0, 1, 1)  # FLOP model dominated by attention: segments of unequal length
    scheds = [
        q.seq1f1b(2, 1, segments=3, seq_len=n, model=long_context, steps=2),  # 2 steps of 1 x 2 sequences
        q.seq1f1b_zb(2, 2, segments=3, seq_len=n, model=long_context),
        q.seq1f1b_interleaved(4, 2, segments=2, chunks=2, seq_len=n, split="tokens"),
        build("pipedream-flush", 2, 2),
        q.seq1f1b(2, 2, segments=3, seq_len=n, model=long_context),
    ]
    assert len(set(scheds[0].segment_tokens)) > 1
    jobs = [R.SegmentJob(s, x, y, model=model, lr=0.5, timeout_s=120) for s in scheds]
    outs = R.run(jobs)
    for job, out in zip(jobs, outs):
        ref = R.reference(job)
        assert set(out["grads"]) == set(ref["grads"]) == set(range(job.schedule.num_stages))
        for s in ref["grads"]:
            for k in ref["grads"][s]:
                torch.testing.assert_close(out["grads"][s][k], ref["grads"][s][k], rtol=1e-10, atol=1e-12)
                torch.testing.assert_close(out["weights"][s][k], ref["weights"][s][k], rtol=1e-10, atol=1e-12)
    assert outs[4]["peak_saved_bytes"][0] < outs[3]["peak_saved_bytes"][0]  # same 2 microbatches per step


@pytest.mark.parametrize("recompute", [False, True])
def test_unit_busy_time_is_one_number(recompute):
    """worker_stats' unit-cost busy time (no timeline) equals the simulator's (F = 1, B = 2)."""
    from workbench.schedules import worker_stats

    for sched in (q.seq1f1b_zb(4, 8, segments=2, seq_len=64, model=GPT_SMALL), q.seq1f1b(3, 4, segments=3)):
        sched = dataclasses.replace(sched, recompute=recompute)
        sim = simulate(sched, fwd=1.0, bwd=2.0)
        assert worker_stats(sched)["busy"].tolist() == pytest.approx(sim.worker_stats["busy"].tolist())


def test_torch_csv_refuses_segments():
    from workbench.schedules import to_torch_csv

    with pytest.raises(ValueError, match="segments"):
        to_torch_csv(q.seq1f1b(2, 2, segments=2))
    assert to_torch_csv(q.seq1f1b(2, 2, segments=1)) == to_torch_csv(build("pipedream-flush", 2, 2))


def test_profile_costs_activation_bytes_per_worker():
    """A uniform 4-layer profile (1 ms / 2 ms, 1 MB activations, 1 MB weights per layer; modeled):
    Seq1F1B's peak stashed bytes per worker are its token shares of 1F1B's, (S - s + k - 1)/k vs S - s."""
    import pandas as pd

    from workbench.profiling.measure import Profile

    df = pd.DataFrame(
        {"name": [f"l{i}" for i in range(4)], "fwd_ms": 1.0, "bwd_ms": 2.0, "act_bytes": 1e6, "param_bytes": 1e6}
    )
    prof = Profile.from_frame(df, model="uniform-4", kind="synthetic")
    one = simulate(build("pipedream-flush", 4, 8), profile=prof).metrics["peak_activation_bytes"]
    seg = simulate(q.seq1f1b(4, 8, segments=4), profile=prof).metrics["peak_activation_bytes"]
    assert seg == pytest.approx([o * (4 - s + 3) / 4 / (4 - s) for s, o in enumerate(one)])


# ---- workbench train: the segment executor on the zoo's gpt -------------------------------------
TRAIN = dict(
    workers=2,
    microbatches=2,
    batch_size=8,
    lr=0.05,
    dtype="float64",
    progress=False,
    timeout_s=120,
    allow_oversubscribe=True,
    evaluate=False,
)


@pytest.mark.parametrize(
    "model, options, needle",
    [
        ("toy-mlp", {}, r"layer 0 \(.*\) cannot run on a segment of a sequence; .*--model gpt"),
        ("gpt", {"dropout": 0.1}, r"dropout 0.1; segments run without dropout"),
    ],
)
def test_train_refuses_models_that_cannot_run_on_segments_before_spawning(tmp_path, model, options, needle):
    from workbench.runtime import prepare

    with pytest.raises(ValueError, match=needle):
        prepare(
            model,
            "seq1f1b",
            out=tmp_path / "x",
            schedule_options={"segments": 2},
            steps=1,
            model_options=options | {"num_layers": 2} if model == "gpt" else options,
            **TRAIN,
        )


def reference_weights(job, momentum: float = 0.0) -> list[dict]:
    return job_reference(job, job.rounds_total, dtype=torch.float64, momentum=momentum)


@pytest.mark.distributed
@pytest.mark.slow
def test_workbench_train_runs_seq1f1b_with_the_layer_models_reference_weights(tmp_path, capsys):
    """`workbench train --schedule seq1f1b --schedule-option segments=4` on the zoo's gpt (2 blocks, tied
    embedding, momentum), float64, 2 steps: the checkpointed weights of both stages equal the
    whole-sequence layer-sequential reference (runtime/reference.py), the tied copies are one tensor;
    the segments are FLOP-balanced from the model's (P, L, d), and every stage ran k forwards per
    microbatch."""
    import pandas as pd

    from workbench.cli.commands import main
    from workbench.runtime import latest_checkpoint, prepare
    from workbench.runtime.launch.outputs import load_stage

    out = tmp_path / "cli"
    argv = [
        "train",
        "--model",
        "gpt",
        "--model-option",
        "num_layers=2",
        "--model-option",
        "tie_weights=true",
        "--schedule",
        "seq1f1b",
        "--schedule-option",
        "segments=4",
        "--workers",
        "2",
        "--microbatches",
        "2",
        "--batch-size",
        "8",
        "--steps",
        "2",
        "--lr",
        "0.05",
        "--momentum",
        "0.5",
        "--dtype",
        "float64",
        "--no-eval",
        "--no-progress",
        "--allow-oversubscribe",
        "--timeout",
        "120",
        "--out",
        str(out),
    ]
    assert main(argv) == 0, capsys.readouterr().err
    assert "seq1f1b: 2 steps" in capsys.readouterr().out
    job = prepare(
        "gpt",
        "seq1f1b",
        out=tmp_path / "ref",
        schedule_options={"segments": 4},
        steps=2,
        momentum=0.5,
        model_options={"num_layers": 2, "tie_weights": True},
        **TRAIN,
    )
    from workbench.models.segmented import flop_model, segment_layers

    fm = flop_model(segment_layers(job.model_fn().layers))  # (P, L, d) of the model: FLOP-balanced segments
    assert job.schedule.segment_tokens == q.balanced_tokens(64, 4, *fm) == (16, 16, 16, 16)
    ck = latest_checkpoint(out)
    got = [load_stage(ck, s, 0)["weights"] for s in range(2)]
    for s, w in enumerate(reference_weights(job, momentum=0.5)):
        for n, t in w.items():
            torch.testing.assert_close(got[s][n], t, rtol=1e-10, atol=1e-13, msg=n)
    assert torch.equal(got[0]["0.tok.weight"], got[1]["1.proj.weight"])  # the tied embedding's two copies
    tl = pd.read_csv(out / "timeline.csv")
    assert (tl[tl.kind == "F"].groupby(["stage", "microbatch"]).size() == 4).all()


@pytest.mark.distributed
@pytest.mark.slow
def test_train_runs_the_zero_bubble_and_interleaved_variants_with_the_reference_weights(tmp_path):
    """seq1f1b-zb (BI/BW per unit) and seq1f1b-interleaved (4 stages on 2 ranks) through
    workbench.runtime.train on the untied zoo gpt, float64, 2 steps: the reference's weights."""
    from workbench.runtime import prepare, run_jobs

    jobs = [
        prepare(
            "gpt",
            name,
            out=tmp_path / name,
            schedule_options=opts,
            steps=2,
            model_options={"num_layers": 2},
            return_weights=True,
            **TRAIN,
        )
        for name, opts in (("seq1f1b-zb", {"segments": 3}), ("seq1f1b-interleaved", {"segments": 2, "chunks": 2}))
    ]
    for job, summary in zip(jobs, run_jobs(jobs)):
        assert job.schedule.num_segments > 1 and summary["steps"] == 2
        for s, w in enumerate(reference_weights(job)):
            for n, t in w.items():
                torch.testing.assert_close(
                    summary["weights"][s][n], t, rtol=1e-10, atol=1e-13, msg=f"{job.schedule.name} {n}"
                )

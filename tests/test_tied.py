"""Weights tied across stages (workbench.runtime.executors.tied): which owning stages share a parameter, and
which schedules can combine their gradients before every update (the rest refused in one line).
The real runs (tied GPT-2 and Llama over two gloo ranks against the original module's gradient and
the semantic reference) are in tests/test_user_models.py."""

from __future__ import annotations

import pytest
import torch
from runtime_checks import assert_weights_close, job_reference

from workbench.models import build as build_model
from workbench.runtime.executors.tied import (
    TiedWeight,
    check_tied,
    combine_ranks,
    defer_steps,
    tied_weights,
)
from workbench.runtime.semantics.stages import even_bounds
from workbench.schedules import REGISTRY, build, validate

REMOTE_OR_ASYNC = {"dp-asp", "fsdp", "fslpp"}  # no common update / fetched weights: refused


def test_the_zoo_gpts_tied_embedding_is_owned_by_the_first_and_the_last_stage():
    m = build_model("gpt", tie_weights=True, num_layers=2)
    (tie,) = tied_weights(m, even_bounds(len(m.layers), 2))
    assert tie.names == ((0, "0.tok.weight"), (1, "1.proj.weight"))
    assert tie.nbytes == m.layers[0].tok.weight.numel() * 4
    assert tied_weights(m, [(0, len(m.layers) - 1)]) == ()  # one stage: tied inside it
    assert tied_weights(build_model("gpt", num_layers=2), even_bounds(4, 2)) == ()


@pytest.mark.parametrize("name", ["gpipe", "pipedream", "pipedream-flush", "pipedream-2bw", "zb-h1", "pp"])
def test_schedules_whose_owners_updates_pair_up_are_accepted(name):
    sched = build(name, 3, 6, **({"workers": 3} if name == "pp" else {}))
    check_tied(sched, (TiedWeight(((0, "a"), (2, "b")), 4),))


def test_replicated_owners_combine_replica_by_replica():
    sched = build("dp-bsp", 2, 4, workers=2)  # both stages on both workers
    tie = TiedWeight(((0, "a"), (1, "b")), 4)
    check_tied(sched, (tie,))
    assert combine_ranks(sched, tie) == [(0,), (1,)]  # each rank sums its own two stages' buffers


@pytest.mark.parametrize(
    "name, why",
    [
        ("dp-asp", "the 'async' rule"),
        ("fsdp", "fetches weights from other workers"),
    ],
)
def test_rules_without_a_common_update_are_refused_in_one_line(name, why):
    sched = build(name, 2, 4, workers=2)
    with pytest.raises(ValueError, match=r"^a and b are one tied weight used by stages \[0, 1\]; .*" + why) as e:
        check_tied(sched, (TiedWeight(((0, "a"), (1, "b")), 4),))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_every_schedule_combines_a_tie_of_its_first_and_last_stage_or_refuses_it(name):
    """4 stages (V-shapes: both ends on worker 0; interleaving: 2 stages per worker): after
    defer_steps the schedule validates and the combine neither deadlocks nor precedes a local owner's
    backward; only the async rule and fetched weights are refused."""
    sp = REGISTRY[name]
    sched = build(name, 4, 8, **({"workers": 4} if sp.takes_workers else {}))
    if sched.num_stages < 2:
        pytest.skip("one stage")
    ties = (TiedWeight(((0, "a"), (sched.num_stages - 1, "b")), 4),)
    moved = defer_steps(sched, ties)
    validate(moved)
    if name in REMOTE_OR_ASYNC:
        with pytest.raises(ValueError, match="one tied weight"):
            check_tied(moved, ties)
        return
    check_tied(moved, ties)
    for _w, ops in enumerate(moved.ops):  # every owner's STEP follows the worker's backwards of its update
        last_b = max((i for i, op in enumerate(ops) if op.kind in ("B", "BW")), default=-1)
        if moved.update == "sync" and moved.microbatches_per_step == moved.microbatches:
            assert all(i > last_b for i, op in enumerate(ops) if op.kind == "STEP" and op.stage in (0, 3))


def test_a_v_shape_keeps_both_ends_on_one_worker_and_moves_the_early_step():
    sched = build("zb-v", 4, 8)
    assert sched.stage_workers[0] == sched.stage_workers[3] == (0,)
    ties = (TiedWeight(((0, "a"), (3, "b")), 4),)
    with pytest.raises(ValueError, match="before another owner's last backward"):
        check_tied(sched, ties)
    moved = defer_steps(sched, ties)
    assert [op for op in moved.ops[0] if op.kind != "STEP"] == [op for op in sched.ops[0] if op.kind != "STEP"]
    assert {str(op) for op in moved.ops[0][-2:]} == {"STEP0#0", "STEP3#0"}  # after the last backward of both
    assert combine_ranks(moved, ties[0]) == [(0,)]  # a sum on worker 0, no communication


@pytest.mark.distributed
@pytest.mark.slow
def test_v_shape_and_interleaved_runs_with_a_tied_embedding_equal_the_reference(tmp_path):
    """The zoo gpt (2 blocks, output projection tied to the token embedding) over 4 stages on 2 gloo
    ranks, float64, 2 steps: zb-v (both ends on rank 0: a local sum) and interleaved-1f1b (stage 0 on
    rank 0, stage 3 on rank 1: an all-reduce) give the semantic reference's weights, tied copies equal."""
    from workbench.runtime import prepare, run_jobs

    common = dict(
        workers=2,
        microbatches=4,
        batch_size=8,
        lr=0.05,
        dtype="float64",
        progress=False,
        steps=2,
        return_weights=True,
        timeout_s=120,
        allow_oversubscribe=True,
        evaluate=False,
    )
    jobs = [
        prepare("gpt", name, out=tmp_path / name, model_options={"num_layers": 2, "tie_weights": True}, **common)
        for name in ("zb-v", "interleaved-1f1b")
    ]
    for job, summary in zip(jobs, run_jobs(jobs)):
        (tie,) = tied_weights(job.model_fn(), job.bounds)
        assert tie.stages == (0, 3)
        (s0, n0), (s1, n1) = tie.names
        assert torch.equal(summary["weights"][s0][n0], summary["weights"][s1][n1])
        ref = job_reference(job, 2, dtype=torch.float64)
        assert_weights_close(summary["weights"], ref, f"{job.schedule.name} ", rtol=1e-10, atol=1e-13)

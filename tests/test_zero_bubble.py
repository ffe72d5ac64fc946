"""Zero bubble beyond ZB-H1: per-rank orders equal torch.distributed.pipelining's (built without
processes), the zero-bubble paper's closed forms for bubbles and memory, the V-shape family's memory
fractions, bad input, and a real run on gloo ranks against minibatch SGD."""

from __future__ import annotations

import pytest
from runtime_checks import TOY_MLP, initial_weights, job_reference, job_sgd, max_diff
from torch.distributed.pipelining import schedules as ts

from workbench.schedules import build, in_flight_peak, validate
from workbench.schedules.generators import in_flight_of
from workbench.schedules.vshape import V_PEAK
from workbench.schedules.vshape_order import block_orders
from workbench.schedules.zero_bubble import v_layout
from workbench.simulation import simulate
from workbench.simulation.costed_build import bubble_memory_table

TORCH_KIND = {"F": "F", "I": "BI", "W": "BW", "B": "B"}


class StandInStage:
    """The attributes torch's schedule constructors read from a pipeline stage; no module, no process."""

    def __init__(self, index: int, num_stages: int, rank: int, ranks: int):
        self.stage_index, self.num_stages, self.group_rank, self.group_size = index, num_stages, rank, ranks
        self.is_first, self.is_last = index == 0, index == num_stages - 1
        self.submod = None
        self.stage_index_to_group_rank = {}


def torch_schedule(cls, P: int, M: int, local_stages: list[int], num_stages: int):
    stages = [StandInStage(s, num_stages, 0, P) for s in local_stages]
    return cls(stages, M, loss_fn=lambda out, target: out)


def flatten(action) -> list[tuple[str, int, int]]:
    """torch action -> (kind, stage, microbatch) ops; OVERLAP_F_B -> its sub-actions in order."""
    if action is None:
        return []
    if action.sub_actions:
        return [k for a in action.sub_actions for k in flatten(a)]
    return [(TORCH_KIND[action.computation_type.value], action.stage_index, action.microbatch_index)]


def compute_keys(sched, w):
    return [(op.kind, op.stage, op.microbatch) for op in sched.ops[w] if op.kind in ("F", "B", "BI", "BW")]


# ---- per-rank order equal to torch's -----------------------------------------------------------------
CASES = [(P, M) for P in (1, 2, 3, 4) for M in (1, 2, 3, 4, 5, 6, 8, 9, 12)]


@pytest.mark.parametrize("P,M", CASES)
@pytest.mark.parametrize("v", [2, 3])
def test_interleaved_zb_equals_torch(P, M, v):
    if M % max(1, M // P):
        with pytest.raises(ValueError, match="rounds"):
            build("interleaved-zb", P * v, M, chunks=v)
        return
    ref = torch_schedule(ts.ScheduleInterleavedZeroBubble, P, M, [k * P for k in range(v)], P * v)
    sched = build("interleaved-zb", P * v, M, chunks=v)
    for r in range(P):
        assert compute_keys(sched, r) == [k for a in ref.pipeline_order[r] for k in flatten(a)], r
    assert all(sched.stage_workers[s] == (s % P,) for s in range(P * v))


@pytest.mark.parametrize("P,M", CASES)
def test_zb_v_equals_torch(P, M):
    ref = torch_schedule(ts.ScheduleZBVZeroBubble, P, M, [0, 2 * P - 1], 2 * P)
    sched = build("zb-v", 2 * P, M, variant="torch")
    for r in range(P):
        assert compute_keys(sched, r) == [k for a in ref.pipeline_order[r] for k in flatten(a)], r
    assert {s: ws[0] for s, ws in enumerate(sched.stage_workers)} == ref.stage_index_to_group_rank
    assert sched.stage_workers == v_layout(P)


@pytest.mark.parametrize("P,M", [(P, M) for P in (1, 2, 3, 4) for M in (2 * P, 2 * P + 1, 3 * P, 12)])
def test_dualpipev_equals_torch(P, M):
    ref = torch_schedule(ts.ScheduleDualPipeV, P, M, [0, 2 * P - 1], 2 * P)
    sched = build("dualpipev", 2 * P, M)
    pairs = set(sched.options["overlap_f_b"])
    n_pairs = 0
    for r in range(P):
        assert compute_keys(sched, r) == [k for a in ref.pipeline_order[r] for k in flatten(a)], r
        for a in ref.pipeline_order[r]:  # every torch OVERLAP_F_B is a listed (F, B) pair, F first
            if a is not None and a.sub_actions:
                f, b = a.sub_actions
                assert (r, (f.stage_index, f.microbatch_index), (b.stage_index, b.microbatch_index)) in pairs
                n_pairs += 1
    assert n_pairs == len(pairs) > 0 or P * 2 > M
    keys = [(op.kind, op.stage, op.microbatch) for op in sched.ops[0] if op.kind != "STEP"]
    for r, (fs, fb), (bs, bb) in pairs:  # back to back in the op list
        ks = compute_keys(sched, r)
        assert ks[ks.index(("F", fs, fb)) + 1] == ("B", bs, bb)
    assert keys


# ---- every schedule validates, with steps --------------------------------------------------------------
NEW = ["zb-h2", "interleaved-zb", "zb-v", "dualpipev", "v-min", "v-half", "v-zb"]


def stages_for(name, P, v=2):
    return P if name == "zb-h2" else P * v


@pytest.mark.parametrize("name", NEW)
def test_validates_over_sizes_and_steps(name):
    for P in (1, 2, 3, 5):
        for M in sorted({2 * P, 2 * P + 2, 3 * P}):
            for steps in (1, 2):
                sched = build(name, stages_for(name, P), M, steps=steps)
                validate(sched)
                assert sched.microbatches == M * steps and sched.num_workers == P
                n_steps = sum(op.kind == "STEP" for _, op in sched)
                assert n_steps == steps * sched.num_stages  # one update per stage and step


# ---- closed forms (zero-bubble paper, Table 1; controllable-memory paper, Table 1) -----------------------
def steady_idle(name, P, M, f, b):
    """Idle time per step in steady state: spacing of stage 0's updates minus M (T_F + T_B + T_W)."""
    sched = build(name, P, M, steps=3)
    r = simulate(sched, f, b)
    return r.metrics["steady_iteration_time"] - M * (f + b), r.metrics["peak_activations"]


@pytest.mark.parametrize("P", [2, 3, 4, 5])
@pytest.mark.parametrize("f,b", [(1, 2), (2, 2), (3, 2)])  # T_B = T_W = b / 2 <= T_F
def test_zero_bubble_closed_forms(P, f, b):
    """1F1B: (P-1)(T_F+T_B+T_W); ZB-H1: (P-1)(T_F+T_B-T_W); ZB-H2: (P-1)(T_F+T_B-2T_W); peak
    activations P, P, 2P-1 microbatches."""
    tf, tb, tw = f, b / 2, b / 2
    M = 2 * P
    idle, peak = steady_idle("pipedream-flush", P, M, f, b)
    assert (idle, max(peak)) == ((P - 1) * (tf + tb + tw), P)
    idle, peak = steady_idle("zb-h1", P, M, f, b)
    assert (idle, max(peak)) == ((P - 1) * (tf + tb - tw), P)
    idle, peak = steady_idle("zb-h2", P, M, f, b)
    assert (idle, max(peak)) == ((P - 1) * (tf + tb - 2 * tw), 2 * P - 1)


@pytest.mark.parametrize("P", [2, 3, 4, 6])
def test_zb_v_zero_bubble_with_1f1b_memory(P):
    """ZB-V, T_F = T_B = T_W: each rank runs 2 chunks x M x 3 units per step with no idle time in
    steady state; its peak is 2P chunks of half a worker = P microbatches, 1F1B's."""
    M = 2 * P
    r = simulate(build("zb-v", 2 * P, M, steps=3), 1, 2)
    assert r.metrics["steady_iteration_time"] == 2 * M * 3
    assert max(r.metrics["peak_activations"]) == 2 * P


@pytest.mark.slow
@pytest.mark.parametrize("P", range(1, 11))
def test_building_blocks_hold_the_papers_memory(P):
    """The controllable-memory paper's V-Min and V-Half building blocks, repeated and squeezed, hold
    exactly 2 (P + 4) // 3 and 2 (P + 2) // 2 chunks at their peak (a chunk: half a worker's
    layers), and the schedules built from them stay within that."""
    for name, memory in (("v-min", "min"), ("v-half", "half")):
        peak = max(in_flight_of(o) for o in block_orders(P, 4 * P, memory))
        assert peak == 2 * V_PEAK[name](P), name
        sched = build(name, 2 * P, 4 * P)
        assert max(in_flight_peak(ops) for ops in sched.ops) <= peak


@pytest.mark.slow
@pytest.mark.parametrize("P", [2, 3, 4, 6])
def test_v_family_memory_within_limit_and_bubble_bounded(P):
    """Peak activations within 2 x (P+4)//3, (P+2)//2, P chunks; idle time per worker
    (makespan - 6M at T_F = T_B = T_W = 1 per chunk) does not grow with M (bubble rate O(P/M)), is at
    most the paper's ~(2P/3M)(6M) = 4P for V-Min, and shrinks as memory grows."""
    idle = {}
    for name in ("v-min", "v-half", "v-zb"):
        runs = [simulate(build(name, 2 * P, M), 1, 2) for M in (4 * P, 8 * P)]
        assert all(max(r.metrics["peak_activations"]) <= 2 * V_PEAK[name](P) for r in runs)
        excess = [r.makespan - 6 * M for r, M in zip(runs, (4 * P, 8 * P))]
        assert excess[0] == excess[1], name
        idle[name] = excess[0]
    assert idle["v-min"] <= 4 * P
    assert idle["v-min"] >= idle["v-half"] >= idle["v-zb"]
    assert P - 1 <= idle["v-zb"] <= 2 * P  # at least the fill of one step: the last worker starts at P - 1


def test_v_family_trades_memory_for_bubble():
    P, M = 4, 16
    bubble = {
        n: max(simulate(build(n, 2 * P, M), 1, 2).metrics["bubble_fraction"]) for n in ("v-min", "v-half", "v-zb")
    }
    assert bubble["v-min"] > bubble["v-half"] > bubble["v-zb"]
    one_f_one_b = max(simulate(build("pipedream-flush", P, M), 1, 2).metrics["bubble_fraction"])
    assert bubble["v-min"] < one_f_one_b  # a third of the memory of 1F1B, fewer bubbles


def test_readme_table_4_workers_8_microbatches():
    """The table in docs/zero-bubble.md: P = 4, M = 8, per worker T_F = 1, T_B + T_W = 2."""
    t = bubble_memory_table(4, 8, 1.0, 2.0)
    assert t.loc["pipedream-flush", "steady_idle_per_step"] == 3 * 3  # (P-1)(T_F+T_B+T_W)
    assert t.loc["zb-h1", "steady_idle_per_step"] == 3 * 1  # (P-1)(T_F+T_B-T_W)
    assert t.loc["zb-h2", "steady_idle_per_step"] == 0 == t.loc["zb-v", "steady_idle_per_step"]
    assert t.loc["pipedream-flush", "makespan"] == 8 * 3 + 3 * 3
    assert list(t["peak_activations"][["pipedream-flush", "zb-h1", "zb-h2", "zb-v", "v-min"]]) == [4, 4, 7, 4, 2]
    assert t.loc["v-half", "peak_activations"] <= 3 and t.loc["v-zb", "peak_activations"] <= 4
    assert (t["bubble_fraction"] >= 0).all() and (t["bubble_fraction"] < 0.3).all()
    # inside each worker's own span (the zero-bubble papers' rate) ZB-H2, ZB-V and V-ZB idle nowhere;
    # the span bubble never exceeds the whole-makespan one
    assert (t.loc[["zb-h2", "zb-v", "v-zb"], "span_bubble_fraction"] == 0).all()
    assert (t["span_bubble_fraction"] <= t["bubble_fraction"] + 1e-12).all()


# ---- bad input --------------------------------------------------------------------------------------
def test_bad_input_names_the_constraint_and_a_fix():
    with pytest.raises(ValueError, match=r"at least as many microbatches as stages.*microbatches >= 8"):
        build("dualpipev", 8, 6)
    with pytest.raises(ValueError, match=r"do not split into 2 stages per worker.*multiple of 2"):
        build("zb-v", 5, 8)
    with pytest.raises(ValueError, match=r"multiple of the 2 rounds.*use one of"):
        build("interleaved-zb", 8, 9, chunks=2)
    with pytest.raises(ValueError, match="straight pipeline"):
        from workbench.cost.plan import Plan

        build("zb-h2", Plan.from_boundaries([0, 1], [2, 1]), 4)
    with pytest.raises(ValueError, match="options"):
        build("zb-v", 4, 4, chunks=3)


# ---- a real run on gloo ranks: gradients equal the single-process reference and minibatch SGD --------
BATCH, LR, ROUNDS = 12, 0.1, 2
RUN = TOY_MLP | dict(batch_size=BATCH, lr=LR, timeout_s=60, steps=ROUNDS)
RANKS = {  # workers -> [(schedule name, microbatches, options)]; the launcher derives the stage count
    2: [
        ("zb-h2", 4, {}),
        ("interleaved-zb", 4, {"chunks": 2}),
        ("zb-v", 4, {}),
        ("dualpipev", 6, {}),
        ("v-min", 4, {}),
        ("v-half", 4, {}),
        ("v-zb", 4, {}),
    ],
    3: [("zb-v", 6, {}), ("dualpipev", 6, {})],  # a middle rank of the V: sends both ways on both chunks
}


@pytest.fixture(scope="module", params=sorted(RANKS))
def zb_runs(request, tmp_path_factory):
    from workbench.runtime import prepare, run_jobs

    P = request.param
    root = tmp_path_factory.mktemp(f"zb{P}")
    jobs = [
        prepare("toy-mlp", name, workers=P, microbatches=M, out=root / name, schedule_options=opts, **RUN)
        for name, M, opts in RANKS[P]
    ]
    return P, jobs, run_jobs(jobs)


@pytest.mark.distributed
def test_runtime_matches_reference_and_minibatch_sgd(zb_runs):
    P, jobs, summaries = zb_runs
    for job, summary in zip(jobs, summaries):
        assert job.schedule.num_workers == P and job.schedule.num_stages == (
            P if job.schedule.name == "zb-h2" else 2 * P
        )
        assert max_diff(summary["weights"], job_reference(job, ROUNDS)) < 1e-12, job.schedule.name
        assert max_diff(summary["weights"], job_sgd(job, ROUNDS)) < 1e-12, job.schedule.name
        assert max_diff(summary["weights"], initial_weights(job)) > 1e-3  # it did train
        for info in summary["ranks"]:  # measured stash depth = the schedule's, stage by stage
            r = info["rank"]
            for s, mem in info["memory"].items():
                ops = [op for op in job.schedule.ops[r] if op.stage == int(s)]
                assert mem["peak_live_microbatches"] == in_flight_peak(ops), (job.schedule.name, r, s)

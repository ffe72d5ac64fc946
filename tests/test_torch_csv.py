"""PyTorch's schedules as the reference: per-rank orders built by torch's own schedule classes
(without processes: their order functions run on a stand-in ``self``), compared op by op; and
torch's schedule CSV read and written both ways."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torch.distributed.pipelining import schedules as ts

from workbench.schedules import build, from_torch_csv, to_torch_csv, validate
from workbench.simulation import simulate

KIND = {"F": "F", "B": "B", "I": "BI", "W": "BW"}


def compute_only(order: dict) -> dict[int, list[tuple]]:
    return {
        r: [
            (KIND[a.computation_type.value], a.stage_index, a.microbatch_index)
            for a in acts
            if a is not None and a.computation_type.value in KIND
        ]
        for r, acts in order.items()
    }


def ours(sched) -> dict[int, list[tuple]]:
    return {
        w: [(str(op.kind), op.stage, op.microbatch) for op in ops if op.kind in ("F", "B", "BI", "BW")]
        for w, ops in enumerate(sched.ops)
    }


def torch_looped(cls, P: int, v: int, M: int) -> dict:
    """Per-rank order of torch's multi-stage schedule ``cls`` (P ranks, v stages each, M microbatches)."""
    rounds = max(1, M // P)
    if cls is ts.ScheduleInterleaved1F1B and M % rounds:  # as torch's constructor checks
        raise ValueError("torch refuses")
    me = SimpleNamespace(
        pp_group_size=P,
        n_local_stages=v,
        _stages=[None] * v,
        _n_microbatches=M,
        number_of_rounds=rounds,
        microbatches_per_round=M // rounds,
    )
    return compute_only({r: cls._calculate_single_rank_operations(me, r) for r in range(P)})


def torch_1f1b(P: int, M: int) -> dict:
    return compute_only(ts.Schedule1F1B._get_pipeline_order(SimpleNamespace(_num_stages=P, _n_microbatches=M)))


@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_looped_bfs_equals_torch(P):
    for v in (1, 2, 3):
        for M in range(1, 10):
            assert ours(build("looped-bfs", P * v, M, chunks=v)) == torch_looped(ts.ScheduleLoopedBFS, P, v, M)


@pytest.mark.parametrize("P", [2, 3, 4])
def test_interleaved_1f1b_equals_torch_for_any_microbatch_count_torch_accepts(P):
    for v in (2, 3):
        for M in range(1, 13):
            try:
                want = torch_looped(ts.ScheduleInterleaved1F1B, P, v, M)
            except ValueError:
                with pytest.raises(ValueError, match="multiple of"):
                    build("interleaved-1f1b", P * v, M, chunks=v)
                continue
            assert ours(build("interleaved-1f1b", P * v, M, chunks=v)) == want, (P, v, M)


def test_pipedream_flush_equals_torch_1f1b():
    """torch's ``Schedule1F1B._get_pipeline_order`` (its IR, not what it executes) names microbatch
    M on the last rank and extra forwards when M < P (torch 2.13); its executed order
    (``_step_microbatches``: min(M, S - stage) forwards, then B, F alternately) has neither. So: every
    rank but the last equals the IR op by op for M >= P, and the last rank equals the IR with its
    forwards' microbatch shifted back by one."""
    for P in range(1, 5):
        for M in range(P, 9):
            got, want = ours(build("pipedream-flush", P, M)), torch_1f1b(P, M)
            for r in range(P - 1):
                assert got[r] == want[r], (P, M, r)
            assert got[P - 1] == [(k, s, b - 1 if k == "F" else b) for k, s, b in want[P - 1]], (P, M)


def torch_runtime_loads(path, P: int, S: int, M: int):
    """torch's ``_PipelineScheduleRuntime._load_csv`` on a stand-in (no stages, no process group):
    validation, lowering to send/recv, then torch's own dry-run simulator must find no deadlock."""
    rt = object.__new__(ts._PipelineScheduleRuntime)
    rt.pipeline_order, rt._stages, rt._defer_pp_recv = {}, [], False
    rt.pp_group_size, rt._num_stages, rt._n_microbatches = P, S, M
    rt._load_csv(str(path))
    p2p = {
        r: [a for a in acts if a.computation_type.value not in ("UNSHARD", "RESHARD", "REDUCE_GRAD")]
        for r, acts in rt.pipeline_order_with_comms.items()
    }  # torch's dry run knows compute and send/recv only
    assert sum(a.computation_type.value.startswith("SEND") for acts in p2p.values() for a in acts) > 0
    ts._simulate_comms_compute(p2p, lambda s: rt.stage_index_to_group_rank[s], S)
    return rt


@pytest.mark.parametrize(
    "name,stages,M,opts",
    [
        ("pipedream-flush", 4, 6, {}),
        ("gpipe", 3, 4, {}),
        ("interleaved-1f1b", 6, 5, {"chunks": 2}),
        ("looped-bfs", 4, 3, {"chunks": 2}),
        ("zb-h1", 3, 5, {}),
    ],
)
def test_csv_round_trip_and_torch_runtime_loads_it(tmp_path, name, stages, M, opts):
    sched = build(name, stages, M, **opts)
    path = tmp_path / f"{name}.csv"
    text = to_torch_csv(sched, path)
    assert text.splitlines()[0].split(",")[0] == "0F0"
    back = from_torch_csv(path)
    validate(back)
    assert ours(back) == ours(sched) and back.stage_workers == sched.stage_workers
    assert simulate(back, fwd=1, bwd=2).makespan == pytest.approx(simulate(sched, fwd=1, bwd=2).makespan)
    rt = torch_runtime_loads(path, sched.num_workers, stages, M)
    assert compute_only(rt.pipeline_order) == ours(sched)
    comms = tmp_path / f"{name}-comms.csv"  # torch's lowered form (sends, receives, reduce_grad) reads back too
    ts._PipelineScheduleRuntime._dump_csv(rt, str(comms), format="compute_comms")
    assert "SEND_F" in comms.read_text() and ours(from_torch_csv(comms)) == ours(sched)
    with pytest.raises(ValueError, match="exists"):
        to_torch_csv(sched, path)


def test_torch_dumped_schedule_simulates_with_real_costs(tmp_path):
    """A schedule torch builds (interleaved zero bubble, 2 ranks x 2 stages) dumped by torch's own
    ``_dump_csv`` reads back, validates and simulates with per-stage costs."""
    me = SimpleNamespace(
        pipeline_order={
            r: ts.ScheduleInterleavedZeroBubble._calculate_single_rank_operations(
                SimpleNamespace(
                    pp_group_size=2,
                    n_local_stages=2,
                    _n_microbatches=4,
                    number_of_rounds=2,
                    microbatches_per_round=2,
                    _stages=[None] * 2,
                ),
                r,
            )
            for r in range(2)
        }
    )
    path = tmp_path / "izb.csv"
    ts.PipelineScheduleMulti._dump_csv(me, str(path))
    sched = from_torch_csv(path, name="torch-izb")
    assert ours(sched) == compute_only(me.pipeline_order)
    assert sched.split_backward and sched.stage_workers == ((0,), (1,), (0,), (1,))
    res = simulate(sched, fwd=[1.0, 2.0, 1.0, 2.0], bwd=[2.0, 4.0, 2.0, 4.0])
    assert res.makespan >= 4 * (3 + 6)  # a rank's compute: 4 microbatches x (F + B) of its two stages


def test_bad_csv_and_unsupported_exports_say_why(tmp_path):
    with pytest.raises(ValueError, match="row 1 cell 2: Invalid action string"):
        from_torch_csv("0F0,zz\n1F0")
    with pytest.raises(ValueError, match="stage 0 appears on ranks 0 and 1"):
        from_torch_csv("0F0,0B0\n0F1,0B1")
    with pytest.raises(ValueError, match="no such schedule CSV"):
        from_torch_csv(tmp_path / "missing.csv")
    with pytest.raises(ValueError, match="one update per stage"):
        to_torch_csv(build("pipedream", 2, 4))
    with pytest.raises(ValueError, match="replicated stage"):
        to_torch_csv(build("dp-bsp", 2, 4, workers=2))
    with pytest.raises(ValueError, match="other workers"):
        to_torch_csv(build("fsdp", 2, 2, workers=2))


def test_zb_h1_equals_torch_interleaved_zero_bubble_with_one_stage_per_rank():
    """For M >= P (with fewer microbatches than ranks the two orders differ)."""
    for P in range(1, 5):
        for M in range(P, 10):
            assert ours(build("zb-h1", P, M)) == torch_looped(ts.ScheduleInterleavedZeroBubble, P, 1, M), (P, M)

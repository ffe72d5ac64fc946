"""The one dataflow module: kind codes, the op key, the edges both the validator and the simulator
read, and the in-flight counter."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.schedules import Op, Schedule, ScheduleError, build, validate
from workbench.schedules import dataflow as dfm
from workbench.schedules.dataflow import KIND_CODES, in_flight_peaks, op_key, peak_in_flight, producer_keys, split_key


def test_kind_codes_have_one_home():
    from workbench.simulation import costs

    assert costs.KIND_CODES is KIND_CODES
    assert [KIND_CODES[k] for k in ("F", "B", "BI", "BW", "STEP", "AR")] == list(range(6))
    assert costs.KindCode is dfm.KindCode  # the simulator charges by the dataflow's codes
    assert (
        costs.KindCode.F,
        costs.KindCode.B,
        costs.KindCode.BI,
        costs.KindCode.BW,
        costs.KindCode.STEP,
        costs.KindCode.AR,
    ) == tuple(range(6))


def test_op_key_round_trips():
    S, U = 3, 10
    codes = {op_key(k, s, u, S, U) for k in range(4) for s in range(S) for u in range(U)}
    assert codes == set(range(4 * S * U))
    assert split_key(op_key(2, 1, 7, S, U), S, U) == (2, 1, 7)


def test_producer_keys_follow_the_rules():
    """S = 2 stages, U = 4 units of k = 2 segments; stage 1 splits its backward (BI present)."""
    S, U, k = 2, 4, 2
    key = lambda kind, s, u: op_key(KIND_CODES[kind], s, u, S, U)  # noqa: E731
    present = np.zeros(4 * S * U, dtype=bool)
    for u in range(U):
        present[[key("F", 0, u), key("F", 1, u), key("B", 0, u), key("BI", 1, u), key("BW", 1, u)]] = True
    rows = producer_keys(np.array([key("F", 1, 3), key("B", 0, 2), key("BW", 1, 1), key("F", 0, 0)]), S, U, k, present)
    got = [sorted(int(p) for p in row if p >= 0) for row in rows]
    assert got == [
        sorted([key("F", 0, 3), key("F", 1, 2)]),  # previous stage, previous segment (3 = b1 j1)
        sorted([key("F", 0, 2), key("BI", 1, 2), key("B", 0, 3)]),  # own F, next stage's BI, next segment
        [key("BI", 1, 1)],
        [],
    ]


def _reference_peak(order) -> int:
    live, peak = set(), 0
    for kind, s, u in order:
        if kind == "F":
            live.add((s, u))
            peak = max(peak, len(live))
        elif kind in ("B", "BW"):
            live.discard((s, u))
    return peak


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["F", "B", "BI", "BW", "STEP"]), st.integers(0, 2), st.integers(0, 3))))
def test_in_flight_counter_matches_a_set_walk(order):
    """Repeated forwards, backwards without a forward and ignored kinds included."""
    assert peak_in_flight(order) == _reference_peak(order)


def test_in_flight_peaks_count_each_sequence_alone():
    kinds = np.array([KIND_CODES[k] for k in "F F B F B B F F F".split()])
    items = np.array([0, 1, 0, 0, 1, 0, 0, 1, 2])
    # sequence 0: F0 F1 B0 (peak 2); sequence 1: F0 B1 B0 (peak 1); sequence 2: F0 F1 F2 (peak 3); one empty
    assert in_flight_peaks(kinds, items, np.array([0, 3, 6, 6, 9])).tolist() == [2, 1, 0, 3]


def _remote_pair() -> Schedule:
    """Worker 1 computes stage 0 with worker 0's weights: version 0 for microbatch 2 (its gradient
    goes to worker 0's STEP#0), then version 1 for microbatch 1 (it waits for that STEP)."""
    w0 = (Op("F", 0, 0, 0), Op("B", 0, 0, 0), Op("STEP", 0, step=0))
    w1 = tuple(
        Op(kind, 0, b, v, weights_worker=0) for kind, b, v in (("F", 2, 0), ("B", 2, 0), ("F", 1, 1), ("B", 1, 1))
    )
    return Schedule("remote", 1, 2, 3, (w0, w1), ((0,),), update="sync")


@pytest.mark.parametrize("make", [_remote_pair, lambda: build("fsdp", 3, 4), lambda: build("dp-bsp", 2, 3, workers=2)])
def test_validator_and_simulator_read_the_same_edges(make):
    """Schedule.dataflow is derived once and cached: the op graph's edges are exactly its edges."""
    from workbench.simulation.costs import unit_costs
    from workbench.simulation.edges import build_graph

    sched = make()
    validate(sched)
    df = sched.dataflow
    assert sched.dataflow is df
    g = build_graph(
        sched,
        unit_costs(sched, 1.0, 2.0, None, 0.0, weight_fetch=0.0, step_ms=0.0, latency_ms=0.0, op_overhead_ms=0.0),
    )
    got = sorted((p, c) for p in range(g.N) for c in g.cons_idx[g.cons_ptr[p] : g.cons_ptr[p + 1]])
    assert got == sorted(zip(df.src.tolist(), df.dst.tolist()))


def test_remote_weight_edges():
    """The version-1 read waits for the owner's STEP#0; the version-0 backward pushes to it."""
    sched = _remote_pair()
    df, flat = sched.dataflow, [op for ops in sched.ops for op in ops]
    edges = {(str(flat[p]), str(flat[c])) for p, c in zip(df.src.tolist(), df.dst.tolist())}
    assert ("STEP0#0", "F0.1@v1") in edges and ("B0.2@v0", "STEP0#0") in edges
    assert ("STEP0#0", "F0.2@v0") not in edges


def test_a_remote_read_of_a_version_its_owner_never_creates_is_named():
    w0 = (Op("F", 0, 0, 0), Op("B", 0, 0, 0), Op("STEP", 0, step=0))
    w1 = (Op("F", 0, 1, 2, weights_worker=0), Op("B", 0, 1, 2, weights_worker=0))
    with pytest.raises(ScheduleError, match="reads version 2 of stage 0 from worker 0, which runs no STEP 1"):
        validate(Schedule("remote", 1, 2, 2, (w0, w1), ((0,),), update="sync"))


def test_dataflow_imports_nothing_of_the_workbench():
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(dfm))
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m.startswith("workbench") or m == ""], imported

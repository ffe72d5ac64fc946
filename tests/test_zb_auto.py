"""The zero-bubble automatic scheduler (``zb-1p``, ``zb-2p``, ``zb-auto``) against the authors' own
(sail-sg/zero-bubble-pipeline-parallelism, ``zb.py``'s heuristic), whose orders, makespans and
longest per-stage spans ``scripts/record_zero_bubble.py`` recorded in ``tests/data/zero_bubble/zb.json``
on a grid of P, M, per-op costs (F, B, W, C) and memory limits.

* the reference orders replayed through the workbench's simulator take the reference's makespan;
* at every grid point ours is no longer, in the authors' timing and in the simulator, and holds no
  more live microbatches than theirs (F to W) and no more than the limit;
* closed forms at unit costs (ZB-1p no longer than ZB-H1, ZB-2p without bubble), validity, planning
  at the simulator's costs, bad input.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd
import pytest

from workbench.profiling.measure import Profile
from workbench.schedules import build, in_flight_peak, spec, validate
from workbench.schedules.dataflow import peak_in_flight
from workbench.schedules.generators import assign_versions, insert_updates, stage_layout
from workbench.schedules.vshape_order import SplitCosts
from workbench.schedules.zb_auto import KNOBS, Heuristic, plan_orders, spans
from workbench.simulation import simulate
from workbench.simulation.costed_build import build_for_simulation

DATA = Path(__file__).parent / "data" / "zero_bubble" / "zb.json"
CASES = json.loads(DATA.read_text())["cases"]
REL = 1e-9  # both sum the same float durations, maybe in another order


def point_id(c: dict) -> str:
    return f"P{c['P']}-M{c['M']}-{c['F']},{c['B']},{c['W']},{c['C']}-lim{c['limit']}"


def grid(fast: bool):
    small = [c for c in CASES if c["P"] == 4 and c["M"] == 8]
    chosen = small if fast else [c for c in CASES if c not in small]
    marks = () if fast else (pytest.mark.slow,)
    return [pytest.param(c, id=point_id(c), marks=marks) for c in chosen]


def straight_profile(P: int, f: float, b: float, w: float) -> Profile:
    """P layers, one per stage: forward f, input gradient b, weight gradient w (ms)."""
    df = pd.DataFrame(
        dict(
            name=[f"l{i}" for i in range(P)],
            fwd_ms=[float(f)] * P,
            bwd_ms=[float(b + w)] * P,
            act_bytes=[0.0] * P,
            param_bytes=[0.0] * P,
            bwd_input_ms=[float(b)] * P,
            bwd_weight_ms=[float(w)] * P,
        )
    )
    return Profile(df, {"name": "straight-split"})


def sim_kwargs(c: dict) -> dict:
    """The simulator charging F, B (BI), W (BW) per op and C per message between workers."""
    return dict(
        profile=straight_profile(c["P"], c["F"], c["B"], c["W"]), microbatch_fraction=1.0, latency_ms=float(c["C"])
    )


def costs_of(c: dict) -> SplitCosts:
    return SplitCosts.of((c["F"], c["B"], c["W"], c["C"]), c["P"])


def compute_orders(sched) -> list[list[tuple]]:
    return [[(o.kind, o.stage, o.microbatch) for o in ops if o.kind in ("F", "BI", "BW")] for ops in sched.ops]


def check_point(c: dict) -> None:
    P, M, lim = c["P"], c["M"], c["limit"]
    assert c["orders"] is not None, "the recorded grid has a point the authors' heuristic could not fit"
    ref = [[tuple(k) for k in o] for o in c["orders"]]
    ref_makespan, ref_span = spans(ref, costs_of(c))
    assert ref_makespan == pytest.approx(c["makespan"], rel=REL) and ref_span == pytest.approx(
        c["reference_metric"], rel=REL
    )
    for objective, theirs in (("makespan", c["makespan"]), ("span", c["reference_metric"])):
        sched = build("zb-auto", P, M, costs=(c["F"], c["B"], c["W"], c["C"]), mem_limit=lim, objective=objective)
        ours = spans(compute_orders(sched), costs_of(c))
        assert ours[0 if objective == "makespan" else 1] <= theirs * (1 + REL), objective
        simulated = simulate(sched, **sim_kwargs(c)).makespan
        assert simulated == pytest.approx(ours[0], rel=REL)
        if objective == "makespan":
            assert simulated <= c["makespan"] * (1 + REL)
        peak = max(in_flight_peak(ops) for ops in sched.ops)
        assert peak <= lim and peak <= max(c["peak_chunks"])


@pytest.mark.parametrize("c", grid(fast=True))
def test_no_longer_than_the_authors_scheduler_at_no_more_memory_fast(c):
    check_point(c)


@pytest.mark.parametrize("c", grid(fast=False))
def test_no_longer_than_the_authors_scheduler_at_no_more_memory(c):
    check_point(c)


@pytest.mark.slow
def test_reference_orders_replay_to_their_makespan_in_the_simulator():
    """The simulator times the authors' orders as their scheduler does (every recorded point)."""
    for c in CASES:
        ref = [[tuple(k) for k in o] for o in c["orders"]]
        sched = plan_free_schedule(c["P"], c["M"], ref)
        assert simulate(sched, **sim_kwargs(c)).makespan == pytest.approx(c["makespan"], rel=REL), point_id(c)


def plan_free_schedule(P: int, M: int, orders):
    """A zb-auto schedule with its orders replaced (same layout, updates and versions; the orders' own
    peak as the in-flight bound)."""
    layout = stage_layout(P)
    ops = assign_versions(insert_updates(orders, layout, lambda s, b: 0, lambda s: 1), "sync")
    peak = max(peak_in_flight(o) for o in orders)
    sched = dataclasses.replace(
        build("zb-auto", P, M), ops=tuple(tuple(o) for o in ops), name="reference", max_in_flight=(peak,) * P
    )
    validate(sched)
    return sched


def test_the_grid_has_points_where_ours_is_strictly_shorter_and_the_reference_replays():
    """Not a copy of the reference: on some points the candidates beat it (P = 4, M = 8 part)."""
    shorter = 0
    for c in CASES:
        if c["P"] != 4 or c["M"] != 8:
            continue
        o = plan_orders(4, 8, costs_of(c), c["limit"])
        shorter += spans(o, costs_of(c))[0] < c["makespan"] * (1 - 1e-9)
    assert shorter > 0
    c = next(c for c in CASES if c["P"] == 4 and c["M"] == 8 and c["C"] > 0)
    sched = plan_free_schedule(4, 8, [[tuple(k) for k in o] for o in c["orders"]])
    assert simulate(sched, **sim_kwargs(c)).makespan == pytest.approx(c["makespan"], rel=REL)


@pytest.mark.parametrize("P", [2, 3, 4, 5])
def test_unit_costs_zb_1p_no_longer_than_zb_h1_and_zb_2p_has_no_bubble(P):
    """T_F = T_B = T_W = 1, M = 3P: ZB-1p at most ZB-H1's makespan (the paper's handcrafted schedule at
    the same memory); ZB-2p's longest per-stage span is the work alone, 3M (zero bubble)."""
    M = 3 * P
    one = build("zb-1p", P, M)
    assert simulate(one, 1.0, 2.0).makespan <= simulate(build("zb-h1", P, M), 1.0, 2.0).makespan
    assert max(in_flight_peak(ops) for ops in one.ops) <= P
    two = build("zb-2p", P, M, objective="span")
    assert spans(compute_orders(two), SplitCosts.of(None, P))[1] == 3 * M
    assert max(in_flight_peak(ops) for ops in two.ops) <= 2 * P


def test_every_heuristic_setting_is_valid_and_within_memory():
    """Each of the eight settings alone gives a complete order (every F has its B and W) within the
    limit, with no deadlock (validate)."""
    c = SplitCosts.of((3.0, 2.0, 1.5, 0.25), 6)
    for lim in (1, 3, 6, 12):
        for knobs in KNOBS:
            orders = Heuristic(6, 10, c, lim, knobs).orders()
            assert sorted(k for o in orders for k in o) == sorted(
                (k, s, b) for k in ("F", "BI", "BW") for s in range(6) for b in range(10)
            )
            assert max(peak_in_flight(o) for o in orders) <= lim
            plan_free_schedule(6, 10, orders)


def test_registered_with_costs_steps_and_memory():
    assert spec("zb-1p").costs_from == spec("zb-2p").costs_from == spec("zb-auto").costs_from == "split"
    sched = build("zb-2p", 4, 8, steps=3, costs="1,2,1,0.5")
    validate(sched)
    assert sched.microbatches == 24 and sched.options["memory_limit"] == 8
    assert sched.options["planned_costs"] == ((1.0,) * 4, (2.0,) * 4, (1.0,) * 4, 0.5)
    assert build("zb-auto", 4, 8, mem_limit=3).options["memory_limit"] == 3
    assert max(in_flight_peak(ops) for ops in build("zb-auto", 4, 8, mem_limit=2).ops) <= 2


def test_build_for_simulation_plans_at_the_simulated_costs():
    c = {"P": 4, "F": 2.0, "B": 3.0, "W": 1.0, "C": 1.0}
    kw = sim_kwargs(c)
    auto = build_for_simulation("zb-1p", 4, 8, kw)
    given = build("zb-1p", 4, 8, costs=(2.0, 3.0, 1.0, 1.0))
    assert auto.ops == given.ops
    assert simulate(auto, **kw).makespan <= simulate(build("zb-1p", 4, 8), **kw).makespan


def test_bad_input_says_what_to_fix():
    with pytest.raises(ValueError, match="mem_limit must be a positive int"):
        build("zb-auto", 4, 8, mem_limit=0)
    with pytest.raises(ValueError, match="one of"):
        build("zb-1p", 4, 8, objective="fastest")
    with pytest.raises(ValueError, match="F,B,W"):
        build("zb-2p", 4, 8, costs="quick")
    with pytest.raises(ValueError, match="objective must be one of"):
        plan_orders(4, 8, objective="fastest")

"""NCCL's matching and blocking rules checked on the runtime's communication plan
(workbench.runtime.transport.comm_plan) for every registered schedule, and the check's own power to fail."""

from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict

import pytest

from workbench.cost.plan import Plan
from workbench.runtime.executors.tied import TiedWeight, check_tied, combine_ranks, defer_steps
from workbench.runtime.transport import comm_plan
from workbench.runtime.transport.comm_plan import RankComm, check_nccl, ddp_order_problems, messages, rank_program
from workbench.schedules import REGISTRY, build, build_for_workers
from workbench.schedules.master import PRIORITIES, RULES

NAMED = {"priority": sorted(PRIORITIES), "rule": sorted(RULES)}
GRID = [(2, 4), (3, 6), (4, 8), (2, 8)]  # (workers, microbatches)
REPLICATED = [Plan.from_boundaries([1, 3], [2, 1]), Plan.from_boundaries([1, 3, 5], [1, 2, 1])]


def _variants(name: str) -> list[dict]:
    """The default options, every choice of an option with a closed set, and a larger count of the
    int options that shape the communication (chunks, steps, segments)."""
    sp = REGISTRY[name]
    out: list[dict] = [{}]
    for o in sp.options:
        if o.choices:
            out += [{o.name: c} for c in o.choices if c != o.default]
        elif o.name in NAMED:  # the master family's named priorities and rules
            out += [{o.name: c} for c in NAMED[o.name] if c != o.default]
        elif o.name in ("chunks", "segments"):
            out.append({o.name: 3})
        elif o.name == "steps":
            out.append({o.name: 2})
    if "seq_len" in {o.name for o in sp.options}:
        out = [dict(v, seq_len=24) for v in out]
    return out


def _schedules(name: str):
    """(label, schedule) over the grid, the option variants and, where the schedule takes a
    partitioner's plan, plans with replicated stages."""
    sp = REGISTRY[name]
    for opts, (W, M) in itertools.product(_variants(name), GRID):
        try:
            yield f"{opts} W={W} M={M}", build_for_workers(name, W, M, options=opts)
        except ValueError:
            continue  # a shape the schedule refuses (e.g. fewer microbatches than stages)
    if sp.takes_plan:
        for plan in REPLICATED:
            yield f"replicas {[len(st.workers) for st in plan.stages]}", build(name, plan, 4)


PIPELINE = sorted(n for n, sp in REGISTRY.items() if sp.executor == "pipeline")


def _one_way(programs) -> list[str]:
    """Communicator and pair on which messages travel both ways (p2p_channel's promise)."""
    ways = defaultdict(set)
    for prog in programs:
        for e in prog:
            if e.what == "send":
                ways[(e.channel, min(e.rank, e.peer), max(e.rank, e.peer))].add((e.rank, e.peer))
    return [str(k) for k, v in ways.items() if len(v) > 1]


@pytest.mark.parametrize("name", PIPELINE)
def test_every_schedule_is_deadlock_free_and_matched_under_nccl(name):
    """Over an epoch of two minibatches, every receive is matched with the message it expects
    (label and bytes), collectives agree, no rank waits forever, whether a communicator's
    operations with each peer have a stream of their own or share one; each communicator carries
    a pair's messages one way only."""
    count = 0
    for label, sched in _schedules(name):
        count += 1
        assert check_nccl(sched) == [], f"{name} {label}"
        assert check_nccl(sched, per_pair=False) == [], f"{name} {label} (one stream per communicator)"
        msgs = messages(sched)
        programs = [rank_program(sched, r, msgs=msgs) for r in range(sched.num_workers)]
        assert _one_way(programs) == [], f"{name} {label}"
    assert count >= 3, f"{name}: only {count} shapes built"


@pytest.mark.parametrize("name", PIPELINE)
def test_tied_first_and_last_stage_all_reduce_in_one_order(name):
    """With the first and the last stage's weight tied (combined at every update, test_tied's
    setting), the combine's all-reduce joins the check; schedules that refuse a tie are skipped."""
    sp = REGISTRY[name]
    opts = {"seq_len": 24} if "seq_len" in {o.name for o in sp.options} else {}
    sched = build_for_workers(name, 4, 8, options=opts)
    if sched.num_stages < 2:
        pytest.skip("one stage")
    tie = TiedWeight(((0, "a"), (sched.num_stages - 1, "b")), 4)
    sched = defer_steps(sched, (tie,))
    try:
        check_tied(sched, (tie,))
    except ValueError:
        pytest.skip("the runtime refuses a tie under this schedule")
    ties = [(tie.stages, combine_ranks(sched, tie))]
    programs = [rank_program(sched, r, ties=ties) for r in range(sched.num_workers)]
    if any(len(ranks) > 1 for ranks in ties[0][1]):
        assert any(e.what == "coll" and e.label[0] == "tied" for p in programs for e in p)
    assert check_nccl(sched, ties=ties) == []


def test_data_parallel_backwards_run_in_one_order_on_every_rank():
    for W, M in GRID:
        sched = build_for_workers("dp-bsp", W, M)
        assert ddp_order_problems(sched) == []
    moved = dataclasses.replace(sched, ops=[sched.ops[0], list(reversed(sched.ops[1]))] + list(sched.ops[2:]))
    assert ddp_order_problems(moved) != []


def test_the_runtime_sends_where_the_plan_says_and_receives_in_op_order():
    """RankComm (what the executors read) agrees with the schedule's placement of the consumers."""
    sched = build_for_workers("zb-v", 3, 6)
    where = sched.where()
    for r, ops in enumerate(sched.ops):
        comm = RankComm(sched, r)
        assert [m.recv_op for m in comm.recvs] == sorted(m.recv_op for m in comm.recvs)
        for i, op in enumerate(ops):
            if op.kind == "F" and op.stage < sched.num_stages - 1:
                assert comm.dst(i, 0) == where[("F", op.stage + 1, op.microbatch)]
            if op.kind in ("B", "BI") and op.stage > 0:
                assert comm.dst(i, 1) == where[("F", op.stage - 1, op.microbatch)]


# ---- the check can fail ------------------------------------------------------------------------
def test_swapped_sends_are_reported_as_a_mismatch():
    sched = build_for_workers("pipedream-flush", 3, 4)
    programs = [rank_program(sched, r) for r in range(3)]
    prog = programs[1]
    i, j = [k for k, e in enumerate(prog) if e.what == "send" and e.peer == 2][:2]
    prog[i], prog[j] = dataclasses.replace(prog[j], id=i), dataclasses.replace(prog[i], id=j)
    prog[i].after, prog[j].after = prog[j].after, prog[i].after
    problems = check_nccl(sched, programs=programs)
    assert problems and "rank 2's receive of (0, 1, 0)" in problems[0] and "send of (0, 1, 1)" in problems[0]


def test_one_communicator_for_both_directions_deadlocks_interleaved_and_v_shapes(monkeypatch):
    """The runtime's former layout (one communicator for activations, one for gradients): an
    interleaved or V-shaped schedule sends both ways between a pair on one of them and deadlocks."""
    monkeypatch.setattr(comm_plan, "p2p_channel", lambda kind, src, dst: "act" if kind == 0 else "grad")
    for name in ("interleaved-1f1b", "zb-v", "dualpipev"):
        problems = check_nccl(build_for_workers(name, 2, 4))
        assert problems and problems[-1].startswith("deadlock: rank 0 at op"), name
    assert check_nccl(build_for_workers("pipedream-flush", 2, 4)) == []  # one way per pair: fine


def _direction(kind, src, dst):
    return ("act" if kind == 0 else "grad") + ("-up" if dst > src else "-down")


COARSER = {  # layout -> (p2p channel, fetch/push channel, schedule, options, W, M, per_pair, problem)
    "one group for both kinds": (lambda k, a, b: "p2p", None, "seq1f1b", {"seq_len": 24}, 2, 4, True, "deadlock"),
    "one per direction, peers on one stream": (
        _direction,
        None,
        "pp",
        {"rule": "parallelsim"},
        4,
        8,
        False,
        "deadlock",
    ),
    "one for all fetches, one for all pushes": (None, lambda w, s, a, b: w, "fsdp", {}, 2, 4, True, "deadlock"),
    "fetches per direction, not per stage": (
        None,
        lambda w, s, a, b: w + ("-up" if b > a else "-down"),
        "fslpp",
        {},
        4,
        8,
        True,
        "is matched with",
    ),
}


@pytest.mark.parametrize("layout", list(COARSER))
def test_coarser_communicator_layouts_fail_the_check(monkeypatch, layout):
    """docs/runtime.md's reasons for the runtime's layout: each coarser one fails somewhere."""
    p2p, remote, name, opts, W, M, per_pair, problem = COARSER[layout]
    if p2p is not None:
        monkeypatch.setattr(comm_plan, "p2p_channel", p2p)
    if remote is not None:
        monkeypatch.setattr(comm_plan, "remote_channel", remote)
    sched = build_for_workers(name, W, M, options=opts)
    assert any(problem in p for p in check_nccl(sched, per_pair=per_pair)), layout
    monkeypatch.undo()
    assert check_nccl(sched, per_pair=per_pair) == []


def test_collectives_in_different_orders_are_reported():
    sched = build("gpipe", Plan.from_boundaries([1, 3], [2, 2]), 4, steps=2)  # stages on workers {0, 1}, {2, 3}
    programs = [rank_program(sched, r) for r in range(sched.num_workers)]
    prog = programs[1]
    i, j = [k for k, e in enumerate(prog) if e.what == "coll" and e.label[0] == "AR"][:2]
    prog[i].label, prog[j].label = prog[j].label, prog[i].label
    problems = check_nccl(sched, programs=programs)
    assert any("issue different ones" in p for p in problems)


def test_a_missing_receive_is_a_deadlock():
    sched = build_for_workers("gpipe", 2, 4)
    programs = [rank_program(sched, r) for r in range(2)]
    k = next(k for k, e in enumerate(programs[1]) if e.what == "recv")
    programs[1][k].channel = "elsewhere"
    problems = check_nccl(sched, programs=programs)
    assert problems[-1].startswith("deadlock")

"""NCCL's rules (workbench.runtime.transport.nccl_model) checked on the calls the real executors issue
(recorded by workbench.runtime.transport.dry_run) for every registered pipeline schedule over the grid,
and mutations of the executors and the transport that each make the check fail."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from workbench.cost.plan import Plan
from workbench.runtime import prepare
from workbench.runtime.executors import fetch, pipeline, segment_executor, segments
from workbench.runtime.transport import comm, comm_plan, dry_run
from workbench.runtime.transport.comm_plan import RankComm, communicators, ddp_order_problems
from workbench.runtime.transport.nccl_model import check_nccl
from workbench.schedules import REGISTRY, build, build_for_workers
from workbench.schedules.master import PRIORITIES, RULES

NAMED = {"priority": sorted(PRIORITIES), "rule": sorted(RULES)}
GRID = [(2, 4), (3, 6), (4, 8), (2, 8)]  # (workers, microbatches)
REPLICATED = [Plan.from_boundaries([1, 3], [2, 1]), Plan.from_boundaries([1, 3, 5], [1, 2, 1])]
PIPELINE = sorted(n for n, sp in REGISTRY.items() if sp.executor == "pipeline")


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


def _schedules(name: str, grid=GRID):
    """(label, schedule) over the ``grid``, the option variants and, where the schedule takes a
    partitioner's plan, plans with replicated stages."""
    sp = REGISTRY[name]
    for opts, (W, M) in itertools.product(_variants(name), grid):
        try:
            yield f"{opts} W={W} M={M}", build_for_workers(name, W, M, options=opts)
        except ValueError:
            continue  # a shape the schedule refuses (e.g. fewer microbatches than stages)
    if sp.takes_plan:
        for plan in REPLICATED:
            yield f"replicas {[len(st.workers) for st in plan.stages]}", build(name, plan, 4)


def _two_way(traces) -> list[str]:
    """Communicators (group and pair) on which both ranks send: each is to carry messages one way."""
    senders: dict[tuple, set[int]] = {}
    for r, calls in enumerate(traces):
        for c in calls:
            if c.what == "send":
                senders.setdefault((c.group, *sorted((r, c.peer))), set()).add(r)
    return [str(k) for k, v in senders.items() if len(v) > 1]


def _check_recorded(name: str, label: str, sched) -> None:
    rec = dry_run.record(sched)
    assert rec.errors == [], f"{name} {label}"
    assert check_nccl(rec.traces) == [], f"{name} {label}"
    assert check_nccl(rec.traces, per_pair=False) == [], f"{name} {label} (one stream per group)"
    assert _two_way(rec.traces) == [], f"{name} {label}"
    exchanged = [c for t in rec.traces for c in t if c.what in ("send", "coll") and c.group != "world"]
    assert exchanged, f"{name} {label}: no message or collective recorded"


SEGMENTED = sorted(n for n in PIPELINE if "segments" in {o.name for o in REGISTRY[n].options})


@pytest.mark.parametrize("name", [n for n in PIPELINE if n not in SEGMENTED])
def test_every_schedule_the_executors_run_is_matched_and_deadlock_free_under_nccl(name):
    """The executors' recorded calls over an epoch of two minibatches: every receive is matched with
    the message it posted for (tag and bytes), collectives and creations agree, no rank waits forever
    (communicators created lazily and blocking, waits blocking the host), whether a pair's operations
    in a group have a stream of their own or all peers share one; each communicator carries one way."""
    count = 0
    for label, sched in _schedules(name, GRID[:3]):
        count += 1
        _check_recorded(name, label, sched)
    assert count >= 3, f"{name}: only {count} shapes built"


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n in PIPELINE if n not in SEGMENTED])
def test_every_schedule_with_more_microbatches_per_worker(name):
    """The rest of the grid (2 workers, 8 microbatches: the longest steady state) for every variant."""
    for opts in _variants(name):
        try:
            sched = build_for_workers(name, *GRID[3], options=opts)
        except ValueError:
            continue
        _check_recorded(name, f"{opts} W=2 M=8", sched)


@pytest.mark.parametrize("name", SEGMENTED)
def test_every_segmented_schedule_is_matched_and_deadlock_free_at_its_default_options(name):
    """The seq1f1b family (the segment executor, a transformer per rank: slower to run) at its
    default options at 2, 3 and 4 workers; every option variant over the grid in the slow test below."""
    for W, M in GRID[:3]:
        sched = build_for_workers(name, W, M, options={"seq_len": 24})
        _check_recorded(name, f"W={W} M={M}", sched)


@pytest.mark.slow
@pytest.mark.parametrize("name", SEGMENTED)
def test_every_segmented_schedule_variant_is_matched_and_deadlock_free(name):
    for label, sched in _schedules(name):
        _check_recorded(name, label, sched)


def test_a_tied_first_and_last_stage_all_reduces_in_one_order():
    """The zoo GPT with its output projection tied to the embedding (first and last stage): the
    combine's all-reduce is among the recorded calls, and the check passes."""
    for name in ("gpipe", "pipedream-flush", "zb-h1"):
        sched = build_for_workers(name, 4, 8)
        rec = dry_run.record(sched, tied=True)
        assert rec.errors == [], name
        assert any(c.what == "coll" and c.group.startswith("tied0:") for c in rec.traces[0]), name
        assert check_nccl(rec.traces) == [], name


@pytest.mark.parametrize("name", ["pipedream", "pipedream-2bw", "model-parallel"])
def test_streamed_epochs_are_matched_and_deadlock_free(name, tmp_path):
    """``stream=True``: the epoch's minibatches as one pass of the schedule over all their
    microbatches (the executor's run_stream), at 2 and 4 workers."""
    for W in (2, 4):
        job = prepare(
            "toy-mlp", name, workers=W, microbatches=2 * W, batch_size=2 * W, steps=3, stream=True,
            dtype="float64", allow_oversubscribe=True, progress=False, evaluate=False, out=tmp_path / f"w{W}",
        )  # fmt: skip
        rec = dry_run.record_job(job, rounds=3)
        assert rec.errors == [] and check_nccl(rec.traces) == [], (name, W)
        assert any(c.what == "send" for c in rec.traces[0]), (name, W)


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
        rc = RankComm(sched, r)
        assert [m.recv_op for m in rc.recvs] == sorted(m.recv_op for m in rc.recvs)
        for i, op in enumerate(ops):
            if op.kind == "F" and op.stage < sched.num_stages - 1:
                assert rc.dst(i, 0) == where[("F", op.stage + 1, op.microbatch)]
            if op.kind in ("B", "BI") and op.stage > 0:
                assert rc.dst(i, 1) == where[("F", op.stage - 1, op.microbatch)]


def test_the_warm_up_order_lists_every_communicator_the_executors_use():
    """Every (group, pair) a rank sends or receives on, and every group it all-reduces on, after
    the warm-up is one :func:`communicators` lists (the warm-up creates them all, in its order)."""
    for name, W, M in (("fsdp", 3, 6), ("fslpp", 4, 8), ("zb-v", 3, 6)):
        sched = build_for_workers(name, W, M)
        listed = {(c.key, *sorted(c.ranks)) if c.p2p else (c.key,) for c in communicators([sched])}
        names = {
            c.key if isinstance(c.key, str) else f"replicas:{','.join(map(str, c.key))}" for c in communicators([sched])
        }
        for r, calls in enumerate(dry_run.record(sched).traces):
            for c in calls:
                if c.what in ("send", "recv"):
                    assert (c.group, *sorted((r, c.peer))) in listed, (name, c)
                elif c.what == "coll" and c.group != "world":
                    assert c.group in names, (name, c)


# ---- mutations: each makes the check fail --------------------------------------------------------
def test_without_the_warm_up_master_schedules_deadlock_at_communicator_creation(monkeypatch):
    """torch's lazy, blocking creation of a pair's communicator: without the warm-up, fsdp (every
    W) and fslpp (W = 4) create their fetch and push communicators in orders that wait for each
    other (rank 0 at push0-down while rank 1 is at push1-up)."""
    monkeypatch.setattr(pipeline.PipelineExecutor, "warm_up", lambda self: None)
    for name, W in (("fsdp", 2), ("fsdp", 3), ("fsdp", 4), ("fslpp", 4)):
        problems = dry_run.problems(build_for_workers(name, W, 2 * W))
        assert problems and problems[-1].startswith("deadlock") and "creating the communicator" in problems[-1]
    monkeypatch.undo()
    assert dry_run.problems(build_for_workers("fsdp", 2, 4)) == []


def test_two_sends_reordered_in_the_executor_are_a_mismatch(monkeypatch):
    """Rank 0 sends its first cross-rank activation after its next one (the executor's send order)."""
    held: dict = {}
    send = comm.P2P.send

    def late_first(self, key, tensors, dst):
        if self.rank == 0 and dst != self.rank and key[0] == 0 and not held.get("done"):
            if "first" not in held:
                held["first"] = (key, tensors, dst)
                return
            send(self, key, tensors, dst)
            held["done"] = True
            return send(self, *held["first"])
        return send(self, key, tensors, dst)

    monkeypatch.setattr(comm.P2P, "send", late_first)
    for name, W in (("pipedream-flush", 3), ("interleaved-1f1b", 4)):
        held.clear()
        problems = dry_run.problems(build_for_workers(name, W, 2 * W))
        assert any("rank 1's receive of tag 0 " in p and "is matched with its send of tag" in p for p in problems), name


def test_a_receive_posted_to_the_wrong_peer_fails(monkeypatch):
    """The transport posts a receive to another rank than the sender: on a pair's group NCCL (and
    the recorder) refuse it; on a group of all ranks (the master family's fetches) it deadlocks."""
    post = comm.P2P.post_next if hasattr(comm.P2P, "post_next") else comm.P2P._post_next

    def wrong(self):
        key, src, specs = self.plan[self.next_post]
        self.plan[self.next_post] = (key, (src + 1) % 3 if (src + 1) % 3 != self.rank else (src + 2) % 3, specs)
        return post(self)

    monkeypatch.setattr(comm.P2P, post.__name__, wrong)
    problems = dry_run.problems(build_for_workers("pipedream-flush", 3, 6))
    assert any("not a member" in p or "no process group" in p for p in problems), problems
    monkeypatch.undo()
    one = fetch.RemoteWeights._post_one

    def wrong_owner(self):
        s, b, v, owner = self.plan.fetches[self.next_fetch]
        others = [r for r in range(3) if r not in (owner, self.rank)]
        self.plan.fetches[self.next_fetch] = (s, b, v, others[0])
        return one(self)

    monkeypatch.setattr(fetch.RemoteWeights, "_post_one", wrong_owner)
    problems = dry_run.problems(build_for_workers("fsdp", 3, 6))
    assert problems and (problems[-1].startswith("deadlock") or "is matched with" in problems[0]), problems


def _share(monkeypatch, channel) -> None:
    """Every executor and the groups use ``channel(kind, src, dst)`` as the communicator's name."""
    for mod in (comm_plan, comm, segments, pipeline, segment_executor):
        if hasattr(mod, "p2p_channel"):
            monkeypatch.setattr(mod, "p2p_channel", channel)


@pytest.mark.parametrize("W", [2, 3, 4])
def test_two_kinds_on_one_communicator_per_pair_deadlock(monkeypatch, W):
    """Activations and gradients of a pair on one communicator (both ways): every schedule with a
    backward that overlaps the next forward deadlocks, at every worker count (each rank's send waits
    for the other's receive, or a receive is matched with the other kind)."""
    _share(monkeypatch, lambda kind, src, dst: f"p2p:{min(src, dst)}-{max(src, dst)}")
    for name in ("pipedream-flush", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipev", "seq1f1b"):
        opts = {"seq_len": 24} if name.startswith("seq") else {}
        problems = dry_run.problems(build_for_workers(name, W, 2 * W, options=opts))
        assert problems, (name, W)


def test_one_communicator_for_both_directions_deadlocks_interleaved_and_v_shapes(monkeypatch):
    """One communicator per kind for all pairs (not per ordered pair): interleaved and V-shaped
    schedules send both ways between a pair on one of them and deadlock."""
    _share(monkeypatch, lambda kind, src, dst: "act" if kind == 0 else "grad")
    for name in ("interleaved-1f1b", "zb-v", "dualpipev"):
        problems = dry_run.problems(build_for_workers(name, 2, 4))
        assert problems and problems[-1].startswith("deadlock"), name


def test_fetches_per_direction_not_per_stage_reach_fslpp_in_another_order(monkeypatch):
    """One communicator per direction for all stages' fetches: fslpp's fetches from an owner of two
    stages reach the consumer in another order than it reads them (a receive matched with the other
    stage's weights)."""
    names = ("fetch-up", "fetch-down", "push-up", "push-down")
    monkeypatch.setattr(fetch, "remote_channel", lambda w, s, a, b: w + ("-up" if b > a else "-down"))
    monkeypatch.setattr(comm_plan, "remote_channel", fetch.remote_channel)
    monkeypatch.setattr(comm_plan, "remote_channels", lambda sched: list(names))
    problems = dry_run.problems(build_for_workers("fslpp", 4, 8))
    assert any("is matched with" in p for p in problems), problems

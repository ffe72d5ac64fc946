"""``cost="pipedream"`` against PipeDream's own optimizer (msr-fiddle/pipedream,
``optimizer/optimizer_graph_hierarchical.py``), recorded by scripts/record_pipedream_optimizer.py
on the profiles that ship in workbench/profiling/data/pipedream (flat and hierarchical, straight and
replicated, fewer machines, memory limit, no cut costs).

* The states: same count and order, and per state the same cumulative compute, activation,
  parameter and output sizes (relative 1e-12: PipeDream sums over a Python set, so the last bits
  follow that set's order).
* With PipeDream's candidate order and its cumulative sums replayed (its DP tries split states in a
  Python set's memory-address order, and the last bits of its sums decide exact ties), the
  configuration is bit for bit its own: stages (state ranges and node sets), replication factors
  and every level's stage list.
* With our own order (ascending), the times are the same: where the configuration differs, both
  are optima of the same objective.
* Times: "time per stage in pipeline", its DP estimate and the single-machine time, relative 1e-6.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from workbench.cost.plan import Plan
from workbench.cost.topology import Topology
from workbench.partitioning.antichain import antichain_states
from workbench.partitioning.pipedream_optimizer import (
    Options,
    Settings,
    optimize_states,
    profile_states,
)
from workbench.partitioning.search import partition
from workbench.profiling.graph import LayerGraph
from workbench.profiling.measure import Profile
from workbench.profiling.pipedream import SHIPPED, shipped

DATA = Path(__file__).parent / "data" / "pipedream_optimizer"
RECORDS = sorted(p for p in DATA.glob("*.json*") if p.name.split("__")[0] in SHIPPED)
_STATES: dict = {}


def load(path: Path) -> dict:
    raw = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    rec = json.loads(raw)
    if not rec["finished"]:
        pytest.skip(f"PipeDream's optimizer did not finish {path.name} when recorded")
    return rec


def states(name: str):
    if name not in _STATES:
        _STATES[name] = profile_states(shipped(name))
    return _STATES[name]


def options(rec: dict) -> Options:
    f = rec["flags"]
    mem = float(f[f.index("--memory_size") + 1]) if "--use_memory_constraint" in f else None
    return Options("--straight_pipeline" in f, "--use_fewer_machines" in f, mem, rec["activation_compression_ratio"])


def test_every_shipped_profile_has_recordings():
    assert {p.name.split("__")[0] for p in RECORDS} == set(SHIPPED)
    assert len(RECORDS) >= 27


SUMS = {
    "compute_s": "state_compute_s",
    "activation": "state_activation",
    "parameters": "state_parameters",
    "output_activation": "state_output_activation",
}


@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name.split(".")[0])
def test_states_and_their_sums_equal_pipedreams(path):
    rec = load(path)
    st = states(rec["profile"])
    assert len(st) == rec["states"]
    for ours, theirs in SUMS.items():
        np.testing.assert_allclose(getattr(st, ours), rec[theirs], rtol=1e-12, atol=1e-15, err_msg=ours)


@pytest.mark.slow
@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name.split(".")[0])
def test_configuration_bit_for_bit_with_pipedreams_candidate_order(path):
    rec = load(path)
    st = replace(states(rec["profile"]), **{ours: np.array(rec[theirs], dtype=float) for ours, theirs in SUMS.items()})
    res = optimize_states(st, rec["machines"], rec["bandwidths"], options(rec), candidate_order=rec["candidate_order"])
    assert [[s, e] for s, e, _ in res.stages] == [x["states"] for x in rec["stages"]]
    assert [rep for *_, rep in res.stages] == [x["replicas"] for x in rec["stages"]]
    assert [sorted(n, key=lambda v: int(v[4:])) for n in res.stage_nodes] == [x["nodes"] for x in rec["stages"]]
    assert [list(lv) for lv in res.levels] == [[(s, e, r) for s, e, _, r in lv["stages"]] for lv in rec["levels"]]
    assert res.unused_machines == rec["unused_machines"][-1]
    assert res.pipeline_s == pytest.approx(rec["pipeline_s"], rel=1e-6)
    assert res.single_s == pytest.approx(rec["single_s"], rel=1e-6)
    assert res.single_s / res.data_parallel_s == pytest.approx(rec["dp_speedup"], rel=1e-6)
    own = optimize_states(states(rec["profile"]), rec["machines"], rec["bandwidths"], options(rec))
    assert own.pipeline_s == pytest.approx(rec["pipeline_s"], rel=1e-6)  # our order: a tied optimum at worst


@pytest.mark.slow
@pytest.mark.parametrize("path", RECORDS, ids=lambda p: p.name.split(".")[0])
def test_partition_cost_pipedream_equals_its_times(path):
    rec = load(path)
    opt = options(rec)
    topo = Topology(tuple(zip(rec["machines"], rec["bandwidths"])))
    plan = partition(
        shipped(rec["profile"]),
        topo,
        straight=opt.straight,
        use_fewer_workers=opt.use_fewer_machines,
        memory_bytes=opt.memory_bytes,
        cost="pipedream",
        pipedream=Settings(activation_compression_ratio=opt.activation_compression_ratio),
    )
    assert plan.meta["cost"] == "pipedream"
    assert plan.bottleneck_ms == pytest.approx(rec["pipeline_s"] * 1e3, rel=1e-6)
    assert plan.data_parallel_ms == pytest.approx(rec["single_s"] / rec["dp_speedup"] * 1e3, rel=1e-6)
    assert plan.meta["pipedream"]["dp_speedup"] == pytest.approx(rec["dp_speedup"], rel=1e-6)
    assert plan.num_workers == math.prod(rec["machines"]) - plan.meta["pipedream"]["unused_machines"]
    # every layer of the profile is in exactly one stage, in an order where the stages are contiguous
    prof = shipped(rec["profile"])
    nodes = plan.meta.get("layer_order") or list(prof.layers["node"])
    inputs = {n[0] for n in prof.meta["graph"]["nodes"] if n[1].startswith("Input")}  # not profile rows
    by_stage = [set(nodes[s.first : s.last + 1]) for s in plan.stages]
    for mine, theirs in zip(by_stage, plan.meta["pipedream"]["stage_nodes"]):
        assert set(theirs) - inputs <= mine
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again.meta["cost"] == "pipedream" and again.bottleneck_ms == plan.bottleneck_ms


def test_issue_example_vgg16_on_4x2():
    """PipeDream's own answer on 4 x 12 GB/s servers joined at 1.25 GB/s: 5 stages 4-1-1-1-1,
    157.4 ms per stage, 1.35x over its data parallelism; the workbench's model picks data parallelism."""
    topo = Topology(((4, 12e9), (2, 1.25e9)))
    pd_plan = partition(shipped("vgg16"), topo, cost="pipedream")
    assert [s.replicas for s in pd_plan.stages] == [4, 1, 1, 1, 1]
    assert pd_plan.bottleneck_ms == pytest.approx(157.438816, rel=1e-6)
    assert pd_plan.speedup_over_data_parallel == pytest.approx(1.3468572, rel=1e-6)
    ours = partition(shipped("vgg16"), topo, refine=False)
    assert ours.meta["cost"] == "workbench" and ours.num_stages == 1


def test_chain_profile_over_layers():
    """A profile without a graph is a chain; over="layers" ignores a graph.txt's DAG."""
    import pandas as pd

    df = pd.DataFrame(
        {
            "name": list("abcd"),
            "fwd_ms": [10.0, 1, 1, 10],
            "bwd_ms": [20.0, 2, 2, 20],
            "act_bytes": [1e6, 1e6, 1e6, 1e3],
            "param_bytes": [0.0, 0, 0, 1e6],
        }
    )
    plan = partition(Profile(df), Topology.flat(2, 1e9), cost="pipedream", straight=True)
    assert [(s.first, s.last) for s in plan.stages] == [(0, 1), (2, 3)]
    assert plan.bottleneck_ms == pytest.approx(33.0)  # (10 + 20 + 1 + 2) ms, cuts 2 MB / 1 GB/s = 2 ms
    flat = partition(shipped("resnet50"), Topology.flat(4, 12e9), cost="pipedream", pipedream=Settings(over="layers"))
    assert flat.meta["pipedream"]["over"] == "layers" and flat.meta["pipedream"]["states"] == len(shipped("resnet50"))


def test_bad_options_say_what_to_do():
    prof = shipped("alexnet")
    with pytest.raises(ValueError, match="cost must be one of workbench, pipedream"):
        partition(prof, Topology.flat(2, 1e9), cost="pd")
    with pytest.raises(ValueError, match="over must be 'antichains' or 'layers'"):
        Settings(over="nodes")
    with pytest.raises(ValueError, match="activation_compression_ratio must be a number > 0"):
        Settings(activation_compression_ratio=0)
    with pytest.raises(ValueError, match="no configuration"):
        partition(prof, Topology.flat(2, 1e9), cost="pipedream", memory_bytes=1.0, straight=True)
    with pytest.raises(ValueError, match="candidate_order"):
        optimize_states(states("alexnet"), [2], [1e9], candidate_order=[[0]])


def test_stages_not_contiguous_in_the_profile_order_get_a_layer_order():
    """ResNet-50 on 16 straight stages: PipeDream's node sets interleave in the profile's order, so
    the plan carries a topological order where they are contiguous (and its profile)."""
    from workbench.partitioning.pipedream_optimizer import profile_for

    prof = shipped("resnet50")
    plan = partition(prof, Topology.flat(16, 10e9), cost="pipedream", straight=True)
    order = plan.meta["layer_order"]
    assert sorted(order) == sorted(prof.layers["node"]) and order != list(prof.layers["node"])
    again = profile_for(prof, plan)
    assert list(again.layers["node"]) == order and again.total_ms == pytest.approx(prof.total_ms)
    for s, nodes in zip(plan.stages, plan.meta["pipedream"]["stage_nodes"]):
        assert set(order[s.first : s.last + 1]) == set(nodes) - {"node1"}
    # every node after its inputs
    pos = {v: i for i, v in enumerate(order)}
    for a, b in prof.meta["graph"]["edges"]:
        if a in pos and b in pos:
            assert pos[a] < pos[b]


# ---- the vectorised, pruned DP against the recurrence evaluated one entry at a time ---------
def _reference_level(st, C, M, B, within, rows, opt: Options, order):
    """The module docstring's recurrence for one level, entry by entry: ``A[m][j][i]`` and the
    choice ``(split state, prefix machine index, last stage's machines)`` (split -1: one stage)."""
    n = len(st)

    def seg(cum, i, j):
        return cum[j] - cum[i - 1] if i > 0 else cum[j]

    A = np.full((M, n, rows), np.inf)
    how = np.zeros((M, n, rows, 3), dtype=np.int64)
    how[..., 0] = how[..., 1] = -1
    for i in range(rows):
        for j in range(i, n):
            c, a, w = C(i, j), seg(st.activation, i, j), seg(st.parameters, i, j)
            if not np.isfinite(c):  # no entry below (an outer level's compute)
                continue
            for m in range(1 if opt.straight else M):
                if opt.memory_bytes is not None and math.ceil((M - (m + 1)) / (m + 1)) * (a + w) > opt.memory_bytes:
                    continue
                A[m, j, i] = (c + (4 * m * w) / (B * (m + 1)) / within) / (m + 1)
                how[m, j, i] = (-1, -1, m + 1)
    r = opt.activation_compression_ratio
    for j in range(1, n):
        for m in range(1, M):
            for i in range(min(rows, j)):
                if opt.use_fewer_machines and (np.isinf(A[m, j, i]) or A[m - 1, j, i] < A[m, j, i]):
                    A[m, j, i], how[m, j, i] = A[m - 1, j, i], how[m - 1, j, i]
                for k in order[j]:
                    c, w = C(k + 1, j), seg(st.parameters, k + 1, j)
                    a = seg(st.activation, k + 1, j)
                    for mp in range(1, 2 if opt.straight else m + 1):
                        if opt.memory_bytes is not None and (a + w) * math.ceil((M - (m + 1)) / mp) > opt.memory_bytes:
                            continue
                        last = (c + (4 * (mp - 1) * w) / (B * mp)) / mp
                        if r is not None:
                            last = max(last, (2.0 * st.output_activation[k]) / (B * mp) / r)
                            if j < n - 1:
                                last = max(last, (2.0 * st.output_activation[j]) / (B * mp) / r)
                        val = max(A[m - mp, k, i] if k >= i else np.inf, last)
                        if val < A[m, j, i]:
                            A[m, j, i], how[m, j, i] = val, (k, m - mp, mp)
    return A, how


def _random_graph(rng, n: int) -> LayerGraph:
    """A layer DAG with branches and few distinct sizes (many exact ties)."""
    ids = tuple(f"node{i}" for i in range(n))
    edges = {(ids[i], ids[i + 1]) for i in range(n - 1)}
    for _ in range(n // 2):
        a, b = sorted(rng.choice(n, 2, replace=False))
        edges.add((ids[a], ids[b]))
    pick = lambda *xs: tuple(float(x) for x in rng.choice(xs, n))  # noqa: E731
    return LayerGraph(
        ids, ("Conv",) * n, pick(1, 2), pick(2, 4), pick(1e6, 2e6), pick(0, 1e6, 4e6), tuple(sorted(edges))
    )


@pytest.mark.parametrize("seed", range(6))
def test_pruned_dp_equals_the_recurrence_entry_by_entry(seed, monkeypatch):
    """Small blocks and every survivor deduplicated, so the pruning and the dropping of equal
    candidates are exercised; random options and a random candidate order."""
    import workbench.partitioning.pipedream_optimizer as po

    monkeypatch.setattr(po, "BLOCK", 4)
    monkeypatch.setattr(po, "DEDUP", 0)
    rng = np.random.default_rng(seed)
    st = antichain_states(_random_graph(rng, 9))
    opt = Options(
        straight=bool(seed % 3 == 2),
        use_fewer_machines=bool(seed % 2),
        memory_bytes=[None, 2.5e7][seed % 2],
        activation_compression_ratio=[1.0, None, 2.0][seed % 3],
    )
    order = [rng.permutation(a) for a in st.ancestors]
    machines, bandwidths = [3, 2], [2e9, 1e8]
    solved = []
    real = po._solve
    monkeypatch.setattr(po, "_solve", lambda *a, **k: solved.append(real(*a, **k)) or solved[-1])
    res = optimize_states(st, machines, bandwidths, opt, candidate_order=order)
    n = len(st)
    C = lambda i, j: st.compute_s[j] - st.compute_s[i - 1] if i > 0 else st.compute_s[j]  # noqa: E731
    within = 1
    for lvl, (M, B) in enumerate(zip(machines, bandwidths)):
        rows = 1 if lvl == len(machines) - 1 else n + 1
        A, how = _reference_level(st, C, M, B, within, rows, opt, order)
        lv = solved[lvl]
        np.testing.assert_array_equal(lv.T[:, :, :rows], A)
        np.testing.assert_array_equal(lv.split_k[:, :, :rows], how[..., 0])
        np.testing.assert_array_equal(lv.split_m[:, :, :rows], how[..., 1])
        np.testing.assert_array_equal(lv.used[:, :, :rows], how[..., 2])
        C = lambda i, j, A=A, M=M: A[M - 1, j, i]  # noqa: E731
        within = M
    assert res.pipeline_s == solved[-1].T[-1, n - 1, 0]

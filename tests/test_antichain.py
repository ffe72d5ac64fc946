"""PipeDream's antichain states: a hand-checked diamond, chains, pruning of inputs and
``__getitem__`` sinks, and one-line errors that name the node."""

from __future__ import annotations

import pytest

from workbench.partitioning.antichain import antichain_states
from workbench.profiling.graph import LayerGraph
from workbench.profiling.pipedream import layer_graph, read_graph, shipped_path


def diamond() -> LayerGraph:
    """in -> a -> {b, c} -> d (b and c are parallel branches)."""
    ids = ("n0", "n1", "n2", "n3", "n4")
    return LayerGraph(
        ids,
        ("Input0", "A", "B", "C", "D"),
        (0, 1, 2, 3, 4),
        (0, 10, 20, 30, 40),
        (99, 1, 2, 3, 4),
        (0, 100, 200, 300, 400),
        (("n0", "n1"), ("n1", "n2"), ("n1", "n3"), ("n2", "n4"), ("n3", "n4")),
    )


def test_diamond_states_by_hand():
    st = antichain_states(diamond())
    assert st.inputs == ("n0",)
    # {a}, {c} + a (b still reads a), {b} + a, {b, c} + a (PipeDream's rule is per antichain node:
    # a feeds c, which is outside P(b) + b), {d}
    assert [sorted(a) for a in st.antichains] == [["n1"], ["n1", "n3"], ["n1", "n2"], ["n1", "n2", "n3"], ["n4"]]
    assert [a.tolist() for a in st.ancestors] == [[], [0], [0], [0, 1, 2], [0, 1, 2, 3]]
    # D({a, c}) = {a, c}: 11 ms + 33 ms in seconds
    assert st.compute_s.tolist() == pytest.approx([0.011, 0.044, 0.033, 0.066, 0.110])
    assert st.parameters.tolist() == [100, 400, 300, 600, 1000]
    assert st.output_activation.tolist() == [1, 4, 3, 6, 4]  # the augmented antichain's outputs
    assert st.stage_nodes([2, 5]) == [["n0", "n1", "n3"], ["n2", "n4"]]


def test_chain_states_are_prefixes():
    g = LayerGraph.chain(["x", "y", "z"], [1, 2, 3], [1, 2, 3], [10, 20, 30], [5, 6, 7])
    st = antichain_states(g, prune=False)
    assert len(st) == 3 and st.output_activation.tolist() == [10, 20, 30]
    assert st.compute_s.tolist() == pytest.approx([0.002, 0.006, 0.012])
    assert [a.tolist() for a in st.ancestors] == [[], [0], [0, 1]]


def test_getitem_sinks_are_pruned_and_round_trip():
    g = diamond()
    g = LayerGraph(
        g.ids + ("n5",),
        g.desc + ("__getitem__",),
        g.fwd_ms + (1,),
        g.bwd_ms + (1,),
        g.act_bytes + (1,),
        g.param_bytes + (0,),
        g.edges + (("n4", "n5"),),
    )
    st = antichain_states(g)
    assert "n5" not in st.graph.ids and len(st) == 5
    assert LayerGraph.from_dict(g.to_dict()) == g


def test_shipped_vgg16_states_form_a_chain():
    st = antichain_states(layer_graph(shipped_path("vgg16")))
    assert len(st) == 40  # PipeDream's optimizer prints "Total number of states: 40"
    assert all(a.tolist() == list(range(j)) for j, a in enumerate(st.ancestors))
    assert (st.compute_s[1:] >= st.compute_s[:-1] - 1e-12).all()  # sums in any order: last bits differ


def test_cycle_and_missing_times_name_the_node(tmp_path):
    g = diamond()
    with pytest.raises(ValueError, match="cycle through node n[234]"):
        LayerGraph(g.ids, g.desc, g.fwd_ms, g.bwd_ms, g.act_bytes, g.param_bytes, g.edges + (("n4", "n2"),))
    with pytest.raises(ValueError, match="node n3 has no valid fwd_ms"):
        LayerGraph(g.ids, g.desc, (0, 1, 2, None, 4), g.bwd_ms, g.act_bytes, g.param_bytes, g.edges)
    line = "node{} -- ReLU() -- forward_compute_time=1.0, backward_compute_time=1.0, activation_size=4.0, parameter_size=0.0\n"
    path = tmp_path / "graph.txt"
    path.write_text(
        line.format(1) + line.format(2) + line.format(3) + "\tnode1 -- node2\n\tnode2 -- node3\n\tnode3 -- node2\n"
    )
    with pytest.raises(ValueError, match=r"graph.txt: the graph has a cycle through node node[23];") as e:
        read_graph(path)
    assert "\n" not in str(e.value)
    path.write_text(line.format(1) + "node2 -- ReLU() -- activation_size=4.0, parameter_size=0.0\n")
    with pytest.raises(
        ValueError, match=r"graph.txt:2: not a PipeDream graph.txt line \(node node2 needs forward_compute_time="
    ):
        read_graph(path)


@pytest.mark.slow
def test_traced_model_profile_carries_its_layer_dag():
    """graph.split + profile: meta["graph"] holds the layers' DAG (a residual block's skip branch
    reads the block input), so cost="pipedream" runs over its antichains."""
    import torch
    from torch import nn

    from workbench.cost.topology import Topology
    from workbench.partitioning.pipedream_optimizer import profile_states
    from workbench.partitioning.search import partition
    from workbench.profiling.layering import split
    from workbench.profiling.measure import profile

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b, self.skip = nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x):
            return self.b(torch.relu(self.a(x))) + self.skip(x)

    net = nn.Sequential(nn.Linear(4, 8), Block(), nn.Linear(8, 2))
    m = split(net, torch.randn(2, 4), layers=["0", "1.a", "1.b", "1.skip", "2"])
    assert [layer.reads_from for layer in m.layers] == [(-1,), (0,), (1,), (0, 2), (3,)]
    prof = profile(m, torch.randn(4, 4), batch_size=4, iterations=1, warmup=0, progress=False, flops=False)
    g = LayerGraph.from_dict(prof.meta["graph"])
    assert ("node1", "node4") in g.edges and g.act_bytes[1] == 4 * 8 * 4  # layer 0's own output
    st = profile_states(prof)
    assert [sorted(a) for a in st.antichains] == [
        ["node1"],
        ["node1", "node2"],
        ["node1", "node3"],
        ["node4"],
        ["node5"],
    ]
    plan = partition(prof, Topology.flat(2, 1e9), cost="pipedream", straight=True)
    assert plan.meta["pipedream"]["over"] == "antichains" and plan.num_layers == 5

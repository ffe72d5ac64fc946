"""PipeDream graph.txt import: list-valued activation sizes (recurrent models), several input
nodes, clear errors with file and line, and the shipped profiles' source label."""

from __future__ import annotations

import pytest

from workbench.profiling.measure import Profile
from workbench.profiling.pipedream import SHIPPED, read_graph, shipped

# A GNMT-like graph: two inputs (tokens, lengths), an embedding, two LSTMs whose outputs are lists
# (output, h, c), and a classifier that also reads the lengths (Input1). Node lines out of order.
GNMT = """\
node4 -- LSTM(8, 8) -- forward_compute_time=2.000, backward_compute_time=4.000, activation_size=[300.0; 20.0; 20.0], parameter_size=500.000
node1 -- Input0 -- forward_compute_time=0.000, backward_compute_time=0.000, activation_size=64.0, parameter_size=0.000
node2 -- Input1 -- forward_compute_time=0.000, backward_compute_time=0.000, activation_size=8.0, parameter_size=0.000
node3 -- Embedding(100, 8) -- forward_compute_time=1.000, backward_compute_time=1.500, activation_size=256.0, parameter_size=3200.000
node5 -- LSTM(8, 8) -- forward_compute_time=2.500, backward_compute_time=5.000, activation_size=[300.0; 20.0; 20.0], parameter_size=500.000
node6 -- Classifier(8, 100) -- forward_compute_time=0.500, backward_compute_time=1.000, activation_size=1000.0, parameter_size=900.000
\tnode1 -- node3
\tnode3 -- node4
\tnode2 -- node4
\tnode4 -- node5
\tnode5 -- node6
\tnode2 -- node6
"""


def test_gnmt_like_graph_lists_and_inputs(tmp_path):
    path = tmp_path / "graph.txt"
    path.write_text(GNMT)
    prof = read_graph(path)
    df = prof.layers
    assert list(df["node"]) == ["node3", "node4", "node5", "node6"]  # inputs are not layers
    assert list(df["act_parts"]) == ["256", "300;20;20", "300;20;20", "1000"]
    assert prof.meta["input_bytes"] == 72 and prof.meta["input_parts_bytes"] == [64.0, 8.0]
    assert "batch_size_if_imagenet" not in prof.meta  # several inputs: not an image batch
    # cut after the embedding: its output and the lengths (read by node4 and node6) cross
    # cut after an LSTM: its 340 bytes (output, h, c) and the lengths (read by the classifier)
    assert list(df["act_bytes"]) == [256 + 8, 340 + 8, 340 + 8, 1000]
    assert df["fwd_ms"].sum() == pytest.approx(6.0) and df["param_bytes"].sum() == 5100
    again = Profile.load(prof.save(tmp_path / "p.csv"))
    assert list(again.layers["act_bytes"]) == list(df["act_bytes"])


@pytest.mark.parametrize(
    "bad,where",
    [
        ("activation_size=[1.0; x]", "graph.txt:2: activation_size"),
        ("activation_size=-5.0", "graph.txt:2: activation_size"),
        ("forward_compute_time=abc", "graph.txt:2: compute time 'abc'"),
    ],
)
def test_unparseable_values_name_file_and_line(tmp_path, bad, where):
    line = (
        "node2 -- ReLU() -- forward_compute_time=1.0, backward_compute_time=1.0, activation_size=4.0, "
        "parameter_size=0.0"
    )
    key = bad.split("=")[0]
    line = line.replace(next(p for p in line.split(", ") if p.split(" -- ")[-1].startswith(key)).split(" -- ")[-1], bad)
    path = tmp_path / "graph.txt"
    path.write_text(
        "node1 -- Input0 -- forward_compute_time=0.0, backward_compute_time=0.0, activation_size=4.0, "
        "parameter_size=0.0\n" + line + "\n\tnode1 -- node2\n"
    )
    with pytest.raises(ValueError, match=where):
        read_graph(path)
    path.write_text("node1 -- Input0\n")
    with pytest.raises(ValueError, match="graph.txt:1: not a PipeDream graph.txt line"):
        read_graph(path)


def test_shipped_profiles_name_their_source_without_a_local_path():
    for name in SHIPPED:
        prof = shipped(name)
        assert prof.meta["source"] == f"PipeDream graph.txt (shipped {name})"
        assert "/" not in prof.meta["source"]
        assert len(prof.layers) > 10 and (prof.layers["act_bytes"] > 0).all()


def test_the_authors_runtime_settings_as_recorded():
    """The recorded runtime configs (scripts/record_pipedream_configs.py): VGG-16 runs at 64 images per
    GPU though its graph.txt was profiled at 128; the PipeDream driver configs' stage replicas."""
    from workbench.profiling.pipedream import authors_batch, authors_config, profiled_batch, runtime_configs

    rec = runtime_configs()
    assert len(rec["commit"]) == 40 and rec["drivers"] and rec["configs"]
    assert authors_batch("vgg16") == 64 and profiled_batch("vgg16") == 128
    assert authors_batch("alexnet") == profiled_batch("alexnet") == 256
    assert authors_batch("gnmt_large") == profiled_batch("gnmt_large") == 64
    assert authors_batch("awd-lstm") is None and authors_config("awd-lstm", 4) is None
    # the profiled batch of an image model is its input node's bytes over 3 x 224 x 224 x 4
    assert shipped("resnet50").meta["batch_size_if_imagenet"] == profiled_batch("resnet50")
    assert authors_config("vgg16", 16) == "15-1" and authors_config("vgg16", 8) == "7-1"
    # GNMT-16 on 16 GPUs: its PipeDream driver config runs the straight mp_conf, not hybrid_conf
    assert authors_config("gnmt_large", 16) == "-".join(["1"] * 14)
    assert rec["configs"]["gnmt_large"]["gpus=16"]["hybrid"] != rec["configs"]["gnmt_large"]["gpus=16"]["mp"]


def test_the_recorder_tolerates_a_bare_integer_key():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "scripts" / "record_pipedream_configs.py"
    spec = importlib.util.spec_from_file_location("record_pipedream_configs", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.replicas('{"stage_to_rank_map": {"0": [0], 1: [1, 2]}}') == ([1, 2], True)
    assert mod.replicas('{"stage_to_rank_map": {"1": [3], "0": [0, 1, 2]}}') == ([3, 1], False)
    yml = "'module': 'models.vgg16.gpus=4'\n'config_file': 'models/vgg16/gpus=4/hybrid_conf.json'\n"
    yml += "'machines': ['a:0', 'a:1', 'b:2', 'b:3']\n'batch_size': 64\n"
    assert mod.driver(yml) == dict(model="vgg16", gpus=4, batch_size=64, config="gpus=4/hybrid")


def test_scaled_profile_scales_layers_inputs_batch_and_the_node_dag_together():
    """Profile.scaled: the layer table and the DAG PipeDream's optimizer reads (meta['graph']) agree
    after scaling; parameters do not move; PipeDream's optimizer plans with the scaled times."""
    from workbench.partitioning.pipedream_optimizer import profile_states
    from workbench.profiling.graph import LayerGraph
    from workbench.profiling.pipedream import in_order

    prof = shipped("vgg16")
    half = prof.scaled(compute=1.5, samples=0.5, note=", halved")
    a, b = prof.layers, half.layers
    assert b["fwd_ms"].to_numpy() == pytest.approx(0.75 * a["fwd_ms"].to_numpy())
    assert b["bwd_ms"].to_numpy() == pytest.approx(0.75 * a["bwd_ms"].to_numpy())
    assert b["act_bytes"].to_numpy() == pytest.approx(0.5 * a["act_bytes"].to_numpy())
    assert (b["param_bytes"] == a["param_bytes"]).all()
    assert half.meta["batch_size_if_imagenet"] == 64 and half.meta["input_bytes"] == prof.meta["input_bytes"] / 2
    assert half.meta["source"].endswith(", halved") and half.meta["scaled"] == dict(compute=1.5, samples=0.5)
    g0, g1 = LayerGraph.from_dict(prof.meta["graph"]), LayerGraph.from_dict(half.meta["graph"])
    assert sum(g1.fwd_ms) + sum(g1.bwd_ms) == pytest.approx(0.75 * (sum(g0.fwd_ms) + sum(g0.bwd_ms)))
    assert sum(g1.act_bytes) == pytest.approx(0.5 * sum(g0.act_bytes)) and g1.param_bytes == g0.param_bytes
    # the cut sizes recomputed from the scaled DAG are the scaled table's
    again = in_order(half, list(half.layers["node"]))
    assert again.layers["act_bytes"].to_numpy() == pytest.approx(b["act_bytes"].to_numpy())
    # the states PipeDream's optimizer builds carry the scaled compute
    s0, s1 = profile_states(prof), profile_states(half)
    assert s1.compute_s[-1] == pytest.approx(0.75 * s0.compute_s[-1])
    # a GNMT profile's list-valued activations scale part by part
    gn = shipped("gnmt").scaled(samples=2.0)
    parts = [sum(map(float, p.split(";"))) for p in gn.layers["act_parts"]]
    own = [sum(map(float, p.split(";"))) for p in shipped("gnmt").layers["act_parts"]]
    assert parts == pytest.approx([2 * v for v in own])
    with pytest.raises(ValueError, match="finite factors > 0"):
        prof.scaled(compute=0.0)

"""Both cost models side by side: the comparison table, the plan card, the CLI and the tuner."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from workbench.cli.commands import main
from workbench.cost.plan import Plan
from workbench.cost.topology import Topology
from workbench.partitioning.compare import compare_costs
from workbench.partitioning.pipedream_optimizer import price_plan
from workbench.partitioning.search import partition
from workbench.profiling.measure import Profile
from workbench.profiling.pipedream import shipped, shipped_path

FOUR_BY_TWO = Topology(((4, 12e9), (2, 1.25e9)))


def test_vgg16_on_4x2_both_choices_under_both_models():
    c = compare_costs(shipped("vgg16"), FOUR_BY_TWO)
    t = c.table
    assert list(t.index) == ["workbench model", "pipedream model"]
    assert t.loc["pipedream model", "replicas"] == "4-1-1-1-1"
    assert t.loc["workbench model", "replicas"] == "8"
    # each model rates its own choice at least as good as the other's
    assert t.loc["workbench model", "workbench model ms"] <= t.loc["pipedream model", "workbench model ms"]
    assert t.loc["pipedream model", "pipedream model ms"] <= t.loc["workbench model", "pipedream model ms"]
    # data parallelism under PipeDream's model is its own DP estimate
    assert t.loc["workbench model", "pipedream model ms"] == pytest.approx(
        c.plans["pipedream"].data_parallel_ms, rel=1e-12
    )
    assert t.loc["pipedream model", "pipedream model ms"] == pytest.approx(157.438816, rel=1e-6)
    for plan in c.plans.values():
        assert plan.meta["compare_costs"][1]["replicas"] == "4-1-1-1-1"
        assert "both cost models" in plan.describe() and "pipedream model" in plan._repr_html_()
    assert "pipedream cost model" in c.plans["pipedream"]._repr_html_()


def test_price_plan_reproduces_the_dp_on_a_chain():
    """On a one-level topology, PipeDream's formulas for the configuration its DP chose over the
    profile's layers give back the DP's own value."""
    from workbench.partitioning.pipedream_optimizer import Settings

    prof, topo = shipped("alexnet"), Topology.flat(8, 1.25e9)
    for straight in (False, True):
        plan = partition(prof, topo, straight=straight, cost="pipedream", pipedream=Settings(over="layers"))
        assert price_plan(prof, topo, plan) == pytest.approx(plan.bottleneck_ms, rel=1e-12)
    other = Plan.from_boundaries([3, 21], [4, 4])
    assert math.isnan(price_plan(prof, FOUR_BY_TWO, other))


def test_cli_cost_pipedream_and_compare(capsys, tmp_path):
    out = tmp_path / "plan.json"
    rc = main(
        [
            "partition",
            "--profile",
            str(shipped_path("vgg16")),
            "--topology",
            "4x12e9,2x1.25e9",
            "--cost",
            "pipedream",
            "--compare-costs",
            "--out",
            str(out),
        ]
    )
    text = capsys.readouterr().out
    assert rc == 0 and "4-1-1-1-1" in text and "pipedream model" in text and "157.439" in text
    plan = Plan.load(out)
    assert plan.meta["cost"] == "pipedream" and [s.replicas for s in plan.stages] == [4, 1, 1, 1, 1]
    rc = main(
        [
            "partition",
            "--profile",
            str(shipped_path("vgg16")),
            "--workers",
            "4",
            "--cost",
            "pipedream",
            "--activation-compression-ratio",
            "-2",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2 and len(err.strip().splitlines()) == 1 and "activation_compression_ratio" in err


def test_cli_cycle_names_the_node(capsys, tmp_path):
    line = "node{} -- ReLU() -- forward_compute_time=1.0, backward_compute_time=1.0, activation_size=4.0, parameter_size=0.0\n"
    path = tmp_path / "graph.txt"
    path.write_text(line.format(1) + line.format(2) + "\tnode1 -- node2\n\tnode2 -- node1\n")
    rc = main(["partition", "--profile", str(path), "--workers", "2", "--cost", "pipedream"])
    err = capsys.readouterr().err
    assert rc == 2 and "cycle through node node" in err and "Traceback" not in err


@pytest.mark.slow
def test_tuner_toggle_and_comparison(tmp_path):
    from workbench.viz.widgets import PartitionTuner

    df = pd.DataFrame(
        {
            "name": list("abcdef"),
            "fwd_ms": [4.0, 1, 1, 1, 1, 1],
            "bwd_ms": [8.0, 2, 2, 2, 2, 2],
            "act_bytes": [1e6] * 6,
            "param_bytes": [1e5] * 5 + [1e8],
        }
    )
    t = PartitionTuner(Profile(df), Topology.flat(4, 1e9), compare=True, out_dir=tmp_path)
    assert t.outcome.plan.cost == "workbench" and "pipedream model" in t.cards.value
    t.cost.value = "pipedream"
    assert t.outcome.plan.cost == "pipedream" and "✓" in t.status.value
    assert t.outcome.plan.bottleneck_ms == pytest.approx(
        partition(Profile(df), Topology.flat(4, 1e9), cost="pipedream").bottleneck_ms
    )

"""The schedule registry: one table read by the builder, the CLIs, the launcher and the docs."""

from __future__ import annotations

import pytest

from workbench.cli.commands import main
from workbench.runtime.launch.driver import schedule_for_workers
from workbench.schedules import NAMES, REGISTRY, Op, OpKind, build, markdown_table, register, spec, validate
from workbench.schedules.registry import parse_option


def test_every_registered_schedule_builds_on_its_own_worker_count():
    for name, sp in REGISTRY.items():
        for workers in (1, 2, 4):
            opts = {}
            sched = schedule_for_workers(name, workers, None, 4 * workers, opts)  # dualpipev: M >= stages
            validate(sched)
            assert sched.num_workers == workers, (name, workers)
            if isinstance(sp.stages_per_worker, int):
                assert sched.num_stages == sp.stages_per_worker * workers
            elif sp.stages_per_worker == "chunks":
                assert sched.num_stages == sp.option("chunks").default * workers
            assert sp.description and "\n" not in sp.description and sp.source


def test_options_come_from_the_generator_signature():
    o = spec("interleaved-1f1b").option("chunks")
    assert (o.type, o.default) == (int, 2) and o.help
    assert spec("pipedream").option("weights").choices == ("stash", "vertical-sync", "no-stash")
    assert spec("lpp").option("group_size").type is int
    assert build("interleaved-1f1b", 6, 3, chunks="3").options["chunks"] == 3  # CLI strings are converted
    with pytest.raises(ValueError, match="chunks must be int"):
        build("interleaved-1f1b", 4, 4, chunks="two")
    with pytest.raises(ValueError, match=r"takes options \['steps'\], not 'chunks'"):
        build("gpipe", 2, 2, chunks=2)
    with pytest.raises(ValueError, match="must be one of"):
        build("pipedream", 2, 2, weights="magic")
    with pytest.raises(ValueError, match="unknown schedule 'nope'; expected one of"):
        build("nope", 2, 2)


def test_register_is_one_decorator_and_refuses_duplicates():
    @register("test-only-fill-drain", description="gpipe under another name", source="a test")
    def fill_drain(plan, microbatches: int, steps: int = 1):
        return REGISTRY["gpipe"].build(plan, microbatches, steps=steps)

    try:
        assert build("test-only-fill-drain", 2, 3, steps=2).microbatches == 6
        assert "`test-only-fill-drain`" in markdown_table()
        with pytest.raises(ValueError, match="registered twice"):
            register("test-only-fill-drain", description="x", source="y")(lambda plan, m: None)
        with pytest.raises(ValueError, match="one non-empty line"):
            register("bad", description="two\nlines", source="y")
    finally:
        REGISTRY.pop("test-only-fill-drain")


def test_markdown_table_lists_every_schedule_once():
    table = markdown_table()
    assert table.count("\n") == len(NAMES) + 1
    for name in NAMES:
        assert f"| `{name}` |" in table


def test_docs_schedule_table_is_the_registry_table():
    """docs/schedules.md holds the table between markers; it must be what the registry prints now
    (regenerate it with `workbench schedules --markdown` after changing a registration)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "schedules.md").read_text()
    begin = text.index("-->\n", text.index("<!-- schedule-table")) + len("-->\n")
    end = text.index("\n<!-- /schedule-table -->")
    assert text[begin:end] == markdown_table(), (
        "docs/schedules.md's table is stale: paste `workbench schedules --markdown`"
    )


def test_op_kind_is_a_str_enum():
    op = Op("F", 0, 1)
    assert op.kind is OpKind.F and op.kind == "F" and str(op.kind) == "F" and f"{op.kind}" == "F"
    assert Op(OpKind.BW, 0, 1).kind == "BW" and {op.kind} == {"F"}
    with pytest.raises(ValueError, match="unknown op kind 'X'"):
        Op("X", 0, 0)


def test_dependencies_are_derived_once_and_give_the_receive_plan():
    sched = build("zb-h1", 3, 2)
    deps = sched.dependencies()
    assert deps is sched.dependencies()  # cached
    assert deps[("F", 0, 1)] == () and deps[("F", 2, 1)] == (("F", 1, 1),)
    assert deps[("BI", 1, 0)] == (("F", 1, 0), ("BI", 2, 0)) and deps[("BW", 1, 0)] == (("BI", 1, 0),)
    assert deps[("BI", 2, 0)] == (("F", 2, 0),)
    got = sched.remote_inputs(1)  # worker 1 receives activations from 0 and gradients from 2
    assert {(dep, src) for _, dep, src in got} == {(("F", 0, b), 0) for b in range(2)} | {
        (("BI", 2, b), 2) for b in range(2)
    }
    assert all(sched.ops[1][i].kind in ("F", "BI") for i, _, _ in got)


def test_cli_lists_schedules_and_passes_options(tmp_path, capsys):
    assert main(["schedules"]) == 0
    assert "looped-bfs" in capsys.readouterr().out
    assert main(["schedules", "--markdown"]) == 0
    assert capsys.readouterr().out.startswith("| schedule |")
    out = tmp_path / "sim"
    assert (
        main(
            [
                "simulate",
                "--schedule",
                "looped-bfs",
                "--stages",
                "4",
                "--microbatches",
                "4",
                "--schedule-option",
                "chunks=2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert main(["simulate", "--schedule", "gpipe", "--schedule-option", "chunks=2", "--out", str(out)]) == 2
    assert "takes options ['steps'], not 'chunks'" in capsys.readouterr().err
    assert parse_option("group-size=2") == ("group_size", "2")


def test_no_silent_reshaping_of_a_plan():
    from workbench.cost.plan import Plan

    straight4 = Plan.from_boundaries([0, 1, 2, 3])
    with pytest.raises(
        ValueError,
        match=r"chunks=2 runs the plan's 4 stages on 2 of its 4 workers .* pass chunks=1, "
        r"or a stage count instead of the plan \(8 stages for 4 workers\)",
    ):
        build("interleaved-1f1b", straight4, 4)
    assert build("interleaved-1f1b", straight4, 4, chunks=1).num_workers == 4
    assert build("interleaved-1f1b", 8, 8).num_workers == 4
    assert build("ddp", straight4, 8).num_workers == 4  # the plan's workers, not one per batch
    assert build("ddp", straight4, 8, workers=8).num_workers == 8  # explicit: as asked
    with pytest.warns(
        UserWarning,
        match=r"the plan is data parallel \(1 stage on 4 workers\), so gpipe runs as data "
        r"parallelism with gradient accumulation; use dp-bsp",
    ):
        build("gpipe", Plan.from_boundaries([3], [4]), 4)
    assert build("pipedream", Plan.from_boundaries([3], [4]), 4).num_workers == 4  # PipeDream's data parallel


def test_cli_refuses_a_topology_of_another_size(tmp_path, capsys):
    import pandas as pd

    from workbench.cost.plan import Plan
    from workbench.profiling.measure import Profile

    prof = Profile(
        pd.DataFrame(
            {
                "name": ["a", "b"],
                "fwd_ms": [1.0, 1.0],
                "bwd_ms": [2.0, 2.0],
                "act_bytes": [1e3, 1e3],
                "param_bytes": [1e3, 1e3],
            }
        ),
        {"kind": "measured"},
    )
    prof.save(tmp_path / "p.csv")
    Plan.from_boundaries([0, 1]).save(tmp_path / "plan.json")
    args = [
        "simulate",
        "--plan",
        str(tmp_path / "plan.json"),
        "--profile",
        str(tmp_path / "p.csv"),
        "--out",
        str(tmp_path / "o"),
    ]
    assert main(args + ["--workers", "3"]) == 2
    assert "uses 2 workers but the topology has 3" in capsys.readouterr().err
    assert main(args) == 0


def test_schedule_repr_and_card():
    sched = build("zb-h1", 3, 4)
    assert repr(sched) == (
        "Schedule[zb-h1](workers=3, stages=3, microbatches=4, ops=39, update=sync, "
        "updates per stage=1, peak in flight=3 microbatches)"
    )
    html = sched._repr_html_()
    assert "workbench-card" in html and "F0.0@v0" in html and "no costs" in html


def test_train_cli_passes_schedule_options_to_the_registry(tmp_path, capsys):
    base = ["train", "--model", "toy-mlp", "--workers", "2", "--out", str(tmp_path / "run"), "--no-progress"]
    assert main(base + ["--schedule", "gpipe", "--schedule-option", "chunks=2"]) == 2
    assert "gpipe takes options ['steps'], not 'chunks'" in capsys.readouterr().err
    assert main(base + ["--schedule", "interleaved-1f1b", "--schedule-option", "chunks=x"]) == 2
    assert "option chunks must be int, got 'x'" in capsys.readouterr().err

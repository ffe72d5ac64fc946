"""The run as asked for (workbench.runtime.launch.jobspec) and one timeline row per op (workbench.runtime.executors.record)."""

from __future__ import annotations

import csv
import dataclasses
from types import SimpleNamespace

import pytest

from workbench.runtime.executors.record import RECORD_COLUMNS, OpRecord
from workbench.runtime.launch.jobspec import JobSpec, ModelSpec, OptimSpec, PipelineSpec, RunSpec


def test_keywords_go_to_the_group_of_their_field_and_model_options_to_the_model():
    spec = JobSpec.from_keywords(
        "toy-mlp",
        "gpipe",
        3,
        6,
        lr=0.1,
        steps=4,
        out="o",
        model_seed=7,
        dataset_options={"n": 64},
        model_options={"hidden": 16},
    )
    assert spec.model == ModelSpec(
        model="toy-mlp", model_seed=7, dataset_options={"n": 64}, model_options={"hidden": 16}
    )
    assert spec.pipeline == PipelineSpec(schedule="gpipe", workers=3, microbatches=6)
    assert spec.optim == OptimSpec(lr=0.1, steps=4)
    assert spec.run == RunSpec(out="o")
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.optim.lr = 1.0  # type: ignore[misc]


def test_no_keyword_names_two_fields():
    names = [f.name for g in (ModelSpec, PipelineSpec, OptimSpec, RunSpec) for f in dataclasses.fields(g)]
    assert len(names) == len(set(names))


@pytest.mark.slow
def test_build_job_of_a_spec_is_prepare_of_its_keywords(tmp_path):
    from workbench.runtime.launch.driver import build_job, prepare

    kw = dict(steps=2, batch_size=16, lr=0.2, momentum=0.5, seed=3, allow_oversubscribe=True, progress=False)
    a = prepare("toy-mlp", "pipedream", 2, 4, out=tmp_path / "a", **kw)
    b = build_job(
        JobSpec(
            ModelSpec("toy-mlp"),
            PipelineSpec("pipedream", 2, 4),
            OptimSpec(batch_size=16, lr=0.2, momentum=0.5, steps=2, seed=3),
            RunSpec(out=tmp_path / "a", allow_oversubscribe=True, progress=False),
        )
    )
    assert (a.bounds, a.rounds_total) == (b.bounds, b.rounds_total)
    for f in ("batch_size", "lr", "momentum", "seed"):
        assert getattr(a.optim, f) == getattr(b.optim, f), f
    for f in ("out", "threads", "transport"):
        assert getattr(a.run, f) == getattr(b.run, f), f
    assert a.schedule.ops == b.schedule.ops and a.options == b.options


def test_a_record_without_send_times_leaves_their_cells_empty(tmp_path):
    """DDP's and Hogwild's records end at wait_ms: send_ms, data_ms and send_at are empty cells;
    the CSV's columns are the record's fields (then step, a copy of round)."""
    from workbench.runtime.launch.outputs import append_outputs

    rows = [dict(step=0, epoch=0, loss=1.0, n=1, correct=0, samples=8, end_ms=3.0)]
    tl = [OpRecord(0, 0, 0, "F", 0.0, 1.0, 0, 0, 0.0), OpRecord(1, 1, 0, "F", 1.0, 2.0, 0, 0, 0.5, 0.1, 0.2, 1.5)]
    append_outputs(tmp_path, [(rows, tl)], SimpleNamespace(options={}, optim=SimpleNamespace(batch_size=8)), -1)
    with open(tmp_path / "timeline.csv") as f:
        header = next(csv.reader(f))
        f.seek(0)
        got = list(csv.DictReader(f))
    assert header == RECORD_COLUMNS + ["step"]
    assert [got[0][c] for c in ("send_ms", "data_ms", "send_at")] == ["", "", ""]
    assert [float(got[1][c]) for c in ("wait_ms", "send_ms", "data_ms", "send_at")] == [0.5, 0.1, 0.2, 1.5]


def test_an_unknown_keyword_is_a_type_error_naming_the_closest_field():
    from workbench.runtime.launch.driver import prepare

    with pytest.raises(TypeError, match=r"unexpected keyword 'batchsize'; did you mean 'batch_size'\?"):
        JobSpec.from_keywords("toy-mlp", batchsize=16)
    with pytest.raises(TypeError, match=r"unexpected keyword 'depth';.* \(a zoo model's options go in model_options"):
        prepare("mlp", "gpipe", depth=3)  # a zoo option must go in model_options
    with pytest.raises(TypeError, match=r"unexpected keyword 'zzzz'; the keywords are .*batch_size"):
        JobSpec.from_keywords("toy-mlp", zzzz=1)


def test_every_cli_run_option_has_one_train_flag_and_every_flag_is_a_run_option():
    import argparse

    from workbench.cli.args import flag_of
    from workbench.cli.train import add_train_arguments
    from workbench.runtime.launch.jobspec import cli_fields, run_options

    p = argparse.ArgumentParser()
    add_train_arguments(p)
    flags = {a.option_strings[0]: a.dest for a in p._actions if a.option_strings}
    declared = {flag_of(f, meta): f.name for f, meta in cli_fields()}
    assert {k: v for k, v in flags.items() if k not in ("-h", "--weights")} == declared
    api_only = {f.name for f, _ in run_options()} - set(declared.values())
    assert api_only == {"model_seed", "dataset_options", "lookahead", "return_weights"}
    defaults = vars(p.parse_args([]))
    for f, meta in cli_fields():
        if not meta.get("key_value"):
            assert defaults[f.name] == f.default, f.name  # the flag's default is the field's


def test_a_run_option_added_to_a_group_gets_its_flag():
    import argparse
    from dataclasses import make_dataclass

    from workbench.cli.args import add_option_argument
    from workbench.runtime.launch.jobspec import option

    Extra = make_dataclass("Extra", [("one_tag", "bool", option(False, "one tag per pair"))])
    f = dataclasses.fields(Extra)[0]
    p = argparse.ArgumentParser()
    add_option_argument(p, f, dict(f.metadata["cli"]), str)
    assert p.parse_args(["--one-tag"]).one_tag is True and p.parse_args([]).one_tag is False

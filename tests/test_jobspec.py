"""The run as asked for (workbench.runtime.jobspec) and one timeline row per op (workbench.runtime.record)."""

from __future__ import annotations

import csv
import dataclasses
from types import SimpleNamespace

import pytest

from workbench.runtime.jobspec import JobSpec, ModelSpec, OptimSpec, PipelineSpec, RunSpec
from workbench.runtime.record import RECORD_COLUMNS, OpRecord


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


def test_build_job_of_a_spec_is_prepare_of_its_keywords(tmp_path):
    from workbench.runtime.launch import build_job, prepare

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
    the CSV's columns are the record's fields (then step, the alias of round)."""
    from workbench.runtime.outputs import append_outputs

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

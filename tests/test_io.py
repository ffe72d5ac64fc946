"""workbench.io.folders: fresh names never overwrite, keep a file's suffix, and run folders move into place."""

from __future__ import annotations

import pytest

from workbench.io.folders import fresh_path, run_folder


def test_fresh_path_keeps_the_suffix_of_files(tmp_path):
    plan = tmp_path / "plan.json"
    assert fresh_path(plan) == plan  # free: used as given
    plan.write_text("{}")
    assert fresh_path(plan) == tmp_path / "plan-2.json"
    (tmp_path / "plan-2.json").write_text("{}")
    assert fresh_path(plan) == tmp_path / "plan-3.json"
    bare = tmp_path / "notes"
    bare.write_text("")
    assert fresh_path(bare) == tmp_path / "notes-2"
    assert plan.read_text() == "{}"  # nothing is touched


def test_fresh_path_numbers_folders_whole(tmp_path):
    run = tmp_path / "run.v1"
    run.mkdir()
    assert fresh_path(run) == tmp_path / "run.v1-2"  # a folder's dots are not a suffix


def test_run_folder_never_overwrites(tmp_path):
    dest = tmp_path / "sim"
    with run_folder(dest) as out:
        (out / "a.csv").write_text("first")
    with run_folder(dest) as out:
        (out / "a.csv").write_text("second")
    assert out.final == tmp_path / "sim-2"
    assert (dest / "a.csv").read_text() == "first" and (tmp_path / "sim-2" / "a.csv").read_text() == "second"
    with pytest.raises(RuntimeError):
        with run_folder(dest) as out:
            raise RuntimeError("boom")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sim", "sim-2"]  # the failed run left nothing

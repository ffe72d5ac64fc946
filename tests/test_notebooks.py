"""Every notebook runs top to bottom under papermill with its parameters cell overridden."""

from pathlib import Path

import nbformat
import pytest

# 02-05 (the paper reproductions) run once per session in conftest.py's quick_run (workbench reproduce --quick)
NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("01_*.ipynb"))
QUICK = {"01_quickstart.ipynb": dict(servers=2, microbatches=None, schedule="pipedream")}


def test_there_are_notebooks():
    assert NOTEBOOKS


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs_under_papermill(path, tmp_path):
    papermill = pytest.importorskip("papermill")
    nb = nbformat.read(path, as_version=4)
    assert any("parameters" in c.get("metadata", {}).get("tags", []) for c in nb.cells)
    params = dict(QUICK.get(path.name, {}), out=str(tmp_path / "out"))
    executed = papermill.execute_notebook(
        str(path),
        str(tmp_path / path.name),
        parameters=params,
        cwd=str(tmp_path),
        kernel_name="python3",
        progress_bar=False,
    )
    errors = [o for c in executed.cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    assert (tmp_path / "out" / "timeline.csv").exists()
    if path.name == "01_quickstart.ipynb":  # the measured profile says whether its times can be trusted
        text = "".join(o.get("text", "") for c in executed.cells for o in c.get("outputs", []))
        assert "warning: these measured times" in text or "no warning: load" in text
        # a first look shows a pipeline (more than one stage) and its steady state, never "no steady state"
        assert "time per minibatch" in text and "no steady state" not in text
        assert "\n    1 " in text  # the plan's table has a stage 1


def test_notebooks_02_and_05_are_what_their_generator_writes(tmp_path, monkeypatch):
    """notebooks/make_02_05.py writes notebooks 02 and 05: an edit made in a notebook alone would be
    lost the next time the generator runs (a measured section was once dropped that way)."""
    import runpy

    folder = Path(__file__).resolve().parents[1] / "notebooks"
    made = runpy.run_path(str(folder / "make_02_05.py"), run_name="make_02_05")
    monkeypatch.setitem(made["write"].__globals__, "HERE", tmp_path)
    for name, cells in (("02_dp_communication_overhead", made["NB02"]), ("05_unified_schedules", made["NB05"])):
        written = nbformat.read(made["write"](name, cells), as_version=4)
        committed = nbformat.read(folder / f"{name}.ipynb", as_version=4)
        assert [(c.cell_type, c.source) for c in written.cells] == [(c.cell_type, c.source) for c in committed.cells]

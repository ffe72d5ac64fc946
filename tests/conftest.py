"""Shared fixtures. ``quick_run``: one ``workbench reproduce --quick`` per test session; the
notebook tests (test_dp_overhead, test_unified, and the 03/04 tests) read their CSVs from it, so
CI executes every reproduction notebook exactly once.

Warm ranks: every test that trains in this process forks its ranks from one warm server
(:mod:`workbench.runtime.launch.warm`), started by the first such test and serving the whole
session, as multiprocessing's resource tracker does. The tests of :data:`COUNTS_CHILDREN` look at
this process's child processes, so the server is stopped before them (a later warm job starts a
new one)."""

from pathlib import Path

import pytest

QUICK_RUN_TIMEOUT_S = 1500  # the whole quick reproduction, run inside the first test that needs it


#: fixtures that (may) start the quick run: their tests get the longer timeout
NEEDS_QUICK_RUN = {"quick_run", "reproduce_quick", "out03", "out04", "any_run"}


#: tests that look at this process's child processes (every test of a file, or file::test): the
#: warm server is stopped before them
COUNTS_CHILDREN = {
    "test_lifetime.py",
    "test_browser.py",
    "test_runtime.py::test_fault_stops_job_then_resume_matches_uninterrupted",
}
#: of those, the ones that train in this process and then count its children: their ranks are spawned
SPAWNS_HERE = {"test_runtime.py::test_fault_stops_job_then_resume_matches_uninterrupted"}


@pytest.fixture(autouse=True)
def no_warm_server_where_children_are_counted(request, monkeypatch):
    """Stops the warm server before a test of :data:`COUNTS_CHILDREN` (and spawns the ranks of
    :data:`SPAWNS_HERE`, ``WORKBENCH_WARM=0``)."""
    file = request.node.path.name
    test = f"{file}::{getattr(request.node, 'originalname', request.node.name)}"
    if file in COUNTS_CHILDREN or test in COUNTS_CHILDREN:
        from workbench.runtime.launch import warm

        warm.stop()
    if test in SPAWNS_HERE:
        monkeypatch.setenv("WORKBENCH_WARM", "0")


def pytest_collection_modifyitems(config, items):
    """The quick run's tests get its timeout; they and every ``distributed`` test are ``slow``, so
    ``pytest -m "not slow"`` is the fast tier of the edit-test loop."""
    for item in items:
        if NEEDS_QUICK_RUN & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.timeout(QUICK_RUN_TIMEOUT_S))
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("distributed") is not None:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def quick_run(tmp_path_factory) -> Path:
    """The run folder of ``workbench reproduce --quick`` (every notebook of the checkout)."""
    pytest.importorskip("papermill")
    from workbench.cli.commands import main

    out = tmp_path_factory.mktemp("reproduce")
    rc = main(["reproduce", "--quick", "--out", str(out)])
    runs = [p for p in out.iterdir() if p.is_dir() and not p.name.startswith(".")]
    assert len(runs) == 1, f"expected one run folder in {out}, found {runs}"
    run = runs[0]
    assert rc == 0, (
        f"workbench reproduce --quick exited {rc}; see {run / 'summary.md'}:\n" + (run / "summary.md").read_text()
    )
    return run


COMMITTED_RUNS = Path(__file__).resolve().parents[1] / "results" / "reproduce"


@pytest.fixture(scope="session")
def committed_run() -> Path:
    """The committed full run under ``results/reproduce/`` (the newest ``reproduce-full-*`` folder)."""
    runs = sorted(p for p in COMMITTED_RUNS.glob("reproduce-full-*") if p.is_dir())
    if not runs:
        pytest.skip("no committed full run under results/reproduce/")
    return runs[-1]


@pytest.fixture(scope="session", params=["quick", "committed"])
def any_run(request) -> Path:
    """The trend tests read both the session's quick run and the committed full run."""
    return request.getfixturevalue("quick_run" if request.param == "quick" else "committed_run")


@pytest.fixture(scope="session")
def out03(quick_run) -> Path:
    """The 03_time_to_accuracy folder of the session's quick run (test_time_to_accuracy, test_lr_grid)."""
    return Path(quick_run) / "03_time_to_accuracy"


@pytest.fixture(scope="session")
def reproduce_quick(quick_run) -> Path:
    """The same run under the name the 03/04 tests look up."""
    return quick_run

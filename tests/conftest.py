"""Shared fixtures. ``quick_run``: one ``workbench reproduce --quick`` per test session; the
notebook tests (test_dp_overhead, test_unified, and the 03/04 tests) read their CSVs from it, so
CI executes every reproduction notebook exactly once.

Warm ranks: every test that trains in this process forks its ranks from one warm server
(:mod:`workbench.runtime.launch.warm`), started by the first such test and serving the whole
session, as multiprocessing's resource tracker does. The tests of :data:`COUNTS_CHILDREN` look at
this process's child processes, so the server is stopped before them (a later warm job starts a
new one).

In parallel (pyproject's addopts: ``-n 2 --dist loadfile``, pytest-xdist): each file's tests run on
one worker (module- and class-scoped fixtures run once), and the files of :data:`QUICK_RUN_FILES`
(the tests that read the quick run, and the others of their files) are one unit, sent out first,
since the quick run is the longest piece of the suite (:func:`pytest_xdist_make_scheduler`; not
``--dist loadgroup`` with ``xdist_group`` marks: pytest-xdist 3.8.0 writes a test's group into a
node-id field that pytest 9.2 no longer reads, pytest-xdist issue #1386, and the groups are lost
without a word). The
quick run runs at most once per session however the tests are spread (:func:`quick_run`: a lock and
a folder shared by the session's workers). Each worker computes with one torch thread, so that two
workers on two cores do not oversubscribe them (the ranks a test starts set their own threads)."""

import fcntl
import json
import os
from contextlib import contextmanager
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


#: the files with tests that read the quick run: in parallel, one unit of work (on one worker)
QUICK_RUN_FILES = (
    "test_dp_overhead.py",
    "test_lr_grid.py",
    "test_reproduce.py",
    "test_time_to_accuracy.py",
    "test_timelines.py",
    "test_unified.py",
)
#: files that take the longest (measured on the 2-core machine): in parallel they go out right after
#: the quick run's unit, so that no long file is left for the end
LONG_FILES = (
    "test_runtime.py",
    "test_doc_snippets.py",
    "test_one_tag.py",
    "test_lifetime.py",
    "test_committed_tables.py",
)


def xdist_worker() -> str | None:
    """This process's pytest-xdist worker id (``gw0``, ...), None when the session is not parallel."""
    return os.environ.get("PYTEST_XDIST_WORKER")


def pytest_configure(config):
    if xdist_worker():
        import torch

        torch.set_num_threads(1)  # two workers on two cores: one thread each (the module's docstring)


def needs_quick_run(item) -> bool:
    return bool(NEEDS_QUICK_RUN & set(getattr(item, "fixturenames", ())))


def run_order(item) -> int:
    """Where a test's file goes in a parallel session: the quick run's files, the long ones, the rest."""
    name = item.path.name
    if name in QUICK_RUN_FILES:
        return -1
    return LONG_FILES.index(name) if name in LONG_FILES else len(LONG_FILES)


def pytest_collection_modifyitems(config, items):
    """The quick run's tests get its timeout; they and every ``distributed`` test are ``slow``, so
    ``pytest -m "not slow"`` is the fast tier of the edit-test loop. In a parallel session the files
    are ordered by :func:`run_order` (the scheduler hands them out in this order), and a test that
    reads the quick run outside :data:`QUICK_RUN_FILES` stops the session (it would wait for the run
    on the other worker)."""
    for item in items:
        if needs_quick_run(item):
            item.add_marker(pytest.mark.timeout(QUICK_RUN_TIMEOUT_S))
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("distributed") is not None:
            item.add_marker(pytest.mark.slow)
    if xdist_worker():
        outside = sorted({item.path.name for item in items if needs_quick_run(item)} - set(QUICK_RUN_FILES))
        if outside:
            raise pytest.UsageError(f"tests/conftest.py: add {outside} to QUICK_RUN_FILES (they read the quick run)")
        items.sort(key=run_order)  # stable: within a file, collection order


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` with the files of :data:`QUICK_RUN_FILES` as one unit of work."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class QuickRunTogether(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return "quick run" if Path(file).name in QUICK_RUN_FILES else file

    return QuickRunTogether(config, log)


@contextmanager
def locked(path: Path):
    """Holds an exclusive lock on the file ``path`` (created if missing) while inside."""
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def session_folder(tmp_path_factory) -> Path:
    """The session's temporary folder: in a parallel session the one its workers' folders are in."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if xdist_worker() else base


@pytest.fixture(scope="session")
def quick_run(tmp_path_factory) -> Path:
    """The run folder of ``workbench reproduce --quick`` (every notebook of the checkout), run once
    per session: the first worker that needs it runs it, holding a lock in the session's folder, and
    writes its exit status beside it; a later one (if the tests were spread another way) reads that."""
    pytest.importorskip("papermill")
    from workbench.cli.commands import main

    shared = session_folder(tmp_path_factory)
    out, status = shared / "reproduce", shared / "reproduce-status.json"
    with locked(shared / "reproduce.lock"):
        if not status.exists():
            out.mkdir(exist_ok=True)
            rc = main(["reproduce", "--quick", "--out", str(out)])
            status.write_text(json.dumps({"rc": rc, "by": xdist_worker()}))
    rc = json.loads(status.read_text())["rc"]
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

"""``workbench reproduce``: a new run folder each time, failures reported with notebook and cell,
bad parameters rejected with one line and exit status 2 before anything runs."""

import math
from pathlib import Path

import nbformat
import pandas as pd
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from repro.common import CLAIM_COLUMNS
from repro.reproduce import NOTEBOOKS, notebooks_dir
from workbench.cli.commands import main


# ---- the session's quick run -------------------------------------------------------------------
def test_quick_run_summary_lists_every_notebook_and_claim(quick_run):
    summary = (quick_run / "summary.md").read_text()
    present = [n for n in NOTEBOOKS if (notebooks_dir() / f"{n}.ipynb").exists()]
    for name in NOTEBOOKS:
        assert f"| {name} |" in summary
    for name in present:
        assert (quick_run / f"{name}.ipynb").exists(), name
        assert f"| {name} | ok |" in summary
    claims = list(quick_run.glob("*/claims.csv"))
    assert claims, "no notebook wrote claims.csv"
    rows = 0
    for path in claims:
        df = pd.read_csv(path)
        assert tuple(df.columns) == CLAIM_COLUMNS, path
        assert df["label"].str.match(r"^(measured|modeled|untestable) \(").all(), path
        for r in df.itertuples():
            if math.isfinite(r.paper) and r.paper != 0 and math.isfinite(r.ours):
                assert r.ratio == pytest.approx(r.ours / r.paper)
            assert r.claim in summary  # every claim reaches summary.md
        rows += len(df)
    table = summary.split("## Paper vs reproduction")[1].splitlines()
    assert len([line for line in table if line.startswith("| 0")]) == rows  # one table line per claim
    every = pd.read_csv(quick_run / "claims.csv")  # all notebooks' claims in one file, each with its fit
    assert len(every) == rows and set(every["fit"]) <= {"in-sample", "out-of-sample", "none"}
    assert (every.loc[every["label"].str.startswith("measured"), "fit"] == "none").all()
    assert "in-sample" in set(every["fit"]) and "out-of-sample" in set(every["fit"])
    assert "Code: commit " in summary and "## How close" in summary and "## Hardware settings" in summary


def test_quick_run_writes_figures_and_no_temporary_folder(quick_run):
    assert list(quick_run.glob("*/*.html")), "no HTML figure"
    assert not [p for p in quick_run.parent.iterdir() if p.name.endswith(".tmp")]


# ---- runner behaviour on a tiny notebooks/ folder ------------------------------------------------
def _notebook(path, params: str, body: str):
    params_cell = new_code_cell(params)
    params_cell.metadata["tags"] = ["parameters"]
    nb = new_notebook(
        cells=[params_cell, new_code_cell(body)],
        metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}},
    )
    nbformat.write(nb, path)


@pytest.fixture
def tiny_notebooks(tmp_path):
    d = tmp_path / "notebooks"
    d.mkdir()
    _notebook(d / "01_quickstart.ipynb", 'out = "x"', "print('about to fail')\n1 / 0")
    _notebook(
        d / "05_unified_schedules.ipynb",
        'quick = False\nout_dir = "x"\nsweep_S = 8\nsweep_B = 16',
        "from repro import common\n"
        "out = common.out_folder(out_dir)\n"
        "common.write_claims([common.claim('toy', 'two', 2.0, 3.0, 'units', label='modeled (toy)')], out)",
    )
    return d


@pytest.mark.slow
def test_failure_is_reported_others_run_and_runs_never_overwrite(tiny_notebooks, tmp_path, capsys):
    out = tmp_path / "results"
    rc = main(["reproduce", "--notebooks", str(tiny_notebooks), "--out", str(out)])
    assert rc == 1
    text = capsys.readouterr()
    assert "01_quickstart" in text.err and "ZeroDivisionError" in text.err
    first = [p for p in out.iterdir()]
    assert len(first) == 1
    summary = (first[0] / "summary.md").read_text()
    assert (
        "| 01_quickstart | **failed**: cell 2 of the executed 01_quickstart.ipynb (`print('about to fail')`): "
        "ZeroDivisionError" in summary
    )  # cell 0: parameters, 1: papermill's injected parameters
    assert "| 05_unified_schedules | ok |" in summary
    # paper, ours, ours at each end of the protocol's intervals, verdict, kind, ratio, unit, comparison, met, fit, label
    assert (
        "| two | 2 | 3 | 3 | 3 | contradicted | formula | 1.5 | units | point | no | out-of-sample | modeled (toy) |"
        in summary
    )
    assert "**missing**" in summary  # 02-04 are absent from the tiny folder: listed, not run
    before = {p: p.read_bytes() for p in first[0].rglob("*") if p.is_file()}

    assert main(["reproduce", "--notebooks", str(tiny_notebooks), "--out", str(out), "--only", "05"]) == 0
    runs = sorted(out.iterdir())
    assert len(runs) == 2 and first[0] in runs
    assert {p: p.read_bytes() for p in first[0].rglob("*") if p.is_file()} == before


@pytest.mark.slow
def test_relative_out_folder_keeps_each_notebooks_outputs_in_the_run(tiny_notebooks, tmp_path, monkeypatch):
    """README's command passes the default, relative ``results/reproduce``; the kernels run inside
    the run folder, so a relative output folder handed to them would land in a copy of that path
    inside the run (as it did until session 9): each notebook's outputs are in ``<run>/<notebook>/``
    and ``summary.md`` lists them."""
    monkeypatch.chdir(tmp_path)
    assert main(["reproduce", "--notebooks", str(tiny_notebooks), "--out", "results/reproduce", "--only", "05"]) == 0
    (run,) = [p for p in (tmp_path / "results" / "reproduce").iterdir()]
    assert (run / "05_unified_schedules" / "claims.csv").exists()
    assert not (run / "results").exists()
    assert "05_unified_schedules/claims.csv" in (run / "summary.md").read_text()


# ---- bad parameters: one line, exit 2, nothing written ------------------------------------------
@pytest.mark.parametrize(
    "content,args,message",
    [
        (None, ["--only", "09"], "unknown notebook '09'"),
        (None, ["--params", "does-not-exist.yaml"], "does-not-exist.yaml does not exist"),
        ("02:\n  models: [vgg17]\n", [], "unknown model 'vgg17'"),
        ("02:\n  measured_models: [nosuchnet]\n", [], "unknown model 'nosuchnet'"),
        ('{"02_dp_communication_overhead": {"gpu_counts": [0, 4]}}', [], "gpu_counts must be an integer >= 1"),
        ("05:\n  sweep_S: 0\n", [], "sweep_S must be a positive integer"),
        ("05:\n  no_such_parameter: 1\n", [], "has no parameter(s) ['no_such_parameter']"),
        ("02: [1, 2]\n", [], "must map notebook names"),
    ],
)
def test_bad_parameters_fail_with_one_line(tmp_path, capsys, monkeypatch, content, args, message):
    monkeypatch.chdir(tmp_path)
    if content is not None:
        name = "p.json" if content.startswith("{") else "p.yaml"
        (tmp_path / name).write_text(content)
        args = args + ["--params", name]
    rc = main(["reproduce", "--quick", "--out", str(tmp_path / "results"), *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not (tmp_path / "results").exists()


def test_the_summary_names_the_cpu_model(quick_run, monkeypatch):
    """The machine line names the processor (floating-point kernels may round differently on
    another CPU): read from /proc/cpuinfo, and a plain fallback where it cannot be read."""
    from repro import reproduce

    summary = (quick_run / "summary.md").read_text()
    assert f"CPU cores ({reproduce.cpu_model()})" in summary
    if Path("/proc/cpuinfo").exists():
        assert reproduce.cpu_model() != "model unknown"
    monkeypatch.setattr(reproduce, "Path", lambda *_: Path("/nonexistent/cpuinfo"))
    monkeypatch.setattr(reproduce.platform, "processor", lambda: "")
    assert reproduce.cpu_model() == "model unknown"


def test_summary_starts_with_a_short_headline_of_the_furthest_misses():
    import pandas as pd

    from repro.reproduce import headline

    claims = pd.DataFrame(
        dict(
            notebook=["02_dp_communication_overhead"] * 4,
            claim=["close", "far below", "far above", "no number"],
            paper=[2.0, 4.0, 1.0, None],
            ours=[2.2, 1.0, 3.0, None],
            ratio=[1.1, 0.25, 3.0, None],
            fit=["out-of-sample", "out-of-sample", "none", "none"],
        )
    )
    lines = headline(claims, worst=2)
    assert lines[0] == "## At the protocol's point values"
    line = next(ln for ln in lines if "The papers' measurements" in ln)
    assert "1 of 3 claims" in line and "out-of-sample 1/2" in line and "none 0/1" in line
    misses = [ln for ln in lines if ln.startswith("- ")]
    assert [m.split(":")[0] for m in misses] == ["- far below", "- far above"]  # |log ratio| 1.39, then 1.10
    assert all(len(m) < 200 for m in misses)
    assert not any("headline speedups" in ln for ln in lines)  # none of these is a speedup to target


def test_headline_counts_the_modeled_speedups_to_target_apart():
    """The papers' headline speedups (time to target accuracy) get their own line: the modeled ones
    only, each with ours / paper, counted within 25%."""
    import pandas as pd

    from repro.reproduce import headline

    claims = pd.DataFrame(
        dict(
            notebook=["02_dp_communication_overhead"] * 2 + ["03_time_to_accuracy"] * 2,
            claim=[
                "vgg16 SOSP Cluster-A PipeDream speedup over data parallelism to target accuracy, 16 GPUs",
                "gnmt SOSP Cluster-B PipeDream speedup over data parallelism to target accuracy, 16 GPUs",
                "PipeDream faster than ASP to target accuracy",
                "PipeDream faster than ASP to target accuracy (this machine)",
            ],
            paper=[5.28, 3.14, 7.4, 7.4],
            ours=[4.4, 1.0, 2.0, 0.9],
            ratio=[4.4 / 5.28, 1.0 / 3.14, 2.0 / 7.4, 0.9 / 7.4],
            fit=["out-of-sample"] * 3 + ["none"],
            label=["modeled", "modeled", "modeled", "measured (this machine)"],
        )
    )
    line = next(ln for ln in headline(claims) if "headline speedups" in ln)
    assert "1 of 3 within 25%" in line
    assert "vgg16 SOSP Cluster-A ×0.83" in line and "PipeDream faster than ASP ×0.27" in line
    assert "this machine" not in line


def test_lean_strips_figure_data_and_keeps_tables(tmp_path, monkeypatch):
    """--lean: a figure output becomes one line naming its page; a table output stays; pages load
    plotly.js from the CDN (no 4.8 MB copy in the run folder)."""
    import nbformat
    import plotly.graph_objects as go

    from repro.reproduce import shared_plotlyjs, strip_figures
    from workbench.viz.plot import save_html

    fig = go.Figure(go.Bar(x=[1, 2], y=[3, 4]))
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("fig")
    cell.outputs = [
        nbformat.v4.new_output(
            "display_data",
            data={"application/vnd.plotly.v1+json": fig.to_plotly_json(), "text/html": "<div>plotly</div>"},
        ),
        nbformat.v4.new_output("execute_result", data={"text/plain": "   a  b\n0  1  2"}, execution_count=1),
    ]
    nb.cells.append(cell)
    path = tmp_path / "09_x.ipynb"
    nbformat.write(nb, str(path))
    before = path.stat().st_size
    assert strip_figures(path) == 1
    again = nbformat.read(str(path), as_version=4).cells[0].outputs
    assert "09_x/" in again[0]["data"]["text/plain"] and again[1]["data"]["text/plain"].startswith("   a")
    assert path.stat().st_size < before
    with shared_plotlyjs(tmp_path, lean=True):
        page = save_html(fig, tmp_path / "09_x" / "fig.html")
    assert not (tmp_path / "plotly.min.js").exists()
    html = page.read_text()
    assert "cdn.plot.ly" in html and len(html) < 100_000


@pytest.mark.slow
def test_ctrl_c_during_a_run_is_one_line_and_leaves_no_partial_run(tmp_path):
    """SIGINT to the whole foreground group (what a terminal's Ctrl-C sends: the command, its notebook's
    kernel and the kernel's ranks) while notebook 04 trains its ranks: exit 130, one line on stderr
    naming what happened, no traceback, no run folder left, no process of the run left."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    cmd = [
        str(Path(sys.executable).parent / "workbench"),
        "reproduce",
        "--quick",
        "--only",
        "04",
        "--out",
        str(tmp_path),
    ]
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, text=True)
    deadline = time.monotonic() + 240
    trained = ".reproduce-quick-*/04_pipeline_timelines/runs/*/checkpoints/*"  # ranks past their start, training
    while time.monotonic() < deadline and not list(tmp_path.glob(trained)):
        time.sleep(0.2)
    assert p.poll() is None, p.communicate()
    os.killpg(p.pid, signal.SIGINT)
    out, err = p.communicate(timeout=120)
    lines = [ln for ln in err.splitlines() if ln.strip() and not ln.lstrip().startswith(("Executing", "notebooks:"))]
    assert p.returncode == 130 and "Traceback" not in err, (p.returncode, out[-1500:], err[-1500:])
    assert lines == [
        f"workbench reproduce: interrupted; the unfinished run was removed (nothing in {tmp_path} changed)"
    ]
    assert list(tmp_path.iterdir()) == []
    time.sleep(2)
    with pytest.raises(ProcessLookupError):
        os.killpg(p.pid, 0)  # no process of the run's group is left

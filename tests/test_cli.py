import subprocess
import sys
from pathlib import Path

import pytest

from workbench.cli import main

SHARED = Path(__file__).resolve().parents[2] / "shared" / "pipedream-profiles"


def run_cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "workbench.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


@pytest.mark.parametrize("args,needle", [
    (["profile", "--model", "no-such-model", "--out", "x.csv"], "no-such-model"),
    (["partition", "--profile", "missing.csv", "--workers", "2"], "does not exist"),
    (["partition", "--profile", "PROFILE", "--workers", "0"], "worker"),
    (["partition", "--profile", "PROFILE", "--topology", "4y1e9"], "COUNTxBANDWIDTH"),
    (["partition", "--profile", "PROFILE", "--workers", "2", "--bandwidth", "0"], "bandwidth"),
])
def test_bad_input_one_line_exit_2(tmp_path, args, needle):
    prof = tmp_path / "p.csv"
    prof.write_text("name,fwd_ms,bwd_ms,act_bytes,param_bytes\na,1,2,100,10\nb,1,2,100,10\n")
    args = [str(prof) if a == "PROFILE" else a for a in args]
    r = run_cli(*args, cwd=tmp_path)
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert needle.lower() in r.stderr.lower()


def test_argparse_errors_are_status_2():
    r = run_cli("partition", "--workers", "notanumber")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_partition_writes_plan(tmp_path, capsys):
    prof = tmp_path / "p.csv"
    prof.write_text("name,fwd_ms,bwd_ms,act_bytes,param_bytes\n" + "".join(f"l{i},{i + 1},{2 * i + 2},1000,100\n" for i in range(8)))
    out = tmp_path / "plan.json"
    assert main(["partition", "--profile", str(prof), "--workers", "4", "--out", str(out)]) == 0
    from workbench.plan import Plan

    plan = Plan.load(out)
    assert plan.num_workers == 4
    text = capsys.readouterr().out
    assert "bottleneck" in text and "baseline" in text


@pytest.mark.skipif(not SHARED.exists(), reason="../shared not present")
def test_profile_import_pipedream(tmp_path, capsys):
    out = tmp_path / "vgg.csv"
    assert main(["profile", "--pipedream", str(SHARED / "vgg16" / "graph.txt"), "--out", str(out)]) == 0
    assert out.exists() and "40 layers" in capsys.readouterr().out


def test_simulate_writes_timeline_metrics_html(tmp_path, capsys):
    prof = tmp_path / "p.csv"
    prof.write_text("name,fwd_ms,bwd_ms,act_bytes,param_bytes\n" + "".join(f"l{i},1,2,1e6,1e3\n" for i in range(8)))
    plan = tmp_path / "plan.json"
    assert main(["partition", "--profile", str(prof), "--workers", "4", "--straight", "--out", str(plan)]) == 0
    out = tmp_path / "sim"
    assert main(["simulate", "--profile", str(prof), "--plan", str(plan), "--workers", "4", "--schedule",
                 "pipedream", "--microbatches", "16", "--out", str(out)]) == 0
    import json

    import pandas as pd

    tl = pd.read_csv(out / "timeline.csv")
    assert {"worker", "stage", "microbatch", "kind", "start", "end"} <= set(tl.columns)
    assert (tl["kind"] == "F").sum() == 4 * 16
    assert json.loads((out / "metrics.json").read_text())
    assert (out / "timeline.html").stat().st_size > 10_000
    # a second run never overwrites the first
    assert main(["simulate", "--stages", "2", "--microbatches", "4", "--out", str(out)]) == 0
    assert (tmp_path / "sim-2" / "timeline.csv").exists()
    assert len(pd.read_csv(out / "timeline.csv")) == len(tl)


def test_models_lists_zoo(capsys):
    assert main(["models"]) == 0
    text = capsys.readouterr().out
    for name in ("vgg16", "resnet50", "alexnet", "gnmt", "awd-lstm", "gpt", "digits"):
        assert name in text


def test_simulate_alltoall_overlap_of_dualpipev_pairs(tmp_path):
    """--alltoall charges every forward/backward an in-op all-to-all; DualPipeV's pairs hide it unless
    --no-overlap-pairs (metrics.json: the exposed all-to-all per worker; the back-to-back run is longer)."""
    import json

    spans = {}
    for flag in ([], ["--no-overlap-pairs"]):
        out = tmp_path / ("b2b" if flag else "paired")
        assert main(["simulate", "--schedule", "dualpipev", "--stages", "8", "--microbatches", "16", "--alltoall", "1",
                     *flag, "--out", str(out)]) == 0
        m = json.loads((out / "metrics.json").read_text())
        spans[bool(flag)] = (m["makespan"], m["alltoall_exposed"])
    assert spans[True][1] == [64.0] * 4  # 2 stages x 16 microbatches x (F + B), each waits 1
    assert max(spans[False][1]) < 64.0 and spans[False][0] < spans[True][0]

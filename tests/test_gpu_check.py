"""benchmarks/gpu_check.py: one line and exit 0 without a GPU; its naming helpers."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(tmp_path):
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(ROOT))
    p = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path)], capture_output=True, text=True, env=env, timeout=120
    )
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: no CUDA device"), p.stdout
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_device_names_become_file_names_and_pick_the_nearest_listed_spec():
    from workbench.profiling.measure import GPUS

    m = _module()
    assert m.slug("NVIDIA H200") == "nvidia-h200"
    assert m.slug("Tesla V100-SXM2-32GB") == "tesla-v100-sxm2-32gb"
    assert m.nearest_spec("NVIDIA A100-SXM4-40GB", GPUS) == "A100"
    assert m.nearest_spec("NVIDIA H200", GPUS) == "H100"
    assert m.nearest_spec("Tesla V100-SXM2-16GB", GPUS) == "V100"
    assert m.nearest_spec("Some Future GPU", GPUS) in GPUS


def test_the_training_runs_on_the_ranks_the_nccl_step_found_working():
    m = _module()
    two = m.train_modes(2, [])
    assert [(x["workers"], x.get("hostids", False)) for x in two] == [(2, False)]
    shared = [dict(part="nccl", workers=1, status="ok"), dict(part="nccl", workers=2, status="ok")]
    assert [(x["workers"], x.get("hostids", False)) for x in m.train_modes(1, shared)] == [(2, True)]
    refused = [dict(part="nccl", workers=1, status="ok"), dict(part="nccl", workers=2, status="failed")]
    assert [x["workers"] for x in m.train_modes(1, refused)] == [1]
    assert "did not run" in m.unexercised_nccl(1, refused) and "shared one" in m.unexercised_nccl(1, shared)
    assert m.probe_status("", [{"all_reduce": True, "p2p_first": "refused: no"}], 1) == "partial"
    assert m.probe_status("", [{"all_reduce": True, "p2p_first": False}], 1) == "failed"
    assert m.probe_status("", [{"all_reduce": True}], 2) == "failed"  # a rank wrote nothing
    assert "messages between ranks" in m.unexercised_train(m.train_modes(1, refused)[0])


def _importable(monkeypatch):
    """The script as module ``gpu_check``, importable by the processes it spawns (as when it runs)."""
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    return importlib.import_module("gpu_check")


@pytest.mark.slow
@pytest.mark.distributed
def test_each_schedule_runs_on_its_own_and_is_compared_with_the_cpu_reference(tmp_path, capsys, monkeypatch):
    """The training part on CPU ranks (gloo): one run per schedule, each compared with the
    single-process float64 reference; a schedule that fails loses only its own row; with
    ``hostids`` the ranks are the script's own processes (how two ranks share one GPU)."""
    m = _importable(monkeypatch)
    mode = dict(what="gloo on CPU", workers=2, device="cpu", backend="gloo", tag="cpu")
    own = dict(mode, what="gloo, own processes", tag="own", hostids=True)
    rows = m.train_rows([mode], tmp_path, names=("gpipe", "no-such-schedule", "fsdp"))
    rows += m.train_rows([own], tmp_path, names=("zb-v",))
    assert [(r["schedule"], r["status"]) for r in rows] == [
        ("gpipe", "equal"),
        ("no-such-schedule", "failed"),
        ("fsdp", "equal"),
        ("zb-v", "equal"),
    ]
    assert all(r["max_weight_diff"] <= m.TOLERANCE for r in rows if r["status"] == "equal")
    assert "train gloo on CPU: not exercised:" in capsys.readouterr().out


@pytest.mark.slow
@pytest.mark.distributed
def test_the_probe_runs_its_messages_on_cpu_ranks(tmp_path, monkeypatch):
    """The NCCL step's probe with gloo on CPU (the same processes, messages and report): two ranks
    pass an all-reduce and a message each way; one rank's send to itself is run or refused."""
    m = _importable(monkeypatch)
    rows = m.nccl_rows(1, tmp_path, backend="gloo", timeout_s=120)
    assert [r["workers"] for r in rows] == [1, 2]
    assert rows[1]["status"] == "ok", rows[1]
    assert rows[0]["status"] in ("ok", "partial"), rows[0]

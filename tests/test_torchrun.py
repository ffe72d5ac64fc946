"""The same `workbench train` entry point under torchrun (env:// rendezvous) gives the same
weights as under mp.spawn."""
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workbench.runtime import train
from workbench.runtime.launch import free_port

TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent))


def final_weights(out: Path) -> dict:
    last = sorted((out / "checkpoints").iterdir())[-1]
    assert (last / "COMPLETE").exists()
    return {p.name: torch.load(p, weights_only=False)["weights"] for p in sorted(last.glob("stage*.pt"))}


@pytest.mark.skipif(TORCHRUN is None, reason="torchrun not installed beside this Python")
def test_torchrun_matches_spawn(tmp_path):
    args = dict(model="mlp", schedule="pipedream", workers=2, microbatches=4, steps=3, seed=3)
    cmd = [TORCHRUN, "--nproc_per_node", "2", "--master_port", str(free_port()), "-m", "workbench.cli", "train",
           "--model", "mlp", "--schedule", "pipedream", "--workers", "2", "--microbatches", "4", "--steps", "3",
           "--seed", "3", "--no-progress", "--out", str(tmp_path / "torchrun")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "torchrun" / "timeline.html").stat().st_size > 10_000  # the CLI draws the measured run
    train(out=tmp_path / "spawn", progress=False, **args)
    a, b = final_weights(tmp_path / "torchrun"), final_weights(tmp_path / "spawn")
    assert a.keys() == b.keys() and len(a) == 2
    for name in a:
        for k in a[name]:
            torch.testing.assert_close(a[name][k], b[name][k], rtol=0, atol=0)

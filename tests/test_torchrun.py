"""The same `workbench train` entry point under torchrun (env:// rendezvous; two launchers as two
"nodes" with a c10d rendezvous) gives the same weights as spawned by `train`. The stop path under
torchrun is tested in test_lifetime.py."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from workbench.cost.plan import Plan
from workbench.cost.topology import Topology
from workbench.runtime import train
from workbench.runtime.launch.driver import free_port

TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent))


def final_weights(out: Path) -> dict:
    last = sorted((out / "checkpoints").iterdir())[-1]
    assert (last / "COMPLETE").exists()
    return {p.name: torch.load(p, weights_only=False)["weights"] for p in sorted(last.glob("stage*.pt"))}


@pytest.mark.slow
@pytest.mark.skipif(TORCHRUN is None, reason="torchrun not installed beside this Python")
def test_torchrun_matches_spawn(tmp_path):
    args = dict(model="mlp", schedule="pipedream", workers=2, microbatches=4, steps=3, seed=3)
    cmd = [
        TORCHRUN,
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        "-m",
        "workbench.cli.commands",
        "train",
        "--model",
        "mlp",
        "--schedule",
        "pipedream",
        "--workers",
        "2",
        "--microbatches",
        "4",
        "--steps",
        "3",
        "--seed",
        "3",
        "--no-progress",
        "--out",
        str(tmp_path / "torchrun"),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "torchrun" / "timeline.html").stat().st_size > 10_000  # the CLI draws the measured run
    train(out=tmp_path / "spawn", progress=False, **args)
    a, b = final_weights(tmp_path / "torchrun"), final_weights(tmp_path / "spawn")
    assert a.keys() == b.keys() and len(a) == 2
    for name in a:
        for k in a[name]:
            torch.testing.assert_close(a[name][k], b[name][k], rtol=0, atol=0)


def two_machine_plan(path: Path, per_machine: int) -> Path:
    """A 2-stage plan of toy-mlp's 5 layers for a topology of 2 machines x ``per_machine`` workers
    (innermost first, bytes/s): with 2 per machine, each stage is replicated on one machine's workers."""
    topo = Topology(((per_machine, 10e9), (2, 1.25e9)))
    plan = Plan.from_boundaries([2, 4], [per_machine, per_machine], meta={"topology": topo.to_list()})
    return plan.save(path)


@pytest.mark.slow
@pytest.mark.skipif(TORCHRUN is None, reason="torchrun not installed beside this Python")
@pytest.mark.parametrize("per_machine", [1, 2])
def test_two_torchrun_nodes_match_one_launcher(tmp_path, per_machine):
    """One job as two torchrun "nodes" on this machine (--nnodes 2, c10d rendezvous on 127.0.0.1,
    two launchers, ``per_machine`` ranks each) gives the same weights as the spawned run of the
    same plan: ranks are numbered node by node, as the plan's topology numbers workers."""
    plan = two_machine_plan(tmp_path / "plan.json", per_machine)
    port, workers = free_port(), 2 * per_machine
    train_args = [
        "--model",
        "toy-mlp",
        "--plan",
        str(plan),
        "--workers",
        str(workers),
        "--microbatches",
        "4",
        "--steps",
        "6",
        "--seed",
        "3",
        "--no-progress",
        "--allow-oversubscribe",
        "--timeout",
        "120",
    ]
    cmd = [
        TORCHRUN,
        "--nnodes",
        "2",
        "--nproc_per_node",
        str(per_machine),
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"127.0.0.1:{port}",
        "--rdzv_id",
        f"two{os.getpid()}",
        "-m",
        "workbench.cli.commands",
        "train",
        *train_args,
        "--out",
        str(tmp_path / "nodes"),
    ]
    nodes = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for n in nodes:
        _, err = n.communicate(timeout=600)
        assert n.returncode == 0, err[-3000:]
    train(
        out=tmp_path / "spawn",
        progress=False,
        model="toy-mlp",
        plan=Plan.load(plan),
        workers=workers,
        microbatches=4,
        steps=6,
        seed=3,
        allow_oversubscribe=True,
    )
    a, b = final_weights(tmp_path / "nodes"), final_weights(tmp_path / "spawn")
    assert a.keys() == b.keys() and len(a) == workers
    for name in a:
        for k in a[name]:
            torch.testing.assert_close(a[name][k], b[name][k], rtol=0, atol=0)


def test_a_plan_for_other_machines_is_refused_under_torchrun(tmp_path, monkeypatch):
    """A plan partitioned for 2 workers per machine, launched with 1 per node: one line, no run."""
    from workbench.runtime import prepare

    for k, v in dict(RANK="0", WORLD_SIZE="4", MASTER_ADDR="127.0.0.1", LOCAL_WORLD_SIZE="1").items():
        monkeypatch.setenv(k, v)
    plan = Plan.load(two_machine_plan(tmp_path / "plan.json", 2))
    with pytest.raises(ValueError, match="partitioned for 2 workers per machine .* torchrun started 1 per node"):
        prepare("toy-mlp", "pipedream", workers=4, steps=1, plan=plan, out=tmp_path / "x")

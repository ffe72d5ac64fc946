"""Warm ranks (workbench.runtime.launch.warm): forked from one server per launcher that imported torch
and the workbench once; every job still gets fresh processes that see their launcher as it is now
(environment, affinity, ignored signals, stdout/stderr), nothing of one job reaches the next, the
server restarts when the workbench's code changes, and a model defined in ``__main__`` (a notebook)
still reaches the ranks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from multiprocessing import forkserver
from pathlib import Path

import pytest

from workbench.runtime.launch import warm
from workbench.runtime.launch.lifetime import RankFailed, spawn

pytestmark = pytest.mark.distributed
ROOT = Path(__file__).resolve().parents[1]

#: set by a rank of one job; a rank of the next job must not see it
LEFT_BY_A_JOB: list = []


def report(rank: int, out: str, tag: str) -> None:
    """What a rank sees, written to ``out/rank<r>.json``; also prints ``tag`` on stdout and stderr."""
    import torch

    seen = dict(
        pid=os.getpid(),
        ppid=os.getppid(),
        left=list(LEFT_BY_A_JOB),
        env=os.environ.get("WB_TEST_WARM"),
        affinity=sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        sighup_ignored=signal.getsignal(signal.SIGHUP) is signal.SIG_IGN,
        cuda_initialized=torch.cuda.is_initialized(),
        cwd=os.getcwd(),
    )
    LEFT_BY_A_JOB.append(tag)  # module state of this rank: the next job's ranks are new processes
    print(f"out {tag} {rank}", flush=True)
    print(f"err {tag} {rank}", file=sys.stderr, flush=True)
    Path(out, f"rank{rank}.json").write_text(json.dumps(seen))


def run_report(tmp_path: Path, tag: str, world: int = 2, *, is_warm: bool = True) -> list[dict]:
    out = tmp_path / tag
    out.mkdir()
    spawn(report, (str(out), tag), world, warm=is_warm, what=tag)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def test_each_job_gets_fresh_ranks_forked_by_one_server(tmp_path):
    first, second = run_report(tmp_path, "a"), run_report(tmp_path, "b")
    pids = {r["pid"] for r in first + second}
    assert len(pids) == 4 and os.getpid() not in pids
    servers = {r["ppid"] for r in first + second}
    assert len(servers) == 1 and servers != {os.getpid()}  # one server forked them all, not this process
    assert all(r["left"] == [] for r in first + second)  # nothing of job "a" in job "b"'s ranks
    assert all(not r["cuda_initialized"] for r in first + second)


def test_a_rank_sees_its_launcher_as_it_is_now(tmp_path, monkeypatch, capfd):
    """Changed after the server started: the environment, the CPU affinity, an ignored signal, the
    working directory and stdout/stderr (here pytest's capture of this test)."""
    run_report(tmp_path, "start")  # the server runs before the changes
    capfd.readouterr()
    monkeypatch.setenv("WB_TEST_WARM", "now")
    monkeypatch.chdir(tmp_path)
    cpus = sorted(os.sched_getaffinity(0))
    old = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        os.sched_setaffinity(0, cpus[:1])
        seen = run_report(tmp_path, "later")
    finally:
        os.sched_setaffinity(0, cpus)
        signal.signal(signal.SIGHUP, old)
    assert all(r["env"] == "now" and r["affinity"] == cpus[:1] and r["sighup_ignored"] for r in seen), seen
    assert all(Path(r["cwd"]) == tmp_path for r in seen)
    out, err = capfd.readouterr()
    assert sorted(out.split("\n")[:2]) == ["out later 0", "out later 1"], out
    assert sorted(err.split("\n")[:2]) == ["err later 0", "err later 1"], err
    # the next job: the launcher's own disposition again (ignored only where the launcher ignores it, e.g. under nohup)
    assert run_report(tmp_path, "after")[0]["sighup_ignored"] == (old is signal.SIG_IGN)


def test_changed_code_restarts_the_server(tmp_path, monkeypatch):
    before = run_report(tmp_path, "old")[0]["ppid"]
    starts = warm.starts()
    fingerprint = warm.code_fingerprint()
    monkeypatch.setattr(warm, "code_fingerprint", lambda: fingerprint + (("edited.py", 0, 0),))
    after = run_report(tmp_path, "new")[0]["ppid"]
    assert after != before and warm.starts() == starts + 1
    assert run_report(tmp_path, "same")[0]["ppid"] == after  # unchanged since: the same server


def test_warm_off_starts_ranks_with_spawn(tmp_path):
    seen = run_report(tmp_path, "cold", is_warm=False)
    assert all(r["ppid"] == os.getpid() for r in seen)


def test_spawn_refuses_env_for_cold_ranks():
    with pytest.raises(ValueError, match="environment of warm ranks"):
        spawn(report, ("x", "y"), 1, env={"A": "1"})


def test_the_preloaded_modules_do_not_initialize_cuda():
    code = "import importlib, torch; from workbench.runtime.launch import warm\n"
    code += "[importlib.import_module(m) for m in warm.PRELOAD]; print(torch.cuda.is_initialized())"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr[-2000:]


NOTEBOOK = """
import torch
from torch import nn
from torch.utils.data import TensorDataset
from workbench.runtime import train

class Net(nn.Module):  # defined in __main__, as in a notebook's cell: the ranks cannot import it
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))

g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,), generator=g))
for i in range(2):
    s = train(Net(), "gpipe", workers=2, microbatches=2, dataset=data, steps=2, batch_size=8, out=OUT + str(i),
              progress=False, allow_oversubscribe=True)
    print("steps", s["steps"])
"""


def test_a_model_defined_in_main_reaches_warm_ranks(tmp_path):
    """A ``python -c`` program has no file to re-import, as a notebook's kernel: the model travels by
    value (its traced layers), to warm ranks as to spawned ones."""
    script = f"OUT = {str(tmp_path / 'run')!r}\n" + textwrap.dedent(NOTEBOOK)
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["steps", "2", "steps", "2"], r.stdout


def fail(rank: int, bad: int) -> None:
    if rank == bad:
        raise ValueError("bad rank")
    time.sleep(60)


def test_a_failing_warm_rank_stops_the_job_and_only_the_server_is_left(tmp_path):
    psutil = pytest.importorskip("psutil")
    server = run_report(tmp_path, "s")[0]["ppid"]
    t = time.monotonic()
    with pytest.raises(
        RankFailed, match=r"^rank 1 \(pid \d+\) failed while setting up \(exit code 1\): ValueError: bad"
    ):
        spawn(fail, (1,), 2, warm=True)
    assert time.monotonic() - t < 30  # rank 0's sleep was cut short
    left = [p for p in psutil.Process().children(recursive=True) if "resource_tracker" not in " ".join(p.cmdline())]
    assert [p.pid for p in left if p.status() != psutil.STATUS_ZOMBIE] == [server]  # the ranks were joined


def receive(rank: int, tensors: list) -> None:
    assert all(float(t.sum()) == 0 for t in tensors)


def test_the_descriptors_a_rank_receives_are_counted_per_storage():
    import torch

    base = torch.zeros(8)
    args = ([base, base[2:], torch.ones(3)], {"w": torch.nn.Linear(2, 2)})  # a view shares its storage
    assert warm.fds_needed(args) == 2 + 2 + 2 + 4  # 2 storages, the layer's 2, stdio, the server's pipes
    assert warm.fits(args) and not warm.fits([torch.zeros(1) for _ in range(forkserver.MAXFDS_TO_SEND)])


def test_arguments_past_the_servers_descriptor_limit_are_spawned(tmp_path, monkeypatch):
    """Tensors travel to a rank as file descriptors, at most MAXFDS_TO_SEND through the warm server:
    past it (:func:`warm.fits`: Hogwild's shared weights, a user's model or data set sent by value) a
    job's ranks are spawned."""
    import torch

    from workbench.runtime import train

    many = [torch.zeros(2).share_memory_() for _ in range(forkserver.MAXFDS_TO_SEND)]
    with pytest.raises(ValueError, match="too many fds"):
        spawn(receive, (many,), 1, warm=True)
    spawn(receive, (many,), 1)  # spawned: no such limit
    asked, context = [], warm.context
    monkeypatch.setattr(warm, "context", lambda is_warm: asked.append(is_warm) or context(is_warm))
    train("toy-mlp", "dp-asp", workers=2, microbatches=1, steps=1, out=tmp_path / "a", progress=False)
    monkeypatch.setattr(warm, "fits", lambda args: False)
    s = train("toy-mlp", "dp-asp", workers=2, microbatches=1, steps=2, out=tmp_path / "b", progress=False)
    assert s["steps"] == 2 and asked == [True, False]


SERVER_MASK_PROBE = """
import json, operator, signal
import multiprocessing.util as util
from workbench.runtime.launch import lifetime

seen = []
spawnv = util.spawnv_passfds

def record(path, args, passfds):
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    seen.append(dict(server="forkserver" in " ".join(map(str, args)), sigint_blocked=signal.SIGINT in blocked))
    return spawnv(path, args, passfds)

util.spawnv_passfds = record
lifetime.spawn(operator.truth, (), 2, warm=True)
print(json.dumps(seen))
"""


def test_the_server_is_started_with_sigint_blocked():
    """Its ranks are forked with its signal mask: SIGINT blocked until become_rank gave it the default
    action, as for spawned ranks (test_lifetime's Ctrl-C cases); the server itself ignores SIGINT."""
    r = subprocess.run(
        [sys.executable, "-c", SERVER_MASK_PROBE], capture_output=True, text=True, timeout=300, check=True, cwd=ROOT
    )
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    servers = [s for s in seen if s["server"]]
    assert len(servers) == 1 and servers[0]["sigint_blocked"], seen

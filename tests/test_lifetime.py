"""The stop path of a job (workbench.runtime.launch.lifetime): every signal case and a rank's death end the
whole job, with nothing of THAT job left: no process (its launcher's descendants, found by pid), no
channel file (its token names the launcher's pid), no port (its rendezvous port binds again), the
last complete checkpoint loadable, one line naming the cause.

Each case starts a real ``workbench train`` (or ``torchrun``) in a subprocess of its own session,
waits until the job has written a complete checkpoint, sends the signal and measures the time from
the signal until the job's last process is gone. The bound is 5 s scaled by the machine's load per
core (``slack()``: the stop itself needs almost no CPU, but a loaded machine schedules the
launcher late), so the tests hold on a shared machine at load 20; the measured times are printed
(``-s``) for docs/runtime.md.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from workbench.runtime.launch.driver import free_port
from workbench.runtime.launch.outputs import latest_checkpoint
from workbench.runtime.transport.shm import SHM_DIR, pid_namespace

psutil = pytest.importorskip("psutil")
pytestmark = pytest.mark.distributed

STOP_S = 5.0  # the bound for a stop, on an idle machine
TORCHRUN = shutil.which("torchrun", path=str(Path(sys.executable).parent))


def slack() -> float:
    """1 on a machine with at most one runnable process per core, else load per core / 2."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1) / 2)


def train_args(out: Path, port: int, *extra: str) -> list[str]:
    return [
        "-m",
        "workbench.cli.commands",
        "train",
        "--model",
        "toy-mlp",
        "--workers",
        "2",
        "--steps",
        "1000000",
        "--no-progress",
        "--out",
        str(out),
        "--port",
        str(port),
        "--timeout",
        "60",
        "--allow-oversubscribe",
        *extra,
    ]


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def default_signals() -> None:
    """In a started process before it runs its program: the stop signals at their default
    disposition and unblocked, whatever this test process inherited (``nohup`` ignores SIGHUP, a
    shell's background job ignores SIGINT, a caller may block them): the cases test the launcher's
    handling of these signals, not the caller's."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


class Job:
    """A job in a session of its own (its process group id is the launcher's pid), started with the
    stop signals at their defaults (:func:`default_signals`)."""

    def __init__(self, argv: list[str], out: Path, port: int, ignore_sigint: bool = False):
        self.out, self.port = out, port
        if ignore_sigint:  # as a shell starts a background job (`&`) of a script: SIGINT ignored, then exec
            argv = ["sh", "-c", 'trap "" INT; exec "$@"', "sh", *argv]
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
            preexec_fn=default_signals,
        )
        self.launcher = psutil.Process(self.proc.pid)

    def wait_for_checkpoint(self, timeout_s: float = 120.0) -> Path:
        """The first complete checkpoint of the job (it has logged steps)."""
        end = time.monotonic() + timeout_s * slack()
        while time.monotonic() < end:
            ck = latest_checkpoint(self.out)
            if ck is not None and (self.out / "metrics.csv").exists():
                return ck
            if self.proc.poll() is not None:
                pytest.fail(f"the job ended early ({self.proc.returncode}): {self.proc.stderr.read()[-3000:]}")
            time.sleep(0.1)
        self.kill()
        pytest.fail(f"no complete checkpoint within {timeout_s * slack():.0f} s")

    def processes(self) -> list:
        """The launcher and all its descendants (ranks, multiprocessing's resource tracker)."""
        return [self.launcher] + self.launcher.children(recursive=True)

    def files(self, pids) -> list[Path]:
        """This job's channel files: their token names one of the job's pids (the spawning launcher)."""
        return [p for pid in pids for p in SHM_DIR.glob(f"workbench-{pid_namespace()}.{pid}.*")]

    def mapped_channels(self, procs: list) -> list[str]:
        """Channel files of this job that its ranks map: unlinked once every rank mapped them, so that no file outlives the ranks."""
        prefix = str(SHM_DIR / f"workbench-{pid_namespace()}.{self.proc.pid}.")
        maps = [m.path for p in procs[1:] for m in p.memory_maps(grouped=True) if m.path.startswith(prefix)]
        assert maps and not any(Path(m.removesuffix(" (deleted)")).exists() for m in maps), maps
        return maps

    def stop_time(self, procs: list, pids: set, t0: float) -> str:
        """Seconds from ``t0`` until every process of ``procs`` is gone (or a zombie) and no channel
        file of the job is left, and until its ranks were gone (as text); fails after the bound."""
        bound, ranks = STOP_S * slack(), None
        while time.monotonic() - t0 < bound:
            alive = [p for p in procs if _alive(p)]
            if ranks is None and not [p for p in alive if _name(p).startswith("wb-rank")]:
                ranks = time.monotonic() - t0
            if not alive and not self.files(pids):
                return f"{time.monotonic() - t0:.2f} s (ranks gone after {ranks:.2f} s)"
            time.sleep(0.02)
        left = [(p.pid, " ".join(p.cmdline())[:80]) for p in procs if _alive(p)]
        self.kill()
        pytest.fail(f"after {bound:.1f} s: processes {left}, files {self.files(pids)}")

    def kill(self) -> None:
        """SIGKILL to the job's processes, then reap the launcher (no zombie for later tests)."""
        try:
            procs = self.processes()
        except psutil.NoSuchProcess:
            procs = []
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        try:
            self.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            pass

    def check_released(self) -> None:
        """The job's port can be listened on again (its process group's store is gone) and the last complete
        checkpoint loads (every stage file of it)."""
        with socket.socket() as s:  # as torch's TCPStore binds it: connections in TIME_WAIT do not count
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", self.port))
            s.listen()
        ck = latest_checkpoint(self.out)
        stages = sorted(ck.glob("stage*.pt"))
        assert len(stages) == 2, stages
        for p in stages:
            assert torch.load(p, weights_only=False)["weights"]


def _alive(p) -> bool:
    try:
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def start(tmp_path: Path, *extra: str, ignore_sigint: bool = False) -> Job:
    port = free_port()
    out = tmp_path / "run"
    return Job([sys.executable, *train_args(out, port, *extra)], out, port, ignore_sigint)


def signal_job(job: Job, sig: int, target: str) -> tuple[str, str]:
    """Send ``sig`` to the launcher's pid or its whole process group; returns (stop time, stderr)."""
    first = job.wait_for_checkpoint()
    procs = job.processes()
    pids = {p.pid for p in procs}
    assert len([p for p in procs if _name(p).startswith("wb-rank")]) == 2 and job.mapped_channels(procs), (
        "expected 2 ranks with shared-memory channels"
    )
    t0 = time.monotonic()
    (os.killpg if target == "group" else os.kill)(job.proc.pid, sig)
    took = job.stop_time(procs, pids, t0)
    _, err = job.proc.communicate(timeout=60 * slack())
    assert latest_checkpoint(job.out) >= first
    job.check_released()
    print(f"\n[stop] {signal.Signals(sig).name} to the {target}: {took} (load {os.getloadavg()[0]:.1f})")
    return took, err


def one_line(err: str) -> str:
    assert "Traceback" not in err, err[-3000:]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines, "no message"
    return lines[-1]


@pytest.mark.parametrize(
    "sig,target",
    [
        (signal.SIGINT, "launcher"),
        (signal.SIGTERM, "launcher"),
        (signal.SIGHUP, "launcher"),
        (signal.SIGINT, "group"),
        (signal.SIGTERM, "group"),
        (signal.SIGHUP, "group"),
    ],
    ids=lambda v: v.name if isinstance(v, signal.Signals) else v,
)
def test_a_stop_signal_ends_the_whole_job(tmp_path, sig, target):
    job = start(tmp_path, "--transport", "shm")
    _, err = signal_job(job, sig, target)
    assert job.proc.returncode == 128 + sig
    line = one_line(err)
    assert (
        f"stopped by {signal.Signals(sig).name} received by the launcher" in line and "last complete checkpoint" in line
    )


def test_ctrl_c_while_the_ranks_start_prints_no_traceback(tmp_path):
    """Ctrl-C reaches the terminal's whole process group; ranks still importing must not each print
    a KeyboardInterrupt traceback: the launcher says one line and stops them."""
    job = Job([sys.executable, *train_args(tmp_path / "run", free_port())], tmp_path / "run", 0)
    end = time.monotonic() + 60 * slack()
    while not [c for c in job.launcher.children() if "resource_tracker" not in " ".join(c.cmdline())]:
        assert time.monotonic() < end and job.proc.poll() is None, "no rank was started"
        time.sleep(0.005)
    os.killpg(job.proc.pid, signal.SIGINT)  # the first rank is still starting (importing torch)
    _, err = job.proc.communicate(timeout=60 * slack())
    assert "KeyboardInterrupt" not in err and "Traceback" not in err, err[-3000:]
    assert job.proc.returncode in (130, 2), err[-2000:]


MASK_PROBE = """
import json, operator, signal, sys
import multiprocessing.util as util
from workbench.runtime.launch import lifetime

seen = []
spawnv = util.spawnv_passfds

def record(path, args, passfds):
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    seen.append(dict(rank="spawn_main" in " ".join(map(str, args)), sigint_blocked=signal.SIGINT in blocked))
    return spawnv(path, args, passfds)

util.spawnv_passfds = record
lifetime.spawn(operator.truth, (), 2)
print(json.dumps(seen))
"""


def test_every_rank_starts_with_sigint_blocked():
    """The Ctrl-C race behind the test above, made deterministic: in a fresh launcher (no resource
    tracker yet), every rank is exec'd with SIGINT blocked. Starting the resource tracker unblocks
    SIGINT in the launcher (CPython's ensure_running), so the launcher starts it before it blocks."""
    import json

    out = subprocess.run(
        [sys.executable, "-c", MASK_PROBE], capture_output=True, text=True, timeout=120 * slack(), check=True
    ).stdout
    seen = json.loads(out.strip().splitlines()[-1])
    ranks = [s for s in seen if s["rank"]]
    assert len(ranks) == 2 and all(s["sigint_blocked"] for s in ranks), seen


def test_sigterm_with_sigint_ignored_leaves_no_orphan(tmp_path):
    """A job started with `&` from a script ignores SIGINT: SIGINT is ignored, SIGTERM stops it."""
    job = start(tmp_path, "--transport", "shm", ignore_sigint=True)
    job.wait_for_checkpoint()
    os.kill(job.proc.pid, signal.SIGINT)
    time.sleep(1.0)
    assert job.proc.poll() is None and all(_alive(p) for p in job.processes())
    _, err = signal_job(job, signal.SIGTERM, "launcher")
    assert job.proc.returncode == 128 + signal.SIGTERM
    assert "stopped by SIGTERM" in one_line(err)


def test_sigkill_of_the_launcher_takes_its_ranks_along(tmp_path):
    """The launcher cannot clean up after SIGKILL: its ranks die with it (parent-death signal) and
    they had already unlinked their channel files; the job resumes from its last complete checkpoint."""
    job = start(tmp_path, "--transport", "shm")
    job.wait_for_checkpoint()
    procs = job.processes()
    pids = {p.pid for p in procs}
    job.mapped_channels(procs)
    t0 = time.monotonic()
    job.proc.kill()
    took = job.stop_time(procs, pids, t0)
    job.proc.communicate(timeout=60)
    job.check_released()
    print(f"\n[stop] SIGKILL to the launcher: {took} (load {os.getloadavg()[0]:.1f})")
    done = int(latest_checkpoint(job.out).name[len("round") :])  # the job resumes from it, killed mid-epoch or not
    argv = train_args(job.out, free_port(), "--transport", "shm", "--resume")
    argv[argv.index("--steps") + 1] = str(done + 4)
    r = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=300 * slack())
    assert r.returncode == 0, r.stderr[-3000:]
    assert latest_checkpoint(job.out).name == f"round{done + 4:06d}"


def test_a_rank_killed_ends_the_job_and_is_named_with_its_step(tmp_path):
    job = start(tmp_path, "--transport", "shm")
    job.wait_for_checkpoint()
    procs = job.processes()
    pids = {p.pid for p in procs}
    rank1 = next(p for p in procs if _name(p) == "wb-rank1")  # lifetime.become_rank names the ranks
    t0 = time.monotonic()
    rank1.kill()
    took = job.stop_time(procs, pids, t0)
    _, err = job.proc.communicate(timeout=60 * slack())
    assert job.proc.returncode == 1
    line = one_line(err)
    assert f"rank 1 (pid {rank1.pid}) was killed by SIGKILL (exit code -9) at step " in line, line
    step = int(line.split(" at step ")[1].split(";")[0])
    assert step >= int(latest_checkpoint(job.out).name[len("round") :]) - 1  # it had trained past the checkpoint
    job.check_released()
    print(f"\n[stop] SIGKILL to rank 1: {took} (load {os.getloadavg()[0]:.1f})")


def _name(p) -> str:
    try:
        return p.name()
    except psutil.NoSuchProcess:
        return ""


# ---- lifetime.spawn on its own (no training) ------------------------------------------------------
def _fail_on(rank: int, bad: int, step: int) -> None:
    """Rank ``bad`` raises in ``step``; the others would sleep for a minute."""
    from workbench.runtime.launch.lifetime import reached

    reached(step)
    if rank == bad:
        raise ValueError(f"bad rank {rank}\nsecond line")
    time.sleep(60)


def _rebuild_fails():
    raise RuntimeError("cannot rebuild this argument")


class _Unpicklable:
    def __reduce__(self):
        return _rebuild_fails, ()


def test_spawn_names_the_failing_rank_and_stops_the_others():
    from workbench.runtime.launch.lifetime import RankFailed, spawn

    t = time.time()
    with pytest.raises(
        RankFailed, match=r"^rank 1 \(pid \d+\) failed at step 7 \(exit code 1\): ValueError: bad rank 1$"
    ) as e:
        spawn(_fail_on, (1, 7), 2)
    assert time.time() - e.value.at < STOP_S * slack()  # rank 0's sleep was cut short
    assert (e.value.rank, e.value.exitcode, e.value.step) == (1, 1, 7) and "second line" in e.value.traceback
    assert e.value.at >= t and not _children()  # every rank joined (no zombie either)


def test_a_rank_that_cannot_unpickle_its_job_reports_the_real_error():
    """An argument the rank cannot unpickle (a traced graph that did not rebuild, a class it cannot
    import): the launcher names that error, not a guess about the script's main guard."""
    from workbench.runtime.launch.lifetime import RankFailed, spawn

    with pytest.raises(
        RankFailed,
        match=r"^rank 0 \(pid \d+\) failed before it started \(exit code 1\): could not unpickle the job in the "
        r"rank: RuntimeError: cannot rebuild this argument$",
    ) as e:
        spawn(_fail_on, (_Unpicklable(), 0), 1)
    assert "_rebuild_fails" in e.value.traceback and not _children()


def test_spawn_deadline_stops_the_ranks():
    from workbench.runtime.launch.lifetime import spawn

    with pytest.raises(TimeoutError, match="the nap did not finish within 1 s"):
        spawn(_fail_on, (-1, 0), 1, deadline_s=1, what="the nap")
    assert not _children()


def test_spawn_stops_on_a_signal_and_restores_the_handlers():
    """In-process: SIGTERM to the launcher while its ranks run raises JobStopped (a KeyboardInterrupt)
    naming the signal, stops the ranks and gives the process its own handlers back."""
    import threading

    from workbench.runtime.launch.lifetime import JobStopped, spawn

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM)).start()
    t = time.monotonic()
    with pytest.raises(JobStopped, match=r"^stopped by SIGTERM received by the launcher \(pid \d+\); rank 0 ") as e:
        spawn(_fail_on, (-1, 0), 2)
    assert e.value.signum == signal.SIGTERM and time.monotonic() - t < 2.0 + STOP_S * slack()
    assert not _children() and {s: signal.getsignal(s) for s in before} == before


def _children() -> list:
    """This process's children but multiprocessing's resource tracker (it serves the whole session)."""
    return [p for p in psutil.Process().children() if "resource_tracker" not in " ".join(p.cmdline())]


# ---- torchrun: one launcher, and two launchers as two "nodes" -------------------------------------
def torchrun_job(tmp_path: Path, port: int, *nodes_args: str, out: Path | None = None) -> Job:
    out = out or tmp_path / "run"
    return Job([TORCHRUN, *nodes_args, "-m", *train_args(out, free_port())[1:]], out, port)


needs_torchrun = pytest.mark.skipif(TORCHRUN is None, reason="torchrun not installed beside this Python")


@needs_torchrun
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL], ids=lambda s: s.name)
def test_a_signal_to_torchrun_ends_its_ranks(tmp_path, sig):
    """torchrun forwards SIGINT/SIGTERM/SIGHUP to its workers (each in a session of its own), which
    die at once on it; on SIGKILL of torchrun they die of their parent-death signal."""
    port = free_port()
    job = torchrun_job(tmp_path, port, "--nproc_per_node", "2", "--master_port", str(port))
    first = job.wait_for_checkpoint()
    procs = job.processes()
    assert len([p for p in procs if _name(p).startswith("wb-rank")]) == 2
    t0 = time.monotonic()
    os.kill(job.proc.pid, sig)
    took = job.stop_time(procs, {p.pid for p in procs}, t0)
    job.proc.communicate(timeout=60 * slack())
    assert job.proc.returncode != 0 and latest_checkpoint(job.out) >= first
    job.check_released()
    print(f"\n[stop] {sig.name} to torchrun: {took} (load {os.getloadavg()[0]:.1f})")


@needs_torchrun
def test_a_rank_killed_under_torchrun_ends_the_job(tmp_path):
    """torchrun watches its workers: one killed, it stops the other."""
    port = free_port()
    job = torchrun_job(tmp_path, port, "--nproc_per_node", "2", "--master_port", str(port))
    job.wait_for_checkpoint()
    procs = job.processes()
    rank1 = next(p for p in procs if _name(p) == "wb-rank1")
    t0 = time.monotonic()
    rank1.kill()
    took = job.stop_time(procs, {p.pid for p in procs}, t0)
    _, err = job.proc.communicate(timeout=60 * slack())
    assert job.proc.returncode != 0 and "Signal 9 (SIGKILL)" in err, err[-2000:]  # torchrun's report names it
    job.check_released()
    print(f"\n[stop] SIGKILL to rank 1 under torchrun: {took} (load {os.getloadavg()[0]:.1f})")


@needs_torchrun
@pytest.mark.parametrize("victim", ["host", "guest"])
def test_a_signal_to_one_of_two_torchrun_nodes_ends_both(tmp_path, victim):
    """One job as two torchrun "nodes" on this machine (c10d rendezvous on 127.0.0.1, one rank
    each): SIGTERM to one launcher ends the other node's rank as well (its peer's sockets close)."""
    port = free_port()
    rdzv = [
        "--nnodes",
        "2",
        "--nproc_per_node",
        "1",
        "--rdzv_backend",
        "c10d",
        "--rdzv_endpoint",
        f"127.0.0.1:{port}",
        "--rdzv_id",
        f"stop{os.getpid()}",
    ]
    nodes = [torchrun_job(tmp_path, port, *rdzv), torchrun_job(tmp_path, port, *rdzv)]
    first = nodes[0].wait_for_checkpoint()
    procs = nodes[0].processes() + nodes[1].processes()
    assert len([p for p in procs if _name(p).startswith("wb-rank")]) == 2
    hosts = [
        n
        for n in nodes
        if any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in n.launcher.net_connections())
    ]
    assert len(hosts) == 1  # the launcher that hosts the rendezvous store
    target = hosts[0] if victim == "host" else next(n for n in nodes if n is not hosts[0])
    t0 = time.monotonic()
    os.kill(target.proc.pid, signal.SIGTERM)
    took = nodes[0].stop_time(procs, {p.pid for p in procs}, t0)
    for n in nodes:
        n.proc.communicate(timeout=60 * slack())
        assert n.proc.returncode != 0
    assert latest_checkpoint(nodes[0].out) >= first
    nodes[0].check_released()
    print(f"\n[stop] SIGTERM to the torchrun node {victim} of 2: {took} (load {os.getloadavg()[0]:.1f})")


def test_the_stop_message_has_a_line_of_its_own_after_the_progress_bar(tmp_path):
    port = free_port()
    argv = [a for a in train_args(tmp_path / "run", port) if a != "--no-progress"]
    job = Job([sys.executable, *argv], tmp_path / "run", port)
    job.wait_for_checkpoint()
    os.kill(job.proc.pid, signal.SIGTERM)
    _, err = job.proc.communicate(timeout=60 * slack())
    assert "train:" in err and "step" in err  # the bar was drawn
    last = err.rstrip("\n").split("\n")[-1]
    assert last.startswith("workbench train: stopped by SIGTERM received by the launcher"), err[-2000:]
    assert "\r" not in last and "Traceback" not in err and "leaked semaphore" not in err

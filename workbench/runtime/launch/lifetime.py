"""Process lifetime of a job: the one place that starts ranks, watches them and stops them.

**Launcher** (:func:`spawn`): starts one process per rank (``spawn`` start method, or with
``warm=True`` forked by the warm server of :mod:`workbench.runtime.launch.warm`), then waits on
three things at once: the ranks' exits, the errors they report, and the signals SIGINT, SIGTERM,
SIGHUP sent to the launcher (or to its whole process group). The first of

* a stop signal (one the launcher's process does not ignore: ``nohup`` / a job started with ``&``
  keep their ignored signals),
* a rank that exits with a non-zero code (an error it raised, or a signal such as SIGKILL),

stops the job: every live rank gets SIGTERM, and SIGKILL after :data:`GRACE_S`; the launcher joins
them and raises one exception whose message is one line naming the cause: :class:`JobStopped` (a
``KeyboardInterrupt``, with ``.signum``) for a signal, :class:`RankFailed` (a ``RuntimeError``) for a
rank, with its exit code and the step it reached (:func:`reached`). The caller's ``finally``
releases what the job holds on disk (shared-memory channel files).

**Rank** (:func:`become_rank`, run first in every rank: a spawned one, or one started by
``torchrun`` through :func:`run_rank`): SIGINT, SIGTERM and SIGHUP take their default action,
immediate termination (unless the rank inherited them ignored), so a rank never finishes an op or
a wait before it stops: a Python handler would run only once the main thread is back in the
interpreter, which a gloo wait can delay by the whole timeout. ``torchrun`` forwards the signal it
receives to its workers, so its ranks must die on all three. The rank asks the kernel for SIGKILL
when its parent dies (Linux ``prctl(PR_SET_PDEATHSIG)``) and runs a watchdog thread that exits
when its parent pid changes (any POSIX system), so a rank never outlives its launcher, even one
killed with SIGKILL. A warm rank's parent is the warm server, so its watchdog waits on its
launcher instead (multiprocessing's parent sentinel, a pipe that only the launcher holds open). A rank that raises reports its error (to the launcher through a pipe; under
torchrun, as one line on stderr) and ends at once with ``os._exit(1)``: no interpreter or process
group teardown can keep it waiting on a peer that is gone.

Nothing a stopped rank leaves behind is needed: checkpoints are written to temporary names and
renamed, and a checkpoint counts only once rank 0 marked it ``COMPLETE``
(:func:`~workbench.runtime.launch.outputs.latest_checkpoint`); channel files are unlinked by the ranks as
soon as all of them have mapped them (:meth:`~workbench.runtime.transport.comm.ShmP2P.unlink`).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
import traceback
from multiprocessing import connection, parent_process, resource_tracker
from multiprocessing.reduction import ForkingPickler

from workbench.runtime.launch import warm as warm_start

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GRACE_S = 2.0  # a rank that outlives SIGTERM by this long gets SIGKILL
POLL_S = 0.1  # the launcher's and the watchdog's polling period
SETTLE_S = 0.3  # after a rank's reported error, how long the launcher looks for a peer killed by a signal
NOT_STARTED, SETTING_UP = -2, -1  # progress values before a rank's first step

_PR_SET_PDEATHSIG, _PR_SET_NAME = 1, 15
_progress = None  # (shared array, rank) in a spawned rank: where reached() writes


class JobStopped(KeyboardInterrupt):
    """The launcher received a stop signal; its ranks are stopped. ``signum``: the signal."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.signum = signum


class RankFailed(RuntimeError):
    """A rank ended with a non-zero exit code; the others were stopped. ``rank``, ``exitcode``,
    ``step`` (the step it was in; negative before its first step), ``traceback`` (of the error it
    raised, "" if it was killed), ``at`` (``time.time()`` of the failure: when the rank reported its
    error, or when the launcher saw it exit)."""

    def __init__(self, message: str, rank: int, exitcode: int, step: int, tb: str = "", *, at: float = 0.0):
        super().__init__(message)
        self.rank, self.exitcode, self.step, self.traceback = rank, exitcode, step, tb
        self.at = at or time.time()


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# ---- rank side -------------------------------------------------------------------------------
def become_rank(rank: int, parent: int | None = None, launcher=None) -> None:
    """Set this process up as rank ``rank`` (module docstring): default action for the stop signals
    not ignored, SIGKILL on the parent's death, a watchdog thread on the launcher, and the process
    name ``wb-rank<rank>`` (what ``ps`` / ``top`` show on Linux). ``parent``: the parent's pid
    (default: the current parent); exits at once if the parent is already gone. ``launcher``: a
    warm rank's sentinel of its launcher (multiprocessing's ``parent_process().sentinel``, ready once
    the launcher is gone), watched instead of the parent pid (the parent is the warm server)."""
    parent = os.getppid() if parent is None else parent
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, signal.SIG_DFL)
    if sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            libc.prctl(_PR_SET_NAME, f"wb-rank{rank}".encode()[:15], 0, 0, 0)
        except (OSError, AttributeError):  # pragma: no cover - no prctl: the watchdog alone
            pass
    if os.getppid() != parent or (launcher is not None and connection.wait([launcher], 0)):
        os._exit(1)  # the launcher died before the request could take effect
    watch, on = (_watch_launcher, launcher) if launcher is not None else (_watch_parent, parent)
    threading.Thread(target=watch, args=(on,), name="workbench-parent-watchdog", daemon=True).start()


def _watch_parent(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S * 5)
    os._exit(1)  # re-parented: the launcher is gone


def _watch_launcher(sentinel) -> None:
    connection.wait([sentinel])
    os._exit(1)  # the launcher is gone (its end of the sentinel's pipe closed)


def reached(step: int) -> None:
    """Record that this rank started ``step`` (global minibatch index), for the launcher's message
    when the rank dies; a no-op outside a rank started by :func:`spawn` (e.g. under torchrun)."""
    if _progress is not None:
        array, rank = _progress
        array[rank] = step


def run_rank(rank: int, fn, *args):
    """``fn(*args)`` as rank ``rank`` of a job whose launcher is not ours (``torchrun``): after
    :func:`become_rank`, an error prints one line naming the rank and the step it reached and ends
    the process at once (exit 1; torchrun then stops the job), as a spawned rank's error does."""
    global _progress
    become_rank(rank)
    _progress = ([SETTING_UP], 0)
    try:
        return fn(*args)
    except BaseException as e:  # noqa: BLE001 - this process is the rank: it ends here
        print(f"workbench: rank {rank} failed {_where(_progress[0][0])}: {_one_line(e)}", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


def _one_line(e: BaseException) -> str:
    return (f"{type(e).__name__}: {e}".splitlines() or [type(e).__name__])[0][:500]


class _Guarded:
    """``obj`` pickled on its own inside the process-start pickle (same pickler, so shared-memory
    tensors travel as before), so that a rank that cannot unpickle it (a class it cannot import,
    an object whose unpickling raises) still starts and reports that error through its pipe
    instead of dying in the interpreter's start-up with nothing reported."""

    def __init__(self, obj):
        self.obj = obj

    def __reduce__(self):
        return _unguard, (bytes(ForkingPickler.dumps(self.obj)),)


class _LoadFailed:
    def __init__(self, line: str, tb: str):
        self.line, self.tb = line, tb


def _unguard(data: bytes):
    try:
        return ForkingPickler.loads(data)
    except BaseException as e:  # noqa: BLE001 - reported by the rank (_rank_main)
        return _LoadFailed(_one_line(e), traceback.format_exc()[-8000:])


def _rank_main(
    rank: int, payload, progress, errors, parent: int, *, unblock_sigint: bool = False, inherit=None
) -> None:
    """Entry of a spawned rank: :func:`become_rank`, then ``fn(rank, *args)`` (``payload``:
    ``(fn, args)``, unpickled by :func:`_unguard`). An error, unpickling the job included, is
    reported to the launcher (one line and its traceback) and the process ends at once
    (``os._exit``: no interpreter teardown that could wait on a peer). ``inherit``: a warm rank's
    :class:`~workbench.runtime.launch.warm.Inherit`, applied first; its parent is the warm server
    and it watches its launcher through multiprocessing's parent sentinel."""
    global _progress
    if inherit is None:
        become_rank(rank, parent)
    else:
        inherit.apply()
        launcher = parent_process()  # multiprocessing's record of the launcher, in every process it started
        assert launcher is not None
        become_rank(rank, os.getppid(), launcher=launcher.sentinel)
    if unblock_sigint:  # blocked by the launcher while the ranks started (spawn); now at its default action
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    _progress = (progress, rank)
    if isinstance(payload, _LoadFailed):
        errors.send((rank, time.time(), f"could not unpickle the job in the rank: {payload.line}", payload.tb))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    fn, args = payload
    progress[rank] = SETTING_UP
    try:
        fn(rank, *args)
    except BaseException as e:  # noqa: BLE001 - every failure is reported, then the rank ends
        errors.send((rank, time.time(), _one_line(e), traceback.format_exc()[-8000:]))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)


# ---- launcher side ---------------------------------------------------------------------------
class _StopSignals:
    """Records the first stop signal while installed (a context manager); signals the process
    ignores stay ignored; the previous handlers come back on exit. Off the main thread (where
    Python cannot install handlers) it records nothing."""

    def __init__(self):
        self.signum, self.previous = None, {}

    def _handler(self, signum, frame) -> None:
        if self.signum is None:
            self.signum = signum

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    self.previous[sig] = signal.signal(sig, self._handler)
        return self

    def __exit__(self, *exc) -> None:
        for sig, old in self.previous.items():
            signal.signal(sig, old)


def spawn(
    fn,
    args: tuple,
    world: int,
    *,
    deadline_s: float | None = None,
    what: str = "the job",
    warm: bool = False,
    env: dict | None = None,
) -> None:
    """Run ``fn(rank, *args)`` in ``world`` new processes until all return; raises
    :class:`JobStopped` / :class:`RankFailed` after stopping every rank (module docstring), or
    ``TimeoutError`` when ``deadline_s`` (an overall bound, for short measurements) passes.
    ``warm``: fork the ranks from the warm server (:mod:`workbench.runtime.launch.warm`), with
    ``env`` added to the launcher's environment in theirs; else start each with ``spawn`` (a new
    interpreter)."""
    if env and not warm:
        raise ValueError("spawn(env=...) sets the environment of warm ranks; pass warm=True or set os.environ")

    procs, pipes = [], []
    with _StopSignals() as stop:
        try:
            # SIGINT blocked while the ranks start (a new process inherits the mask; the warm server
            # is exec'd with it and forks its ranks with it): a Ctrl-C to the terminal's process group
            # then waits in a starting rank until become_rank gave it the default action, instead of
            # raising KeyboardInterrupt in its imports (a traceback per rank); the launcher's own
            # handler gets it once the mask is restored. The resource tracker is started first:
            # starting it unblocks SIGINT in the caller (CPython's ensure_running)
            resource_tracker.ensure_running()
            before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            unblock = signal.SIGINT not in before
            try:
                ctx = warm_start.context(warm)
                progress = ctx.RawArray("q", [NOT_STARTED] * world)
                pipes += [ctx.Pipe(duplex=False) for _ in range(world)]  # (reader, writer): a rank reports its error
                kwargs = {
                    "unblock_sigint": unblock,
                    "inherit": warm_start.Inherit.capture(stdio=True, env=env) if warm else None,
                }
                for r in range(world):
                    p = ctx.Process(
                        target=_rank_main,
                        args=(r, _Guarded((fn, args)), progress, pipes[r][1], os.getpid()),
                        kwargs=kwargs,
                        name=f"workbench-rank{r}",
                        daemon=False,
                    )
                    p.start()
                    procs.append(p)
                    pipes[r][1].close()  # the rank holds its own copy: at its end the reader sees EOF
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, before)
            _supervise(procs, [r for r, _ in pipes], progress, stop, deadline_s, what=what)
        finally:
            stop_ranks(procs)
            for pipe in pipes:
                for end in pipe:
                    end.close()


def _supervise(procs, readers, progress, stop: _StopSignals, deadline_s, *, what: str) -> None:
    """Wait until every rank exited 0; raise on the first stop signal, failed rank or the deadline."""
    end = None if deadline_s is None else time.monotonic() + deadline_s
    reports, readers = [], list(readers)
    while True:
        connection.wait([p.sentinel for p in procs] + readers, timeout=POLL_S)  # a signal's handler runs meanwhile
        for r in [r for r in readers if r.poll()]:
            try:
                reports.append(r.recv())
            except EOFError:  # the rank ended without a report
                pass
            readers.remove(r)
        if stop.signum is not None:
            raise JobStopped(_stopped_message(stop.signum, progress), stop.signum)
        dead = [(i, p) for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if reports and not any(p.exitcode < 0 for _, p in dead):
            # a peer's reported error (a reset connection) is often the consequence of another rank's
            # death whose exit has not been seen yet: give the exits a moment to land
            settle = time.monotonic() + SETTLE_S
            while not any(p.exitcode < 0 for _, p in dead) and time.monotonic() < settle:
                time.sleep(0.02)
                dead = [(i, p) for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
        if dead or reports:
            if any(p.exitcode < 0 for _, p in dead):
                time.sleep(0.05)  # a signal to the whole group reaches the launcher too: let its handler run
                if stop.signum is not None:
                    raise JobStopped(_stopped_message(stop.signum, progress), stop.signum)
            raise _failure(procs, dead, reports, progress)
        if all(p.exitcode == 0 for p in procs):
            return
        if end is not None and time.monotonic() > end:
            raise TimeoutError(f"{what} did not finish within {deadline_s:.0f} s; its ranks were stopped")


def _stopped_message(signum: int, progress) -> str:
    where = ", ".join(f"rank {r} {_where(progress[r])}" for r in range(len(progress)))
    return f"stopped by {signal_name(signum)} received by the launcher (pid {os.getpid()}); {where}"


def _where(step: int) -> str:
    return {NOT_STARTED: "before it started", SETTING_UP: "while setting up"}.get(step, f"at step {step}")


def _failure(procs: list, dead: list, reports: list, progress) -> RankFailed:
    """The root cause among what went wrong first: a rank killed by a signal (no peer dies of a
    signal as a consequence before the launcher stops them), else the earliest error a rank
    reported, else the first non-zero exit."""
    killed = [(i, p) for i, p in dead if p.exitcode < 0]
    if killed:
        i, p = killed[0]
        return RankFailed(
            f"rank {i} (pid {p.pid}) was killed by {signal_name(-p.exitcode)} (exit code {p.exitcode}) "
            f"{_where(progress[i])}",
            i,
            p.exitcode,
            progress[i],
        )
    if reports:
        i, at, line, tb = min(reports, key=lambda r: r[1])  # the rank ends with os._exit(1) once it reported
        return RankFailed(
            f"rank {i} (pid {procs[i].pid}) failed {_where(progress[i])} (exit code 1): {line}",
            i,
            1,
            progress[i],
            tb,
            at=at,
        )
    i, p = dead[0]
    if progress[i] == NOT_STARTED:  # it never ran our code: the spawned interpreter failed to start it
        return RankFailed(
            f"rank {i} exited with code {p.exitcode} before it started; if you train from a script, "
            'put the training code under `if __name__ == "__main__":`',
            i,
            p.exitcode,
            progress[i],
        )
    return RankFailed(
        f"rank {i} (pid {p.pid}) exited with code {p.exitcode} {_where(progress[i])}", i, p.exitcode, progress[i]
    )


def stop_ranks(procs, grace_s: float = GRACE_S) -> None:
    """SIGTERM to every live rank, SIGKILL to those alive ``grace_s`` later, then join them all."""
    for p in procs:
        if p.exitcode is None:
            _signal(p.pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
    for p in procs:
        if p.exitcode is None:
            _signal(p.pid, signal.SIGKILL)
            p.join()


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass

"""Warm ranks: each rank forked from a server that has already imported torch and the workbench.

A rank started with multiprocessing's ``spawn`` method is a new interpreter that imports torch and the
workbench before it runs a line of its job (seconds on a small CPU machine, every job). A warm rank
(:func:`workbench.runtime.launch.lifetime.spawn` with ``warm=True``) is forked by the standard
library's ``forkserver``: one server per launcher process, started at its first warm job, imports
:data:`PRELOAD` once and then forks a fresh process for every rank of every job. The server is a
new interpreter (exec'd, not forked from the launcher), so it holds no CUDA context, no thread and no
state of the launcher; it runs nothing but those imports, so every job's ranks start from the same
state and nothing one job does reaches the next. A job then pays a fork, its process-group
rendezvous and its own work.

A forked rank would take from the server what a spawned rank takes from its launcher (environment
variables, CPU affinity, stdout and stderr, ignored signals), as it was when the server started;
:class:`Inherit` carries the launcher's values of the moment into each rank instead. The working
directory, ``sys.path`` and ``__main__`` come with multiprocessing's own preparation data, as for
``spawn``. Variables read once when torch is imported (``OMP_NUM_THREADS`` and the like) keep the
values the server started with; :func:`stop` ends the server (the next warm job starts a new one).
The server also restarts by itself when a ``.py`` file of the workbench changed since it started,
so edited code reaches the next job.

``WORKBENCH_WARM=0`` in the launcher's environment starts every rank with ``spawn`` instead.
"""

from __future__ import annotations

import io
import multiprocessing
import os
import pickle
import signal
import sys
from dataclasses import dataclass
from multiprocessing import forkserver, reduction
from pathlib import Path

import torch
import torch.multiprocessing as mp

#: what the server imports: torch, and the modules whose functions the workbench's ranks run
PRELOAD = (
    "torch",
    "torch.distributed",
    "workbench.runtime.launch.lifetime",
    "workbench.runtime.launch.rank",
    "workbench.runtime.calibration.machine",
    "workbench.runtime.launch.preloaded",  # last: freezes what the imports above created (its docstring)
)
PACKAGE = Path(__file__).resolve().parents[2]  # the workbench package: its sources are the server's code
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_server: dict = {"code": None, "starts": 0}  # the running server's code fingerprint; servers started


class _StorageCounter(reduction.ForkingPickler):
    """Pickles like the rank's own pickling, but counts each tensor's storage once instead of
    sharing it (multiprocessing sends every shared storage as one file descriptor)."""

    def __init__(self, buf):
        super().__init__(buf, pickle.HIGHEST_PROTOCOL)
        self.storages: set = set()

    def persistent_id(self, obj):
        if isinstance(obj, torch.Tensor):
            self.storages.add((obj.device.type, obj.untyped_storage().data_ptr()))
            return len(self.storages)
        return None


def fds_needed(args) -> int:
    """File descriptors one rank receives with ``args``: one per tensor storage, plus its stdout and
    stderr and the server's pipes; more than ``forkserver.MAXFDS_TO_SEND`` cannot start warm."""
    counter = _StorageCounter(io.BytesIO())
    counter.dump(args)
    return len(counter.storages) + 2 + 4


def fits(args) -> bool:
    """Whether a rank with ``args`` can start from the warm server (:func:`fds_needed`)."""
    return fds_needed(args) < forkserver.MAXFDS_TO_SEND


def enabled() -> bool:
    """Whether jobs start warm ranks: unless ``WORKBENCH_WARM=0``."""
    return os.environ.get("WORKBENCH_WARM", "1") != "0"


def code_fingerprint() -> tuple:
    """(path, mtime, size) of every ``.py`` file of the workbench: changes when its code does."""
    return tuple(sorted((str(p), s.st_mtime_ns, s.st_size) for p in PACKAGE.rglob("*.py") for s in [p.stat()]))


def context(warm: bool):
    """The multiprocessing context that starts the ranks: ``forkserver`` with the server running
    (:func:`ensure_running`) when ``warm``, else ``spawn``."""
    if not warm:
        return mp.get_context("spawn")
    ensure_running()
    return mp.get_context("forkserver")


def ensure_running() -> None:
    """Start the server if it is not running, or again if the workbench's code changed since it
    started. It is exec'd with the caller's signal mask (the launcher blocks SIGINT while ranks
    start, so a Ctrl-C cannot interrupt the server's imports) and its preparation data."""
    code = code_fingerprint()
    if _server["code"] not in (None, code):
        stop()
    if _server["code"] is None:
        _server["starts"] += 1
    multiprocessing.set_forkserver_preload(list(PRELOAD))
    forkserver.ensure_running()
    _server["code"] = code


def starts() -> int:
    """How many warm servers this process started (a restart after a code change counts)."""
    return _server["starts"]


def stop() -> None:
    """End the server (it exits once this process and every rank it forked let go of it); a later
    warm job starts a new one. A no-op when none runs."""
    # the standard library has no public way to stop its server; this is the method its own tests use
    server = getattr(forkserver, "_forkserver", None)
    if server is not None and hasattr(server, "_stop"):
        server._stop()
    _server["code"] = None


@dataclass(frozen=True)
class Inherit:
    """What a rank takes from its launcher at start: the environment, the CPU affinity, the stop
    signals the launcher ignores and, with ``stdio``, the launcher's stdout and stderr (fds 1 and
    2, duplicated into the rank when it is pickled: multiprocessing's ``DupFd``; ``fds`` in the rank)."""

    env: dict
    affinity: tuple | None
    ignored: tuple
    stdio: bool = False
    fds: tuple = ()

    @classmethod
    def capture(cls, stdio: bool, env: dict | None = None) -> Inherit:
        """The launcher's values now, with ``env`` added to its environment."""
        affinity = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else None
        ignored = tuple(int(s) for s in STOP_SIGNALS if signal.getsignal(s) is signal.SIG_IGN)
        return cls({**os.environ, **(env or {})}, affinity, ignored, stdio)

    def __reduce__(self):
        fds = (reduction.DupFd(1), reduction.DupFd(2)) if self.stdio else ()
        return received, (self.env, self.affinity, self.ignored, fds)

    def apply(self) -> None:
        """In the rank, first: the launcher's environment, affinity, ignored signals and stdio."""
        os.environ.clear()
        os.environ.update(self.env)
        if self.affinity is not None:
            os.sched_setaffinity(0, self.affinity)
        for s in STOP_SIGNALS:
            signal.signal(s, signal.SIG_IGN if int(s) in self.ignored else signal.SIG_DFL)
        if self.fds:
            for stream in (sys.stdout, sys.stderr):
                if stream is not None:
                    stream.flush()
            for fd, target in zip(self.fds, (1, 2)):
                if fd != target:
                    os.dup2(fd, target)
                    os.close(fd)


def received(env: dict, affinity, ignored: tuple, fds: tuple) -> Inherit:
    """An :class:`Inherit` unpickled in the rank, with the fds it received."""
    return Inherit(env, affinity, ignored, fds=tuple(f.detach() for f in fds))

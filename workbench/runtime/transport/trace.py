"""The runtime's ``torch.distributed`` calls, recorded: what each rank really issues, in order.

A :class:`Recorder` replaces ``torch.distributed.isend``, ``irecv`` and ``all_reduce`` (the calls
the executors, the transport, the remote weights and the tied weights make through the module)
with wrappers that append one :class:`Call` per call, and wraps every returned work so that its
``wait`` is recorded too; the dry world's ``new_group`` records group creation. Two modes:

* **live** (:func:`from_env`): the calls go on to the real backend (a gloo run); the calls are
  appended to a JSON-lines file per rank, ``$WORKBENCH_COMM_TRACE/<run folder>.rank<r>.jsonl``.
* **dry** (:mod:`~workbench.runtime.transport.dry_run`): nothing is sent; a receive leaves zeros in
  its buffer and a wait returns at once (a work not waited on reports itself incomplete), so one
  process can run every rank's executor in turn and record the order its own code issues the calls in.

Either way the list of a rank's calls is what :func:`~workbench.runtime.transport.nccl_model.check_nccl`
reads. A call names its communicator by the process group's name in the runtime's groups
(:func:`group_name`) and its members, so two ranks' records refer to the same groups.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

ENV = "WORKBENCH_COMM_TRACE"  # folder of the live traces (unset: nothing is recorded)
WORLD = "world"  # the name of the default group


@dataclass(frozen=True)
class Call:
    """One call of a rank. ``what``: ``"group"`` (process group created), ``"send"`` / ``"recv"``
    (point-to-point with ``peer``), ``"coll"`` (collective ``op``), ``"wait"`` (on the work of call
    ``work``). ``group`` / ``ranks``: the communicator's process group and its members; ``tag``:
    the tag the runtime gave (NCCL ignores it; it names the message when tags are on); ``nbytes``:
    the tensor's size; ``work``: the id of the work it returned (or waits on)."""

    what: str
    group: str
    ranks: tuple[int, ...]
    peer: int = -1
    tag: int = 0
    nbytes: int = 0
    work: int = -1
    op: str = ""

    def to_json(self) -> str:
        return json.dumps(dataclasses.astuple(self))

    @classmethod
    def from_json(cls, line: str) -> Call:
        what, group, ranks, *rest = json.loads(line)
        return cls(what, group, tuple(ranks), *rest)


def group_name(key: Hashable, ranks: tuple[int, ...]) -> str:
    """The name a record gives the runtime's group ``key``: a communicator name as it is (``"act:0>1"``,
    ``"fetch0-up"``), a stage's replica set ``"replicas:0,1"``, a tie's combine ``"tied0:0,3"``."""
    members = ",".join(map(str, ranks))
    if isinstance(key, str):
        return key
    if isinstance(key, tuple) and key and key[0] == "tied":
        return f"tied{key[1]}:{members}"
    return f"replicas:{members}"


class DryGroup:
    """A process group of the dry world: its name and members, nothing else."""

    def __init__(self, name: str, ranks: tuple[int, ...]):
        self.name, self.ranks = name, ranks


class _DoneWork:
    """The work of a dry call: complete once waited on. Until then it reports itself incomplete, so
    code that drops completed works keeps it and waits on it later, as the slowest peer would make
    it do (and as gloo, whose works report completion only once waited on, always does)."""

    def __init__(self):
        self.waited = False

    def wait(self, timeout=None) -> bool:
        self.waited = True
        return True

    def is_completed(self) -> bool:
        return self.waited


class _TracedWork:
    """A work whose ``wait`` is recorded before it runs."""

    def __init__(self, recorder: Recorder, work, call: Call):
        self.recorder, self.work, self.call = recorder, work, call

    def wait(self, timeout=None):
        self.recorder.add(dataclasses.replace(self.call, what="wait", work=self.call.work))
        return self.work.wait() if timeout is None else self.work.wait(timeout)

    def is_completed(self) -> bool:
        return self.work.is_completed()


class Recorder:
    """Records ``rank``'s calls while installed (module docstring). ``groups``: the runtime's process
    groups (key -> group) so a call can name its group; ``world``: the number of ranks; ``dry``: no
    real backend (a dry world); ``sink``: a file the calls are appended to as they happen."""

    def __init__(self, rank: int, world: int, groups: dict, *, dry: bool = False, sink: Path | None = None):
        self.rank, self.world, self.dry, self.sink = rank, world, dry, sink
        self.calls: list[Call] = []
        self.names: dict[int, tuple[str, tuple[int, ...]]] = {}
        self.lock = threading.Lock()
        self.saved: dict[str, Callable] = {}
        for key, g in groups.items():
            self.name(key, g)

    def name(self, key: Hashable, group) -> None:
        """Learn the name of ``group`` (the runtime's ``key`` for it)."""
        ranks = group.ranks if isinstance(group, DryGroup) else tuple(dist.get_process_group_ranks(group))
        self.names[id(group)] = (group_name(key, ranks), ranks)

    def _of(self, group) -> tuple[str, tuple[int, ...]]:
        if group is None:
            return WORLD, tuple(range(self.world))
        return self.names.get(id(group), (f"unnamed:{id(group)}", ()))

    def add(self, call: Call) -> Call:
        with self.lock:
            if call.what != "wait":
                call = dataclasses.replace(call, work=len(self.calls))
            self.calls.append(call)
            if self.sink is not None:
                with open(self.sink, "a") as f:
                    f.write(call.to_json() + "\n")
        return call

    # ---- the wrapped calls ---------------------------------------------------------------
    def _p2p(self, what: str, tensor: torch.Tensor, peer: int, group, tag: int):
        name, ranks = self._of(group)
        if ranks and (peer not in ranks or self.rank not in ranks):
            raise ValueError(
                f"rank {self.rank}: {what} with rank {peer} on group {name} of ranks {ranks}: not a member"
            )
        call = self.add(Call(what, name, ranks, peer, int(tag), tensor.numel() * tensor.element_size()))
        if self.dry:
            if what == "recv":
                tensor.zero_()
            return _TracedWork(self, _DoneWork(), call)
        f = self.saved["isend" if what == "send" else "irecv"]
        return _TracedWork(self, f(tensor, peer, group=group, tag=tag), call)

    def isend(self, tensor, dst=None, group=None, tag=0, **kw):
        return self._p2p("send", tensor, dst, group, tag)

    def irecv(self, tensor, src=None, group=None, tag=0, **kw):
        return self._p2p("recv", tensor, src, group, tag)

    def all_reduce(self, tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        name, ranks = self._of(group)
        call = self.add(Call("coll", name, ranks, nbytes=tensor.numel() * tensor.element_size(), op="all_reduce"))
        work = _DoneWork() if self.dry else self.saved["all_reduce"](tensor, op=op, group=group, async_op=True)
        traced = _TracedWork(self, work, call)
        if async_op:
            return traced
        traced.wait()
        return None

    def collective(self, op: str) -> None:
        """A blocking collective of the default group (the driver's barrier, broadcasts, gathers)."""
        call = self.add(Call("coll", WORLD, tuple(range(self.world)), op=op))
        self.add(dataclasses.replace(call, what="wait"))

    def new_group(self, ranks, timeout=None, **kw) -> DryGroup:
        """A dry world's group (recorded; every rank creates every group, in one order)."""
        members = tuple(int(r) for r in ranks)
        g = DryGroup(f"group{sum(c.what == 'group' for c in self.calls)}", members)
        self.add(Call("group", WORLD, tuple(range(self.world)), op=",".join(map(str, members))))
        self.names[id(g)] = (g.name, members)
        return g

    # ---- installation --------------------------------------------------------------------
    def install(self) -> Recorder:
        for fn in ("isend", "irecv", "all_reduce"):
            self.saved[fn] = getattr(dist, fn)
            setattr(dist, fn, getattr(self, fn))
        return self

    def uninstall(self) -> None:
        for fn, f in self.saved.items():
            setattr(dist, fn, f)
        self.saved = {}


_live: dict[str, Any] = {"recorder": None}


def from_env(rank: int, world: int, groups: dict, run_out: str | None) -> Recorder | None:
    """Start recording this rank's live calls when ``$WORKBENCH_COMM_TRACE`` names a folder (an
    executor calls this when it is built, so each job of a process has its own file); else None."""
    folder = os.environ.get(ENV)
    if not folder or not dist.is_initialized():  # a dry run's executors (no process group) record dry
        return None
    if _live["recorder"] is not None:
        _live["recorder"].uninstall()
    sink = Path(folder) / f"{Path(run_out or 'run').name}.rank{rank}.jsonl"
    sink.parent.mkdir(parents=True, exist_ok=True)
    sink.unlink(missing_ok=True)
    _live["recorder"] = Recorder(rank, world, groups, sink=sink).install()
    return _live["recorder"]


def load(folder: Path, run_out: str, world: int) -> list[list[Call]]:
    """The live traces of run ``run_out``'s ranks from ``folder``."""
    out = []
    for r in range(world):
        path = Path(folder) / f"{Path(run_out).name}.rank{r}.jsonl"
        out.append([Call.from_json(line) for line in path.read_text().splitlines() if line])
    return out


def per_communicator(calls: list[Call], rank: int, *, tags: bool = True) -> dict[tuple, list[tuple]]:
    """``rank``'s point-to-point operations and collectives (``calls``) grouped by communicator
    (group and pair of ranks) in issue order, as ``(what, peer, tag, nbytes)`` (``tags=False``: the
    tag left out, for a run with ``one_tag``)."""
    out: dict[tuple, list[tuple]] = {}
    for c in calls:
        if c.what in ("send", "recv"):
            key: tuple = (c.group, *sorted((c.peer, rank)))
        elif c.what == "coll" and c.group != WORLD:
            key = (c.group,)
        else:
            continue
        out.setdefault(key, []).append((c.what, c.peer, c.tag if tags else 0, c.nbytes))
    return out


def sequence(calls: list[Call], *, tags: bool = True) -> list[tuple]:
    """A rank's point-to-point operations, collectives and waits in issue order, without the default
    group's (the driver's barrier and gathers, recorded in a dry run only) and without group
    creation: ``(what, group, peer, tag, nbytes)`` (a wait: of the call it waits on; ``tags=False``:
    the tag left out)."""
    return [
        (c.what, c.group, c.peer, c.tag if tags else 0, c.nbytes)
        for c in calls
        if c.what in ("send", "recv", "coll", "wait") and c.group != WORLD
    ]

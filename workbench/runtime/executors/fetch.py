"""Remote weights of the master-schedule family (FSDP, FSLPP, any ``from_placement`` placement).

An op F/B/BI/BW of stage ``s`` on worker ``w`` whose ``weights_worker`` is ``o != w`` reads
``W_s^(v)`` (``v = op.version``) owned by ``o`` (see :mod:`workbench.schedules.core`). Two transfers
follow, both derived once from the schedule, so both ends know every message in advance:

* **fetch** (owner -> consumer): one transfer of the flat parameter vector of ``W_s^(v)`` per
  ``(stage, microbatch)`` pair that ``w`` computes with remote weights: the forward fetches, its
  backward reuses the same tensors (they are stashed in the forward's graph). Per round this is
  exactly ``worker_stats(schedule)["weight_transfers"][w]``, the document's count. The owner posts its
  sends as soon as the version exists: at the start of the round for the round's first version,
  right after the STEP that creates it otherwise. The consumer keeps :data:`FETCH_AHEAD` receives
  posted ahead of use, so the next fetch overlaps the current op (FSDP's prefetch).
* **push** (consumer -> owner): the weight gradients ``g_s(b)`` of the ops of ``w`` on stage ``s``
  that read version ``t`` of owner ``o`` (``w`` holds no replica of ``s``) are summed on ``w``,
  ``P = sum_b g_s(b)``, and sent once, after ``w``'s last such op. The owner adds every ``P`` to its
  update buffer before the AR/STEP of update ``t``; the STEP divides by
  ``n = |step_microbatches(s, t)|`` (which lists these microbatches too), so
  ``W_s^(t+1) = W_s^(t) - lr * mean_{b in step t} g_s(b)``, exactly the rule of the schedule.

Fetches and pushes travel in their own process groups (:func:`remote_channel`: one per stage and
direction), apart from the activation and gradient traffic, with tags unique within an epoch (or
all 0 with ``one_tag``: matched by order, as NCCL does):
``fetch: (g * S + s)`` with ``g = k * M + b`` and ``push: ((k * S + s) * T + t)`` (``k`` the round
within the epoch, ``T`` the most updates a stage makes per round). Every wait has the job's timeout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from workbench.schedules.core import COMPUTE, Schedule

FETCH_AHEAD = 2  # fetch receives kept posted ahead of the op that needs them


def remote_channel(what: str, stage: int, src: int, dst: int) -> str:
    """The communicator of the weight fetches (``what`` = ``"fetch"``) and gradient pushes
    (``"push"``) of ``stage`` from ``src`` to ``dst``: one per stage and direction. An owner of
    several stages sends each stage's versions as it makes them while its consumers read them in
    their op order: per stage these orders agree, across stages they need not (fslpp), and NCCL
    matches a pair's messages on one communicator by order
    (:func:`workbench.runtime.transport.nccl_model.check_nccl`)."""
    return f"{what}{stage}" + ("-up" if dst > src else "-down")


def remote_channels(schedule: Schedule) -> list[str]:
    """Every :func:`remote_channel` name of ``schedule``'s run, in one order for all ranks."""
    S = schedule.num_stages
    return [f"{w}{s}{d}" for s in range(S) for w in ("fetch", "push") for d in ("-up", "-down")]


def is_remote(op, worker: int) -> bool:
    return op.kind in COMPUTE and op.weights_worker is not None and op.weights_worker != worker


def has_remote(schedule: Schedule) -> bool:
    return schedule.remote_weights


def check_remote(schedule: Schedule) -> None:
    """ValueError unless the runtime can execute the schedule's remote-weight ops: the weights
    worker holds the stage, the forward and backward of a (stage, microbatch) read the same owner
    and version, and the rule is not ``async``."""
    reads: dict[tuple[int, int], set] = {}
    remote: set[tuple[int, int]] = set()
    for w, op in schedule:
        if op.kind not in COMPUTE:
            continue
        o = op.weights_worker if op.weights_worker is not None else w
        if is_remote(op, w):
            if schedule.update == "async":
                raise ValueError(
                    f"schedule {schedule.name!r}: remote weights ({op} on worker {w}) under the 'async' "
                    "rule are not supported; use a synchronous rule"
                )
            if o not in schedule.stage_workers[op.stage]:
                raise ValueError(
                    f"schedule {schedule.name!r}: {op} on worker {w} reads weights of worker {o}, which "
                    f"holds no replica of stage {op.stage} (holders {schedule.stage_workers[op.stage]})"
                )
            remote.add((op.stage, op.microbatch))
        reads.setdefault((op.stage, op.microbatch), set()).add((o, op.version))
    for s, b in sorted(remote):
        if len(reads[(s, b)]) > 1:
            raise ValueError(
                f"schedule {schedule.name!r}: the ops of stage {s}, microbatch {b} read weights (worker, "
                f"version) {sorted(reads[(s, b)])}; remote weights must come from one owner's version for "
                "a forward and its backward (give both directions the same weights_worker)"
            )


class RemotePlan:
    """One rank's share of the remote-weight traffic of a schedule, derived once (versions relative
    to the round, as in the op lists).

    Consumer side: ``fetches`` = ``[(s, b, v, owner)]`` in the order of this rank's first op of each
    remote ``(s, b)``; ``push_of[i]`` = ``(s, t, owner)`` for op ``i`` whose weight gradient is pushed;
    ``push_last[(s, t, owner)]`` = index of its last op. Owner side: ``sends[(s, v)]`` =
    ``[(consumer, b)]``; ``pushes_in[(s, t)]`` = consumers that push to this rank.
    """

    def __init__(self, schedule: Schedule, rank: int):
        check_remote(schedule)
        self.rank = rank
        holders = [set(ws) for ws in schedule.stage_workers]
        self.fetches: list[tuple[int, int, int, int | None]] = []
        self.push_of: dict[int, tuple[int, int, int | None]] = {}
        self.push_last: dict[tuple[int, int, int | None], int] = {}
        seen = set()
        for i, op in enumerate(schedule.ops[rank]):
            if not is_remote(op, rank):
                continue
            s, b = op.stage, op.microbatch
            if (s, b) not in seen:
                seen.add((s, b))
                self.fetches.append((s, b, op.version, op.weights_worker))
            if op.kind in ("B", "BW") and rank not in holders[s]:
                key = (s, op.version, op.weights_worker)
                self.push_of[i] = key
                self.push_last[key] = i
        self.sends: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self.pushes_in: dict[tuple[int, int], list[int]] = {}
        for w in range(schedule.num_workers):
            done = set()
            for op in schedule.ops[w]:
                if not is_remote(op, w) or op.weights_worker != rank:
                    continue
                if (op.stage, op.microbatch) not in done:
                    done.add((op.stage, op.microbatch))
                    self.sends.setdefault((op.stage, op.version), []).append((w, op.microbatch))
                if op.kind in ("B", "BW") and w not in holders[op.stage]:
                    got = self.pushes_in.setdefault((op.stage, op.version), [])
                    if w not in got:
                        got.append(w)

    def __bool__(self) -> bool:
        return bool(self.fetches or self.sends)


@dataclass(slots=True)
class RemoteStats:
    """One rank's remote-weight traffic over a run (its ``summary.json`` entry, in this order): the
    fetches it received and their bytes, the summed gradients it pushed and their bytes, the weight
    versions it sent as an owner, and the ms it waited for fetches."""

    weight_fetches: int = 0
    weight_fetch_bytes: int = 0
    gradient_pushes: int = 0
    gradient_push_bytes: int = 0
    weight_sends: int = 0
    weight_fetch_wait_ms: float = 0.0


class RemoteWeights:
    """Executes a :class:`RemotePlan`: posts and waits the fetches and pushes of one rank."""

    def __init__(
        self,
        schedule: Schedule,
        rank: int,
        layouts: dict[int, tuple[list[tuple[str, torch.Size]], torch.dtype]],
        device,
        timeout_s: float,
        *,
        groups: dict,
        one_tag: bool = False,
    ):
        self.plan = RemotePlan(schedule, rank)
        self.rank, self.S, self.M = rank, schedule.num_stages, schedule.microbatches
        # stage -> [(name, shape)] in the order of the flat vector, and the stage's dtype
        self.layouts = {s: lay for s, (lay, _) in layouts.items()}
        self.dtypes = {s: dt for s, (_, dt) in layouts.items()}
        self.numel = {s: sum(sh.numel() for _, sh in lay) for s, lay in self.layouts.items()}
        self.device = device
        self.timeout = timedelta(seconds=timeout_s)
        self.groups, self.one_tag = groups, one_tag  # remote_channel(...) -> process group
        self.T = max(schedule.updates_per_round) + 1
        self.sends: list = []  # (work, tensor) in flight
        self.posted: dict = {}  # (s, b) -> (work, buffer, owner)
        self.next_fetch = 0
        self.k = 0
        self.push_bufs: dict = {}  # consumer: (s, t, owner) -> flat sum
        self.push_recvs: dict = {}  # owner: (s, t) -> [(work, buffer, consumer)]
        self.collected: set = set()
        self.stats = RemoteStats()

    # ---- tags ---------------------------------------------------------------------------
    def _fetch_tag(self, s: int, b: int) -> int:
        return 0 if self.one_tag else (self.k * self.M + b) * self.S + s

    def _push_tag(self, s: int, t: int) -> int:
        return 0 if self.one_tag else (self.k * self.S + s) * self.T + t

    def _group(self, what: str, s: int, src: int, dst: int):
        """The process group of the channel (None: the default group, where none were made)."""
        name = remote_channel(what, s, src, dst)
        if self.groups and name not in self.groups:
            raise RuntimeError(f"no process group for communicator {name!r}")
        return self.groups.get(name)

    # ---- per round ----------------------------------------------------------------------
    def begin_round(self, k: int, versions: dict[int, dict]) -> None:
        """Round ``k`` of the epoch starts; ``versions[s]`` = this rank's current weights of every
        stage it holds (the round's version 0)."""
        if self.posted or any(self.push_recvs.values()):
            raise RuntimeError(f"rank {self.rank}: remote-weight messages of the previous round were not consumed")
        self.k, self.next_fetch = k, 0
        self.collected = set()
        for (s, t), consumers in self.plan.pushes_in.items():
            recvs = []
            for c in consumers:
                buf = torch.empty(self.numel[s], dtype=self.dtypes[s], device=self.device)
                recvs.append(
                    (dist.irecv(buf, c, tag=self._push_tag(s, t), group=self._group("push", s, c, self.rank)), buf, c)
                )
            self.push_recvs[(s, t)] = recvs
        for s, params in versions.items():
            self.post_sends(s, 0, params)
        self._prefetch()

    def post_sends(self, s: int, v: int, params: dict[str, torch.Tensor]) -> None:
        """Owner: version ``v`` (relative to the round) of stage ``s`` now exists; send it to every
        (consumer, microbatch) that reads it."""
        targets = self.plan.sends.get((s, v), ())
        if not targets:
            return
        flat = torch.cat([params[n].detach().reshape(-1) for n, _ in self.layouts[s]])
        self.sends = [(w, t) for w, t in self.sends if not w.is_completed()]
        for c, b in targets:
            group = self._group("fetch", s, self.rank, c)
            self.sends.append((dist.isend(flat, c, tag=self._fetch_tag(s, b), group=group), flat))
            self.stats.weight_sends += 1

    def _prefetch(self) -> None:
        while self.next_fetch < len(self.plan.fetches) and len(self.posted) < FETCH_AHEAD:
            self._post_one()

    def _post_one(self) -> None:
        s, b, _, owner = self.plan.fetches[self.next_fetch]
        assert owner is not None, "a remote op names its weights' owner"
        buf = torch.empty(self.numel[s], dtype=self.dtypes[s], device=self.device)
        group = self._group("fetch", s, owner, self.rank)
        self.posted[(s, b)] = (dist.irecv(buf, owner, tag=self._fetch_tag(s, b), group=group), buf, owner)
        self.next_fetch += 1

    def fetch(self, s: int, b: int) -> tuple[dict[str, torch.Tensor], float]:
        """Consumer: the weights of stage ``s`` for microbatch ``b`` as autograd leaves, and the ms waited."""
        while (s, b) not in self.posted and self.next_fetch < len(self.plan.fetches):
            self._post_one()
        if (s, b) not in self.posted:
            raise RuntimeError(f"rank {self.rank}: weights of stage {s} for microbatch {b} were not expected")
        work, buf, owner = self.posted.pop((s, b))
        t = time.perf_counter()
        self._wait(work, f"weights of stage {s} (microbatch {b}) from rank {owner}")
        waited = (time.perf_counter() - t) * 1e3
        self.stats.weight_fetches += 1
        self.stats.weight_fetch_bytes += buf.numel() * buf.element_size()
        self.stats.weight_fetch_wait_ms += waited
        self._prefetch()
        out, k = {}, 0
        for n, sh in self.layouts[s]:
            out[n] = buf[k : k + sh.numel()].view(sh).detach().requires_grad_(True)
            k += sh.numel()
        return out, waited

    def add_gradient(self, i: int, dw: dict[str, torch.Tensor]) -> None:
        """Consumer: op ``i``'s weight gradient joins the push of its (stage, update, owner); the sum
        is sent after the last op that contributes to it."""
        key = self.plan.push_of[i]
        s, t, owner = key
        flat = torch.cat([dw[n].detach().reshape(-1) for n, _ in self.layouts[s]])
        if key in self.push_bufs:
            self.push_bufs[key].add_(flat)
        else:
            self.push_bufs[key] = flat
        if self.plan.push_last[key] == i:
            buf = self.push_bufs.pop(key)
            self.sends = [(w, x) for w, x in self.sends if not w.is_completed()]
            assert owner is not None, "a remote op names its weights' owner"
            group = self._group("push", s, self.rank, owner)
            self.sends.append((dist.isend(buf, owner, tag=self._push_tag(s, t), group=group), buf))
            self.stats.gradient_pushes += 1
            self.stats.gradient_push_bytes += buf.numel() * buf.element_size()

    def collect(self, s: int, t: int, flat: torch.Tensor) -> float:
        """Owner: add every pushed gradient sum of update ``t`` of stage ``s`` to ``flat`` (the update
        buffer), once, before that update's AR or STEP; returns the ms waited."""
        if (s, t) in self.collected:
            return 0.0
        self.collected.add((s, t))
        start = time.perf_counter()
        for work, buf, c in self.push_recvs.pop((s, t), ()):
            self._wait(work, f"gradient push of stage {s} update {t} from rank {c}")
            flat.add_(buf)
        return (time.perf_counter() - start) * 1e3

    def flush(self) -> None:
        for w, _ in self.sends:
            self._wait(w, "a weight or gradient send")
        self.sends = []

    def _wait(self, work, what: str) -> None:
        try:
            work.wait(self.timeout)
        except Exception as e:  # noqa: BLE001 - re-raise with context
            raise TimeoutError(
                f"rank {self.rank}: {what} did not complete within {self.timeout.total_seconds():.0f} s ({e})"
            ) from None

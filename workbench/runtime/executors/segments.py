"""Runtime for Seq1F1B schedules and activation re-materialization on a segment-wise transformer.

One process per worker (``torch.multiprocessing.spawn``, gloo); each runs its op list of the
:class:`~workbench.schedules.core.Schedule` in order, with a model from
:func:`workbench.models.segmented.segment_gpt` cut into stages by layer ranges.

Segments. ``F(s, b, j)`` runs stage s on tokens ``N_(j-1) .. N_j - 1`` of sequence batch b. Every
block attends over the keys and values of the earlier segments, which it reads as *detached leaves*
``K_i~, V_i~`` (one per earlier segment and block), so their gradients accumulate in
``K_i~.grad``, ``V_i~.grad`` while the later segments run their backward. The backward of
segment i (``B``; backward order j = k-1 .. 0) then differentiates its outputs together::

    torch.autograd.backward([y_i, K_i, V_i, ...], [dL/dy_i, K_i~.grad, V_i~.grad, ...])

which gives the exact gradient of the whole-sequence loss: the chain rule through every path from
segment i's weights and input to the loss. ``BI``/``BW`` (ZB-H1) split that call: input, past-key
and past-value gradients first (``inputs=`` those leaves, graph retained), weight gradients later
(``inputs=`` the parameters), from the same graph and cotangents.

Loss: token-level cross entropy summed and divided by the tokens of the step
(``microbatches_per_step * batch * seq_len``), so the accumulated gradient is the mean over the
step's tokens, like the single-process reference :func:`reference`. ``STEP``: SGD, ``W -= lr g``.

Recompute (``schedule.recompute``): the stage forward runs under
:func:`torch.utils.checkpoint.checkpoint` (non-reentrant): only its inputs (stage input, past keys
and values) are kept, and the forward is recomputed when the backward reaches it.

Measured memory: bytes autograd saves for the backward (``saved_tensors_hooks``; parameters
excluded, storages counted once per unit) plus the stage inputs kept, summed over the units in flight;
``peak_saved_bytes`` per rank is the peak of that sum over the op list.

Communication: activations and gradients with ``isend``/``irecv`` and a tag per (kind, stage, unit);
every receive waits at most ``timeout_s`` (the process group has the same timeout), so a broken
schedule fails instead of hanging.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from workbench.models.data import TokenDataset, load_dataset
from workbench.models.segmented import SegBlock, SegEmbedding, segment_gpt
from workbench.runtime.launch.lifetime import spawn
from workbench.runtime.launch.ports import free_port
from workbench.runtime.semantics.stages import even_bounds
from workbench.runtime.transport.comm_plan import group_of, p2p_channel
from workbench.runtime.transport.messages import MessageKind
from workbench.schedules.core import Schedule


@dataclass
class SegmentJob:
    """Everything a rank needs: the schedule, the model recipe, the data and the run limits."""

    schedule: Schedule
    x: torch.Tensor  # [microbatches * batch, seq_len] token ids
    y: torch.Tensor  # next-token targets, same shape
    model: dict = field(default_factory=dict)  # keyword arguments of segment_gpt
    bounds: list | None = None  # layer range per stage; None: even split
    lr: float = 0.1
    timeout_s: float = 60.0

    def layer_bounds(self, num_layers: int) -> list[tuple[int, int]]:
        return self.bounds or even_bounds(num_layers, self.schedule.num_stages)

    @property
    def batch(self) -> int:
        return self.x.shape[0] // self.schedule.microbatches

    def offsets(self) -> list[int]:
        """N_0 = 0, N_1, ..., N_k: segment boundaries in tokens (one segment: the whole sequence)."""
        n = self.schedule.segment_tokens or (self.x.shape[1],)
        if sum(n) != self.x.shape[1]:
            raise ValueError(
                f"segments cover {sum(n)} tokens but the sequences have {self.x.shape[1]}; "
                f"build the schedule with seq_len={self.x.shape[1]}"
            )
        return [0] + [sum(n[: i + 1]) for i in range(len(n))]


# ---- one stage -------------------------------------------------------------------------------
class SegmentStage:
    """Layers of one stage (segment layers: :mod:`workbench.models.segmented`) and the state of the
    (microbatch, segment) units in flight. ``params``: the stage's parameters by name (the tensors
    its layers hold); ``offsets``: segment boundaries N_0 .. N_k in tokens; the last stage's loss of
    a unit is its tokens' summed cross entropy divided by ``norm``."""

    def __init__(
        self, stage: int, layers, is_last: bool, params: dict, offsets, *, norm: float, recompute: bool = False
    ):
        self.stage, self.layers, self.is_last, self.params = stage, list(layers), is_last, params
        self.ptrs = {p.data_ptr() for p in self.params.values()}
        self.blocks = [i for i, m in enumerate(self.layers) if isinstance(m, SegBlock)]
        self.offsets, self.k, self.norm, self.recompute = list(offsets), len(offsets) - 1, norm, recompute
        self.units: dict[tuple[int, int], dict] = {}
        self.past: dict[tuple[int, int], list] = {}  # (b, j) -> [(K~, V~) per block]: leaves for later segments
        self.saved_bytes = 0

    @classmethod
    def of_job(cls, stage: int, layers, first: int, last: int, job: SegmentJob) -> SegmentStage:
        """Layers ``first..last`` of ``segment_gpt`` for a :class:`SegmentJob` (parameters named
        ``"<layer>.<name>"``, the loss normalised by the step's tokens)."""
        mine = [layers[i] for i in range(first, last + 1)]
        params = {f"{first + i}.{n}": p for i, m in enumerate(mine) for n, p in m.named_parameters()}
        norm = job.schedule.microbatches_per_step * job.batch * job.x.shape[1]
        return cls(
            stage, mine, last == len(layers) - 1, params, job.offsets(), norm=norm, recompute=job.schedule.recompute
        )

    def _run(self, x, offset: int, j: int, *flat_past):
        """The stage on one segment: returns (output, K, V of each block)."""
        kv, h, i = [], x, 0
        for _li, m in enumerate(self.layers):
            if isinstance(m, SegBlock):
                past = flat_past[i * 2 * j : (i + 1) * 2 * j]
                h, kk, vv = m(h, offset, past[:j], past[j:])
                kv += [kk, vv]
                i += 1
            elif isinstance(m, SegEmbedding):
                h = m(h, offset)
            else:
                h = m(h)
        return (h, *kv)

    def forward(self, b: int, j: int, x: torch.Tensor, target: torch.Tensor | None = None):
        """F(s, b, j): ``(output, loss)``: the activation to send on, or on the last stage the logits
        (detached) and the unit's loss (``target``: the segment's next tokens)."""
        x_leaf = x.detach().requires_grad_(True) if x.is_floating_point() else x
        past_leaves = [
            t
            for i in range(len(self.blocks))
            for t in [self.past[(b, jj)][i][0] for jj in range(j)] + [self.past[(b, jj)][i][1] for jj in range(j)]
        ]
        storages: dict[int, int] = {}

        def pack(t):
            if t.data_ptr() not in self.ptrs:
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if self.recompute:
                outs = checkpoint(self._run, x_leaf, self.offsets[j], j, *past_leaves, use_reentrant=False)
            else:
                outs = self._run(x_leaf, self.offsets[j], j, *past_leaves)
        y, kv = outs[0], list(outs[1:])
        out = y.detach()
        if self.is_last:
            assert target is not None, "the last stage's forward needs the segment's next tokens"
            y = F.cross_entropy(y.reshape(-1, y.shape[-1]), target.reshape(-1), reduction="sum") / self.norm
        self.past[(b, j)] = [
            (kv[2 * i].detach().requires_grad_(True), kv[2 * i + 1].detach().requires_grad_(True))
            for i in range(len(self.blocks))
        ]
        held = sum(storages.values()) + x.numel() * x.element_size()
        self.saved_bytes += held
        self.units[(b, j)] = {"x": x_leaf, "y": y, "kv": kv, "past": past_leaves, "bytes": held}
        return out, (y.detach() if self.is_last else None)

    def _cotangents(self, b: int, j: int, grad_y):
        """Outputs of unit (b, j) and their gradients: dL/dy, and K~/V~ gradients from later segments."""
        u = self.units[(b, j)]
        outs, grads = [u["y"]], [torch.ones_like(u["y"]) if self.is_last else grad_y]
        for i, (kl, vl) in enumerate(self.past[(b, j)]):
            for t, leaf in ((u["kv"][2 * i], kl), (u["kv"][2 * i + 1], vl)):
                if leaf.grad is not None:
                    outs.append(t)
                    grads.append(leaf.grad)
        return outs, grads

    def backward(self, kind: str, b: int, j: int, grad_y) -> torch.Tensor | None:
        """B / BI / BW of unit (b, j); returns the input gradient to send upstream (B, BI)."""
        u = self.units[(b, j)]
        if kind in ("B", "BI"):
            u["cot"] = self._cotangents(b, j, grad_y)
        outs, grads = u["cot"]
        x_in = [u["x"]] if u["x"].is_floating_point() else []
        if kind == "B":
            torch.autograd.backward(outs, grads)
        elif kind == "BI" and x_in + u["past"]:
            torch.autograd.backward(outs, grads, inputs=x_in + u["past"], retain_graph=True)
        elif kind == "BW":
            torch.autograd.backward(outs, grads, inputs=list(self.params.values()))
        if kind in ("B", "BW"):
            self.saved_bytes -= u["bytes"]
            del self.units[(b, j)], self.past[(b, j)]
        return u["x"].grad if kind != "BW" and x_in else None

    def step(self, lr: float) -> dict[str, torch.Tensor]:
        """SGD step; returns the gradients it applied."""
        grads = {}
        with torch.no_grad():
            for n, p in self.params.items():
                g = p.grad if p.grad is not None else torch.zeros_like(p)
                grads[n] = g.clone()
                p -= lr * g
                p.grad = None
        return grads


# ---- one rank ----------------------------------------------------------------------------------
class Mailbox:
    """Tagged point-to-point transfers between ranks (local hand-over on the same rank). ``groups``:
    communicator name (:func:`~workbench.runtime.transport.comm_plan.p2p_channel`) -> process group (None or a
    missing name: the default group); ``one_tag``: every message with tag 0 (matched by order)."""

    def __init__(self, schedule: Schedule, rank: int, timeout_s: float, groups=None, one_tag: bool = False):
        self.where, self.rank, self.timeout = schedule.where(), rank, timedelta(seconds=timeout_s)
        self.groups, self.one_tag = groups or {}, one_tag
        self.S, self.U = schedule.num_stages, schedule.microbatches * schedule.num_segments
        self.local: dict[int, torch.Tensor] = {}
        self.pending: list[tuple[Any, torch.Tensor]] = []

    def tag(self, kind: MessageKind, stage: int, unit: int) -> int:
        """The tag of ``unit``'s message to ``stage``: its input (``ACT``) or its output's gradient (``GRAD``)."""
        return (kind * self.S + stage) * self.U + unit

    def _group(self, tag: int, src: int, dst: int):
        kind = MessageKind.GRAD if tag >= self.S * self.U else MessageKind.ACT
        return group_of(self.groups, p2p_channel(kind, src, dst))

    def send(self, t: torch.Tensor, dst: int, tag: int) -> None:
        if dst == self.rank:
            self.local[tag] = t
        else:
            t = t.contiguous()
            group, wire = self._group(tag, self.rank, dst), 0 if self.one_tag else tag
            self.pending.append((dist.isend(t, dst, group=group, tag=wire), t))  # keep t alive until sent

    def recv(self, like: torch.Tensor, src: int, tag: int) -> torch.Tensor:
        if src == self.rank:
            return self.local.pop(tag)
        buf = torch.empty_like(like)
        work = dist.irecv(buf, src, group=self._group(tag, src, self.rank), tag=0 if self.one_tag else tag)
        if work is None or not work.wait(timeout=self.timeout):
            raise TimeoutError(f"rank {self.rank}: no message with tag {tag} from rank {src} within {self.timeout}")
        return buf

    def flush(self) -> None:
        for work, _ in self.pending:
            work.wait(timeout=self.timeout)
        self.pending.clear()


def run_rank(rank: int, job: SegmentJob) -> dict:
    """Execute ``job.schedule.ops[rank]``; returns the first step's gradients, the final weights of
    this rank's stages and the measured peak of saved activation bytes."""
    sched = job.schedule
    layers = segment_gpt(**job.model)
    bounds = job.layer_bounds(len(layers))
    mine = sorted({op.stage for op in sched.ops[rank]})
    stages = {s: SegmentStage.of_job(s, layers, *bounds[s], job) for s in mine}
    box = Mailbox(sched, rank, job.timeout_s)
    dim, dtype, B = cast(nn.Embedding, layers[0].tok).embedding_dim, next(layers.parameters()).dtype, job.batch
    off = stages[mine[0]].offsets
    grads: dict[int, dict[str, torch.Tensor]] = {}
    peak = 0
    for op in sched.ops[rank]:
        st = stages[op.stage]
        if op.kind == "STEP":
            grads.setdefault(op.stage, st.step(job.lr))
            continue
        b, j, u = op.microbatch, op.segment or 0, sched.unit(op)
        like = torch.empty(B, off[j + 1] - off[j], dim, dtype=dtype)
        if op.kind == "F":
            x = (
                job.x[b * B : (b + 1) * B, off[j] : off[j + 1]]
                if op.stage == 0
                else box.recv(like, box.where[("F", op.stage - 1, u)], box.tag(MessageKind.ACT, op.stage, u))
            )
            target = job.y[b * B : (b + 1) * B, off[j] : off[j + 1]] if st.is_last else None
            y, _ = st.forward(b, j, x, target)
            if not st.is_last:
                box.send(y, box.where[("F", op.stage + 1, u)], box.tag(MessageKind.ACT, op.stage + 1, u))
            peak = max(peak, sum(s.saved_bytes for s in stages.values()))
            continue
        g = None
        if op.kind in ("B", "BI") and op.stage < sched.num_stages - 1:
            split = ("BI", op.stage + 1, u) in box.where  # zero bubble: the input half sends it
            src = box.where[("BI" if split else "B", op.stage + 1, u)]
            g = box.recv(like, src, box.tag(MessageKind.GRAD, op.stage, u))
        dx = st.backward(op.kind, b, j, g)
        if dx is not None and op.stage > 0:
            box.send(dx, box.where[("F", op.stage - 1, u)], box.tag(MessageKind.GRAD, op.stage - 1, u))
    box.flush()
    weights = {s: {n: p.detach().clone() for n, p in st.params.items()} for s, st in stages.items()}
    return {"grads": grads, "weights": weights, "peak_saved_bytes": peak}


def _entry(rank: int, world: int, jobs: list[SegmentJob], port: int, out: str) -> None:
    torch.set_num_threads(1)
    timeout = timedelta(seconds=max(job.timeout_s for job in jobs))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timeout)
    try:
        results = []
        for job in jobs:  # one after another; a barrier keeps their messages apart
            results.append(run_rank(rank, job))
            dist.monitored_barrier(timeout=timeout)
        torch.save(results, Path(out) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run(jobs: SegmentJob | list[SegmentJob]) -> dict | list[dict]:
    """Run a job (or several, one after another in the same processes: one start-up) on
    ``schedule.num_workers`` gloo ranks (:func:`workbench.runtime.launch.lifetime.spawn`). Per job: ``grads[stage]`` and
    ``weights[stage]`` ({parameter name: tensor}) and ``peak_saved_bytes[rank]``."""

    many = isinstance(jobs, (list, tuple))
    jobs = list(jobs) if isinstance(jobs, (list, tuple)) else [jobs]
    W = jobs[0].schedule.num_workers
    if any(job.schedule.num_workers != W for job in jobs):
        raise ValueError("jobs run together must have schedules with the same number of workers")
    with tempfile.TemporaryDirectory() as out:
        spawn(_entry, (W, jobs, free_port(), out), W, what="the segment job")
        parts = [torch.load(Path(out) / f"rank{r}.pt") for r in range(W)]
    merged = []
    for i in range(len(jobs)):
        m: dict[str, Any] = {"grads": {}, "weights": {}, "peak_saved_bytes": [p[i]["peak_saved_bytes"] for p in parts]}
        for p in parts:
            m["grads"].update(p[i]["grads"])
            m["weights"].update(p[i]["weights"])
        merged.append(m)
    return merged if many else merged[0]


def reference(job: SegmentJob) -> dict:
    """Whole sequences, one process: per step, the mean token cross entropy over the step's
    microbatches, its gradient, and SGD; the same ``grads`` / ``weights`` layout as :func:`run`."""
    layers = segment_gpt(**job.model)
    bounds = job.layer_bounds(len(layers))
    params = {
        s: {f"{first + i}.{n}": p for i, m in enumerate(layers[first : last + 1]) for n, p in m.named_parameters()}
        for s, (first, last) in enumerate(bounds)
    }
    m = job.schedule.microbatches_per_step * job.batch
    grads: dict[int, dict[str, torch.Tensor]] = {}
    for t in range(math.ceil(job.x.shape[0] / m)):
        h = job.x[t * m : (t + 1) * m]
        for layer in layers:
            h = layer(h)[0] if isinstance(layer, SegBlock) else layer(h)
        loss = F.cross_entropy(h.reshape(-1, h.shape[-1]), job.y[t * m : (t + 1) * m].reshape(-1))
        loss.backward()
        with torch.no_grad():
            for s, ps in params.items():
                step = {n: cast(torch.Tensor, p.grad) for n, p in ps.items()}
                if t == 0:
                    grads[s] = {n: g.clone() for n, g in step.items()}
                for n, p in ps.items():
                    p.sub_(job.lr * step[n])
                    p.grad = None
    weights = {s: {n: p.detach().clone() for n, p in ps.items()} for s, ps in params.items()}
    return {"grads": grads, "weights": weights}


def pydocs_batch(rows: int, seq_len: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``rows`` sequences of the offline ``pydocs`` corpus (char level), picked with ``seed``: (x, y, vocab)."""

    ds = load_dataset("pydocs", seq_len=seq_len)
    idx = torch.randperm(len(ds), generator=torch.Generator().manual_seed(seed))[:rows]
    x, y = ds.tensors
    return x[idx], y[idx], len(cast(TokenDataset, ds).vocab)


__all__ = ["SegmentJob", "SegmentStage", "run", "run_rank", "reference", "pydocs_batch"]

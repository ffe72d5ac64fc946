"""Data-parallel BSP (``dp-bsp``) executed with :class:`torch.nn.parallel.DistributedDataParallel`."""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from workbench.runtime.executors import opclock
from workbench.runtime.executors.pipeline import RankProgram
from workbench.runtime.executors.record import timed
from workbench.runtime.executors.tied import tied_weights
from workbench.runtime.semantics.randomness import microbatch_rng
from workbench.runtime.semantics.stages import (
    MomentumState,
    as_leaves,
    as_tuple,
    float_indices,
    from_tuple,
    nbytes,
    stage_module,
)
from workbench.schedules.core import Schedule

# DDP all-reduces the gradients in buckets: the first (the last layers' gradients, ready first) of
# torch's default first-bucket size, then buckets of bucket_cap_mb (its default, 25 MiB). The cost
# model charges one all-reduce per bucket (CostModel.allreduce_buckets).
DDP_BUCKETS = (float(getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 2**20)), 25.0 * 2**20)


@dataclass(slots=True)
class Forwarded:
    """A forward of stage ``s`` on microbatch ``b`` until its backward: the input's leaves ``x``, the
    output ``y`` (its graph runs through the stage's DDP module), their ``act_bytes``, and on the last
    stage the ``loss``."""

    x: tuple
    y: Any
    act_bytes: int
    loss: Any = None


class DDPExecutor(MomentumState):
    """Data-parallel BSP (``dp-bsp``) through :class:`torch.nn.parallel.DistributedDataParallel`.

    Every worker holds all stages; stage ``s`` is wrapped in its own DDP module, so ``B(s, b)``
    (one ``backward`` of the stage from its output cotangent) all-reduces stage ``s``'s gradient
    buckets while the backward runs (DDP's reducer), and ``AR(s, t)`` has nothing left to do.
    Microbatches other than a worker's last one of an update run their forward under ``no_sync``
    (local accumulation). The loss of each microbatch is scaled by ``R / n`` so DDP's average over
    the ``R`` replicas yields the mean over the ``n`` microbatches of the update.
    """

    def __init__(self, ctx, schedule: Schedule, model, bounds, init_weights: list[dict], *, groups: dict):

        self.ctx, self.schedule, self.model, self.rank = ctx, schedule, model, ctx.rank
        self.S, self.M = schedule.num_stages, schedule.microbatches
        self.prog = RankProgram(schedule, self.rank)
        self.clock = opclock.for_device(ctx.device)  # None: the host's clock around each op (CPU)
        self.R = schedule.num_workers
        if tied_weights(model, bounds):  # one parameter in two DDP modules: its reducer would update it twice
            raise ValueError(
                f"{tied_weights(model, bounds)[0].label()}; dp-bsp wraps each stage in its own DDP "
                "module, which cannot share it: train dp-bsp with one stage (no plan)"
            )
        self.modules, self.ddp = [], []
        for s, (a, z) in enumerate(bounds):
            m = stage_module(model.layers, a, z).to(ctx.device)
            with torch.no_grad():
                for n, p in m.named_parameters():
                    p.copy_(init_weights[s][n])
            self.modules.append(m)
            # gradients are views into DDP's all-reduce buckets: no copy into the bucket and back out
            # (measured: 1-2 ms less per backward of the 8 x 512 MLP on 2 gloo ranks)
            self.ddp.append(
                DDP(
                    m,
                    device_ids=None if ctx.device.type == "cpu" else [ctx.device.index],
                    gradient_as_bucket_view=True,
                    bucket_cap_mb=DDP_BUCKETS[1] / 2**20,
                )
            )
        ops = self.prog.ops
        # the microbatch whose backward completes each (stage, update) on this worker: forward with sync
        self.sync, self.step_of = set(), {}
        pending = defaultdict(list)
        for op in ops:
            if op.kind == "B":
                pending[op.stage].append(op.microbatch)
            elif op.kind in ("BI", "BW"):
                raise ValueError("split backward (BI/BW) is not supported with DDP")
            elif op.kind == "AR":
                if pending[op.stage]:
                    self.sync.add((op.stage, pending[op.stage][-1]))
                for b in pending[op.stage]:
                    self.step_of[(op.stage, b)] = op.step
                pending[op.stage] = []
        for s, b in self.sync:
            i_f = next(i for i, o in enumerate(ops) if (o.kind, o.stage, o.microbatch) == ("F", s, b))
            i_b = next(i for i, o in enumerate(ops) if (o.kind, o.stage, o.microbatch) == ("B", s, b))
            if any(o.kind == "B" and o.stage == s for o in ops[i_f + 1 : i_b]):
                raise ValueError(
                    "DDP needs each update's last forward of a stage to be followed by its own backward "
                    "before any other backward of that stage"
                )
        self.records: dict[tuple[int, int], Forwarded] = {}  # (stage, microbatch) -> its forward
        self.cots: dict[tuple[int, int], list[torch.Tensor]] = {}  # (s, b) -> the gradient of s's output
        self.peak_live = 0
        self.peak_act_bytes = 0
        self.momentum = [{n: torch.zeros_like(p) for n, p in m.named_parameters()} for m in self.modules]

    def receive_plan(self, rounds):
        return []

    def run_round(self, k, R, data, timeline, metrics):
        t0, clock = self.ctx.t0, self.clock
        if clock is not None:
            clock.begin(t0)
        for op in self.prog.ops:
            s, b = op.stage, op.microbatch
            start = time.perf_counter()
            pre = clock.mark() if clock is not None else None
            if op.kind == "F":
                x = data(b)[0] if s == 0 else self.records[(s - 1, b)].y.detach()
                xl = as_leaves(x, requires_grad=s > 0)
                sync = (s, b) in self.sync
                rng = microbatch_rng(self.ctx.optim.seed, R * self.M + b)  # the same draws as one process
                with rng, contextlib.nullcontext() if sync else self.ddp[s].no_sync():
                    y = self.ddp[s](from_tuple(xl, isinstance(x, tuple)))
                rec = Forwarded(xl, y, act_bytes=nbytes(xl) + nbytes(as_tuple(y)))
                if s == self.S - 1:
                    _, target = data(b)
                    loss = self.model.loss(y, target)
                    metrics["loss"] += float(loss.detach())
                    metrics["n"] += 1
                    metrics["correct"] += self.model.correct(y.detach(), target)
                    metrics["samples"] += int(target.shape[0])
                    rec.loss = loss
                self.records[(s, b)] = rec
                self.peak_live = max(self.peak_live, len({bb for _, bb in self.records}))
                self.peak_act_bytes = max(self.peak_act_bytes, sum(r.act_bytes for r in self.records.values()))
            elif op.kind == "B":
                rec = self.records.pop((s, b))
                if s == self.S - 1:
                    n = self.prog.count[(s, self.step_of[(s, b)])]
                    (rec.loss * (self.R / n)).backward()
                else:
                    yt = as_tuple(rec.y)
                    cot = self.cots.pop((s, b))
                    pairs = [(yt[i], c) for i, c in zip(float_indices(yt), cot) if yt[i].requires_grad]
                    torch.autograd.backward([p[0] for p in pairs], [p[1] for p in pairs])
                if s > 0:
                    xs = [rec.x[i] for i in float_indices(rec.x)]
                    self.cots[(s - 1, b)] = [t.grad if t.grad is not None else torch.zeros_like(t) for t in xs]
            elif op.kind == "STEP":
                mu = self.ctx.optim.momentum
                with torch.no_grad():
                    for nm, p in self.modules[s].named_parameters():
                        if p.grad is not None:
                            d = p.grad
                            if mu:
                                d = self.momentum[s][nm].mul_(mu).add_(p.grad)
                            p.add_(d, alpha=-self.ctx.optim.lr)
                            p.grad = None
            end = time.perf_counter()
            if clock is not None:
                clock.add(len(timeline), pre, pre, clock.mark())
            rel = op.step + 1 if op.kind == "STEP" else (op.step if op.kind == "AR" else op.version)
            mb = R * self.M + b if b >= 0 else -1
            timeline.append(
                timed(self.rank, s, mb, op.kind, start, end=end, t0=t0, version=R * self.prog.per_round[s] + rel, rnd=R)
            )
        if clock is not None:  # the round's rows in the device's times (one synchronization)
            clock.resolve(timeline, R)

    def weights(self):
        return {s: {n: p.detach().clone() for n, p in m.named_parameters()} for s, m in enumerate(self.modules)}

    def memory(self):
        return {
            s: dict(peak_versions=1, peak_live_microbatches=self.peak_live, peak_activation_bytes=self.peak_act_bytes)
            for s in range(self.S)
        }

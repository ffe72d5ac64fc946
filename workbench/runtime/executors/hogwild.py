"""Asynchronous data parallelism (``dp-asp``): Hogwild on shared-memory weights, staleness measured."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch

from workbench.runtime.executors.pipeline import RankProgram
from workbench.runtime.executors.record import timed
from workbench.runtime.semantics.randomness import microbatch_rng
from workbench.runtime.semantics.stages import MomentumState, as_leaves, from_tuple, run_stage, stage_module, vjp
from workbench.schedules.core import Schedule


@dataclass(slots=True)
class Pulled:
    """A forward of stage ``s`` on microbatch ``b`` until its backward: the input's leaves ``x``
    (``like_tuple``: the stage takes a tuple), the output ``y``, the weights pulled for the update
    (``params``: the backward differentiates at them, whatever the shared weights are by then), and
    on the last stage the ``loss`` and its ``target``."""

    x: tuple
    y: Any
    params: dict
    like_tuple: bool
    loss: Any = None
    target: Any = None


class HogwildExecutor(MomentumState):
    """Asynchronous data parallelism (``async`` rule) on shared-memory weights, without locks.

    Every worker holds all stages. The first ``F(s, b)`` of an update *pulls* stage ``s``: it copies
    the current shared weights, and that copy serves every forward and backward of the update, as an
    asynchronous parameter-server worker computes its gradient on the weights it pulled (the paper's
    ASP). ``STEP(s, t)`` then writes ``W_s <- W_s - lr * mean gradient`` into the shared weights in
    place while the other replicas keep running (Hogwild: no locks). Without the copy, autograd would
    keep references to the shared storage, and a backward would read weights another replica wrote
    after its forward (a gradient of no single weight version). Staleness of an update = updates of
    that stage written by the other replicas between this replica's pull and its write, counted with
    a shared per-(stage, replica) counter table whose slots only their owner writes.
    """

    def __init__(self, ctx, schedule: Schedule, model, bounds, shared: list[dict], *, counters: torch.Tensor):
        self.ctx, self.schedule, self.model, self.rank = ctx, schedule, model, ctx.rank
        self.S, self.M = schedule.num_stages, schedule.microbatches
        self.prog = RankProgram(schedule, self.rank)
        self.modules = [stage_module(model.layers, a, z).to(ctx.device) for a, z in bounds]
        self.shared, self.counters = shared, counters  # counters[s, w]
        self.buf = [{n: torch.zeros_like(t) for n, t in sh.items()} for sh in shared]
        self.momentum = [{n: torch.zeros_like(t) for n, t in sh.items()} for sh in shared]  # local to the replica
        self.records: dict[tuple[int, int], Pulled] = {}  # (stage, microbatch) -> its forward
        self.cots: dict[tuple[int, int], Any] = {}  # (s, b) -> the gradient of s's output
        # stage -> (the other replicas' updates at the pull, the weights pulled) of the current update
        self.pulled: dict[int, tuple[int, dict]] = {}
        self.staleness: list[int] = []

    def receive_plan(self, rounds):
        return []

    def _others(self, s: int) -> int:
        return int(self.counters[s].sum().item() - self.counters[s, self.rank].item())

    def run_round(self, k, R, data, timeline, metrics):
        t0 = self.ctx.t0
        for op in self.prog.ops:
            s, b = op.stage, op.microbatch
            start = time.perf_counter()
            version = -1
            if op.kind == "F":
                x = data(b)[0] if s == 0 else self.records[(s - 1, b)].y.detach()
                if s not in self.pulled:  # the update's pull: one weight version for all its passes
                    copy = {n: t.detach().clone().requires_grad_(True) for n, t in self.shared[s].items()}
                    self.pulled[s] = (self._others(s), copy)
                version = int(self.counters[s].sum().item())
                params = self.pulled[s][1]
                xl = as_leaves(x, requires_grad=s > 0)
                with microbatch_rng(self.ctx.optim.seed, R * self.M + b):
                    y = run_stage(self.modules[s], params, from_tuple(xl, isinstance(x, tuple)))
                rec = Pulled(xl, y, params, like_tuple=isinstance(x, tuple))
                if s == self.S - 1:
                    _, target = data(b)
                    rec.loss = self.model.loss(y, target)
                    rec.target = target
                    metrics["loss"] += float(rec.loss.detach())
                    metrics["n"] += 1
                    metrics["correct"] += self.model.correct(y.detach(), target)
                    metrics["samples"] += int(target.shape[0])
                self.records[(s, b)] = rec
            elif op.kind in ("B", "BW"):
                rec = self.records.pop((s, b))
                last = s == self.S - 1
                kw = dict(loss_fn=self.model.loss, target=rec.target) if last else dict(cot=self.cots.pop((s, b)))
                dx, dw, _ = vjp(self.modules[s], rec.params, rec.x, rec.like_tuple, rec.y, **kw)
                for n, g in dw.items():
                    self.buf[s][n].add_(g)
                if s > 0:
                    self.cots[(s - 1, b)] = dx
            elif op.kind == "STEP":
                n = self.prog.count[(s, op.step)]
                self.staleness.append(self._others(s) - self.pulled.pop(s, (0, None))[0])
                mu = self.ctx.optim.momentum
                for name, t in self.shared[s].items():
                    d = self.buf[s][name].div_(n)
                    if mu:
                        d = self.momentum[s][name].mul_(mu).add_(d)
                    t.data.add_(d, alpha=-self.ctx.optim.lr)  # no lock: Hogwild
                    self.buf[s][name].zero_()
                self.counters[s, self.rank] += 1
                version = int(self.counters[s].sum().item())
            else:
                raise ValueError(f"the async rule cannot run {op.kind} ops")
            end = time.perf_counter()
            mb = R * self.M + b if b >= 0 else -1
            timeline.append(timed(self.rank, s, mb, op.kind, start, end=end, t0=t0, version=version, rnd=R))

    def weights(self):
        return {s: {n: t.detach().clone() for n, t in sh.items()} for s, sh in enumerate(self.shared)}

    def memory(self):
        st = self.staleness
        return {
            s: dict(
                peak_versions=1,
                peak_live_microbatches=None,
                peak_activation_bytes=None,
                staleness_mean=(sum(st) / len(st)) if st else 0.0,
                staleness_max=max(st, default=0),
                updates=len(st),
            )
            for s in range(self.S)
        }

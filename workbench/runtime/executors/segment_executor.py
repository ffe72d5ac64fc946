"""Seq1F1B in ``workbench.runtime.train``: the executor of schedules that cut sequences into segments.

A schedule with ``segment_tokens = (n_1, ..., n_k)`` (the ``seq1f1b`` family) runs F/B/BI/BW on
units (microbatch b, segment j): tokens ``N_(j-1) .. N_j - 1`` of the microbatch's sequences. The
model is the zoo's causal transformer, whose layers :func:`~workbench.models.segmented.segment_layers`
run on segments (earlier segments' keys and values as leaves; the gradient algebra is
:mod:`workbench.runtime.executors.segments`'). Each stage holds its own copy of its layers (a weight tied
across stages is one copy per owner, combined at every update as in :mod:`~workbench.runtime.executors.tied`).

Loss and update, the same as the layer runtime's (:mod:`~workbench.runtime.executors.pipeline`): a unit's loss is its tokens'
summed cross entropy over the microbatch's tokens (``batch · seq_len``), so the units of a
microbatch add up to ``model.loss`` of the whole microbatch; ``STEP`` applies
:func:`~workbench.runtime.semantics.stages.sgd_step` to the sum over the update's ``n`` microbatches
(``W - lr · sum / n``, or heavy ball). The seq1f1b family is synchronous (a flush per update), so
every op of update t reads version t and a stage keeps one version, updated in place.

Measured timeline: one row per op (a unit's F/B/BI/BW, STEP) in the runtime's columns; the segment
of a row is not a column (rows of one microbatch follow the schedule's segment order).
"""

from __future__ import annotations

import copy
import time

import torch
from torch import nn

from workbench.models.segmented import flop_model, segment_layers
from workbench.runtime.executors.record import OpRecord
from workbench.runtime.executors.segments import Mailbox, SegmentStage
from workbench.runtime.executors.tied import TiedGradients, tied_weights
from workbench.runtime.semantics.stages import sgd_step, stage_lrs, stage_module
from workbench.runtime.transport import trace
from workbench.runtime.transport.comm import warm_up
from workbench.runtime.transport.comm_plan import RankComm, communicators
from workbench.runtime.transport.messages import MessageKind
from workbench.schedules.core import Schedule


def check_segments(schedule: Schedule, model) -> None:
    """One-line ``ValueError`` unless ``model`` can run ``schedule``'s segments: layers that run on
    segments (:func:`segment_layers`), a synchronous rule, segments covering the model's sequence."""
    segment_layers(model.layers)
    if schedule.update != "sync":
        raise ValueError(
            f"{schedule.name} has weight rule {schedule.update!r}; the segment runtime runs synchronous "
            "schedules (one version per stage)"
        )
    seq = int(model.inputs[0].shape[0])
    if sum(schedule.segment_tokens) != seq:
        raise ValueError(
            f"{schedule.name}'s segments cover {sum(schedule.segment_tokens)} tokens but {model.name}'s "
            f"sequences have {seq}; build it with --schedule-option seq_len={seq}"
        )


def sequence_options(options: dict, known, model) -> dict:
    """``options`` of a schedule with segments (``known``: the names it takes), completed from the
    model: ``seq_len`` its sequence length, ``model`` the FLOP estimate ``(P, L, d)`` of
    :func:`~workbench.models.segmented.flop_model` (FLOP-balanced segments, Seq1F1B's split)."""
    out = dict(options)
    if "seq_len" in known and "seq_len" not in out and model.inputs:
        out["seq_len"] = int(model.inputs[0].shape[0])
    if "model" in known and "model" not in out:
        try:
            out["model"] = flop_model(segment_layers(model.layers))
        except ValueError:
            pass  # not a segment model: check_segments says so once the schedule exists
    return out


class SegmentExecutor:
    """Executes a rank's op list of a segmented schedule (module docstring); the executor interface of
    :mod:`~workbench.runtime.executors.pipeline` (``run_round``, ``weights``, ``optimizer_state``, ``memory`` ...)."""

    def __init__(self, ctx, schedule: Schedule, model, bounds, init_weights: list[dict], *, groups: dict):
        self.ctx, self.schedule, self.model, self.rank = ctx, schedule, model, ctx.rank
        trace.from_env(ctx.rank, ctx.world, groups, ctx.run.out)  # records the calls when asked ($WORKBENCH_COMM_TRACE)
        self.S, self.M, self.k = schedule.num_stages, schedule.microbatches, schedule.num_segments
        ops = schedule.ops[self.rank]
        self.offsets = [0]
        for n in schedule.segment_tokens:
            self.offsets.append(self.offsets[-1] + n)
        self.stages, self.momentum, self.peak = {}, {}, {}
        for s in sorted({op.stage for op in ops}):
            a, z = bounds[s]
            layers = copy.deepcopy(segment_layers(stage_module(model.layers, a, z)))  # this stage's own copy
            params = dict(nn.Sequential(*layers).named_parameters())  # the names of stage_params
            with torch.no_grad():
                for name, p in params.items():
                    p.copy_(init_weights[s][name])
            norm = ctx.specs[-1][0][0][0] * self.offsets[-1]  # microbatch size x tokens per sequence
            self.stages[s] = SegmentStage(
                s, layers, z == len(model.layers) - 1, params, self.offsets, norm=norm, recompute=schedule.recompute
            )
            self.momentum[s] = {n: torch.zeros_like(p) for n, p in params.items()}
            self.peak[s] = 0
        self.count = {
            (op.stage, op.step): len(schedule.step_microbatches(op.stage, op.step, worker=self.rank))
            for op in ops
            if op.kind == "STEP"
        }
        self.per_round = schedule.updates_per_round
        self.lrs = stage_lrs(schedule.stage_workers, ctx.optim.lr, ctx.optim.stage_lr)
        self.version = {s: ctx.start_round * self.per_round[s] for s in self.stages}
        self.box = Mailbox(schedule, self.rank, ctx.run.timeout_s, groups=groups, one_tag=ctx.run.one_tag)
        # the plan (transport.nccl_model checks the calls it leads to): who sends each message, where each goes
        self.plan = RankComm(schedule, self.rank)
        self.src = {(m.recv_op, m.kind): m.src for m in self.plan.recvs}
        ties = tied_weights(model, bounds)
        self.tied = TiedGradients(schedule, self.rank, ties, groups, ctx.run.timeout_s) if ties else None
        # every communicator created before the first step, in one order for all ranks (comm.warm_up):
        # NCCL creates each lazily at its first operation, blocking, and two orders deadlock
        warm_up(self.rank, communicators([schedule]), groups, device=ctx.device, timeout_s=ctx.run.timeout_s)

    def _like(self, s: int, j: int) -> torch.Tensor:
        """A buffer shaped like stage ``s``'s output on segment ``j``."""
        shape, dtype = self.ctx.specs[s][0]
        return torch.empty(
            (shape[0], self.offsets[j + 1] - self.offsets[j], *shape[2:]), dtype=dtype, device=self.ctx.device
        )

    def run_round(self, k: int, R: int, data, timeline: list, metrics: dict) -> None:
        """Round ``k`` of the epoch (global minibatch ``R``): one pass of the op list; ``data(b)`` ->
        (input ids, next-token ids) of microbatch ``b``."""
        t0 = self.ctx.t0
        for i, op in enumerate(self.schedule.ops[self.rank]):
            start, wait = time.perf_counter(), 0.0
            if op.kind == "STEP":
                wait = self._step(op)
            elif op.kind == "F":
                wait = self._forward(op, i, data, metrics)
            elif op.kind in ("B", "BI", "BW"):
                wait = self._backward(op, i)
            end = time.perf_counter()
            b = op.microbatch
            v = self.version[op.stage] if op.kind == "STEP" else R * self.per_round[op.stage] + op.version
            timeline.append(
                OpRecord(
                    worker=self.rank,
                    stage=op.stage,
                    microbatch=R * self.M + b if b >= 0 else -1,
                    kind=op.kind,
                    start=(start - t0) * 1e3,
                    end=(end - t0) * 1e3,
                    version=v,
                    round=R,
                    wait_ms=wait,
                    send_ms=0.0,
                    data_ms=0.0,
                    send_at=float("nan"),
                )
            )

    def _recv(self, s_from: int, s: int, j: int, op, *, i: int, kind: MessageKind) -> tuple[torch.Tensor, float]:
        u = self.schedule.unit(op)
        src = self.src.get((i, kind), self.rank)
        t = time.perf_counter()
        x = self.box.recv(self._like(min(s_from, s), j), src, self.box.tag(kind, s, u))
        return x, (time.perf_counter() - t) * 1e3

    def _forward(self, op, i: int, data, metrics: dict) -> float:
        s, b, j = op.stage, op.microbatch, op.segment
        st, lo, hi = self.stages[s], self.offsets[op.segment], self.offsets[op.segment + 1]
        wait = 0.0
        if s == 0:
            x = data(b)[0][:, lo:hi]
        else:
            x, wait = self._recv(s - 1, s, j, op, i=i, kind=MessageKind.ACT)
        target = data(b)[1][:, lo:hi] if st.is_last else None
        out, loss = st.forward(b, j, x, target)
        if target is not None:  # the last stage
            metrics["loss"] += float(loss)  # the units of a microbatch sum to its mean token loss
            metrics["correct"] += self.model.correct(out, target)
            if j == 0:
                metrics["n"] += 1
                metrics["samples"] += int(target.shape[0])
        else:
            u = self.schedule.unit(op)
            self.box.send(out, self.plan.dst(i, MessageKind.ACT), self.box.tag(MessageKind.ACT, s + 1, u))
        self.peak[s] = max(self.peak[s], st.saved_bytes)
        return wait

    def _backward(self, op, i: int) -> float:
        s, b, j = op.stage, op.microbatch, op.segment
        g, wait = None, 0.0
        if op.kind != "BW" and s < self.S - 1:
            g, wait = self._recv(s + 1, s, j, op, i=i, kind=MessageKind.GRAD)
        dx = self.stages[s].backward(op.kind, b, j, g)
        if dx is not None and s > 0:
            u = self.schedule.unit(op)
            self.box.send(dx, self.plan.dst(i, MessageKind.GRAD), self.box.tag(MessageKind.GRAD, s - 1, u))
        return wait

    def _step(self, op) -> float:
        s, st = op.stage, self.stages[op.stage]
        grads = {s2: {n: p.grad for n, p in x.params.items()} for s2, x in self.stages.items()}
        wait = 0.0
        if self.tied is not None:  # weights tied across stages: the owners' gradients combined first
            wait = self.tied.combine(s, op.step, grads, {s2: x.params for s2, x in self.stages.items()})
            for s2, x in self.stages.items():
                for n, p in x.params.items():
                    p.grad = grads[s2].get(n)
        sgd_step(
            st.params,
            grads[s],
            self.momentum[s],
            self.lrs[s],
            self.ctx.optim.momentum,
            n=self.count[(s, op.step)],
            in_place=True,
        )
        for p in st.params.values():
            p.grad = None
        self.version[s] += 1
        return wait

    def flush(self) -> None:
        self.box.flush()

    def weights(self) -> dict[int, dict]:
        return {s: {n: p.detach().clone() for n, p in st.params.items()} for s, st in self.stages.items()}

    def optimizer_state(self) -> dict[int, dict]:
        return {s: {n: b.clone() for n, b in m.items()} for s, m in self.momentum.items()}

    def load_optimizer_state(self, state: dict[int, dict]) -> None:
        for s, bufs in state.items():
            for n, b in bufs.items():
                if s in self.momentum:
                    self.momentum[s][n].copy_(b)

    def memory(self) -> dict:
        """Per stage: the peak of the bytes autograd saved for the units in flight (segments.py)."""
        return {s: dict(peak_activation_bytes=self.peak[s]) for s in self.stages}

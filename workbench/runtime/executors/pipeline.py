"""One rank of the runtime: walks its op list of the schedule, round after round.

Weights. Stage ``s`` keeps versioned parameter tensors ``W_s^(v)`` (``v`` = updates applied). ``F``
evaluates ``f_s(x; W_s^(v))`` with :func:`torch.func.functional_call` on the tensors of the op's
version, so the autograd graph it leaves behind holds exactly those tensors: that *is* weight
stashing. A version is dropped from the table once no later op of this rank reads it (the op list
says so); it stays alive only as long as a stashed graph still references it. ``B`` backpropagates the
stashed graph (input gradient sent upstream, weight gradient added to the update buffer); when the
schedule asks the backward to read another version than its forward (no stashing, some 2BW ops),
the stage output is recomputed from the stashed input with that version and differentiated there;
the forward then keeps no graph at all. Under ``no-stash`` this is PipeDream's failure mode: the
gradient of ``B(s, b)`` is the VJP at ``(x_s^(F version), W_s^(newest))``, weights the forward of
``b`` never used, so the update is not the gradient of any single set of weights (the tests show
the trajectory departs from the stashed one). ``BI``/``BW`` (zero bubble) split the VJP: input gradient
first with ``retain_graph``, weight gradient later from the same graph; where the stage can be split
into its layers (:func:`~workbench.runtime.semantics.stages.run_stage_layers`), ``BI`` keeps the cotangent of
every layer's output and ``BW`` differentiates each layer from its own outputs, so the activation
gradients are not computed twice.

Streams (``stream`` given: pipedream, pipedream-2bw, model-parallel): an epoch's rounds run as one
pass of the schedule over all their microbatches (:meth:`PipelineExecutor.run_stream`), no drain
between minibatches; versions count from the first round's updates as in round-by-round runs.

Updates. The buffer of update ``t`` of stage ``s`` is the sum of the contributions of the
microbatches of ``schedule.step_microbatches(s, t)`` on this rank; ``AR`` sums the buffers of the
stage's replicas in their own process group; ``STEP`` creates ``W^(t+1) = W^(t) - lr * d_t`` with
``g_t = buffer / n`` (``n`` the number of microbatches the update covers: a mean over the minibatch)
and ``d_t = g_t``, or with momentum ``mu`` the heavy-ball direction ``d_t = mu * d_(t-1) + g_t``
(``d_(-1) = 0``, as :class:`torch.optim.SGD` without dampening). A weight tied across stages
(:mod:`~workbench.runtime.executors.tied`) has one copy per owning stage; before ``STEP`` the owners' buffers of it are summed
(an all-reduce among the owners' ranks), so every copy takes the same update.

Remote weights (master family: FSDP, FSLPP, any ``from_placement`` placement). An op whose
``weights_worker`` is another rank evaluates the stage with a copy of the owner's version fetched for
that (stage, microbatch); its weight gradient, if this rank holds no replica of the stage, is summed
and pushed to the owner, which adds it to the update buffer before the AR/STEP (see :mod:`~workbench.runtime.executors.fetch`).
Such a rank keeps no weights of the stage (``StageState.held`` is False) and checkpoints none.

Executors: :class:`PipelineExecutor` here (every pipeline schedule, replicated stages included);
:class:`~workbench.runtime.executors.ddp.DDPExecutor` (``dp-bsp`` through DistributedDataParallel) and
:class:`~workbench.runtime.executors.hogwild.HogwildExecutor` (``async`` rule, lock-free shared memory).
An executor offers ``receive_plan(rounds)``, ``run_round(k, R, data, timeline, metrics)`` (one with a
``comm`` transport also ``begin_epoch(rounds)``),
``weights()``, ``optimizer_state()``, ``load_optimizer_state(state)`` and ``memory()``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

from workbench.runtime.executors import opclock
from workbench.runtime.executors.fetch import RemoteWeights, has_remote, is_remote
from workbench.runtime.executors.record import OpRecord
from workbench.runtime.executors.tied import TiedGradients, tied_weights
from workbench.runtime.semantics.randomness import microbatch_rng
from workbench.runtime.semantics.stages import (
    as_leaves,
    as_tuple,
    from_tuple,
    nbytes,
    run_stage,
    run_stage_layers,
    sgd_step,
    split_input_grad,
    split_weight_grad,
    stage_lrs,
    stage_module,
    stage_roots,
    vjp,
)
from workbench.runtime.transport import shm, trace
from workbench.runtime.transport.comm import P2P, ShmP2P, warm_up
from workbench.runtime.transport.comm_plan import RankComm, communicators
from workbench.runtime.transport.messages import MessageKind
from workbench.schedules.core import Schedule


class RankProgram:
    """What one rank needs to know about the schedule, precomputed once."""

    def __init__(self, schedule: Schedule, rank: int):
        self.schedule, self.rank = schedule, rank
        self.ops = schedule.ops[rank]
        self.where = schedule.where()
        self.stages = sorted({op.stage for op in self.ops})
        self.per_round = schedule.updates_per_round
        # microbatches averaged by update t of stage s (all replicas when the update is all-reduced)
        has_ar = {(op.stage, op.step) for op in self.ops if op.kind == "AR"}
        self.count = {}
        for op in self.ops:
            if op.kind == "STEP":
                w = None if (op.stage, op.step) in has_ar else rank
                n = len(schedule.step_microbatches(op.stage, op.step, worker=w))
                if n == 0:
                    raise ValueError(f"update {op.step} of stage {op.stage} covers no microbatch on rank {rank}")
                self.count[(op.stage, op.step)] = n
        # last index (in this rank's list) at which each (stage, relative version) is read
        self.last_read = {}
        for i, op in enumerate(self.ops):
            if op.kind in ("F", "B", "BI", "BW") and not is_remote(op, rank):  # remote reads are fetched copies
                self.last_read[(op.stage, op.version)] = i
        self.version = {
            (op.kind, op.stage, op.microbatch): op.version for _, op in schedule if op.kind in ("F", "B", "BI", "BW")
        }
        # the messages this rank receives (in consumption order) and sends (per op): the plan that
        # transport.nccl_model checks on the calls the executors really issue (transport.dry_run)
        self.comm = RankComm(schedule, rank)

    def backward_version(self, s: int, b: int) -> int:
        v = self.version
        return v[("B", s, b)] if ("B", s, b) in v else v[("BI", s, b)]

    def dst(self, i: int, kind: MessageKind) -> int:
        """Where op ``i``'s activation (``ACT``) or input gradient (``GRAD``) goes (this rank: locally)."""
        return self.comm.dst(i, kind)


@dataclass(slots=True)
class MicrobatchState:
    """What a stage keeps of one microbatch between its forward and its (last) backward op.

    ``x``: the input's leaves; ``y``: the output with its autograd graph (None: the forward kept no
    graph, the backward recomputes it); ``version``: the weight version ``y``'s graph holds (the
    forward's, or the version a BI recomputed at); ``act_bytes``: the bytes of ``x`` and ``y``
    (the activation peak of :meth:`StageState.note_memory`); ``layers``: per-layer outputs for a
    split backward (:func:`~workbench.runtime.semantics.stages.run_stage_layers`), else None;
    ``params``: the weights the backward differentiates at when this rank's table may no longer hold
    them (fetched remote weights; after a BI its version's tensors); ``target`` / ``loss``: the last
    stage's target and loss (the loss only of a forward that kept its graph); ``cot``: the output's
    cotangent a BI received (its BW reuses it); ``cots`` / ``roots`` / ``grads``: a layer-split BI's
    kept cotangents for the BW (:func:`~workbench.runtime.semantics.stages.split_weight_grad`)."""

    x: tuple
    y: Any
    version: int
    act_bytes: int
    layers: Any = None
    params: dict | None = None
    target: Any = None
    loss: Any = None
    cot: Any = None
    cots: Any = None
    roots: Any = None
    grads: Any = None


class StageState:
    """Versioned weights and the update buffer of one stage on one rank. A rank that only computes
    with another worker's weights of the stage (``held=False``, master family) keeps no version,
    only the layout ``[(name, shape)]`` of the fetched flat vector and the stashed microbatches."""

    def __init__(
        self,
        stage: int,
        module,
        weights: dict[str, torch.Tensor],
        device,
        version: int = 0,
        *,
        held: bool = True,
        flat: bool = True,
    ):
        self.stage, self.module, self.held = stage, module, held
        self.names = list(weights)
        self.layout = [(n, w.shape) for n, w in weights.items()]
        self.versions = (
            {version: {n: w.detach().to(device).requires_grad_(True) for n, w in weights.items()}} if held else {}
        )
        self.newest = version
        total = sum(w.numel() for w in weights.values()) if held else 0  # no update buffer without weights
        dtype = next(iter(weights.values())).dtype if weights else torch.float32
        self.flat = torch.zeros(total, dtype=dtype, device=device)
        # the update buffer: views of one flat vector (all-reduced / pushed gradients added), or, with
        # ``flat=False``, per-parameter tensors created by the first contribution of each update
        # (``{}`` = all zero; see ``vjp(into=...)``): no zeroing pass and no first addition per update
        self.is_flat = flat
        self.grad, k = {}, 0
        for n, w in weights.items() if held and flat else ():
            self.grad[n] = self.flat[k : k + w.numel()].view_as(w)
            k += w.numel()
        self.momentum = {n: torch.zeros_like(w, device=device) for n, w in weights.items()} if held else {}
        self.records: dict[int, MicrobatchState] = {}
        self.peak_versions = 1 if held else 0
        self.peak_live = 0
        self.peak_act_bytes = 0

    def weights(self) -> dict[str, torch.Tensor]:
        return {n: t.detach().clone() for n, t in self.versions[self.newest].items()}

    def note_memory(self) -> None:
        live = set(self.versions) | {r.version for r in self.records.values() if r.y is not None}
        self.peak_versions = max(self.peak_versions, len(live))
        self.peak_live = max(self.peak_live, len(self.records))
        self.peak_act_bytes = max(self.peak_act_bytes, sum(r.act_bytes for r in self.records.values()))


class PipelineExecutor:
    """Executes a rank's op list with exact versioned-weight semantics (module docstring)."""

    def __init__(self, ctx, schedule: Schedule, model, bounds, init_weights: list[dict], *, groups: dict, stream=None):
        self.ctx, self.schedule, self.model = ctx, schedule, model
        trace.from_env(ctx.rank, ctx.world, groups, ctx.run.out)  # records the calls when asked ($WORKBENCH_COMM_TRACE)
        # stream(n) -> the schedule over n microbatches: the rounds of an epoch run as one pipeline
        # (no drain between minibatches; see run_stream); None: every round drains (run_round)
        self.stream = stream
        self._streams: dict[int, tuple[Schedule, RankProgram, frozenset[int]]] = {}
        if schedule.num_segments > 1:
            raise ValueError(
                f"{schedule.name} cuts sequences into segments; this executor runs whole microbatches: "
                f"use workbench.runtime.executors.segment_executor.SegmentExecutor (train() picks it)"
            )
        self.rank, self.S, self.M = ctx.rank, schedule.num_stages, schedule.microbatches
        self.prog = RankProgram(schedule, self.rank)
        self.stashing = schedule.stashing_steps(self.rank)  # STEPs that keep the old version (else in place)
        self.lrs = stage_lrs(schedule.stage_workers, ctx.optim.lr, ctx.optim.stage_lr)
        flat = schedule.flat_buffers(self.rank)  # all-reduced or pushed-to stages: one flat buffer
        self.state = {
            s: StageState(
                s,
                stage_module(model.layers, *bounds[s]).to(ctx.device),
                init_weights[s],
                ctx.device,
                ctx.start_round * self.prog.per_round[s],
                held=self.rank in schedule.stage_workers[s],
                flat=s in flat,
            )
            for s in self.prog.stages
        }
        self.groups = groups
        self.remote: RemoteWeights | None = None  # fetches / pushes of the master family (see fetch.py)
        if has_remote(schedule):
            self.remote = RemoteWeights(
                schedule,
                self.rank,
                {s: (st.layout, st.flat.dtype) for s, st in self.state.items()},
                ctx.device,
                ctx.run.timeout_s,
                groups=groups,
                one_tag=ctx.run.one_tag,
            )
        self.split = {op.stage for op in self.prog.ops if op.kind == "BI"}  # stages whose backward is split (BI/BW)
        ties = tied_weights(model, bounds)  # weights tied across stages: gradients combined at STEP (tied.py)
        self.tied = TiedGradients(schedule, self.rank, ties, groups, ctx.run.timeout_s) if ties else None
        self.specs = ctx.specs  # specs[s]: [(shape, dtype)] of stage s's output
        self.like_tuple = ctx.like_tuple  # like_tuple[s]: stage s's input is a tuple
        if ctx.run.transport == "shm":
            self.comm: P2P = self._shm_comm(ctx)
        else:
            self.comm = P2P(
                self.rank,
                self.S,
                ctx.device,
                ctx.run.timeout_s,
                lookahead=ctx.run.lookahead,
                groups=groups,
                backend=ctx.run.backend,
                one_tag=ctx.run.one_tag,
            )
        self.clock = opclock.for_device(ctx.device)  # None: the host's clock around each op (CPU)
        if self.clock is not None:
            self.comm.on_first_send = self.clock.on_send

    def _shm_comm(self, ctx) -> ShmP2P:
        """Shared-memory channels to and from every peer, sized from a full epoch's receive plans."""
        epoch = list(range(max(1, ctx.rounds_per_epoch)))
        plans = {r: self.receive_plan(epoch, r) for r in range(self.schedule.num_workers)}
        sizes = shm.channel_sizes(plans, budget=shm.CHANNEL_BYTES if shm.ring_channels(self.schedule) else None)
        chan = {
            (a, b): shm.Channel(shm.channel_path(ctx.shm_token, a, b), n, nb, ctx.run.timeout_s)
            for (a, b), (n, nb) in sizes.items()
            if self.rank in (a, b)
        }
        return ShmP2P(
            self.rank,
            self.S,
            ctx.device,
            ctx.run.timeout_s,
            inbound={a: c for (a, b), c in chan.items() if b == self.rank},
            outbound={b: c for (a, b), c in chan.items() if a == self.rank},
        )

    def begin_epoch(self, rounds: list[int]) -> None:
        """Hand the epoch's receive plan to the transport (gloo posts the receives; shm numbers the
        messages, also those this rank sends, from its peers' plans)."""
        self.comm.set_plan(self.receive_plan(rounds))
        if isinstance(self.comm, ShmP2P):
            self.comm.set_send_plan({dst: self.receive_plan(rounds, dst) for dst in self.comm.outbound})

    def warm_up(self) -> None:
        """Create (NCCL) or connect (gloo) every communicator of the job before the first step, in one
        order for all ranks (:func:`~workbench.runtime.transport.comm.warm_up`): NCCL creates each
        lazily at its first operation, blocking, and ranks that meet them in different orders deadlock."""
        scheds = [self.schedule] + ([self.stream(2 * self.M)] if self.stream else [])
        warm_up(self.rank, communicators(scheds), self.groups, device=self.ctx.device, timeout_s=self.ctx.run.timeout_s)

    # ---- per epoch ----------------------------------------------------------------------
    def receive_plan(self, rounds: list[int], rank: int | None = None) -> list:
        """Receives of ``rank`` (default this one) to post, in op order, from the schedule's one
        derivation of dataflow edges (:class:`~workbench.runtime.transport.comm_plan.RankComm`): an activation
        of stage s-1 for F(s, b), the gradient of stage s+1 for B/BI(s, b)."""
        plan = []
        rank = self.rank if rank is None else rank
        # a stream is one pass of its schedule over the rounds' microbatches, numbered from the first round's
        passes = (
            [(rounds[0], self._stream_program(len(rounds))[0])]
            if self.stream and rounds
            else [(k, self.schedule) for k in rounds]
        )
        for k, sched in passes:
            ops = sched.ops[rank]
            for m in RankComm(sched, rank).recvs:
                s, g = ops[m.recv_op].stage, k * self.M + m.unit
                if m.kind == MessageKind.ACT:  # activation from the previous stage
                    plan.append(((MessageKind.ACT, m.boundary, g), m.src, self.specs[m.boundary]))
                else:  # gradient from the next stage
                    spec = self.specs[s]
                    plan.append(((MessageKind.GRAD, s, g), m.src, [spec[j] for j in _float_spec(spec)]))
        return plan

    def run_round(self, k: int, R: int, data, timeline: list, metrics: dict) -> None:
        """Round ``k`` of the epoch (global minibatch ``R``); ``data(b)`` -> (input, target). The
        round is one pass of the schedule: it fills the pipeline and drains it."""
        self._run(_Pass(self.prog, self.stashing, k, R, data, lambda b: metrics, lambda b: R), timeline)

    def run_stream(
        self, rounds: list[int], R0: int, data, timeline: list, metrics: list[dict], *, on_round=None
    ) -> list[float]:
        """The minibatches ``rounds`` of the epoch (global minibatch ``R0`` first) as one stream: one
        pass of ``stream(len(rounds) * M)``, the schedule over all their microbatches, so the next
        minibatch's forwards enter the pipeline while the last one's backwards drain (PipeDream has no
        flush; its weight rule is the schedule's, version for version). ``data(j, b)``: microbatch
        ``b`` of the ``j``-th of these rounds; ``metrics[j]`` collects that minibatch's training loss;
        ``on_round(R)`` is called when this rank's first op of minibatch ``R`` starts. Returns, per
        minibatch, the end (ms since t0) of this rank's last op that belongs to it (its update
        included)."""
        prog, stashing = self._stream_program(len(rounds))[1:]
        M, ends = self.M, [0.0] * len(rounds)
        self._run(
            _Pass(
                prog,
                stashing,
                rounds[0],
                R0,
                lambda b: data(b // M, b % M),
                lambda b: metrics[b // M],
                lambda b: R0 + b // M,
                ends,
                on_round,
            ),
            timeline,
        )
        return ends

    def _stream_program(self, n: int):
        """(schedule, RankProgram, stashing STEPs) of the stream of ``n`` minibatches (cached)."""
        if n not in self._streams:
            sched = self.stream(n * self.M)
            if sched.flat_buffers(self.rank) != self.schedule.flat_buffers(self.rank):
                raise ValueError(f"{sched.name}: the stream's update buffers differ from the minibatch schedule's")
            self._streams[n] = (sched, RankProgram(sched, self.rank), sched.stashing_steps(self.rank))
        return self._streams[n]

    def _run(self, ps: _Pass, timeline: list) -> None:
        """One pass of ``ps.prog``'s op list (:class:`_Pass`): each op receives what it needs,
        computes or updates, and leaves one :class:`~workbench.runtime.executors.record.OpRecord`."""
        off = {s: ps.R * self.prog.per_round[s] for s in self.state}
        t0, clock = self.ctx.t0, self.clock
        if clock is not None:
            clock.begin(t0)
        if self.remote is not None:
            self.remote.begin_round(ps.k, {s: st.versions[st.newest] for s, st in self.state.items() if st.held})
        t = _OpTimer(clock)  # begun again at every op
        data = _TimedData(ps.data)  # data_ms: the input / target copy of a microbatch (breakdown columns)
        # the newest minibatch begun; the minibatch of this op (an update: of the op before)
        newest, mine = ps.R - 1, ps.R
        for i, op in enumerate(ps.prog.ops):
            st, s, b = self.state[op.stage], op.stage, op.microbatch
            if b >= 0:
                mine = ps.round_of(b)
                if mine > newest:
                    newest = mine
                    if ps.on_round is not None:
                        ps.on_round(mine)
            send0, data0 = self.comm.send_ms, data.ms
            self.comm.op_send_start = None
            t.begin()
            if op.kind in ("F", "B", "BI", "BW"):
                with microbatch_rng(self.ctx.optim.seed, ps.R * self.M + b):  # the same draws as one process
                    wait = self._compute(ps, st, op, i, off[s], data=data, t=t)
            else:
                wait = self._update(ps, st, op, i, t)
            end = time.perf_counter()
            if clock is not None:
                clock.add(len(timeline), t.pre, t.ev, clock.mark())
            timeline.append(
                OpRecord(
                    worker=self.rank,
                    stage=s,
                    microbatch=ps.R * self.M + b if b >= 0 else -1,
                    kind=op.kind,
                    start=(t.start - t0) * 1e3,
                    end=(end - t0) * 1e3,
                    version=off[s] + op.version if op.kind in ("F", "B", "BI", "BW") else st.newest,
                    round=mine,
                    wait_ms=wait,
                    send_ms=self.comm.send_ms - send0,
                    data_ms=data.ms - data0,
                    send_at=_since(self.comm.op_send_start, t0),
                )
            )
            if ps.ends is not None:
                ps.ends[mine - ps.R] = (end - t0) * 1e3
            self._free(ps.prog, st, off[s], i)
            if op.kind not in ("B", "BW"):  # these only release records and versions
                st.note_memory()
        if clock is not None:  # the pass's rows in the device's times (one synchronization)
            clock.resolve(timeline, ps.R, ps.ends)

    def _compute(self, ps: _Pass, st: StageState, op, i: int, off: int, *, data, t: _OpTimer) -> float:
        """F / B / BI / BW: receive the input (activation of stage s-1, gradient of stage s+1), fetch
        remote weights (master family), compute at version ``off + op.version``; the ms waited."""
        s, b = op.stage, op.microbatch
        g, wait = ps.k * self.M + b, 0.0
        if op.kind == "F":
            if s == 0:
                x, _ = data(b)
            else:
                bufs, wait = self.comm.recv((MessageKind.ACT, s - 1, g))
                x = from_tuple(tuple(bufs), self.like_tuple[s])
                t.restart()
            params = None
            if is_remote(op, self.rank):  # master family: fetch the owner's weights for this microbatch
                assert self.remote is not None
                params, fw = self.remote.fetch(s, b)
                wait += fw
                t.restart()
            self._forward(ps, st, op, off + op.version, x, data=data, params=params, i=i)
            return wait
        cot = None
        if op.kind != "BW" and s < self.S - 1:
            cot, wait = self.comm.recv((MessageKind.GRAD, s, g))
            t.restart()
        self._backward(ps, st, op, off + op.version, cot, data=data, i=i)
        return wait

    def _update(self, ps: _Pass, st: StageState, op, i: int, t: _OpTimer) -> float:
        """AR / STEP of stage s: pushed gradients (master family) and tied weights' gradients join the
        buffer first; AR sums the replicas' buffers, STEP applies the SGD rule; the ms waited."""
        s, wait = op.stage, 0.0
        if op.kind in ("AR", "STEP") and self.remote is not None:  # pushed gradients join the buffer first
            wait += self.remote.collect(s, op.step, st.flat)
            t.restart()
        if op.kind == "STEP" and self.tied is not None:  # weights tied across stages: combine first
            tw = self.tied.combine(
                s,
                op.step,
                {u: x.grad for u, x in self.state.items()},
                {u: x.versions[x.newest] for u, x in self.state.items()},
            )
            if tw:
                wait += tw
                t.restart()
        if op.kind == "AR":
            grp = self.groups.get(tuple(self.schedule.stage_workers[s]))
            if grp is not None:
                work = dist.all_reduce(st.flat, op=dist.ReduceOp.SUM, group=grp, async_op=True)
                assert work is not None
                work.wait(timedelta(seconds=self.ctx.run.timeout_s))
        elif op.kind == "STEP":
            self._step(ps, st, op, i)
        return wait

    def _step(self, ps: _Pass, st: StageState, op, i: int) -> None:
        """``W^(t+1) = W^(t) - lr_s * d_t`` (the stage's learning rate) from the buffer's mean over the
        update's microbatches (module docstring); a stashing STEP keeps the old version, the others
        update in place."""
        s = op.stage
        n = ps.prog.count[(s, op.step)]
        new = sgd_step(
            dict(st.versions[st.newest]),
            st.grad,
            st.momentum,
            self.lrs[s],
            self.ctx.optim.momentum,
            n=n,
            in_place=i not in ps.stashing,
        )
        st.newest += 1
        st.versions[st.newest] = new
        if st.is_flat:
            st.flat.zero_()
        else:
            st.grad = {}
        if self.remote is not None and op.step + 1 < ps.prog.per_round[s]:
            self.remote.post_sends(s, op.step + 1, new)

    def _free(self, prog: RankProgram, st: StageState, off: int, i: int) -> None:
        for v in list(st.versions):
            if v != st.newest and prog.last_read.get((st.stage, v - off), -1) <= i:
                del st.versions[v]

    def _forward(self, ps: _Pass, st: StageState, op, v: int, x, *, data, params=None, i: int) -> None:
        """F of ``op`` on input ``x`` at version ``v``; ``params``: fetched weights (remote op) or None
        for this rank's version ``v``. The last stage adds the loss to the minibatch's metrics; the
        others send the output downstream."""
        s, b, prog = op.stage, op.microbatch, ps.prog
        g, metrics = ps.k * self.M + b, ps.metrics_of(b)
        last = s == self.S - 1
        keep_graph = prog.backward_version(s, b) == op.version
        xl = as_leaves(x, requires_grad=s > 0)
        remote = params is not None
        params = params if remote else st.versions[v]
        layers = None
        with torch.set_grad_enabled(keep_graph):
            if keep_graph and not remote and not self.schedule.recompute and s in self.split and s > 0:
                # a split backward follows: keep each layer's output, so BW differentiates layer by layer
                # (the first stage sends no input gradient: its BI has nothing to do early, BW does it all)
                y, layers = run_stage_layers(st.module, params, from_tuple(xl, self.like_tuple[s]))
            else:
                y = _stage_forward(
                    st.module, params, from_tuple(xl, self.like_tuple[s]), self.schedule.recompute and keep_graph
                )
        rec = MicrobatchState(
            x=xl,
            y=y if keep_graph else None,
            version=v,
            act_bytes=nbytes(xl) + nbytes(as_tuple(y)),
            layers=layers,
            # the backward reuses fetched weights (check_remote: same owner and version)
            params=params if remote else None,
        )
        if last:
            _, target = data(b)
            # the loss of a stashed forward is built once, with its graph: the backward starts from it
            with torch.set_grad_enabled(keep_graph):
                loss = self.model.loss(y, target)
            with torch.no_grad():
                metrics["loss"] += float(loss.detach())
                metrics["n"] += 1
                metrics["correct"] += self.model.correct(y.detach() if torch.is_tensor(y) else y, target)
                metrics["samples"] += int(target.shape[0])
            rec.target = target
            rec.loss = loss if keep_graph else None
        else:
            self.comm.send((MessageKind.ACT, s, g), list(as_tuple(y)), prog.dst(i, MessageKind.ACT))
        st.records[g] = rec

    def _backward(self, ps: _Pass, st: StageState, op, v: int, cot, *, data, i: int) -> None:
        """B / BI / BW of ``op`` at version ``v`` from the stage output's cotangent ``cot`` (None on
        the last stage: the loss's); the input gradient goes upstream."""
        s, b, prog = op.stage, op.microbatch, ps.prog
        g = ps.k * self.M + b
        rec = st.records[g]
        last = s == self.S - 1
        y = rec.y if rec.version == v else None
        kw = (
            dict(loss_fn=self.model.loss, target=rec.target, loss=rec.loss if y is not None else None)
            if last
            else dict(cot=cot if cot is not None else rec.cot)
        )
        remote = is_remote(op, self.rank)
        params = rec.params if remote or v not in st.versions else st.versions[v]
        assert params is not None, f"{op}: version {v} is neither held nor kept with the microbatch"
        if op.kind == "BI" and rec.layers is not None and y is not None:
            # only the activation-gradient chain now; the weight gradients later from the kept cotangents
            roots, grads = stage_roots(y, loss=kw.get("loss"), cot=kw.get("cot"))
            dx, cots = split_input_grad(rec.layers, rec.x, roots, grads)
            rec.cots, rec.roots, rec.grads, rec.version, rec.params = cots, roots, grads, v, params
        elif op.kind == "BW" and rec.cots is not None and rec.version == v:
            split_weight_grad(rec.layers, rec.cots, rec.roots, rec.grads, params, into=st.grad)
            del st.records[g]
            return
        elif op.kind == "BI":
            recomputed = y is None
            dx, _, y = vjp(st.module, params, rec.x, self.like_tuple[s], y, **kw, want_weights=False, retain_graph=True)
            rec.y, rec.version, rec.params, rec.cot = y, v, params, cot
            if recomputed and last:
                rec.loss = None  # the stored loss belongs to the forward's evaluation, not to this one
        elif remote and not st.held:  # summed and pushed to the owner of the weights
            dx, dw, _ = vjp(st.module, params, rec.x, self.like_tuple[s], y, **kw, want_input=op.kind == "B")
            assert self.remote is not None
            self.remote.add_gradient(i, dw)
            del st.records[g]
        else:  # the weight gradient is added to the update buffer by the backward pass itself
            dx, _, _ = vjp(
                st.module, params, rec.x, self.like_tuple[s], y, **kw, want_input=op.kind == "B", into=st.grad
            )
            del st.records[g]
        if op.kind != "BW" and s > 0:
            self.comm.send((MessageKind.GRAD, s - 1, g), dx, prog.dst(i, MessageKind.GRAD))

    def weights(self) -> dict[int, dict]:
        """Newest weights of the stages this rank holds (not of those it only computes with)."""
        return {s: st.weights() for s, st in self.state.items() if st.held}

    def optimizer_state(self) -> dict[int, dict]:
        return {s: {n: b.detach().clone() for n, b in st.momentum.items()} for s, st in self.state.items() if st.held}

    def flush(self) -> None:
        """Wait for every send of this rank (end of an epoch)."""
        self.comm.flush()
        if self.remote is not None:
            self.remote.flush()

    def load_optimizer_state(self, state: dict[int, dict]) -> None:
        for s, bufs in state.items():
            if s in self.state and self.state[s].held:
                for n, b in bufs.items():
                    self.state[s].momentum[n].copy_(b)

    def memory(self) -> dict:
        return {
            s: dict(
                peak_versions=st.peak_versions,
                peak_live_microbatches=st.peak_live,
                peak_activation_bytes=st.peak_act_bytes,
            )
            for s, st in self.state.items()
        }


@dataclass(frozen=True)
class _Pass:
    """One pass of a rank's op list: ``prog`` and its ``stashing`` STEPs (the schedule's, or a
    stream's); microbatch ``b`` of the pass is microbatch ``k * M + b`` of the epoch and ``R * M + b``
    of the run, versions count from ``R`` minibatches' updates; ``data(b)`` -> (input, target),
    ``metrics_of(b)`` the metrics of b's minibatch, ``round_of(b)`` that minibatch (global; for the
    timeline and ``ends``); a stream's ``ends`` (per minibatch, its last op's end) and ``on_round(R)``
    (its first op of minibatch R starts)."""

    prog: RankProgram
    stashing: frozenset[int]
    k: int
    R: int
    data: Callable
    metrics_of: Callable[[int], dict]
    round_of: Callable[[int], int]
    ends: list[float] | None = None
    on_round: Callable[[int], None] | None = None


class _OpTimer:
    """Where an op began (``pre``: a device event, or None on the host's clock) and where its
    computation began (``start`` on the host, ``ev`` on the device), moved by :meth:`restart`
    after each wait (a receive, a fetch, a combine)."""

    __slots__ = ("clock", "start", "pre", "ev")

    def __init__(self, clock):
        self.clock, self.start, self.pre, self.ev = clock, 0.0, None, None

    def begin(self) -> None:
        """The next op begins."""
        self.start, self.pre = self._now()
        self.ev = self.pre

    def _now(self):
        return time.perf_counter(), (self.clock.mark() if self.clock is not None else None)

    def restart(self) -> None:
        self.start, self.ev = self._now()


def _since(t: float | None, t0: float) -> float:
    """ms from ``t0`` to ``t`` (NaN when the op did not send)."""
    return float("nan") if t is None else (t - t0) * 1e3


class _TimedData:
    """``data(b)`` that adds the ms it spends to ``ms`` (the per-op ``data_ms`` of the timeline)."""

    def __init__(self, data):
        self.data, self.ms = data, 0.0

    def __call__(self, b):
        t = time.perf_counter()
        out = self.data(b)
        self.ms += (time.perf_counter() - t) * 1e3
        return out


def _float_spec(spec) -> list[int]:
    return [i for i, (_, dt) in enumerate(spec) if dt.is_floating_point]


def _stage_forward(module, params, x, recompute: bool):
    """``f_s(x; W)``; with ``recompute`` (GPipe re-materialization) under non-reentrant
    :func:`torch.utils.checkpoint.checkpoint`: only the inputs are kept, the forward is re-run in the backward."""
    if not recompute:
        return run_stage(module, params, x)

    return checkpoint(run_stage, module, params, x, use_reentrant=False)

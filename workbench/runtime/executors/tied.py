"""Weights tied across pipeline stages: one parameter used by layers of two or more stages.

A GPT-2 or Llama language model with ``tie_word_embeddings`` multiplies by the token embedding
``E`` twice: at the input (``E[ids]``) and at the output (``h E^T``), in the first and the last
stage. The loss depends on ``E`` through both uses, so its gradient is the sum

    dL/dE = dL/dE|_input + dL/dE|_output.

Every owning stage keeps its own copy of ``E`` (a stage's weights live on its worker). Before each
update, the owners combine the gradient of their use: the buffers of update ``t`` of the owning
stages are summed (an all-reduce among the owners' ranks, Megatron-LM's "embedding group"; a plain
sum when one rank owns several of them), and every owner applies the same update

    E^(t+1) = E^(t) - lr · d_t,   d_t = (1/n) Σ_owners buffer_s(t)  (+ momentum · d_(t-1)),

so version ``v`` of ``E`` is the same tensor on every owner. Each stage still reads the version its
schedule's rule names (under PipeDream's stashing the first and last stage read different versions
of ``E`` for one microbatch: the rule's stage-wise staleness, as for any other weight).

Supported: every update rule whose owning stages' updates pair up (update ``t`` of each owner
applies the same microbatches and the owners have as many replicas: replica ``r`` combines with
replica ``r``), in an order in which the combine can neither deadlock nor precede an owner's last
backward of that update on a rank that holds two owners (:func:`check_tied`). Refused with one
line: the ``async`` rule (Hogwild has no common update), schedules whose workers fetch each other's
weights (master family), and everything the check finds.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from typing import cast

import torch

from workbench.runtime.semantics.stages import stage_module
from workbench.schedules.core import Schedule


@dataclass(frozen=True)
class TiedWeight:
    """One parameter held by several stages: ``names`` = ``(stage, its name in that stage's module)``
    for every owning stage (ascending), ``nbytes`` its size, ``model_names`` its names in the model
    the layers were traced from (a GraphModel's ``tied``; empty otherwise)."""

    names: tuple[tuple[int, str], ...]
    nbytes: int
    model_names: tuple[str, ...] = ()

    @property
    def stages(self) -> tuple[int, ...]:
        return tuple(s for s, _ in self.names)

    def label(self) -> str:
        """``"a and b are one tied weight used by stages [0, 1]"``."""
        names = self.model_names or tuple(n for _, n in self.names)
        return f"{' and '.join(dict.fromkeys(names))} are one tied weight used by stages {list(self.stages)}"


def tied_weights(model, bounds) -> tuple[TiedWeight, ...]:
    """The parameters (one tensor object) that layers of different stages of ``model`` (a LayerModel)
    share, for stage bounds ``bounds[s] = (first, last)``; a weight tied inside one stage is that
    stage's business."""
    owners: dict[int, list] = defaultdict(list)
    size: dict[int, int] = {}
    layer_of: dict[int, int] = {}
    for s, (a, z) in enumerate(bounds):
        for n, p in stage_module(model.layers, a, z).named_parameters():
            owners[id(p)].append((s, n))
            size[id(p)] = p.numel() * p.element_size()
            layer_of.setdefault(id(p), a + int(n.split(".")[0]))
    traced = {i: tuple(names) for names, idx in getattr(model, "tied", ()) for i in idx[:1]}
    return tuple(TiedWeight(tuple(o), size[k], traced.get(layer_of[k], ())) for k, o in owners.items() if len(o) > 1)


def combine_ranks(schedule: Schedule, tie: TiedWeight) -> list[tuple[int, ...]]:
    """Per replica ``r``: the ranks whose replica ``r`` of an owning stage takes part in the combine."""
    return [
        tuple(sorted({schedule.stage_workers[s][r] for s in tie.stages}))
        for r in range(len(schedule.stage_workers[tie.stages[0]]))
    ]


def check_tied(schedule: Schedule, ties) -> None:
    """Raise one-line ``ValueError`` unless ``schedule`` can combine the gradients of ``ties``
    (module docstring): pairing updates, and an order without deadlock (:func:`_check_order`)."""
    if not ties:
        return
    what = ties[0].label()
    if schedule.update == "async":
        raise ValueError(
            f"{what}; the 'async' rule (Hogwild) has no common update to combine its gradients at: "
            "untie it or keep its layers in one stage"
        )
    if schedule.remote_weights:
        raise ValueError(
            f"{what}; {schedule.name} fetches weights from other workers, which the tied-weight combine "
            "does not support: untie it or keep its layers in one stage"
        )
    for tie in ties:
        s0 = tie.stages[0]
        for s in tie.stages[1:]:
            if len(schedule.stage_workers[s]) != len(schedule.stage_workers[s0]):
                raise ValueError(
                    f"{tie.label()} but stages {s0} and {s} have "
                    f"{len(schedule.stage_workers[s0])} and {len(schedule.stage_workers[s])} replicas; "
                    "give the owning stages as many replicas"
                )
            steps = [_updates(schedule, x) for x in (s0, s)]
            if steps[0] != steps[1]:
                raise ValueError(
                    f"{tie.label()} but {schedule.name}'s updates of stages {s0} and {s} "
                    f"apply different microbatches ({steps[0][:3]} vs {steps[1][:3]}...), so their "
                    "gradients cannot be combined: untie it or keep its layers in one stage"
                )
    _check_order(schedule, ties)


def defer_steps(schedule: Schedule, ties) -> Schedule:
    """``schedule`` with every owner's STEP ``t`` of a tie moved to just after its worker's last
    backward of update ``t`` (of any stage there). V-shapes put the input and the output stage on one
    worker and interleaving several stages per worker, and both update a stage as soon as its own
    backwards end: a combine there would sum an unfinished buffer or wait for a rank that waits for
    this one. Moved, the combine sums complete buffers and every backward the other owners wait for
    has run. A STEP moves only past ops that do not read the version it creates (else it stays, and
    :func:`check_tied` refuses what remains)."""
    owner = {s: i for i, tie in enumerate(ties) for s in tie.stages}
    ops = [list(o) for o in schedule.ops]
    moved = False
    for wops in ops:
        while (late := _late_steps(wops, owner)) is not None:
            idx, end = late
            keep = [op for i, op in enumerate(wops) if i not in idx]
            at = keep.index(wops[end]) + 1
            wops[:] = keep[:at] + [wops[i] for i in idx] + keep[at:]
            moved = True
    return dataclasses.replace(schedule, ops=tuple(map(tuple, ops))) if moved else schedule


def _late_steps(wops: list, owner: dict) -> tuple[list[int], int] | None:
    """On one worker, the first (indices of the owners' STEP t that precede the worker's last
    backward of update t of any stage, that backward's index) whose STEPs can move
    (:func:`defer_steps`), or None."""
    count: dict[int, int] = defaultdict(int)
    last: dict[int, int] = {}
    steps: dict[tuple[int, int], list[int]] = defaultdict(list)
    for i, op in enumerate(wops):
        t = count[op.stage]
        if op.kind == "STEP":
            count[op.stage] += 1
            if op.stage in owner:
                steps[(owner[op.stage], t)].append(i)
        elif op.kind in ("B", "BW"):
            last[t] = i
    for (_, t), idx in steps.items():
        end = last.get(t, -1)
        early = [i for i in idx if i < end]
        if early and not any(
            op.kind != "STEP" and op.stage == wops[i].stage and op.version > wops[i].step
            for i in early
            for op in wops[i + 1 : end + 1]
        ):
            return early, end
    return None


def _updates(schedule: Schedule, stage: int) -> list[list[int]]:
    w = schedule.stage_workers[stage][0]
    n = sum(1 for op in schedule.ops[w] if op.kind == "STEP" and op.stage == stage)
    return [schedule.step_microbatches(stage, t) for t in range(n)]


def _check_order(schedule: Schedule, ties) -> None:
    """Execute the op lists symbolically (compute ops once their producers ran, AR and the tied
    combine as rendezvous of their ranks) and require that (a) every rank reaches its end and (b) on
    a rank holding several owners the combine of update t (at their first STEP t) follows every
    backward of update t of those owners."""
    owner = {s: i for i, tie in enumerate(ties) for s in tie.stages}
    members = {}  # (tie, rank) -> ranks of its combine
    for i, tie in enumerate(ties):
        for _r, ranks in enumerate(combine_ranks(schedule, tie)):
            for w in ranks:
                members[(i, w)] = set(ranks)
    deps, unit = schedule.dependencies(), schedule.unit
    ops, W = schedule.ops, schedule.num_workers
    for w in range(W):
        _check_local(schedule, w, owner)
    ptr, done, arrived = [0] * W, set(), defaultdict(set)
    moved = True
    while moved:
        moved = False
        for w in range(W):
            while ptr[w] < len(ops[w]):
                op = ops[w][ptr[w]]
                if op.kind in ("F", "B", "BI", "BW"):
                    key = (op.kind, op.stage, unit(op))
                    if not all(d in done for d in deps[key]):
                        break
                    done.add(key)
                elif op.kind == "AR" or (op.kind == "STEP" and op.stage in owner):
                    g = ("AR", op.stage, op.step) if op.kind == "AR" else ("TIE", owner[op.stage], op.step)
                    need = set(schedule.stage_workers[op.stage]) if op.kind == "AR" else members[(owner[op.stage], w)]
                    arrived[g].add(w)
                    if not need <= arrived[g]:
                        break
                ptr[w] += 1
                moved = True
    stuck = [(w, ops[w][ptr[w]]) for w in range(W) if ptr[w] < len(ops[w])]
    if stuck:
        w, op = stuck[0]
        raise ValueError(
            f"{ties[0].label()}, and combining its gradients at every owner's update "
            f"deadlocks {schedule.name} (worker {w} waits at {op}); untie it or choose stage bounds that "
            "keep its layers in one stage"
        )


def _check_local(schedule: Schedule, w: int, owner: dict) -> None:
    """On worker ``w``: the first STEP t among the owners of a tie comes after every B/BW of update t
    of each owner on ``w`` (the combine sums complete buffers)."""
    count: dict[int, int] = defaultdict(int)
    first: dict[tuple[int, int], int] = {}
    last_bwd: dict[tuple[int, int], int] = {}
    for i, op in enumerate(schedule.ops[w]):
        if op.stage not in owner:
            continue
        t = count[op.stage]
        if op.kind == "STEP":
            first.setdefault((owner[op.stage], t), i)
            count[op.stage] += 1
        elif op.kind in ("B", "BW"):
            last_bwd[(owner[op.stage], t)] = i
    for key, i in last_bwd.items():
        if key in first and first[key] < i:
            raise ValueError(
                f"tied weight: {schedule.name} updates one of its owning stages on worker {w} before "
                f"another owner's last backward of update {key[1]} there, so their gradients cannot be "
                "combined first; untie it or keep its layers in one stage"
            )


class TiedGradients:
    """A rank's part of the combine (module docstring): at the first STEP ``t`` of a tie's owners on
    this rank, sum the owners' buffers here, all-reduce the sum among the combine's ranks, and
    write it into every local owner's buffer (the later local owners' STEP ``t`` reuse it)."""

    def __init__(self, schedule: Schedule, rank: int, ties, groups: dict, timeout_s: float):
        self.ties, self.rank, self.timeout = ties, rank, timedelta(seconds=timeout_s)
        self.owner = {s: i for i, tie in enumerate(ties) for s in tie.stages}
        self.local = {
            i: [(s, n) for s, n in tie.names if rank in schedule.stage_workers[s]] for i, tie in enumerate(ties)
        }
        self.groups = {i: groups.get(("tied", i, rank)) for i in range(len(ties))}
        self.pending: dict[tuple[int, int], int] = {}  # (tie, step) -> local owners whose STEP is still to come

    def combine(self, stage: int, step: int, buffers: dict, like: dict) -> float:
        """Before STEP ``step`` of ``stage``: ``buffers[s][name]`` (missing: zeros shaped like
        ``like[s][name]``) of the local owners replaced by the combined sum. Returns ms waited."""
        i = self.owner.get(stage)
        if i is None:
            return 0.0
        left = self.pending.pop((i, step), len(self.local[i])) - 1
        if left < len(self.local[i]) - 1:  # combined at an earlier local owner's STEP of this update
            if left:
                self.pending[(i, step)] = left
            return 0.0
        if left:
            self.pending[(i, step)] = left
        parts = [buffers[s].get(n) for s, n in self.local[i]]
        total = cast(  # a new tensor (0 + ...), never one of the parts
            torch.Tensor,
            sum(p if p is not None else torch.zeros_like(like[s][n]) for p, (s, n) in zip(parts, self.local[i])),
        )
        t0 = time.perf_counter()
        if self.groups[i] is not None:
            torch.distributed.all_reduce(total, group=self.groups[i], async_op=True).wait(self.timeout)
        for p, (s, n) in zip(parts, self.local[i]):
            if p is not None:
                p.copy_(total)  # a flat buffer's view stays a view
            else:
                buffers[s][n] = total.clone()
        return (time.perf_counter() - t0) * 1e3


def make_groups(dist, schedule: Schedule, ties, rank: int, timeout_s: float) -> dict:
    """Process groups of the combines, ``("tied", i, rank)`` -> group (all ranks create every group
    in the same order, as ``new_group`` requires; a combine on one rank needs none)."""
    out = {}
    for i, tie in enumerate(ties):
        for ranks in combine_ranks(schedule, tie):
            if len(ranks) < 2:
                continue
            g = dist.new_group(list(ranks), timeout=timedelta(seconds=timeout_s))
            if rank in ranks:
                out[("tied", i, rank)] = g
    return out

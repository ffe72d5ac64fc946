"""Single-process semantic reference: a schedule's weight rule applied literally to one model.

For every stage ``s`` keep every weight version ``W_s^(v)`` (``v`` = number of updates applied).
Microbatch ``b``'s gradient contribution to stage ``s`` is the vector-Jacobian product of
``f_s(x_s; W)`` where

* the stage inputs ``x_0 .. x_{S-1}`` come from the forward chain, stage ``s'`` evaluated at the
  version read by ``F(s', b)``;
* the input gradient sent upstream is evaluated at the version of ``B(s, b)`` (or ``BI(s, b)``), the
  weight gradient at the version of ``B(s, b)`` (or ``BW(s, b)``); for the last stage the cotangent
  is that of the loss ``L(f_{S-1}(x_{S-1}), y_b)``.

Update ``t`` of stage ``s`` applies the mean of the contributions of the microbatches
``schedule.step_microbatches(s, t)`` (all replicas of the stage: the all-reduce averages them):

    W_s^(t+1) = W_s^(t) - lr_s * d_s^(t),   d_s^(t) = mean_{b in step t} g_s(b) + mu * d_s^(t-1)

(``mu = 0``: plain SGD; ``d^(-1) = 0``; ``lr_s`` of :func:`~workbench.runtime.semantics.stages.stage_lrs`:
``lr``, or with ``stage_lr="replicas"`` ``lr`` times the stage's replicas over the first stage's).
A weight tied across stages (:mod:`~workbench.runtime.executors.tied`) is one parameter: its ``g`` is the sum over its owning stages of their mean contributions to update ``t``.

With the versions of the sync rules this is minibatch SGD; with PipeDream's stash versions it is
``W(t+1) = W(t) - lr grad f(w_1^(t-n+1), ..., w_n^(t))``; 2BW and vertical sync follow from theirs.

A run is ``rounds`` repetitions of the schedule (one minibatch of ``M`` microbatches each); in
round ``R`` version ``v`` of an op means ``R * updates_per_round(s) + v``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

from workbench.runtime.executors.tied import check_tied, tied_weights
from workbench.runtime.semantics.randomness import microbatch_rng
from workbench.runtime.semantics.stages import (
    DataOrder,
    as_leaves,
    microbatch,
    run_stage,
    stage_lrs,
    stage_module,
    stage_params,
    vjp,
)
from workbench.schedules.core import Schedule


def updates_per_round(schedule: Schedule) -> list[int]:
    """:attr:`Schedule.updates_per_round <workbench.schedules.core.Schedule.updates_per_round>` as a list."""
    return list(schedule.updates_per_round)


def versions_of(schedule: Schedule) -> dict[tuple[str, int, int], int]:
    """(kind, stage, microbatch) -> weight version read, for every compute op."""
    return {(op.kind, op.stage, op.microbatch): op.version for _, op in schedule if op.kind in ("F", "B", "BI", "BW")}


def backward_versions(v: dict, s: int, b: int) -> tuple[int, int]:
    """(version of the input-gradient half, version of the weight-gradient half) of stage s, microbatch b."""
    if ("B", s, b) in v:
        return v[("B", s, b)], v[("B", s, b)]
    return v[("BI", s, b)], v[("BW", s, b)]


def reference_train(
    schedule: Schedule,
    model,
    bounds,
    dataset,
    *,
    batch_size: int,
    lr: float,
    seed: int = 0,
    rounds: int = 1,
    start_round: int = 0,
    init: list[dict] | None = None,
    dtype: torch.dtype | None = None,
    momentum: float = 0.0,
    stage_lr: str = "same",
) -> list[dict[str, torch.Tensor]]:
    """Final weights of every stage after ``rounds`` minibatches starting at global minibatch ``start_round``.

    ``bounds[s] = (first, last)`` layers of stage ``s``; ``init`` optional starting weights per stage;
    SGD with learning rate ``lr`` (a replicated stage's by ``stage_lr``) and heavy-ball
    ``momentum``; the data order is :class:`~workbench.runtime.semantics.stages.DataOrder`'s (``batch_size``, ``seed``); ``dtype`` of the inputs.
    """
    if schedule.update == "async":
        raise ValueError("the 'async' rule (dp-asp) has no deterministic reference: staleness depends on timing")
    if len(bounds) != schedule.num_stages:
        raise ValueError(f"{len(bounds)} stage bounds for a schedule of {schedule.num_stages} stages")
    lrs = stage_lrs(schedule.stage_workers, lr, stage_lr)
    ref = _Reference(schedule, model, bounds, init, lrs, momentum=momentum)
    ref.seed = seed
    order = DataOrder(len(dataset), batch_size, schedule.microbatches, seed)
    for k in range(rounds):
        epoch, r = divmod(start_round + k, order.rounds_per_epoch)
        perm = order.permutation(epoch)
        ref.minibatch = start_round + k  # global: the microbatches' random draws (randomness.py)
        ref.run_round(k, functools.partial(_microbatch, dataset, order, perm, r, dtype=dtype))
    return [next(iter(w.values())) for w in ref.weights]


def _microbatch(dataset, order: DataOrder, perm, r: int, b: int, *, dtype) -> tuple:
    return microbatch(dataset, order.indices(perm, r, b), dtype=dtype)


class _Reference:
    """The state of :func:`reference_train`: every stage's weight versions ``weights[s][v]`` and
    momentum directions ``direction[s][v]``, created on demand from the microbatches' gradients."""

    def __init__(
        self, schedule: Schedule, model, bounds, init: list[dict] | None, lrs: list[float], *, momentum: float
    ):
        S = schedule.num_stages
        self.S, self.model, self.lrs, self.momentum = S, model, lrs, momentum
        self.modules = [stage_module(model.layers, a, z) for a, z in bounds]
        self.weights = [{0: (dict(init[s]) if init else stage_params(self.modules[s]))} for s in range(S)]
        self.direction = [{0: {n: torch.zeros_like(p) for n, p in self.weights[s][0].items()}} for s in range(S)]
        self.per_round = schedule.updates_per_round
        self.steps = [[schedule.step_microbatches(s, t) for t in range(self.per_round[s])] for s in range(S)]
        self.ver = versions_of(schedule)
        ties = tied_weights(model, bounds)
        check_tied(schedule, ties)
        self.users = {(s, n): tie.names for tie in ties for s, n in tie.names}  # (stage, name) -> every owner's
        self.off = [0] * S
        self.data: Callable[[int], tuple] | None = None  # the round's microbatches (run_round)
        self.memo: dict[int, list[dict]] = {}
        self.seed, self.minibatch, self.M = 0, 0, schedule.microbatches

    def run_round(self, k: int, data: Callable[[int], tuple]) -> None:
        """Round ``k`` of the run (``data(b)``: microbatch b's (input, target)): every update of every
        stage, oldest first; then only the newest version is kept."""
        self.off = [k * self.per_round[s] for s in range(self.S)]
        self.data, self.memo = data, {}
        for t in range(1, max(self.per_round) + 1):  # oldest first: memoized, so the recursion stays shallow
            for s in range(self.S):
                self.version(s, self.off[s] + min(t, self.per_round[s]))
        for s in range(self.S):  # keep only the newest version for the next round
            newest = self.off[s] + self.per_round[s]
            self.weights[s] = {newest: self.weights[s][newest]}
            self.direction[s] = {newest: self.direction[s][newest]}

    def version(self, s: int, v: int) -> dict:
        """``W_s^(v)``: ``W_s^(v-1) - lr_s * d``, ``d`` the mean contribution of update ``t = v - 1`` in
        this round (summed over a tied weight's owners) plus ``momentum`` times the last direction."""
        if v not in self.weights[s]:
            t = v - 1 - self.off[s]
            assert 0 <= t < self.per_round[s], (s, v, t)
            prev = self.version(s, v - 1)

            def mean(s2: int, n: str):  # stage s2's mean contribution to its update t
                return sum(self.grads(b)[s2][n] for b in self.steps[s2][t]) / len(self.steps[s2][t])

            d = {
                n: sum(mean(*u) for u in self.users.get((s, n), ((s, n),)))
                + self.momentum * self.direction[s][v - 1][n]
                for n in prev
            }
            self.direction[s][v] = d
            self.weights[s][v] = {n: prev[n] - self.lrs[s] * d[n] for n in prev}
        return self.weights[s][v]

    def grads(self, b: int) -> list[dict]:
        """Microbatch ``b``'s weight-gradient contribution to every stage (memoized per round): the
        forward chain at the F versions, then the VJPs from the last stage down at the B versions
        (input and weight halves at their own versions when the backward is split)."""
        if b in self.memo:
            return self.memo[b]
        assert self.data is not None, "grads are read within run_round"
        with microbatch_rng(self.seed, self.minibatch * self.M + b):
            self.memo[b] = self._grads(b)
        return self.memo[b]

    def _grads(self, b: int) -> list[dict]:
        assert self.data is not None
        x, y = self.data(b)
        xs = []
        with torch.no_grad():
            for s in range(self.S):
                xs.append(x)
                if s < self.S - 1:  # the inputs of the stages; the last stage's output comes from its vjp
                    x = run_stage(self.modules[s], self.version(s, self.off[s] + self.ver[("F", s, b)]), x)
        out: list[dict] = [{} for _ in range(self.S)]
        cot = None
        for s in reversed(range(self.S)):
            out[s], cot = self._stage_grads(s, b, xs[s], y, cot)
        return out

    def _stage_grads(self, s: int, b: int, x, y, cot) -> tuple[dict, list]:
        """(weight gradient, input gradient) of stage ``s`` for microbatch ``b`` at input ``x``."""
        vi, vw = backward_versions(self.ver, s, b)
        module, off = self.modules[s], self.off[s]
        kw = dict(loss_fn=self.model.loss, target=y) if s == self.S - 1 else dict(cot=cot)
        like = isinstance(x, tuple)
        wi = {n: p.detach().requires_grad_(True) for n, p in self.version(s, off + vi).items()}
        dx, dw, _ = vjp(module, wi, as_leaves(x, requires_grad=s > 0), like, **kw, want_weights=vi == vw)
        if vi != vw:
            ww = {n: p.detach().requires_grad_(True) for n, p in self.version(s, off + vw).items()}
            _, dw, _ = vjp(module, ww, as_leaves(x, requires_grad=False), like, **kw, want_input=False)
        return dw, dx

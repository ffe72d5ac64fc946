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

    W_s^(t+1) = W_s^(t) - lr * d_s^(t),   d_s^(t) = mean_{b in step t} g_s(b) + mu * d_s^(t-1)

(``mu = 0``: plain SGD; ``d^(-1) = 0``). A weight tied across stages (:mod:`.tied`) is one
parameter: its ``g`` is the sum over its owning stages of their mean contributions to update ``t``.

With the versions of the sync rules this is minibatch SGD; with PipeDream's stash versions it is
``W(t+1) = W(t) - lr grad f(w_1^(t-n+1), ..., w_n^(t))``; 2BW and vertical sync follow from theirs.

A run is ``rounds`` repetitions of the schedule (one minibatch of ``M`` microbatches each); in
round ``R`` version ``v`` of an op means ``R * updates_per_round(s) + v``.
"""

from __future__ import annotations

import torch

from ..schedules.core import Schedule
from .stages import DataOrder, as_leaves, microbatch, run_stage, stage_module, stage_params, vjp
from .tied import check_tied, tied_weights


def updates_per_round(schedule: Schedule) -> list[int]:
    """Number of optimizer steps of each stage in one pass of the schedule (first replica's count)."""
    out = []
    for s in range(schedule.num_stages):
        w = schedule.stage_workers[s][0]
        out.append(sum(1 for op in schedule.ops[w] if op.kind == "STEP" and op.stage == s))
    return out


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
) -> list[dict[str, torch.Tensor]]:
    """Final weights of every stage after ``rounds`` minibatches starting at global minibatch ``start_round``.

    ``bounds[s] = (first, last)`` layers of stage ``s``; ``init`` optional starting weights per stage.
    """
    if schedule.update == "async":
        raise ValueError("the 'async' rule (dp-asp) has no deterministic reference: staleness depends on timing")
    S, M = schedule.num_stages, schedule.microbatches
    if len(bounds) != S:
        raise ValueError(f"{len(bounds)} stage bounds for a schedule of {S} stages")
    modules = [stage_module(model.layers, a, z) for a, z in bounds]
    weights = [{0: (dict(init[s]) if init else stage_params(modules[s]))} for s in range(S)]
    direction = [{0: {n: torch.zeros_like(p) for n, p in weights[s][0].items()}} for s in range(S)]
    per_round = updates_per_round(schedule)
    steps = [[schedule.step_microbatches(s, t) for t in range(per_round[s])] for s in range(S)]
    ver = versions_of(schedule)
    ties = tied_weights(model, bounds)
    check_tied(schedule, ties)
    users = {(s, n): tie.names for tie in ties for s, n in tie.names}  # (stage, name) -> every owner's
    order = DataOrder(len(dataset), batch_size, M, seed)
    rpe = order.rounds_per_epoch
    for k in range(rounds):
        epoch, r = divmod(start_round + k, rpe)
        perm = order.permutation(epoch)
        off = [k * per_round[s] for s in range(S)]
        memo: dict[int, list[dict]] = {}

        def version(s: int, v: int) -> dict:
            if v not in weights[s]:
                t = v - 1 - off[s]
                assert 0 <= t < per_round[s], (s, v, t)
                prev = version(s, v - 1)

                def mean(s2: int, n: str):  # stage s2's mean contribution to its update t
                    return sum(grads(b)[s2][n] for b in steps[s2][t]) / len(steps[s2][t])

                d = {
                    n: sum(mean(*u) for u in users.get((s, n), ((s, n),))) + momentum * direction[s][v - 1][n]
                    for n in prev
                }
                direction[s][v] = d
                weights[s][v] = {n: prev[n] - lr * d[n] for n in prev}
            return weights[s][v]

        def grads(b: int) -> list[dict]:
            if b in memo:
                return memo[b]
            x, y = microbatch(dataset, order.indices(perm, r, b), dtype=dtype)
            xs = []
            with torch.no_grad():
                for s in range(S):
                    xs.append(x)
                    if s < S - 1:  # the inputs of the stages; the last stage's output comes from its vjp
                        x = run_stage(modules[s], version(s, off[s] + ver[("F", s, b)]), x)
            out, cot = [None] * S, None
            for s in reversed(range(S)):
                vi, vw = backward_versions(ver, s, b)
                last = s == S - 1
                kw = dict(loss_fn=model.loss, target=y) if last else dict(cot=cot)
                like = isinstance(xs[s], tuple)
                xl = as_leaves(xs[s], requires_grad=s > 0)
                wi = {n: p.detach().requires_grad_(True) for n, p in version(s, off[s] + vi).items()}
                dx, dw, _ = vjp(modules[s], wi, xl, like, **kw, want_weights=vi == vw)
                if vi != vw:
                    ww = {n: p.detach().requires_grad_(True) for n, p in version(s, off[s] + vw).items()}
                    _, dw, _ = vjp(modules[s], ww, as_leaves(xs[s], requires_grad=False), like, **kw, want_input=False)
                out[s], cot = dw, dx
            memo[b] = out
            return out

        for t in range(1, max(per_round) + 1):  # oldest first: memoized, so the recursion stays shallow
            for s in range(S):
                version(s, off[s] + min(t, per_round[s]))
        for s in range(S):  # keep only the newest version for the next round
            newest = off[s] + per_round[s]
            weights[s] = {newest: weights[s][newest]}
            direction[s] = {newest: direction[s][newest]}
    return [next(iter(w.values())) for w in weights]

"""One level of PipeDream's dynamic program: what a stage and a cut cost at topology level k.

A stage is the layers ``first..last`` replicated on ``m`` level-(k-1) components of this level
(one worker each at level 1). With ``p`` components before it in the level's pipeline it keeps
``v = ceil((M_k - p) / m)`` minibatches in flight (PipeDream's NOAM counted from that stage), which
only the memory limit reads. The costs are the cost model's (:mod:`workbench.cost.model`)::

    T_1(first->last, m) = round(F, B, AR_m) / m                    (CostModel.round_ms)
    T_k(first->last, m) = outer_round(A_{k-1}(first->last), F, AR_k) / m   (CostModel.outer_round_ms)
    c_k(s)              = alpha_k + a_s / B_k                       (one direction of a full-duplex link)

with ``F``, ``B`` the stage's forward and backward compute and ``AR`` the ring all-reduce of its
weights among its replicas. ``T`` is ``inf`` where the stage is not allowed (replicated in a
straight pipeline, or over the memory limit at level 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from workbench.cost.model import CostModel, ring_allreduce_ms, stage_memory
from workbench.partitioning.inputs import LayerCosts

INF = math.inf


def allreduce_ms_per_byte(replicas, bandwidth: float):
    """ms per parameter byte of the ring all-reduce among ``replicas`` (CostModel's formula, no latency)."""
    return ring_allreduce_ms(1.0, replicas, bandwidth, 0.0)


@dataclass
class Level:
    """Level ``level`` of the dynamic program: ``components`` (M_k) at ``bandwidth`` (B_k).

    ``inner_ms[j, i]`` is the time of the layers i..j on one level-(k-1) component (``A_{k-1}``;
    None at level 1, where a stage's time is its compute). ``best_ms[m, j, r]`` is the program's
    answer ``A_k(start(r)->j, m)``: the best bottleneck of the layers start(r)..j on exactly m
    components, with ``start(r) = r`` when ``every_start`` (an inner level needs every sub-range)
    and ``start(0) = 0`` only otherwise (the top level needs the prefixes); it is filled by
    :func:`workbench.partitioning.dynamic_program.solve_level`."""

    level: int
    components: int
    bandwidth: float
    costs: LayerCosts
    cost_model: CostModel
    inner_ms: np.ndarray | None
    straight: bool
    memory_bytes: float | None
    every_start: bool
    inner_workers: int = 1  # workers in one level-(k-1) component
    best_ms: np.ndarray = field(default_factory=lambda: np.empty((0, 0, 0)))
    recompute: bool = False  # activation re-materialization in the memory figures (CostModel.stage_memory_bytes)

    @property
    def collective(self) -> tuple[float, float]:
        """``(latency_ms, bandwidth)`` of the ring all-reduce among level-k components
        (:meth:`CostModel.level_collective`: the calibrated all-reduce where there is one, else the
        level's link), as the cost model and the simulator price it."""
        return self.cost_model.level_collective(self.level)

    @cached_property
    def cut_ms(self) -> np.ndarray:
        """``c_k(s) = alpha_k + a_s / B_k`` for every layer s: one direction of a full-duplex link."""
        return self.cost_model.level_cut_ms(self.level)

    @property
    def memory_limited(self) -> bool:
        """Whether a stage's in-flight count changes its time: a memory limit, checked at level 1."""
        return self.memory_bytes is not None and self.inner_ms is None

    def in_flight(self, replicas, before=0):
        """Minibatches in flight of a stage on ``replicas`` components with ``before`` components
        ahead of it: ``ceil((M_k - before) / replicas)`` (integers or numpy arrays)."""
        return -(-(self.components - before) // replicas)

    def stage_ms(self, first, last, m, in_flight, alpha=None):
        """``T_k(first->last, m)`` (numpy broadcasting), ``inf`` where not allowed. ``alpha`` is
        :func:`allreduce_ms_per_byte` of ``m`` at the collective's bandwidth when the caller has it
        already (level 1 only)."""
        costs, cm = self.costs, self.cost_model
        weights = costs.weights(first, last)
        m = np.asarray(m)
        if self.inner_ms is None:
            latency, bandwidth = self.collective
            if alpha is None:
                alpha = allreduce_ms_per_byte(m, bandwidth)
            allreduce = alpha * weights + 2.0 * (m - 1.0) * latency
            t = cm.round_ms(costs.fwd_ms(first, last), costs.bwd_ms(first, last), allreduce) / m
        else:
            allreduce = cm.outer_allreduce_ms(weights, self.level, m, self.inner_workers)
            inner = self.inner_ms[last, first]
            t = cm.outer_round_ms(inner, costs.fwd_ms(first, last), allreduce, self.inner_workers) / m
        if self.straight:
            t = np.where(m > 1, INF, t)
        if self.memory_limited:
            memory = candidate_memory(costs, first, last, in_flight, weights, recompute=self.recompute)
            t = np.where(memory > self.memory_bytes, INF, t)
        return t

    def splits(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every way to end a pipeline on ``m = p + m'`` components, "a prefix on p, the last stage
        on m'", sorted by m: the arrays ``(p, m', v)`` with ``v`` the last stage's in-flight count."""
        out = [
            (p, last, self.in_flight(last, p))
            for m in range(2, self.components + 1)
            for p in range(1, m)
            for last in [m - p]
            if not (self.straight and last > 1)
        ]
        prefix, last, in_flight = (np.array([o[i] for o in out], dtype=np.int64) for i in range(3))
        return prefix, last, in_flight

    def single_in_flight(self) -> np.ndarray:
        """In-flight count of a single stage on m = 1..M_k components."""
        return self.in_flight(np.arange(1, self.components + 1))

    def distinct_shapes(self, last, in_flight):
        """The distinct ``(m', v)`` of the splits (``v`` only where :attr:`memory_limited`) as
        column vectors ``m', v`` and each split's index among them: the last stage's time
        ``T(.., m', v)`` is computed once per shape."""
        key = np.stack([last, in_flight if self.memory_limited else 0 * in_flight], axis=1)
        unique, index = np.unique(key, axis=0, return_inverse=True)
        return unique[:, :1], unique[:, 1:], index.reshape(-1)


def candidate_memory(costs: LayerCosts, first, last, in_flight, weights, *, recompute: bool):
    """:func:`~workbench.cost.model.stage_memory` of the candidate stages ``first..last`` with
    ``in_flight`` minibatches in flight and ``weights`` bytes of parameters (arrays): their
    activations from the prefix sums, and with ``recompute`` their input (0 for the first stage,
    whose input is the data)."""
    acts = costs.acts(first, last)
    if not recompute:
        return stage_memory(weights, acts, 0.0, in_flight)
    first = np.asarray(first)
    act_in = np.where(first > 0, costs.act_bytes[np.maximum(first - 1, 0)], 0.0)
    return stage_memory(weights, acts, act_in, in_flight, recompute=True)

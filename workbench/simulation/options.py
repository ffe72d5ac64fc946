"""What one simulation charges besides its schedule and cost source: :class:`SimOptions`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from workbench.cost.model import CostOptions

_COST_FIELDS = frozenset(f.name for f in dataclasses.fields(CostOptions))


@dataclass(frozen=True)
class SimOptions:
    """Options of :func:`~workbench.simulation.simulate` (the package docstring gives the model).

    * ``cost``: the cost model's calibration (:class:`~workbench.cost.model.CostOptions`); its
      ``latency_ms`` and ``op_overhead_ms`` apply to unit costs too, and its ``overlap_allreduce``
      is the simulator's ``overlap_comm`` (an all-reduce overlaps the backward before it);
    * unit costs (no profile): ``transfer`` per activation/gradient message and ``weight_fetch``
      per weight fetch between different workers;
    * either cost source: ``allreduce`` (per stage or one number; with a profile it replaces the
      cost model's ring), ``step_ms`` per STEP, ``step_copy_ms`` per STEP that keeps the version it
      replaces (None: ``step_ms``), ``alltoall`` the in-op all-to-all of every F, B and BI (None:
      none) and ``overlap_pairs`` whether a schedule's overlapped F/B pairs hide each other's;
    * profile costs: ``microbatch_fraction``, the microbatch's share of the profile's minibatch
      (None: :func:`~workbench.simulation.costs.default_microbatch_fraction`).
    """

    cost: CostOptions = field(default_factory=CostOptions)
    allreduce: float | Sequence[float] | None = None
    transfer: float = 0.0
    weight_fetch: float = 0.0
    step_ms: float | Sequence[float] = 0.0
    step_copy_ms: float | Sequence[float] | None = None
    microbatch_fraction: float | None = None
    alltoall: float | Sequence[float] | None = None
    overlap_pairs: bool = True

    @property
    def overlap_comm(self) -> bool:
        """All-reduces overlap the backward before them (wait-free backprop, DDP buckets)."""
        return bool(self.cost.overlap_allreduce)

    @classmethod
    def from_keywords(cls, options: SimOptions | None = None, **keywords: Any) -> SimOptions:
        """``options`` (default: all defaults) with :func:`~workbench.simulation.simulate`'s flat
        keywords applied: a :class:`~workbench.cost.model.CostOptions` field (``latency_ms``,
        ``message_cpu_ms``, ...) or ``overlap_comm`` (its ``overlap_allreduce``) sets ``cost``, any
        other name a field of this class; an unknown name is a :class:`TypeError`, as for any call."""
        opts = options if options is not None else cls()
        if not keywords:
            return opts
        if "overlap_comm" in keywords:
            keywords["overlap_allreduce"] = keywords.pop("overlap_comm")
        cost = {k: keywords.pop(k) for k in list(keywords) if k in _COST_FIELDS}
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = [k for k in keywords if k not in names]
        if unknown:
            raise TypeError(
                f"simulate() got an unexpected keyword argument {unknown[0]!r}; the options are the fields of "
                "SimOptions and CostOptions (and overlap_comm)"
            )
        opts = dataclasses.replace(opts, **keywords) if keywords else opts
        return dataclasses.replace(opts, cost=dataclasses.replace(opts.cost, **cost)) if cost else opts

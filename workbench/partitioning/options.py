"""What :func:`workbench.partitioning.search.partition` searches and how it prices: one frozen
dataclass whose fields are also its keywords."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from workbench.io.keywords import check_keywords
from workbench.partitioning.pipedream_optimizer import Settings as PipeDreamSettings

COSTS = ("workbench", "pipedream")  # the cost models partition() can price with


@dataclass(frozen=True)
class PartitionOptions:
    """What :func:`~workbench.partitioning.search.partition` searches and how it prices (each
    field is also a keyword of it).

    * ``straight``: no stage replication; ``memory_bytes``: limit per worker (None: none);
      ``use_fewer_workers``: the best plan on any number of workers up to the topology's;
    * ``latency_ms`` (per message, one number or one per level) and ``op_overhead_ms`` (per op):
      the calibrated fixed costs of :mod:`workbench.runtime.calibration.machine`; ``allreduce_bandwidth`` and
      ``allreduce_latency_ms`` (one number or one per level): the ring all-reduce's own bus bandwidth
      and per-step latency where data parallelism's collective is slower than the links (None: the
      links'; :class:`~workbench.cost.model.CostModel`); ``allreduce_ready`` and ``bucket_cap_bytes``:
      when a replicated stage's all-reduce may start and its gradient buckets
      (:meth:`~workbench.cost.model.CostModel.replicated_stage_ms`, the one price of a replicated
      stage, which data parallelism's round also is);
    * ``refine``: simulate the best candidates (:func:`~workbench.partitioning.search.refine_candidates`);
      ``recompute``: activation re-materialization in the memory figures
      (:func:`~workbench.cost.model.stage_memory`);
    * ``cost``: ``"workbench"`` (the cost model) or ``"pipedream"`` (PipeDream's optimizer and
      formulas, with the options in ``pipedream``).
    """

    straight: bool = False
    memory_bytes: float | None = None
    use_fewer_workers: bool = False
    latency_ms: float | Sequence[float] = 0.0
    op_overhead_ms: float = 0.0
    allreduce_bandwidth: float | Sequence[float] | None = None
    allreduce_latency_ms: float | Sequence[float] | None = None
    allreduce_ready: str = "backward-start"
    bucket_cap_bytes: float | None = None
    refine: bool = True
    recompute: bool = False
    cost: str = "workbench"
    pipedream: PipeDreamSettings | None = None


def options_from(options: PartitionOptions | None, keywords: dict[str, Any]) -> PartitionOptions:
    """``options`` (default :class:`PartitionOptions`) with ``keywords`` overriding its fields; an
    unknown keyword is a ``TypeError`` naming the closest field, an unknown ``cost`` a ``ValueError``."""
    if options is not None and not isinstance(options, PartitionOptions):
        raise TypeError(
            f"partition's third argument is a PartitionOptions, got {options!r}; pass straight=..., "
            "memory_bytes=... as keywords"
        )
    check_keywords(keywords, [f.name for f in dataclasses.fields(PartitionOptions)], "partition")
    for key in ("straight", "use_fewer_workers", "refine", "recompute"):
        if key in keywords and not isinstance(keywords[key], bool):
            raise ValueError(f"{key} must be True or False, got {keywords[key]!r}")
    merged = dataclasses.replace(options or PartitionOptions(), **keywords)
    if merged.cost not in COSTS:
        raise ValueError(f"cost must be one of {', '.join(COSTS)}, got {merged.cost!r}")
    return merged

"""The partitioner: PipeDream's dynamic program and PipeDream's own optimizer (pure), refinement by
simulation above them (:mod:`workbench.partitioning.search`), and two straight baselines.

One job per module, in import order:

    inputs            a profile's per-layer costs and prefix sums, the checked topology and memory limit
    level             one level of the program: a stage's time T_k, a cut's c_k, the splits
    crossing          the level-1 accelerator: the minimum over split points as a crossing search
    dynamic_program   the recurrence A_k, level by level (direct minimum at outer levels)
    reconstruction    the stages that attain A_k, the candidates, the flat stages of a Plan
    infeasible        why no partition exists, with the smallest memory limit that fits
    pricing           a plan's closed-form figures; data parallelism's time; a device's memory
    antichain, pipedream_optimizer   PipeDream's own optimizer over its antichain states
    options           PartitionOptions: what partition() searches and how it prices
    candidates        the program's optimum and candidates as Plans
    baselines         equal layer counts and balanced compute, stage k on worker k
    search            partition(): the program or PipeDream's optimizer, then refinement by simulation
    compare           both cost models' choices side by side

``import workbench.partitioning`` imports nothing else: each name below is imported on first use (PEP 562).
"""

from __future__ import annotations

from workbench.io.lazy import lazy_exports

#: public name -> the module that defines it
_EXPORTS = {
    "partition": "workbench.partitioning.search",
    "refine_candidates": "workbench.partitioning.search",
    "PartitionOptions": "workbench.partitioning.options",
    "partition_equal_layers": "workbench.partitioning.baselines",
    "partition_balanced_time": "workbench.partitioning.baselines",
    "data_parallel_ms": "workbench.partitioning.pricing",
    "with_predictions": "workbench.partitioning.pricing",
    "MAX_WORKERS": "workbench.partitioning.inputs",
    "compare_costs": "workbench.partitioning.compare",
    "CostComparison": "workbench.partitioning.compare",
}

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

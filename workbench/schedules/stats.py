"""Per-worker statistics of a schedule, as in "Unifying Parallelization Schemes to Train Deep Nets".

For a worker ``w`` (sums run over the compute ops in ``schedule.ops[w]``):

* ``peak_activations``: max over the worker's op order of the number of (stage, microbatch)
  pairs whose forward has run and whose backward (B, or BW for a split backward) has not — the
  activations the worker must hold at once. The doc bounds it by the number of items w processes.
* ``activation_transfers``: number of compute ops whose producer (see :func:`core.producers`: the
  previous stage's forward, the next stage's backward) ran on another worker,
  ``sum_{(s,b,d) on w} 1[w_compute(pred(s,b,d)) != w]``.
* ``weight_transfers``: number of distinct (stage, microbatch) pairs computed on w with weights
  owned elsewhere, ``sum_{(s,b) on w} 1[w_weights(s,b) != w]`` (the doc counts per (s, b), so a
  forward and its backward share one fetch).
* ``weight_storage``: number of stages whose weights w owns: ``#{s : w in stage_workers[s]}``.
* ``busy``: compute time. From a ``timeline`` (columns ``worker, kind, start, end``) the sum of
  ``end - start`` over compute kinds; otherwise unit costs F = 1, B = 2, BI = BW = 1 (AR, STEP 0),
  times the segment's FLOP share (Seq1F1B), B / BI + F with recompute.
"""

from __future__ import annotations

import pandas as pd

from workbench.schedules.core import COMPUTE, Schedule, in_flight_peak, producers
from workbench.schedules.dataflow import OpKind

UNIT_COST = {"F": 1, "B": 2, "BI": 1, "BW": 1}


def unit_cost(schedule: Schedule, op) -> float:
    """:data:`UNIT_COST` of a compute op, times its Seq1F1B segment's FLOP share; with recompute a
    B / BI also re-runs the forward (+ F), as the simulator charges it."""
    c = UNIT_COST[op.kind] + (UNIT_COST["F"] if schedule.recompute and op.kind in (OpKind.B, OpKind.BI) else 0)
    return c * schedule.segment_share(op)


COLUMNS = ["peak_activations", "activation_transfers", "weight_transfers", "weight_storage", "busy"]


def worker_stats(schedule: Schedule, timeline: pd.DataFrame | None = None) -> pd.DataFrame:
    """DataFrame indexed by ``worker`` with the columns of :data:`COLUMNS` (see module docstring)."""
    where = schedule.where()
    rows = []
    for w, ops in enumerate(schedule.ops):
        act = 0
        fetched: set[tuple[int, int]] = set()
        for op in ops:
            if op.kind not in COMPUTE:
                continue
            if any(where.get(dep, w) != w for dep in producers(schedule, w, op, where)):
                act += 1
            if op.weights_worker is not None and op.weights_worker != w:
                fetched.add((op.stage, op.microbatch))
        rows.append(
            {
                "peak_activations": in_flight_peak(ops),
                "activation_transfers": act,
                "weight_transfers": len(fetched),
                "weight_storage": sum(w in ws for ws in schedule.stage_workers),
                "busy": sum(unit_cost(schedule, op) for op in ops if op.kind in COMPUTE),
            }
        )
    df = pd.DataFrame(rows, columns=COLUMNS, index=pd.RangeIndex(schedule.num_workers, name="worker"))
    if timeline is not None:
        missing = {"worker", "kind", "start", "end"} - set(timeline.columns)
        if missing:
            raise ValueError(f"timeline lacks columns {sorted(missing)}; expected worker, kind, start, end")
        t = timeline[timeline["kind"].isin(COMPUTE)]
        busy = (t["end"] - t["start"]).groupby(t["worker"]).sum()
        df["busy"] = busy.reindex(df.index, fill_value=0).astype(float)
    return df

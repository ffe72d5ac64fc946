"""Where the time of a measured step goes: a per-rank split of the wall time into op categories.

For rank ``w`` over the rounds ``R`` of a window, with ``n`` rounds and the window's wall time
``T = max(end) - min(start - wait_ms)`` (all ranks, so every rank is charged the same ``T``):

* ``compute_ms``  = sum over F/B/BI/BW of ``end - start - send_ms - data_ms`` (the stage's math and
  autograd bookkeeping)
* ``recv_wait_ms`` = sum of ``wait_ms``: blocked on a receive (the pipeline bubble shows up here)
* ``send_ms``     = sum of ``send_ms``: posting ``isend``s (and any contiguous copy)
* ``data_ms``     = sum of ``data_ms``: copying a microbatch's input / target out of the data set
* ``optimizer_ms`` = sum of STEP durations;  ``allreduce_ms`` = sum of AR durations
* ``overhead_ms`` = ``T - (all of the above)``: time between ops (Python dispatch, bookkeeping,
  receive posting, epoch ends: flush, checkpoint, gather)

each divided by ``n`` (ms per step), so the columns of a rank add up to ``T / n``.
"""

from __future__ import annotations

import pandas as pd

PARTS = ["compute_ms", "recv_wait_ms", "send_ms", "data_ms", "optimizer_ms", "allreduce_ms", "overhead_ms"]


def breakdown(timeline: pd.DataFrame, first_round: int = 0) -> pd.DataFrame:
    """Per-rank ms per step (module docstring) of a measured timeline, rounds ``>= first_round``;
    index ``worker``, columns :data:`PARTS` + ``step_ms``."""
    tl = timeline[timeline["round"] >= first_round]
    if tl.empty:
        raise ValueError(f"no measured op at or after round {first_round}: pass a smaller first round")
    tl = tl.assign(dur=tl.end - tl.start, wait=_col(tl, "wait_ms"), send=_col(tl, "send_ms"), data=_col(tl, "data_ms"))
    n = tl["round"].nunique()
    wall_ms = float(tl.end.max() - (tl.start - tl.wait).min())
    work = tl.kind.isin(["F", "B", "BI", "BW"])
    g = tl.groupby("worker")
    out = pd.DataFrame(
        {
            "compute_ms": tl[work].assign(c=lambda d: d.dur - d.send - d.data).groupby("worker").c.sum(),
            "recv_wait_ms": g.wait.sum(),
            "send_ms": g.send.sum(),
            "data_ms": g.data.sum(),
            "optimizer_ms": tl[tl.kind == "STEP"].groupby("worker").dur.sum(),
            "allreduce_ms": tl[tl.kind == "AR"].groupby("worker").dur.sum(),
        }
    ).fillna(0.0)
    out["overhead_ms"] = wall_ms - out.sum(axis=1)
    out = out / n
    out["step_ms"] = wall_ms / n
    out.index.name = "worker"
    return out


def _col(tl: pd.DataFrame, name: str) -> pd.Series:
    return pd.to_numeric(tl[name], errors="coerce").fillna(0.0) if name in tl else pd.Series(0.0, index=tl.index)

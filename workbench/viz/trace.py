"""Chrome / Perfetto trace of a timeline, modeled (:mod:`workbench.simulation`) or measured
(:mod:`workbench.runtime`): open ``trace.json`` in https://ui.perfetto.dev or ``chrome://tracing``.

Layout (Trace Event Format, times in µs = the timeline's ms x 1000):

* one process per worker (``pid`` = worker), two threads: ``tid 0`` compute (F, B, BI, BW, STEP, AR
  ops, ``ph: "X"`` with ``dur = (end - start) * 1000``), ``tid 1`` communication:
  the simulator's comm-lane rows (``send_act``, ``send_grad``, ``allreduce`` ...) as they are; for a
  measured timeline, ``recv wait`` (``[start - wait_ms, start]``: the op blocked on its receive) and
  ``send`` (``[send_at, send_at + send_ms]``: handing the op's sends over to the sender thread, or
  posting its ``isend``s);
* a flow arrow (``ph: "s"`` on the producer, ``ph: "f"`` on the consumer, same ``id``) for every
  dataflow edge that crosses workers: the activation of ``F(s, b)`` into ``F(s + 1, b)`` and the
  gradient of ``B/BI(s + 1, b)`` into ``B/BI(s, b)``; it leaves where the send starts (measured: at
  ``send_at``; modeled: at the op's end) and lands at the consumer's start. Measured ranks on
  one host share one clock (:func:`workbench.runtime.launch.rank._shared_t0`), so no arrow runs backwards;
* two counters per worker (``ph: "C"``), each by the same rule for both timelines, so a modeled and
  a measured trace of a schedule can be compared: ``stashed microbatches``, ``+1`` when a forward
  ends, ``-1`` when the op that releases its stash ends (``B``, or ``BW`` when the backward is
  split); and ``weight versions`` (:func:`version_counts`), the versions of its stages' weights the
  worker holds: the newest plus every older one an op of the worker still reads (a stashed
  backward, a vertical-sync forward), summed over the stages whose updates (``STEP``) it runs. Its
  peak per stage is the simulator's ``weight_versions`` and the runtime's ``peak_versions`` (tested).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd

COMPUTE, COMM = 0, 1
WORK = ("F", "B", "BI", "BW")


def to_chrome_trace(timeline: pd.DataFrame, path=None, label: str = "", lastrnds: int | None = None) -> dict:
    """The trace (module docstring) of ``timeline`` as a dict; written as JSON to ``path`` when
    given (atomically: a temporary file renamed into place). ``lastrnds``: keep only the last
    rounds of a long measured timeline."""
    tl = _rows(timeline, lastrnds)
    measured = "lane" not in tl
    events = _metadata(tl) + _slices(tl, measured) + _flows(tl) + _counters(tl)
    trace = {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {"label": label, "timeline": "measured" if measured else "modeled", "time_unit": "us"},
    }
    if path is not None:
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
        tmp.write_text(json.dumps(trace))
        os.replace(tmp, path)
    return trace


def _rows(timeline: pd.DataFrame, lastrnds: int | None) -> pd.DataFrame:
    if timeline.empty:
        raise ValueError("the timeline has no rows: nothing to trace")
    tl = timeline.reset_index(drop=True)
    if "round" not in tl:
        tl = tl.assign(round=0)
    tl = tl.assign(rnd=tl["round"].astype(int))
    if lastrnds is not None:
        tl = tl[tl.rnd > tl.rnd.max() - lastrnds]
    return tl


def _metadata(tl: pd.DataFrame) -> list[dict]:
    out = []
    for w in sorted(tl.worker.unique()):
        out.append(dict(ph="M", name="process_name", pid=int(w), tid=0, args=dict(name=f"worker {w}")))
        out.append(dict(ph="M", name="thread_name", pid=int(w), tid=COMPUTE, args=dict(name="compute")))
        out.append(dict(ph="M", name="thread_name", pid=int(w), tid=COMM, args=dict(name="communication")))
    return out


def _name(r) -> str:
    return f"{r.kind} s{r.stage}" if r.microbatch < 0 else f"{r.kind} s{r.stage} mb{r.microbatch}"


def _slices(tl: pd.DataFrame, measured: bool) -> list[dict]:
    out = []
    for r in tl.itertuples(index=False):
        comm = getattr(r, "lane", "compute") == "comm"
        args: dict[str, float] = dict(
            stage=int(r.stage), microbatch=int(r.microbatch), round=int(r.rnd), version=int(r.version)
        )
        if comm:
            args.update(src=int(r.src), dst=int(r.dst), bytes=float(r.bytes))
        out.append(
            dict(
                ph="X",
                name=_name(r),
                cat=r.kind,
                pid=int(r.worker),
                tid=COMM if comm else COMPUTE,
                ts=r.start * 1e3,
                dur=(r.end - r.start) * 1e3,
                args=args,
            )
        )
        if measured:
            out += _measured_comm(r)
    return out


def _measured_comm(r) -> list[dict]:
    out = []
    send_at = float(getattr(r, "send_at", float("nan")))
    for col, name, t0 in (("wait_ms", "recv wait", lambda v: r.start - v), ("send_ms", "send", lambda v: send_at)):
        v = float(getattr(r, col, 0.0) or 0.0)
        if v == v and v > 0 and t0(v) == t0(v):  # not NaN
            out.append(
                dict(
                    ph="X",
                    name=f"{name} s{r.stage} mb{r.microbatch}",
                    cat=name,
                    pid=int(r.worker),
                    tid=COMM,
                    ts=t0(v) * 1e3,
                    dur=v * 1e3,
                    args=dict(stage=int(r.stage), microbatch=int(r.microbatch)),
                )
            )
    return out


def dataflow_edges(tl: pd.DataFrame) -> list[tuple[int, int, str]]:
    """``(producer row, consumer row, "activation" | "gradient")`` for every dataflow edge between
    two workers (module docstring), as positions in ``tl``'s compute rows."""
    comp = tl[tl.get("lane", pd.Series("compute", index=tl.index)) == "compute"]
    at = {}
    for i, r in zip(comp.index, comp.itertuples(index=False)):
        if r.kind in WORK:
            at[(r.rnd, r.microbatch, r.stage, r.kind)] = i
    edges = []
    for (rnd, b, s, kind), i in at.items():
        if kind == "F":
            j = at.get((rnd, b, s + 1, "F"))
            what = "activation"
        elif kind in ("B", "BI") and s > 0:
            j = at.get((rnd, b, s - 1, "B"), at.get((rnd, b, s - 1, "BI")))
            what = "gradient"
        else:
            continue
        if j is not None and tl.worker[i] != tl.worker[j]:
            edges.append((i, j, what))
    return edges


def _flows(tl: pd.DataFrame) -> list[dict]:
    out = []
    for n, (i, j, what) in enumerate(dataflow_edges(tl)):
        p, c = tl.loc[i], tl.loc[j]
        send_at = float(p.get("send_at", float("nan")))
        if send_at == send_at:  # measured: where the op began handing its sends over
            ts = send_at * 1e3
        else:  # modeled: the transfer starts at the end of the op; the arrow leaves from inside its slice
            ts = p.end * 1e3 - min(1.0, (p.end - p.start) * 1e3 / 2)
        out.append(dict(ph="s", id=n, name=what, cat="flow", pid=int(p.worker), tid=COMPUTE, ts=ts))
        out.append(dict(ph="f", bp="e", id=n, name=what, cat="flow", pid=int(c.worker), tid=COMPUTE, ts=c.start * 1e3))
    return out


def stash_changes(tl: pd.DataFrame) -> pd.DataFrame:
    """``worker, t_ms, delta`` of the stashed-microbatch counter (module docstring), in time order."""
    comp = tl[tl.get("lane", pd.Series("compute", index=tl.index)) == "compute"]
    split = set(zip(comp.rnd[comp.kind == "BW"], comp.microbatch[comp.kind == "BW"], comp.stage[comp.kind == "BW"]))
    rows = []
    for r in comp.itertuples(index=False):
        if r.kind == "F":
            rows.append((r.worker, r.end, 1))
        elif r.kind == "BW" or (r.kind == "B" and (r.rnd, r.microbatch, r.stage) not in split):
            rows.append((r.worker, r.end, -1))
    ch = pd.DataFrame(rows, columns=["worker", "t_ms", "delta"])
    return ch.sort_values(["worker", "t_ms", "delta"], kind="stable").reset_index(drop=True)  # frees first at a tie


def version_counts(tl: pd.DataFrame) -> pd.DataFrame:
    """``worker, stage, t_ms, versions``: how many versions of the stage's weights the worker holds,
    after every change, in time order per worker and stage. A version is held from its creation (the
    end of the ``STEP`` that makes it; the first one from the start) until it is no longer the newest
    and the last op of the worker that reads it has ended: the runtime's rule for dropping a version
    (``PipelineExecutor._free``). Only stages whose updates the worker runs (a ``STEP`` row): ops
    with fetched copies of another worker's weights hold none, nor does a worker whose updates do
    not create consecutive versions (Hogwild: one shared copy that every worker updates). Versions:
    measured rows carry the run's version (a ``STEP`` row the version it creates); modeled rows
    count within their round (a ``STEP`` row's ``update`` creates version ``update + 1``), offset
    here by the round's updates."""
    if "rnd" not in tl:
        tl = _rows(tl, None)
    comp = tl[tl.get("lane", pd.Series("compute", index=tl.index)) == "compute"]
    measured = "lane" not in tl
    steps = comp[comp.kind == "STEP"]
    per_round = (steps.groupby(["worker", "stage"]).size() / steps.groupby(["worker", "stage"]).rnd.nunique()).to_dict()
    rows = []
    for (w, s), g in comp.groupby(["worker", "stage"]):
        if (w, s) not in per_round:
            continue  # the worker computes with weights it does not hold (fetched copies)
        k = per_round[(w, s)]
        created: dict[int, float] = {}
        last_read: dict[int, float] = {}
        for r in g.itertuples(index=False):
            if measured:
                v = int(r.version)
            else:
                v = int(round(r.rnd * k)) + (int(r.update) + 1 if r.kind == "STEP" else int(r.version))
            if r.kind == "STEP":
                created[v] = r.end
            elif r.kind in WORK:
                last_read[v] = max(last_read.get(v, r.end), r.end)
        made = sorted(created)
        if made[-1] - made[0] != len(made) - 1:
            continue  # not this worker's own sequence of versions: weights shared with others (Hogwild)
        versions = set(created) | set(last_read)
        t0 = float(g.start.min())
        delta: dict = {}
        for v in versions:
            born = created.get(v, t0)  # read before any STEP of the window: held from its start
            delta[born] = delta.get(born, 0) + 1
            if v + 1 in created:  # superseded: dropped once its last reader has ended
                gone = max(created[v + 1], last_read.get(v, created[v + 1]))
                delta[gone] = delta.get(gone, 0) - 1
        n = 0
        for t in sorted(delta):
            n += delta[t]
            rows.append((w, s, t, n))
    return pd.DataFrame(rows, columns=["worker", "stage", "t_ms", "versions"])


def _counters(tl: pd.DataFrame) -> list[dict]:
    out = []
    for w, ch in stash_changes(tl).groupby("worker"):
        out.append(dict(ph="C", name="stashed microbatches", pid=int(w), ts=0.0, args=dict(stashed=0)))
        for t, n in zip(ch.t_ms, ch.delta.cumsum()):
            out.append(dict(ph="C", name="stashed microbatches", pid=int(w), ts=t * 1e3, args=dict(stashed=int(n))))
    vc = version_counts(tl)
    for w, g in vc.groupby("worker"):  # summed over the worker's stages
        held = {}
        for r in g.sort_values("t_ms", kind="stable").itertuples(index=False):
            held[r.stage] = r.versions
            out.append(
                dict(
                    ph="C",
                    name="weight versions",
                    pid=int(w),
                    ts=r.t_ms * 1e3,
                    args=dict(versions=int(sum(held.values()))),
                )
            )
    return out

"""The result of a simulation: timeline, metrics (steady state, bubbles, memory) and their display."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from workbench.io.cards import card, fmt, one_line
from workbench.schedules.core import Schedule
from workbench.schedules.dataflow import KindCode, OpKind, peak_in_flight
from workbench.schedules.stats import worker_stats
from workbench.simulation.costs import KIND_NAMES, TIMELINE_COLUMNS, CommKind, SimCosts, default_microbatch_fraction
from workbench.simulation.edges import OpGraph
from workbench.simulation.engine import CommRow, Sweep


# ---------------------------------------------------------------------------------------------
# result
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SimResult:
    """A modeled timeline and its metrics (see :func:`simulate`)."""

    schedule: Schedule
    timeline: pd.DataFrame = field(repr=False)
    makespan: float = 0.0
    metrics: dict = field(default_factory=dict, repr=False)
    label: str = ""
    _stats: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def worker_stats(self) -> pd.DataFrame:
        """Per-worker statistics of the "Unifying" document (indexed by worker)."""
        if "df" not in self._stats:
            self._stats["df"] = worker_stats(self.schedule, self.timeline)
        return self._stats["df"]

    @property
    def compute(self) -> pd.DataFrame:
        return self.timeline[self.timeline["lane"] == "compute"]

    # ---- headline figures (one place; summary, repr and HTML all read these) -----------------
    @property
    def time_per_minibatch_ms(self) -> float | None:
        """Steady-state time per minibatch (warm-up and drain excluded; see :func:`steady_state`);
        None when the run reached no steady state (``metrics["no_steady_state_reason"]`` says why)."""
        return self.metrics["time_per_minibatch_ms"]

    @property
    def throughput_minibatches_per_s(self) -> float | None:
        return self.metrics["throughput_minibatches_per_s"]

    @property
    def throughput_samples_per_s(self) -> float | None:
        return self.metrics["throughput_samples_per_s"]

    def _rows(self) -> list:
        m = self.metrics
        u = m.get("time_unit", "ms")
        rows: list[tuple[str, Any, str]] = [("schedule", self.schedule.name, "")]
        if m["steady_state"]:
            rows += [
                ("time per minibatch", m["time_per_minibatch_ms"], u),
                (
                    "throughput",
                    m["throughput_minibatches_per_s"] if u == "ms" else 1 / m["time_per_minibatch_ms"],
                    "minibatches/s" if u == "ms" else "minibatches/unit",
                ),
            ]
            if math.isfinite(m["throughput_samples_per_s"]):
                rows.append(("throughput", m["throughput_samples_per_s"], "samples/s"))
        else:
            rows += [
                ("no steady state", m["no_steady_state_reason"], ""),
                ("makespan / minibatches (warm-up and drain included)", m["makespan_per_minibatch"], u),
            ]
        rows += [
            ("makespan", m["makespan"], u),
            ("minibatches", m["minibatches"], ""),
            ("bubble fraction (mean)", m["bubble_fraction_mean"], ""),
            (
                "bubble within each worker's span (max)",
                max((x for x in m["span_bubble_fraction"] if not math.isnan(x)), default=math.nan),
                "",
            ),
            ("comm wait share (max)", max(m["comm_wait_share"], default=0.0), ""),
        ]
        return rows

    def __repr__(self) -> str:
        return one_line("SimResult", self._rows()[:3])

    def _repr_html_(self) -> str:
        table = pd.DataFrame(
            {
                "bubble_fraction": self.metrics["bubble_fraction"],
                "span_bubble_fraction": self.metrics["span_bubble_fraction"],
                "comm_wait_share": self.metrics["comm_wait_share"],
                "peak_activations": self.metrics["peak_activations"],
            }
        )
        table.index.name = "worker"
        return card(f"Simulation of {self.schedule.name}", self._rows(), label=self.label, table=table, max_rows=8)

    def summary(self) -> str:
        m = self.metrics
        u = m.get("time_unit", "ms")
        lines = [
            f"{self.schedule.name}: {self.label}",
            "; ".join(f"{n} {fmt(v, unit)}" for n, v, unit in self._rows()[1:]),
            f"makespan {m['makespan']:.4g} {u} ({m['steps']} update(s) of a stage), rho {m['rho']:.3f}",
        ]
        table = pd.DataFrame(
            {
                k: m[k]
                for k in (
                    "bubble_fraction",
                    "span_bubble_fraction",
                    "comm_stall",
                    "peak_activations",
                    "peak_activation_bytes",
                    "weight_versions",
                )
            }
        )
        table.index.name = "worker"
        unsized = bool(table["peak_activation_bytes"].isna().all())
        if unsized:  # unit costs know no activation sizes: the column would read NaN on every worker
            table = table.drop(columns="peak_activation_bytes")
        with pd.option_context("display.max_rows", 40, "display.width", 120):
            lines.append(table.to_string(float_format=lambda x: f"{x:.4g}"))
        if unsized:
            lines.append(
                "peak_activation_bytes: not modeled (no activation sizes without a profile: --profile, --plan)"
            )
        if m["bytes_per_level"]:
            lines.append(
                "bytes per link level: " + ", ".join(f"L{k}: {v:.4g}" for k, v in m["bytes_per_level"].items())
            )
        return "\n".join(lines)


@dataclass(frozen=True)
class _Ops:
    """The swept ops as arrays indexed by op id (program order, worker after worker)."""

    kc: np.ndarray  # kind codes (int8)
    st: np.ndarray  # stage
    mb: np.ndarray  # microbatch
    w: np.ndarray  # worker
    start: np.ndarray
    end: np.ndarray
    exposed: np.ndarray  # all-to-all ms the op's compute stream waited for (inside [start, end])

    @classmethod
    def of(cls, graph: OpGraph, swept: Sweep) -> _Ops:
        a = graph.arrays
        n = len(a.kind)
        return cls(
            kc=np.asarray(a.kind, dtype=np.int8),
            st=np.asarray(a.stage, dtype=np.int64),
            mb=np.asarray(a.microbatch, dtype=np.int64),
            w=np.asarray(a.worker, dtype=np.int64),
            start=np.fromiter(swept.start, float, len(swept.start)),
            end=np.fromiter(swept.end, float, len(swept.end)),
            exposed=np.asarray(graph.exposed if graph.exposed else [0.0] * n, dtype=float),
        )


def assemble(schedule: Schedule, costs: SimCosts, graph: OpGraph, swept: Sweep) -> SimResult:
    """The :class:`SimResult` of a swept op graph: the timeline (compute and communication lanes,
    :mod:`workbench.io.timeline` schema, :func:`_timeline`) and the metrics of
    :func:`workbench.simulation.simulate` (:func:`_metrics`)."""
    ops = _Ops.of(graph, swept)
    comm_rows = swept.comm_rows + _alltoall_rows(graph, ops.exposed, swept.end)
    timeline = _timeline(schedule, graph, ops, comm_rows)
    metrics = _metrics(schedule, costs, graph, swept, ops)
    return SimResult(schedule, timeline, metrics["makespan"], metrics, costs.label)


def _timeline(schedule: Schedule, graph: OpGraph, ops: _Ops, comm_rows: list[CommRow]) -> pd.DataFrame:
    """Compute-lane rows (one per op but the all-reduces, which are comm-lane rows) and the
    comm-lane rows, in :data:`TIMELINE_COLUMNS` (plus ``segment`` for Seq1F1B);
    ``round = step = 0``: one pass over the op lists."""
    keep = ops.kc != KindCode.AR
    w = ops.w[keep]
    comp = pd.DataFrame(
        {
            "worker": w,
            "stage": ops.st[keep],
            "microbatch": ops.mb[keep],
            "kind": np.array(KIND_NAMES, dtype=object)[ops.kc[keep]],
            "start": ops.start[keep],
            "end": (ops.end - ops.exposed)[keep],  # compute only; the exposed all-to-all follows on the comm lane
            "version": np.asarray(graph.arrays.version, dtype=np.int64)[keep],
            "lane": "compute",
            "src": w,
            "dst": w,
            "update": np.asarray(graph.arrays.step, dtype=np.int64)[keep],
            "bytes": 0.0,
            "round": 0,
            "step": 0,
        }
    )
    if schedule.segment_tokens:  # optional column: the Seq1F1B segment of each compute op
        segments = [-1 if o.segment is None else o.segment for o_s in schedule.ops for o in o_s]
        comp["segment"] = np.asarray(segments)[keep]
    timeline = comp
    if comm_rows:
        comm = pd.DataFrame(comm_rows, columns=list(CommRow._fields))
        comm["lane"] = "comm"
        comm["round"] = comm["step"] = 0
        timeline = pd.concat([comp, comm[list(TIMELINE_COLUMNS)]], ignore_index=True)
    extra = ["segment"] if "segment" in timeline.columns else []
    return timeline[list(TIMELINE_COLUMNS) + extra]


def _metrics(schedule: Schedule, costs: SimCosts, graph: OpGraph, swept: Sweep, ops: _Ops) -> dict:
    """The metrics of :func:`workbench.simulation.simulate` (its docstring gives each formula)."""
    W = schedule.num_workers
    makespan = float(ops.end.max()) if len(ops.end) else 0.0
    if not math.isfinite(makespan):
        makespan = 0.0
    busy, stall, waited, work, span_bubble = _utilisation(ops, swept.stall, W)
    steps, steady = _steps(schedule, ops)
    peak_n, peak_b, versions = _memory(schedule, costs, graph)
    L = makespan if makespan > 0 else float("nan")
    inputs = np.unique(ops.w[(ops.kc == KindCode.F) & (ops.st == 0)]).size
    fraction = costs.fraction if costs.model is not None else default_microbatch_fraction(schedule, inputs)
    steady_mb, why_not = steady_state(schedule, ops.kc, ops.mb, ops.st, ops.end)
    per_mb = steady_mb / fraction if steady_mb is not None else None
    M = schedule.microbatches
    return {
        "makespan": makespan,
        "steps": steps,
        "iteration_time": makespan / steps,
        "steady_iteration_time": steady,
        "microbatches": M,
        "microbatch_fraction": fraction,
        "minibatches": M * fraction,
        "time_per_minibatch_ms": per_mb,
        "steady_state": per_mb is not None,
        "no_steady_state_reason": why_not or None,
        "makespan_per_minibatch": makespan / (M * fraction) if M else float("nan"),
        **_throughputs(per_mb, costs.batch_size),
        "rho": work / (L * W),
        "bubble_fraction": [1.0 - b / L for b in busy.tolist()],
        "bubble_fraction_mean": float(np.mean([1.0 - b / L for b in busy.tolist()])) if W else float("nan"),
        "span_bubble_fraction": span_bubble,
        "comm_wait_share": [x / L for x in stall],
        "busy": busy.tolist(),
        "comm_stall": list(stall),
        "alltoall_exposed": waited.tolist(),
        "peak_activations": peak_n,
        "peak_activation_bytes": peak_b,
        "peak_activation_share": _peak_activation_share(schedule),
        "weight_versions": versions,
        "transfers_received": list(graph.xfer_count),
        "weight_fetches": list(swept.fetch_count),
        "bytes_per_level": dict(sorted(swept.level_bytes.items())),
        "time_unit": "ms" if costs.model is not None else "unit",
        "label": costs.label,
    }


def _utilisation(ops: _Ops, stall: list, W: int) -> tuple:
    """Per worker the compute-lane busy time (the exposed all-to-all is communication, not
    compute), the stall including that all-to-all, the all-to-all alone; the total F/B/BI/BW work
    and the bubble within each worker's span (:func:`_span_bubble`)."""
    keep = ops.kc != KindCode.AR
    dur = ops.end - ops.start
    waited = np.bincount(ops.w, weights=ops.exposed, minlength=W)
    busy = np.bincount(ops.w[keep], weights=dur[keep], minlength=W) - waited
    stall = [s + x for s, x in zip(stall, waited.tolist())]
    work_mask = ops.kc < KindCode.STEP
    work = float(dur[work_mask].sum() - ops.exposed.sum())
    span_bubble = _span_bubble(
        ops.w[work_mask], ops.start[work_mask], ops.end[work_mask], (dur - ops.exposed)[work_mask], W
    )
    return busy, stall, waited, work, span_bubble


def _steps(schedule: Schedule, ops: _Ops) -> tuple[int, float]:
    """The most STEP ops of one stage on one worker (>= 1), and the mean spacing of worker 0's
    STEPs of its first stage (NaN with fewer than two)."""
    steps = 1
    is_step = ops.kc == KindCode.STEP
    if is_step.any():
        steps = int(np.bincount((ops.w * schedule.num_stages + ops.st)[is_step]).max())
    steady = float("nan")
    on0 = np.flatnonzero(is_step & (ops.w == 0))
    if len(on0):
        ends = np.sort(ops.end[on0[ops.st[on0] == ops.st[on0[0]]]])
        if len(ends) >= 2:
            steady = float(ends[-1] - ends[0]) / (len(ends) - 1)
    return steps, steady


def _span_bubble(worker, start, end, work, W: int) -> list[float]:
    """Per worker ``1 - work_w / (last end_w - first start_w)`` over its F, B, BI, BW ops: the bubble
    rate the zero-bubble papers' schedulers report (idle time inside the worker's own span, not
    counting its wait before its first op and after its last; NaN for a worker without ops)."""
    out = []
    for w in range(W):
        on = worker == w
        span = float(end[on].max() - start[on].min()) if on.any() else 0.0
        out.append(1.0 - float(work[on].sum()) / span if span > 0 else float("nan"))
    return out


def _alltoall_rows(graph: OpGraph, exposed: np.ndarray, end: list) -> list[CommRow]:
    """Comm-lane rows ``alltoall`` for the exposed all-to-all at the end of each op that has one
    (:func:`~workbench.simulation.edges.exposed_alltoall`)."""
    rows = []
    kind = CommKind.ALLTOALL.value
    for g in np.flatnonzero(exposed > 0).tolist():
        w = graph.wof[g]
        rows.append(
            CommRow(w, graph.st[g], graph.mb[g], kind, end[g] - exposed[g], end[g], graph.ver[g], w, w, -1, 0.0)
        )
    return rows


def _throughputs(per_mb: float | None, batch_size) -> dict:
    """Minibatches and samples per second from the steady-state ms per minibatch (None without a
    steady state; samples NaN when the profile does not know its batch size)."""
    if per_mb is None:
        return {"throughput_minibatches_per_s": None, "throughput_samples_per_s": None}
    per_s = 1e3 / per_mb if per_mb > 0 else float("nan")
    return {
        "throughput_minibatches_per_s": per_s,
        "throughput_samples_per_s": batch_size * per_s if batch_size else float("nan"),
    }


def steady_state(schedule: Schedule, kc, mb, st, end) -> tuple[float | None, str]:
    """Steady-state time per *microbatch* (time unit of the costs), or ``None`` and the reason why
    the run has none.

    Microbatch b completes when its last backward op of stage 0 (B, BI or BW) ends. Sorting the
    completions ``c_0 <= ... <= c_{n-1}``, the steady state is the slope ``(c_hi - c_lo) / (hi - lo)``
    between update boundaries ``lo < hi`` (synchronous schedules that update every
    ``g = max(microbatches_per_step, replicas of stage 0)`` microbatches complete them in bursts, so
    only ``c_{jg-1}`` count; ``g = 1`` for asynchronous ones) that lie outside the warm-up and the
    drain of the input stage, which holds ``k`` microbatches at once: ``lo >= max(n/4, k)`` and
    ``hi <= n - 1 - max(n/4, k)``, or, where that leaves fewer than two boundaries, ``lo >= k - 1``
    and ``hi <= n - 1 - k`` (the k-th completion is the first one after the warm-up). A run with
    fewer than two such boundaries has no steady state: its completions near the ends come faster
    (drain) or slower (fill) than the bottleneck allows."""
    n = int(schedule.microbatches)
    back = ((kc == KindCode.B) | (kc == KindCode.BI) | (kc == KindCode.BW)) & (st == 0)
    if not back.any():
        return None, "no backward op of the input stage completes a microbatch"
    done = pd.Series(end[back]).groupby(mb[back]).max().sort_values().to_numpy()
    g = int(schedule.microbatches_per_step) if schedule.update != "async" else 1
    g = max(g, len(schedule.stage_workers[0]), 1)  # a round of the input stage's replicas
    k = _input_in_flight(schedule)
    inner = _steady_window(len(done), g, k)
    if len(inner) < 2:
        return None, (
            f"{n} microbatches are all warm-up or drain (the input stage holds {k} at once and updates "
            f"every {g}); simulate more microbatches: a steady state needs two updates outside the "
            f"first and the last {k} completions"
        )
    lo, hi = int(inner[0]), int(inner[-1])
    return float(done[hi] - done[lo]) / (hi - lo), ""


def _steady_window(n: int, g: int, k: int) -> np.ndarray:
    """Completion indices ``jg - 1`` (update boundaries) of ``n`` completions that lie outside the
    warm-up and the drain of an input stage holding ``k`` microbatches (:func:`steady_state`)."""
    bounds = np.arange(g - 1, n, g)
    skip = max(n // 4, k)
    inner = bounds[(bounds >= skip) & (bounds <= n - 1 - skip)]
    if len(inner) < 2:
        inner = bounds[(bounds >= k - 1) & (bounds <= n - 1 - k)]
    return inner


def _input_in_flight(schedule: Schedule) -> int:
    """Microbatches of the input stage (stage 0) its workers hold at once, summed over its replicas:
    forwarded by stage 0 and not yet through stage 0's backward (B, or BW where the backward is
    split; the one counter, :func:`workbench.schedules.dataflow.peak_in_flight`). This bounds the
    warm-up and the drain of the completions."""
    return sum(
        peak_in_flight((op.kind, op.stage, op.microbatch) for op in schedule.ops[w] if op.stage == 0)
        for w in schedule.stage_workers[0]
    )


def _memory(schedule: Schedule, costs: SimCosts, graph: OpGraph) -> tuple[list[int], list[float], list[int]]:
    """Peak stashed activations (count, bytes) and weight versions alive per worker.

    Ops on one worker run one after another, so program order is time order. Activations: +1 at
    F, -1 at its B (or BW); the peak of the running sum per worker (bytes: :func:`_stash_bytes`).
    Versions: :func:`_weight_versions`."""
    a = graph.arrays
    kc_a = np.asarray(a.kind, dtype=np.int64)
    st_a = np.asarray(a.stage, dtype=np.int64)
    W, wbeg, wend = schedule.num_workers, graph.wbeg, graph.wend
    sign = np.where(kc_a == KindCode.F, 1.0, np.where((kc_a == KindCode.B) | (kc_a == KindCode.BW), -1.0, 0.0))
    peak_n = [int(round(x)) for x in _peak_per_worker(wbeg, wend, W, sign)]
    if np.asarray(costs.act_stash_bytes, dtype=float).any():
        peak_b = _peak_per_worker(wbeg, wend, W, *_stash_bytes(schedule, costs, kc_a, st_a))
    else:
        peak_b = [float("nan")] * W
    versions = _weight_versions(
        schedule,
        kc_a,
        st_a,
        np.asarray(a.version, dtype=np.int64),
        np.asarray(a.worker, dtype=np.int64),
        wbeg=wbeg,
        wend=wend,
    )
    return peak_n, peak_b, versions


def _peak_per_worker(wbeg: list, wend: list, W: int, delta: np.ndarray, transient=None) -> list[float]:
    """Per worker the peak (>= 0) of the running sum of ``delta`` over its ops in program order;
    ``transient`` (per op) is held only while the op runs, on top of the sum before it."""
    out = [0.0] * W
    nonempty = [w for w in range(W) if wend[w] > wbeg[w]]
    if not nonempty:
        return out
    starts = np.asarray([wbeg[w] for w in nonempty], dtype=np.int64)
    cum = np.cumsum(delta)
    before = np.concatenate([[0.0], cum])[starts]  # running sum before each worker's first op
    local = cum - np.repeat(before, [wend[w] - wbeg[w] for w in nonempty])
    if transient is not None:
        local = np.maximum(local, local - delta + transient)
    for w, v in zip(nonempty, np.maximum.reduceat(local, starts).tolist()):
        out[w] = max(0.0, v)
    return out


def _weight_versions(schedule: Schedule, kc_a, st_a, ver_a, w_a, *, wbeg: list, wend: list) -> list[int]:
    """Most versions of one stage alive at once per worker (>= 1 on a worker with ops).

    Version v of stage s is alive on worker w over the hull of [first op reading it, last op
    reading it] (program positions) and, when w holds stage s, of the span in which v is w's newest
    version (from its STEP v-1 to STEP v; a version no op of the simulated rounds reads: that span
    alone, :func:`_held_versions`); the result is the most intervals of one stage overlapping at once."""
    W, S = schedule.num_workers, schedule.num_stages
    pos = np.arange(len(kc_a), dtype=np.int64)
    comp = kc_a < KindCode.STEP
    key = w_a * S + st_a
    reads = pd.DataFrame({"k": key[comp], "v": ver_a[comp], "pos": pos[comp]})
    iv = reads.groupby(["k", "v"], sort=False)["pos"].agg(["min", "max"])
    k_iv = iv.index.get_level_values(0).to_numpy()
    v_iv = iv.index.get_level_values(1).to_numpy()
    lo = iv["min"].to_numpy(dtype=np.int64).copy()  # half-open intervals [lo, hi) in program positions
    hi = iv["max"].to_numpy(dtype=np.int64) + 1
    holds = np.zeros(W * S, dtype=bool)
    for s_, ws in enumerate(schedule.stage_workers):
        for w in ws:
            if 0 <= w < W:
                holds[w * S + s_] = True
    if holds[k_iv].any():
        is_step = kc_a == KindCode.STEP
        k_iv, lo, hi = _held_versions(S, holds, (k_iv, v_iv, lo, hi), key[is_step], pos[is_step], wbeg=wbeg, wend=wend)
    ev_k = np.concatenate([k_iv, k_iv])
    ev_t = np.concatenate([lo, hi])
    ev_d = np.concatenate([np.ones(len(lo)), -np.ones(len(lo))])
    order = np.lexsort((ev_d, ev_t, ev_k))  # at equal positions an interval ends before one starts
    running = np.cumsum(ev_d[order])
    peak_v = [1 if wend[w] > wbeg[w] else 0 for w in range(W)]
    if len(running):
        per_key = pd.Series(running).groupby(ev_k[order]).max()
        for k, v in zip(per_key.index.tolist(), per_key.tolist()):
            w = int(k) // S
            peak_v[w] = max(peak_v[w], int(v))
    return peak_v


def _held_versions(S: int, holds, intervals: tuple, sk, sp, *, wbeg: list, wend: list) -> tuple:
    """The read intervals ``(key, version, lo, hi)`` (key = worker · S + stage) of
    :func:`_weight_versions` widened, where the worker holds the stage, to the span in which each
    version is the newest (``sk``, ``sp``: key and program position of every STEP; the i-th STEP on
    a key turns version i into i + 1), plus the spans of versions a STEP makes that no simulated op
    reads. Returns ``(key, lo, hi)``."""
    k_iv, v_iv, lo, hi = intervals
    w_iv = k_iv // S
    order = np.lexsort((sp, sk))
    sk, sp = sk[order], sp[order]
    first = np.searchsorted(sk, sk, side="left")
    si = np.arange(len(sk)) - first
    stride = int(max(v_iv.max(initial=0), si.max(initial=0))) + 2
    step_pos = dict(zip((sk * stride + si).tolist(), sp.tolist()))
    wb = np.asarray(wbeg, dtype=np.int64)[w_iv]
    we = np.asarray(wend, dtype=np.int64)[w_iv]
    idx = np.flatnonzero(holds[k_iv])
    kv = (k_iv[idx] * stride + v_iv[idx]).tolist()
    born = np.array([step_pos.get(x - 1, -2) + 1 for x in kv], dtype=np.int64)  # -1: never born here
    born = np.where(v_iv[idx] == 0, wb[idx], born)
    dies = np.array([step_pos.get(x, -2) + 1 for x in kv], dtype=np.int64)
    dies = np.where(dies < 0, we[idx], dies)
    ok = born >= 0
    lo[idx[ok]] = np.minimum(lo[idx[ok]], born[ok])
    hi[idx[ok]] = np.maximum(hi[idx[ok]], dies[ok])
    # a version a STEP creates that no op of the simulated rounds reads is still held while it is
    # the newest (2BW's next version, read only in the next round, beside the one its forwards
    # still read): from its STEP to the next STEP of the stage, or to the worker's end
    read = set((k_iv * stride + v_iv).tolist())
    made = sk * stride + si + 1
    new = np.flatnonzero(np.isin(made, list(read), invert=True) & holds[sk])
    if len(new):
        nxt = np.array([step_pos.get(x, -2) + 1 for x in (sk[new] * stride + si[new] + 1).tolist()], dtype=np.int64)
        k_iv = np.concatenate([k_iv, sk[new]])
        lo = np.concatenate([lo, sp[new] + 1])
        hi = np.concatenate([hi, np.where(nxt < 0, np.asarray(wend, dtype=np.int64)[sk[new] // S], nxt)])
    return k_iv, lo, hi


def _stash_bytes(schedule: Schedule, costs: SimCosts, kc_a, st_a):
    """Per-op change of a worker's stashed activation bytes, and bytes held only while the op runs.

    Without recompute F adds the stage's activations ``A_s`` (times the op's token share with
    segments) and B / BW frees them. With recompute F keeps only the stage input (the cut bytes of
    stage s-1; stage 0's input, the data, is not counted, as without recompute); B re-creates
    ``A_s`` for its duration (transient) and frees the input; split backward: BI re-creates
    ``A_s`` and holds it until BW frees it with the input."""
    share = np.asarray(
        [
            schedule.segment_share(op, "tokens") if k < KindCode.STEP else 0.0
            for op, k in zip((op for ops in schedule.ops for op in ops), kc_a)
        ]
    )
    full = np.asarray(costs.act_stash_bytes, dtype=float)[st_a] * share
    if not schedule.recompute:
        sign = np.where(kc_a == KindCode.F, 1.0, np.where((kc_a == KindCode.B) | (kc_a == KindCode.BW), -1.0, 0.0))
        return sign * full, None
    cut = np.concatenate([[0.0], np.asarray(costs.cut_bytes, dtype=float)])[st_a] * share  # input of s
    delta = np.select(
        [kc_a == KindCode.F, kc_a == KindCode.B, kc_a == KindCode.BI, kc_a == KindCode.BW],
        [cut, -cut, full, -(cut + full)],
        0.0,
    )
    return delta, np.where(kc_a == KindCode.B, full, 0.0)


def _peak_activation_share(schedule: Schedule) -> list[float]:
    """Peak per worker of the activations held, in units of one whole microbatch's activations of
    one stage: F adds its token share ``n_j / n`` (1 without segments), B / BW removes it. Equals
    ``peak_activations`` without segments; with recompute see ``peak_activation_bytes``."""
    out = []
    for ops in schedule.ops:
        held, peak = 0.0, 0.0
        for op in ops:
            if op.kind == OpKind.F:
                held += schedule.segment_share(op, "tokens")
                peak = max(peak, held)
            elif op.kind in (OpKind.B, OpKind.BW):
                held -= schedule.segment_share(op, "tokens")
        out.append(peak)
    return out

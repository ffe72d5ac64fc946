"""Discrete-event simulation of a :class:`~workbench.schedules.core.Schedule`.

Model
-----
Every worker has one *compute stream* that runs its op list strictly in order, and
communication runs beside it on separate channels, so computation overlaps communication as in
PipeDream (§3.1: "communication overlaps with computation"):

* activations and gradients travel on a per-directed-link channel ``src -> dst`` (full duplex:
  ``a -> b`` and ``b -> a`` are independent); a channel sends one tensor at a time, first-come
  first-served in the order the sender produced them;
* all-reduces of a stage's gradients run on a per-worker *collective* channel shared by the
  replicas of that stage (one all-reduce at a time per worker);
* weight fetches (``op.weights_worker != worker``, the master-schedule family) run on a
  per-link fetch channel and may start while the previous op on the fetching worker is still
  computing (one op of prefetch, as in the two-thread worker of the "Unifying" document).

An op starts at ``max(worker free, inputs ready)``:

* ``F(s, b)`` needs ``F(s-1, b)`` plus, across workers, the activation transfer;
* ``B(s, b)`` / ``BI(s, b)`` need ``F(s, b)`` and the gradient from ``B(s+1, b)`` / ``BI(s+1, b)``;
  ``BW(s, b)`` needs ``BI(s, b)`` (see :func:`~workbench.schedules.core.producers`);
* an op reading weight version ``v > 0`` from another worker (``weights_worker``) needs that
  worker's ``v``-th STEP of the stage (the version must exist) and then the fetch; on its own
  worker the version rule is already encoded in the op order;
* ``AR(s, t)`` starts when every replica in ``stage_workers[s]`` has reached it in its op list
  and the collective channels are free; with ``overlap_comm=True`` (wait-free backprop / DDP
  buckets) the compute stream does not wait for it, only the matching ``STEP`` does; with
  ``overlap_comm=False`` the worker blocks until it ends;
* ``STEP(s, t)`` waits for the worker's ``AR(s, t)`` when there is one, and (master family) for
  the weight gradients that B/BW ops of stage ``s`` with ``version == t`` computed on other workers
  push to it (``send_wgrad``, the stage's parameter bytes, on the link to the owner).

Costs
-----
Unit costs: forward ``fwd``, backward ``bwd`` (numbers, or one number per stage); with split
backward ``BI = BW = bwd / 2``; ``STEP = step_ms``; all-reduce ``allreduce`` (default 0),
activation/gradient transfer between different workers ``transfer`` (default 0), weight fetch
``weight_fetch`` (default 0).

Profile costs (``profile=``, optional ``plan=``, ``topology=``), all in ms:

* compute of stage ``s`` = ``f · Σ fwd_ms`` (``bwd_ms`` for B) over the stage's layers, where
  ``f = 1 / schedule.microbatches_per_step``: the profile is per minibatch, and schedules that
  split a minibatch into ``m`` microbatches (GPipe, Flush, 2BW) run ``m`` ops of ``1/m`` the
  size; override with ``microbatch_fraction=``;
* transfer across the cut after stage ``s`` between workers ``a != b``:
  ``f · act_bytes[last layer of s] / bandwidth_between(a, b)``;
* all-reduce of stage ``s`` over its ``r`` replicas (ring): ``2 (r - 1) / r · P_s / B_min``
  with ``P_s`` the stage's parameter bytes and ``B_min`` the slowest link in the ring;
* weight fetch of stage ``s`` from worker ``a`` to ``b``: ``P_s / bandwidth_between(a, b)``.

Fixed costs (both default 0, calibrated by :mod:`workbench.calibrate`):

* ``latency_ms`` (``α``) is added to every point-to-point message between different workers
  (activation, gradient, weight fetch, weight-gradient push), so a transfer of ``n`` bytes costs
  ``α + n / bandwidth`` (the "alpha-beta" model) and occupies its channel that long; a ring
  all-reduce over ``r`` replicas sends ``2 (r - 1)`` messages in sequence and gets ``2 (r - 1) α``;
* ``op_overhead_ms`` (``o``) is added to the duration of every F, B, BI, BW and STEP op (the
  executor's fixed per-op cost: Python dispatch, bookkeeping, posting messages).

Without a topology, bandwidth is infinite (only ``latency_ms`` is charged). The simulator sweeps the per-worker queues in
topological order (one pass over precomputed integer arrays); ops only wait on ops that
finish earlier, so the result equals a time-ordered event simulation. If no worker can make
progress before all ops ran, the schedule deadlocks and :class:`ValueError` names the stuck ops.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd

from .display import card, fmt, one_line
from .costmodel import CostModel, check_ms, link_level, ring_allreduce_ms
from .schedules.core import Schedule

KIND_CODES = {"F": 0, "B": 1, "BI": 2, "BW": 3, "STEP": 4, "AR": 5}
KIND_NAMES = ("F", "B", "BI", "BW", "STEP", "allreduce")
COMM_KINDS = ("send_act", "send_grad", "allreduce", "fetch_weights", "send_wgrad")
TIMELINE_COLUMNS = ("worker", "stage", "microbatch", "kind", "start", "end", "version", "lane",
                    "src", "dst", "step", "bytes")
_F, _B, _BI, _BW, _STEP, _AR = range(6)
STAT_COLUMNS = ("peak_activations", "activation_transfers", "weight_transfers", "weight_storage", "busy")


# ---------------------------------------------------------------------------------------------
# costs
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Costs:
    """Per-op durations (ms) of one simulation, all drawn from one :class:`CostModel`
    (profile costs) or from the unit constants (``model is None``)."""

    compute: dict  # kind code -> list of ms per stage (without the per-op overhead)
    cut_bytes: list  # bytes crossing the cut after stage s (per microbatch)
    param_bytes: list  # parameter bytes of stage s
    act_stash_bytes: list  # activation bytes stashed per (stage, microbatch) in flight
    transfer_ms: float | None  # unit mode: constant transfer time; None: from the cost model
    fetch_ms: float | None
    allreduce_ms: list  # per stage
    topology: object | None
    label: str
    latency_ms: float = 0.0  # unit mode: fixed cost of every message between different workers
    op_overhead_ms: float = 0.0  # fixed cost added to every F/B/BI/BW/STEP op
    model: CostModel | None = None  # profile mode: the cost model every charge comes from
    fraction: float = 1.0  # microbatch size relative to the profile's minibatch
    batch_size: int | None = None

    def message(self, nbytes: float, a: int, b: int, fixed_ms: float | None) -> tuple[float, float]:
        """(ms, bytes) of one message of ``nbytes`` from ``a`` to ``b``: the cost model's
        ``α + n / B``, or in unit mode ``fixed_ms + α`` between different workers."""
        if self.model is not None:
            return self.model.message_ms(nbytes, a, b), nbytes
        return (fixed_ms + self.latency_ms if a != b else fixed_ms), 0.0

    def xfer(self, cut: int, a: int, b: int) -> tuple[float, float]:
        """(ms, bytes) of an activation/gradient transfer across ``cut`` from ``a`` to ``b``."""
        return self.message(self.cut_bytes[cut], a, b, self.transfer_ms)

    def fetch(self, stage: int, a: int, b: int) -> tuple[float, float]:
        """(ms, bytes) of fetching ``stage``'s weights from ``a`` to ``b``."""
        return self.message(self.param_bytes[stage], a, b, self.fetch_ms)


def _per_stage(x, S: int, name: str) -> list[float]:
    if isinstance(x, (int, float, np.integer, np.floating)):
        vals = [float(x)] * S
    else:
        vals = [float(v) for v in x]
        if len(vals) != S:
            raise ValueError(f"{name} has {len(vals)} values but the schedule has {S} stages; give one per stage or a number")
    for v in vals:
        check_ms(name, v)
    return vals


def _unit_costs(schedule: Schedule, fwd, bwd, allreduce, transfer, weight_fetch, step_ms, latency_ms,
                op_overhead_ms) -> _Costs:
    S = schedule.num_stages
    f = _per_stage(fwd, S, "fwd")
    b = _per_stage(bwd, S, "bwd")
    lat = check_ms("latency_ms", latency_ms)
    ar = [a + ring_allreduce_ms(0.0, len(schedule.stage_workers[s]), math.inf, lat)
          for s, a in enumerate(_per_stage(0.0 if allreduce is None else allreduce, S, "allreduce"))]
    half = [x / 2 for x in b]
    compute = {_F: f, _B: b, _BI: half, _BW: half, _STEP: _per_stage(step_ms, S, "step_ms")}
    zeros = [0.0] * S
    over = check_ms("op_overhead_ms", op_overhead_ms)
    label = "modeled (unit costs)"
    if lat or over:
        label += f", latency {lat:g} ms/message, overhead {over:g} ms/op"
    return _Costs(compute, zeros, zeros, zeros, check_ms("transfer", transfer), check_ms("weight_fetch", weight_fetch),
                  ar, None, label, latency_ms=lat, op_overhead_ms=over)


def default_microbatch_fraction(schedule: Schedule) -> float:
    """Size of one microbatch relative to the profile's minibatch.

    The profile is per minibatch, and the minibatch is what one worker of the input stage
    processes per optimizer step (PipeDream, data parallelism: one microbatch per step and
    worker, fraction 1). A schedule that pushes ``k`` microbatches per step through one input
    worker (GPipe, PipeDream-Flush, 2BW, interleaved, ZB-H1, PP/LPP: ``k = microbatches_per_step
    / #input workers``) splits the minibatch into ``k`` pieces: fraction ``min(1, 1 / k)``."""
    inputs = max(1, len({w for w, op in schedule if op.kind == "F" and op.stage == 0}))
    return min(1.0, inputs / max(1, schedule.microbatches_per_step))


def _stage_ranges(schedule: Schedule, profile, plan) -> list[tuple[int, int]]:
    S, L = schedule.num_stages, len(profile.layers)
    if plan is not None:
        if plan.num_stages != S:
            raise ValueError(f"plan has {plan.num_stages} stages but the schedule has {S}; build the schedule "
                             f"from this plan, or pass plan=None to split the profile into {S} balanced stages")
        if plan.num_layers != L:
            raise ValueError(f"plan covers {plan.num_layers} layers but the profile has {L}")
        return [(st.first, st.last) for st in plan.stages]
    if L < S:
        raise ValueError(f"profile has {L} layers, fewer than the schedule's {S} stages")
    # balanced contiguous split: cut where the prefix sum of fwd+bwd crosses k/S of the total
    t = profile.compute_ms
    csum = np.cumsum(t)
    total = csum[-1] if csum[-1] > 0 else 1.0
    bounds, first = [], 0
    for k in range(1, S):
        last = int(np.searchsorted(csum, total * k / S))
        last = min(max(last, first), L - (S - k) - 1)
        bounds.append((first, last))
        first = last + 1
    bounds.append((first, L - 1))
    return bounds


def _profile_costs(schedule, profile, plan, topology, allreduce, step_ms, fraction, latency_ms, op_overhead_ms,
                   overlap_comm) -> _Costs:
    """Per-stage charges of ``schedule`` from :meth:`CostModel.from_profile` (module docstring)."""
    S = schedule.num_stages
    ranges = _stage_ranges(schedule, profile, plan)
    if fraction is None:
        fraction = default_microbatch_fraction(schedule)
    elif not 0 < fraction <= 1:
        raise ValueError(f"microbatch_fraction must be in (0, 1], got {fraction!r}")
    if topology is not None:
        n = int(getattr(topology, "num_workers", schedule.num_workers))
        if n < schedule.num_workers:
            raise ValueError(f"topology has {n} workers but the schedule needs {schedule.num_workers}")
    cm = CostModel.from_profile(profile, topology, latency_ms=latency_ms, op_overhead_ms=op_overhead_ms,
                                overlap_allreduce=overlap_comm)
    f = [cm.stage_fwd_ms(a, b, fraction) for a, b in ranges]
    b = [cm.stage_bwd_ms(a, b_, fraction) for a, b_ in ranges]
    half = [x / 2 for x in b]
    cut = [cm.cut_bytes(b_, fraction) for _, b_ in ranges]
    stash = [float(fraction * cm.range_sum("act_bytes", a, b_)) for a, b_ in ranges]
    params = [float(cm.range_sum("param_bytes", a, b_)) for a, b_ in ranges]
    if allreduce is not None:
        ar = _per_stage(allreduce, S, "allreduce")
    else:
        ar = [cm.allreduce_ms(params[s], schedule.stage_workers[s]) for s in range(S)]
    compute = {_F: f, _B: b, _BI: half, _BW: half, _STEP: _per_stage(step_ms, S, "step_ms")}
    return _Costs(compute, cut, params, stash, None, None, ar, topology, cm.label,
                  op_overhead_ms=cm.op_overhead_ms, model=cm, fraction=float(fraction), batch_size=cm.batch_size)


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
            self._stats["df"] = _worker_stats(self.schedule, self.timeline)
        return self._stats["df"]

    @property
    def compute(self) -> pd.DataFrame:
        return self.timeline[self.timeline["lane"] == "compute"]

    # ---- headline figures (one place; summary, repr and HTML all read these) -----------------
    @property
    def time_per_minibatch_ms(self) -> float:
        """Steady-state time per minibatch (warm-up and drain excluded; see :func:`steady_state`)."""
        return self.metrics["time_per_minibatch_ms"]

    @property
    def throughput_minibatches_per_s(self) -> float:
        return self.metrics["throughput_minibatches_per_s"]

    @property
    def throughput_samples_per_s(self) -> float:
        return self.metrics["throughput_samples_per_s"]

    def _rows(self) -> list:
        m = self.metrics
        u = m.get("time_unit", "ms")
        steady = "" if m["steady_state"] else " (no steady state: makespan / minibatches)"
        rows = [("schedule", self.schedule.name, ""),
                ("time per minibatch" + steady, m["time_per_minibatch_ms"], u),
                ("throughput", m["throughput_minibatches_per_s"] if u == "ms" else 1 / m["time_per_minibatch_ms"],
                 "minibatches/s" if u == "ms" else "minibatches/unit")]
        if math.isfinite(m["throughput_samples_per_s"]):
            rows.append(("throughput", m["throughput_samples_per_s"], "samples/s"))
        rows += [("makespan", m["makespan"], u), ("minibatches", m["minibatches"], ""),
                 ("bubble fraction (mean)", m["bubble_fraction_mean"], ""),
                 ("comm wait share (max)", max(m["comm_wait_share"], default=0.0), "")]
        return rows

    def __repr__(self) -> str:
        return one_line("SimResult", self._rows()[:3])

    def _repr_html_(self) -> str:
        table = pd.DataFrame({"bubble_fraction": self.metrics["bubble_fraction"],
                              "comm_wait_share": self.metrics["comm_wait_share"],
                              "peak_activations": self.metrics["peak_activations"]})
        table.index.name = "worker"
        return card(f"Simulation of {self.schedule.name}", self._rows(), label=self.label, table=table, max_rows=8)

    def summary(self) -> str:
        m = self.metrics
        u = m.get("time_unit", "ms")
        lines = [f"{self.schedule.name}: {self.label}",
                 "; ".join(f"{n} {fmt(v, unit)}" for n, v, unit in self._rows()[1:]),
                 f"makespan {m['makespan']:.4g} {u} ({m['steps']} update(s) of a stage), rho {m['rho']:.3f}"]
        table = pd.DataFrame({k: m[k] for k in ("bubble_fraction", "comm_stall", "peak_activations",
                                                 "peak_activation_bytes", "weight_versions")})
        table.index.name = "worker"
        with pd.option_context("display.max_rows", 40, "display.width", 120):
            lines.append(table.to_string(float_format=lambda x: f"{x:.4g}"))
        if m["bytes_per_level"]:
            lines.append("bytes per link level: " + ", ".join(f"L{k}: {v:.4g}" for k, v in m["bytes_per_level"].items()))
        return "\n".join(lines)

    def save(self, directory) -> Path:
        """Write ``timeline.csv``, ``metrics.json`` and ``timeline.html`` into a new folder
        ``directory`` (or ``directory-2``, ... when it exists: nothing earlier is overwritten);
        the files are written to a temporary folder first and moved into place. Returns the folder."""
        from .io import run_folder
        from .plot import save_html, timeline_figure

        with run_folder(directory) as d:
            self.timeline.to_csv(d / "timeline.csv", index=False)
            meta = self.metrics | {"label": self.label, "schedule": self.schedule.name}
            (d / "metrics.json").write_text(json.dumps(_jsonable(meta), indent=1))
            save_html(timeline_figure(self.timeline, title=f"{self.schedule.name} — {self.label}"), d / "timeline.html")
        return d.final


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, (np.integer,)):
        return int(x)
    if isinstance(x, (np.floating, float)):
        return None if not math.isfinite(float(x)) else float(x)
    return x


# ---------------------------------------------------------------------------------------------
# the simulator
# ---------------------------------------------------------------------------------------------
def simulate(schedule: Schedule, fwd: float | Sequence[float] = 1.0, bwd: float | Sequence[float] = 2.0, *,
             profile=None, plan=None, topology=None, allreduce: float | Sequence[float] | None = None,
             overlap_comm: bool = True, step_ms: float = 0.0, transfer: float = 0.0,
             weight_fetch: float = 0.0, microbatch_fraction: float | None = None, latency_ms: float = 0.0,
             op_overhead_ms: float = 0.0) -> SimResult:
    """Simulate ``schedule`` and return its timeline and metrics.

    Unit costs by default (``fwd``, ``bwd``, and ``transfer``/``allreduce``/``weight_fetch``/
    ``step_ms`` which default to 0); with ``profile`` the costs come from the profile, ``plan``
    (stage layer ranges) and ``topology`` (bandwidths) as described in the module docstring.
    ``latency_ms`` (per message between workers) and ``op_overhead_ms`` (per F/B/BI/BW/STEP op)
    add fixed costs in either mode (module docstring, "Fixed costs").

    Metrics (``result.metrics``), with ``L`` the makespan and ``W`` the workers:

    * ``iteration_time`` = L / steps (steps = most STEP ops of any stage on any worker, >= 1),
      ``steady_iteration_time``: mean spacing of the first worker's STEPs of its first stage;
    * ``throughput`` = microbatches / L;  ``rho`` = Σ (F, B, BI, BW time) / (L · W), the mean
      compute utilisation (for F = B = 1 it is twice the "Unifying" document's
      ρ = S·B / (L·W), whose bound ``ρ ≤ M/S`` the tests check);
    * ``bubble_fraction[w]`` = 1 − busy_w / L (busy: compute ops incl. STEP);
    * ``comm_stall[w]``: time worker w's compute stream waited although the producing ops had
      finished (transfers, all-reduces, weight fetches in flight);
    * ``peak_activations[w]`` (stage-microbatch pairs forwarded but not yet backwarded) and
      ``peak_activation_bytes[w]`` (profile costs only);
    * ``weight_versions[w]``: most versions of one stage alive at once on w (the newest plus every
      version a forwarded microbatch still needs for its backward);
    * ``bytes_per_level``: bytes sent over links of each topology level (profile costs only).
    """
    if not isinstance(schedule, Schedule):
        raise ValueError(f"simulate() needs a workbench.schedules.Schedule, got {type(schedule).__name__}")
    if profile is None:
        if plan is not None or topology is not None:
            raise ValueError("plan/topology costs need a profile; pass profile=... (or use unit costs fwd=, bwd=)")
        costs = _unit_costs(schedule, fwd, bwd, allreduce, transfer, weight_fetch, step_ms, latency_ms,
                            op_overhead_ms)
    else:
        costs = _profile_costs(schedule, profile, plan, topology, allreduce, step_ms, microbatch_fraction,
                               latency_ms, op_overhead_ms, overlap_comm)
    return _run(schedule, costs, overlap_comm)


def _edge_messages(costs: _Costs, senders, receivers, nbytes, fixed_ms):
    """(ms, bytes) arrays of messages ``senders[i] -> receivers[i]`` of ``nbytes[i]``, priced by
    :meth:`_Costs.message` once per distinct (sender, receiver, size)."""
    if len(senders) == 0:
        return np.zeros(0), np.zeros(0)
    keys = np.stack([senders, receivers, nbytes], axis=1)
    uk, inv = np.unique(keys, axis=0, return_inverse=True)
    priced = np.array([costs.message(n, int(a), int(b), fixed_ms) for a, b, n in uk.tolist()], dtype=float)
    return priced[inv.reshape(-1), 0], priced[inv.reshape(-1), 1]


def _run(schedule: Schedule, costs: _Costs, overlap_comm: bool) -> SimResult:
    S, W = schedule.num_stages, schedule.num_workers
    M = schedule.microbatches * schedule.num_segments  # dataflow keys: (microbatch, segment) units
    flat = [op for ops in schedule.ops for op in ops]
    N = len(flat)
    kc = [KIND_CODES[o.kind] for o in flat]
    st = [o.stage for o in flat]
    mb = [o.microbatch for o in flat]
    ver = [o.version for o in flat]
    stp = [o.step for o in flat]
    wof = [w for w, ops in enumerate(schedule.ops) for _ in ops]
    wbeg, wend, n = [], [], 0
    for ops in schedule.ops:
        wbeg.append(n)
        n += len(ops)
        wend.append(n)

    # ---- index compute ops; dataflow edges (vectorised) --------------------------------------
    kc_a = np.asarray(kc, dtype=np.int64)
    st_a = np.asarray(st, dtype=np.int64)
    mb_a = np.asarray(mb, dtype=np.int64)
    un_a = mb_a if not schedule.segment_tokens else np.asarray(
        [schedule.unit(o) if k < 4 else o.microbatch for o, k in zip(flat, kc)], dtype=np.int64)
    gids = np.arange(N, dtype=np.int64)
    is_comp = kc_a < 4
    if ((st_a < 0) | (st_a >= S)).any() or (is_comp & ((un_a < 0) | (un_a >= M))).any():
        g = int(np.flatnonzero((st_a < 0) | (st_a >= S) | (is_comp & ((un_a < 0) | (un_a >= M))))[0])
        raise ValueError(f"worker {wof[g]}: {flat[g]} is outside {S} stages x {M} microbatches")
    cg = gids[is_comp]
    keys = (kc_a[cg] * S + st_a[cg]) * M + un_a[cg]
    loc = np.full(4 * S * M, -1, dtype=np.int64)
    loc[keys] = cg
    counts = np.bincount(keys, minlength=4 * S * M)
    if len(keys) and counts.max() > 1:
        dup = int(cg[np.flatnonzero(counts[keys] > 1)[0]])
        raise ValueError(f"{flat[dup]} appears twice; validate() the schedule")
    ck, cs, cb = kc_a[cg], st_a[cg], un_a[cg]
    # first producer: F(s-1) for F (s > 0), BI(s) for BW, F(s) for B/BI
    need1 = (ck != _F) | (cs > 0)
    k1 = np.where(ck == _F, (_F * S + cs - 1) * M + cb,
                  np.where(ck == _BW, (_BI * S + cs) * M + cb, cs * M + cb))
    # second producer of B/BI below the last stage: BI(s+1) if it exists, else B(s+1)
    need2 = ((ck == _B) | (ck == _BI)) & (cs < S - 1)
    nxt = np.minimum(cs + 1, S - 1)
    p_bi = loc[(_BI * S + nxt) * M + cb]
    p_b = loc[(_B * S + nxt) * M + cb]
    p2 = np.where(p_bi >= 0, p_bi, p_b)
    p1 = loc[np.where(need1, k1, 0)]
    for need, p, what in ((need1, p1, "its producer"), (need2, p2, "the gradient of the next stage")):
        bad = need & (p < 0)
        if bad.any():
            g = int(cg[np.flatnonzero(bad)[0]])
            raise ValueError(f"{flat[g]} on worker {wof[g]} needs {what}, which no worker runs")
    src = np.concatenate([p1[need1], p2[need2]])
    dst = np.concatenate([cg[need1], cg[need2]])
    extra_src: list[int] = []
    extra_dst: list[int] = []

    # ---- STEP / AR ops, remote weight versions ----------------------------------------------
    step_at: dict[tuple[int, int, int], int] = {}
    ar_group: dict[tuple[int, int], list[int]] = {}
    for g in np.flatnonzero(~is_comp).tolist():
        if kc[g] == _STEP:
            step_at[(wof[g], st[g], stp[g])] = g
        else:
            ar_group.setdefault((st[g], stp[g]), []).append(g)
    wws = [o.weights_worker for o in flat]
    is_fetch = [False] * N
    check_versions = schedule.update != "async"
    for g, ww in enumerate(wws):
        if ww is not None and ww != wof[g] and kc[g] < 4:
            is_fetch[g] = True
            if check_versions and ver[g] > 0:  # the version must exist on the owner
                p = step_at.get((ww, st[g], ver[g] - 1), -1)
                if p >= 0:
                    extra_src.append(p)
                    extra_dst.append(g)
            if kc[g] == _B or kc[g] == _BW:  # the weight gradient goes to the owner's step op.version
                p = step_at.get((ww, st[g], ver[g]), -1)
                if p >= 0:
                    extra_src.append(g)
                    extra_dst.append(p)
    ar_size = {}
    for key, members in ar_group.items():
        expect = set(schedule.stage_workers[key[0]])
        got = [wof[g] for g in members]
        if set(got) != expect or len(got) != len(expect):
            raise ValueError(f"AR of stage {key[0]} step {key[1]} is on workers {sorted(got)}, expected the stage's "
                             f"replicas {sorted(expect)}")
        ar_size[key] = len(members)
        for g in members:
            p = step_at.get((wof[g], key[0], key[1]), -1)
            if p >= 0:
                extra_src.append(g)
                extra_dst.append(p)
    if extra_src:
        src = np.concatenate([src, np.asarray(extra_src, dtype=np.int64)])
        dst = np.concatenate([dst, np.asarray(extra_dst, dtype=np.int64)])
    pending = np.bincount(dst, minlength=N).tolist()
    order = np.argsort(src, kind="stable")
    src, dst = src[order], dst[order]
    cons_idx = dst.tolist()
    cons_ptr = np.searchsorted(src, np.arange(N + 1)).tolist()
    # edge types: 0 same worker; 1 activation/gradient transfer; 2 weight version ready on its
    # owner; 3 weight gradient pushed to the owner's STEP; 4 cross-worker but free
    w_a = np.asarray(wof, dtype=np.int64)
    ws_, wd_ = w_a[src], w_a[dst]
    ks, kd = kc_a[src], kc_a[dst]
    etype = np.where(ws_ == wd_, 0, np.where(ks == _STEP, 2, np.where(kd == _STEP, 3, 1)))
    etype[ks == _AR] = 0
    ems = np.zeros(len(src))
    ebytes = np.zeros(len(src))
    xfer = etype == 1
    ems[xfer], ebytes[xfer] = _edge_messages(costs, ws_[xfer], wd_[xfer], np.asarray(costs.cut_bytes, dtype=float)[
        np.minimum(st_a[src], st_a[dst])[xfer]], costs.transfer_ms)
    push = etype == 3  # a weight gradient pushed to the owner's STEP: the stage's parameter bytes
    ems[push], ebytes[push] = _edge_messages(costs, ws_[push], wd_[push], np.asarray(costs.param_bytes, dtype=float)[
        st_a[src][push]], costs.fetch_ms)
    etype[(etype == 1) & (ems == 0) & (ebytes == 0)] = 4
    xfer_count = np.bincount(wd_[xfer], minlength=W).tolist()
    etype = etype.tolist()
    ems = ems.tolist()
    ebytes = ebytes.tolist()

    # ---- durations ----------------------------------------------------------------------
    comp = costs.compute
    over = costs.op_overhead_ms
    if schedule.segment_tokens or schedule.recompute:
        dur = [_op_ms(schedule, op, comp) + over if k < 5 else 0.0 for op, k in zip(flat, kc)]
    else:
        dur = [comp[k][s] + over if k < 5 else 0.0 for k, s in zip(kc, st)]

    # ---- the sweep ------------------------------------------------------------------------
    INF = math.inf
    start = [INF] * N
    end = [INF] * N
    arrive = [0.0] * N  # inputs ready, including transfers
    nodep = [0.0] * N  # inputs ready if communication were free
    ver_ready = [0.0] * N  # the weight version read exists on its owner (fetch ops)
    free = [0.0] * W
    prev_start = [0.0] * W
    stall = [0.0] * W
    ptr = list(wbeg)
    link_free: dict[int, float] = {}
    fetch_free: dict[int, float] = {}
    coll_free = [0.0] * W
    ar_reached: dict[tuple[int, int], int] = {}  # (stage, step) -> replicas arrived
    ar_reach_t: dict[tuple[int, int], float] = {}  # (stage, step) -> latest arrival time
    ar_ready_t: dict[tuple[int, int], float] = {}  # (stage, step) -> earliest start of the all-reduce
    arrived = [False] * N
    comm_rows: list[tuple] = []  # (worker, stage, mb, kind, start, end, version, src, dst, step, bytes)
    level_bytes: dict[int, float] = {}
    fetch_count = [0] * W
    topo = costs.topology
    ar_ms = costs.allreduce_ms
    level_cache: dict[int, int] = {}

    def level(a: int, b: int) -> int:
        key = a * W + b
        lv = level_cache.get(key)
        if lv is None:
            lv = level_cache[key] = link_level(topo, a, b)
        return lv

    def finish_ar(key, stack):
        members = ar_group[key]
        s = key[0]
        # overlap: the all-reduce may start with the backward before it (DDP buckets) but cannot
        # end before every replica finished that backward (CostModel.exposed_allreduce_ms)
        t0 = max(ar_ready_t[key], max(coll_free[wof[g]] for g in members))
        t1 = max(t0 + ar_ms[s], ar_reach_t[key])
        sync = ar_reach_t[key]
        ws = [wof[g] for g in members]
        r = len(ws)
        pbytes = 2 * (r - 1) / r * costs.param_bytes[s] if r > 1 else 0.0
        for i, g in enumerate(members):
            w = wof[g]
            coll_free[w] = t1
            start[g], end[g] = t0, t1
            if t1 > t0 or pbytes:
                comm_rows.append((w, s, -1, "allreduce", t0, t1, -1, w, ws[(i + 1) % r], key[1], pbytes))
            if pbytes and topo is not None:
                lv = level(w, ws[(i + 1) % r])
                level_bytes[lv] = level_bytes.get(lv, 0.0) + pbytes
            for c in cons_idx[cons_ptr[g]:cons_ptr[g + 1]]:
                if t1 > arrive[c]:
                    arrive[c] = t1
                if sync > nodep[c]:
                    nodep[c] = sync
                pending[c] -= 1
                if pending[c] == 0 and ptr[wof[c]] == c:
                    stack.append(wof[c])
            if not overlap_comm and ptr[w] == g:
                stack.append(w)

    stack = list(range(W - 1, -1, -1))
    while stack:
        w = stack.pop()
        i, stop = ptr[w], wend[w]
        fw = free[w]
        ps = prev_start[w]
        stl = 0.0
        while i < stop:
            k = kc[i]
            if k == _AR:
                key = (st[i], stp[i])
                if not arrived[i]:  # first arrival of this worker at the all-reduce
                    arrived[i] = True
                    ar_reach_t[key] = max(ar_reach_t.get(key, 0.0), fw)
                    ar_ready_t[key] = max(ar_ready_t.get(key, 0.0), ps if overlap_comm else fw)
                    ar_reached[key] = ar_reached.get(key, 0) + 1
                    if ar_reached[key] == ar_size[key]:
                        ptr[w] = i
                        free[w] = fw
                        finish_ar(key, stack)
                if overlap_comm:
                    i += 1
                    continue
                if end[i] == INF:
                    break
                if end[i] > fw:
                    stl += end[i] - fw
                    fw = end[i]
                i += 1
                continue
            if pending[i]:
                break
            ready = arrive[i]
            if is_fetch[i]:
                src_w = wws[i]
                ms, nbytes = costs.fetch(st[i], src_w, w)
                lk = src_w * W + w
                t0 = max(ver_ready[i], fetch_free.get(lk, 0.0), ps)
                t1 = t0 + ms
                fetch_free[lk] = t1
                fetch_count[w] += 1
                if t1 > t0 or nbytes:
                    comm_rows.append((w, st[i], mb[i], "fetch_weights", t0, t1, ver[i], src_w, w, -1, nbytes))
                    if nbytes and topo is not None:
                        lv = level(src_w, w)
                        level_bytes[lv] = level_bytes.get(lv, 0.0) + nbytes
                if t1 > ready:
                    ready = t1
            t = fw if fw > ready else ready
            nd = nodep[i]
            base = fw if fw > nd else nd
            if t > base:
                stl += t - base
            e = t + dur[i]
            start[i] = t
            end[i] = e
            ps = t
            fw = e
            for j in range(cons_ptr[i], cons_ptr[i + 1]):
                c = cons_idx[j]
                typ = etype[j]
                if typ == 0 or typ == 4:
                    a = e
                elif typ == 2:  # a weight version now exists for a remote reader to fetch
                    a = e
                    ver_ready[c] = e
                else:  # 1: activation / gradient, 3: weight gradient to the owner
                    wc = wof[c]
                    ms = ems[j]
                    nbytes = ebytes[j]
                    lk = w * W + wc
                    lf = link_free.get(lk, 0.0)
                    t0 = e if e > lf else lf
                    a = t0 + ms
                    link_free[lk] = a
                    if ms > 0 or nbytes:
                        name = "send_wgrad" if typ == 3 else "send_act" if k == _F else "send_grad"
                        comm_rows.append((w, st[i], mb[i], name, t0, a, ver[i], w, wc, -1, nbytes))
                        if nbytes and topo is not None:
                            lv = level(w, wc)
                            level_bytes[lv] = level_bytes.get(lv, 0.0) + nbytes
                if a > arrive[c]:
                    arrive[c] = a
                if e > nodep[c]:
                    nodep[c] = e
                pc = pending[c] - 1
                pending[c] = pc
                if pc == 0 and typ and ptr[wof[c]] == c:
                    stack.append(wof[c])
            i += 1
        ptr[w] = i
        free[w] = fw
        prev_start[w] = ps
        stall[w] += stl

    stuck = [w for w in range(W) if ptr[w] < wend[w]]
    if stuck:
        desc = []
        for w in stuck[:6]:
            g = ptr[w]
            op = flat[g]
            if kc[g] == _AR:
                key = (st[g], stp[g])
                waits = f"waits for the other replicas of stage {key[0]} to reach the all-reduce"
            else:
                waits = "waits for inputs that never arrive"
            desc.append(f"worker {w}: {op} ({waits})")
        raise ValueError(f"schedule {schedule.name!r} deadlocks: no worker can make progress after "
                         f"{sum(ptr[w] - wbeg[w] for w in range(W))} of {N} ops; stuck: " + "; ".join(desc))

    return _assemble(schedule, costs, kc_a, st_a, mb_a, np.fromiter(ver, np.int64, N), np.fromiter(stp, np.int64, N),
                     w_a, wbeg, wend, np.fromiter(start, float, N), np.fromiter(end, float, N), stall, comm_rows,
                     level_bytes, xfer_count, fetch_count)


# ---------------------------------------------------------------------------------------------
# timeline and metrics
# ---------------------------------------------------------------------------------------------
def _op_ms(schedule: Schedule, op, comp: dict) -> float:
    """Compute time of one op: its kind's stage cost times its segment's FLOP share (Seq1F1B; 1
    otherwise); with ``schedule.recompute`` a B (or BI, which starts the backward) also re-runs the
    forward: ``+ F_s`` times the share (GPipe re-materialization)."""
    k, s = KIND_CODES[op.kind], op.stage
    ms = comp[k][s]
    if schedule.recompute and k in (_B, _BI):
        ms += comp[_F][s]
    return ms * schedule.segment_share(op) if k < _STEP else ms


def _assemble(schedule, costs, kc, st, mb, ver, stp, wof, wbeg, wend, start, end, stall, comm_rows, level_bytes,
              xfer_count, fetch_count) -> SimResult:
    W = schedule.num_workers
    kc_a = np.asarray(kc, dtype=np.int8)
    keep = kc_a != _AR
    names = np.array(KIND_NAMES, dtype=object)
    start_a = np.asarray(start, dtype=float)
    end_a = np.asarray(end, dtype=float)
    w_a = np.asarray(wof, dtype=np.int64)
    comp = pd.DataFrame({
        "worker": w_a[keep],
        "stage": np.asarray(st, dtype=np.int64)[keep],
        "microbatch": np.asarray(mb, dtype=np.int64)[keep],
        "kind": names[kc_a[keep]],
        "start": start_a[keep],
        "end": end_a[keep],
        "version": np.asarray(ver, dtype=np.int64)[keep],
        "lane": "compute",
        "src": w_a[keep],
        "dst": w_a[keep],
        "step": np.asarray(stp, dtype=np.int64)[keep],
        "bytes": 0.0,
    })
    if schedule.segment_tokens:  # optional column: the Seq1F1B segment of each compute op
        comp["segment"] = np.asarray([-1 if o.segment is None else o.segment for ops in schedule.ops for o in ops])[keep]
    if comm_rows:
        comm = pd.DataFrame(comm_rows, columns=["worker", "stage", "microbatch", "kind", "start", "end", "version",
                                                "src", "dst", "step", "bytes"])
        comm["lane"] = "comm"
        timeline = pd.concat([comp, comm[list(TIMELINE_COLUMNS)]], ignore_index=True)
    else:
        timeline = comp
    makespan = float(end_a.max()) if len(end_a) else 0.0
    if not math.isfinite(makespan):
        makespan = 0.0

    # busy time per worker (compute lane)
    dur = end_a - start_a
    busy = np.bincount(w_a[keep], weights=dur[keep], minlength=W)
    work_mask = kc_a < _STEP
    work = float(dur[work_mask].sum())
    steps = 1
    is_step = kc_a == _STEP
    if is_step.any():
        steps = int(np.bincount((w_a * schedule.num_stages + np.asarray(st))[is_step]).max())
    steady = float("nan")
    on0 = np.flatnonzero(is_step & (w_a == 0))
    if len(on0):
        st_a = np.asarray(st)
        ends = np.sort(end_a[on0[st_a[on0] == st_a[on0[0]]]])
        if len(ends) >= 2:
            steady = float(ends[-1] - ends[0]) / (len(ends) - 1)
    peak_n, peak_b, versions = _memory(schedule, costs, kc, st, ver, wof, wbeg, wend)
    peak_share = _peak_activation_share(schedule)
    L = makespan if makespan > 0 else float("nan")
    fraction = costs.fraction if costs.model is not None else default_microbatch_fraction(schedule)
    steady_mb, is_steady = steady_state(schedule, kc_a, np.asarray(mb), np.asarray(st), end_a, makespan)
    per_mb = steady_mb / fraction
    metrics = {
        "makespan": makespan,
        "steps": steps,
        "iteration_time": makespan / steps,
        "steady_iteration_time": steady,
        "microbatches": schedule.microbatches,
        "microbatch_fraction": fraction,
        "minibatches": schedule.microbatches * fraction,
        "time_per_minibatch_ms": per_mb,
        "steady_state": is_steady,
        "throughput_minibatches_per_s": 1e3 / per_mb if per_mb > 0 else float("nan"),
        "throughput_samples_per_s": (costs.batch_size * 1e3 / per_mb) if costs.batch_size and per_mb > 0
        else float("nan"),
        "rho": work / (L * W),
        "bubble_fraction": [1.0 - b / L for b in busy.tolist()],
        "bubble_fraction_mean": float(np.mean([1.0 - b / L for b in busy.tolist()])) if W else float("nan"),
        "comm_wait_share": [x / L for x in stall],
        "busy": busy.tolist(),
        "comm_stall": list(stall),
        "peak_activations": peak_n,
        "peak_activation_bytes": peak_b,
        "peak_activation_share": peak_share,
        "weight_versions": versions,
        "transfers_received": list(xfer_count),
        "weight_fetches": list(fetch_count),
        "bytes_per_level": dict(sorted(level_bytes.items())),
        "time_unit": "ms" if costs.model is not None else "unit",
        "label": costs.label,
    }
    return SimResult(schedule, timeline, makespan, metrics, costs.label)


def steady_state(schedule: Schedule, kc, mb, st, end, makespan: float) -> tuple[float, bool]:
    """Steady-state time per *microbatch* (time unit of the costs) and whether a steady state exists.

    Microbatch b completes when its last backward op of stage 0 (B, BI or BW) ends. Sorting the
    completions ``c_0 <= ... <= c_{n-1}``, the steady state is the slope ``(c_hi - c_lo) / (hi - lo)``
    over the middle (from index ``k`` to ``n - 1 - k``, ``k = max(n/4, microbatches the input stage
    holds at once)``), which excludes warm-up and drain. Synchronous
    schedules that update every ``g = max(microbatches_per_step, replicas of stage 0)`` microbatches
    complete them in bursts,
    so ``lo`` and ``hi`` are moved to update boundaries (``c_{kg-1}``); fewer than three updates
    have no steady state and give ``makespan / n`` with ``False``."""
    n = int(schedule.microbatches)
    back = ((kc == _B) | (kc == _BI) | (kc == _BW)) & (st == 0)
    if n < 2 or not back.any():
        return (makespan / max(n, 1), False)
    done = pd.Series(end[back]).groupby(mb[back]).max().sort_values().to_numpy()
    g = int(schedule.microbatches_per_step) if schedule.update != "async" else 1
    g = max(g, len(schedule.stage_workers[0]), 1)  # a round of the input stage's replicas
    bounds = np.arange(g - 1, len(done), g)  # completion indices that end an update
    if len(bounds) < 3:
        return (makespan / n, False)
    skip = max(len(done) // 4, _input_in_flight(schedule))
    inner = bounds[(bounds >= skip) & (bounds <= len(done) - 1 - skip)]
    if len(inner) < 2:
        inner = bounds[(bounds >= len(done) // 4) & (bounds <= (3 * len(done)) // 4)]
    if len(inner) < 2:
        inner = bounds[1:] if len(bounds) > 3 else bounds
    lo, hi = int(inner[0]), int(inner[-1])
    return (float(done[hi] - done[lo]) / (hi - lo), True)


def _input_in_flight(schedule: Schedule) -> int:
    """Microbatches the input stage's workers hold at once (their warm-up and their drain)."""
    if g := schedule.max_in_flight:
        return int(sum(g[w] for w in schedule.stage_workers[0] if 0 <= w < len(g)))
    return 0


def _memory(schedule, costs, kc, st, ver, wof, wbeg, wend):
    """Peak stashed activations (count, bytes) and weight versions alive per worker.

    Ops on one worker run one after another, so program order is time order. Activations: +1 at
    F, -1 at its B (or BW); the peak of the running sum per worker. Versions: version v of stage s
    is alive on worker w over the hull of [first op reading it, last op reading it] and, when w
    holds stage s, of the span in which v is w's newest version (from its STEP v-1 to STEP v); the
    result is the most intervals of one stage overlapping at once (>= 1 on a worker with ops)."""
    W, S = schedule.num_workers, schedule.num_stages
    kc_a = np.asarray(kc, dtype=np.int64)
    st_a = np.asarray(st, dtype=np.int64)
    w_a = np.asarray(wof, dtype=np.int64)
    N = len(kc_a)
    nonempty = [w for w in range(W) if wend[w] > wbeg[w]]
    starts = np.asarray([wbeg[w] for w in nonempty], dtype=np.int64)
    sign = np.where(kc_a == _F, 1.0, np.where((kc_a == _B) | (kc_a == _BW), -1.0, 0.0))
    stash = np.asarray(costs.act_stash_bytes, dtype=float)

    def peak(delta, transient=None):
        out = [0.0] * W
        if not nonempty:
            return out
        cum = np.cumsum(delta)
        before = np.concatenate([[0.0], cum])[starts]  # running sum before each worker's first op
        local = cum - np.repeat(before, [wend[w] - wbeg[w] for w in nonempty])
        if transient is not None:  # held only while the op runs: on top of the sum before it
            local = np.maximum(local, local - delta + transient)
        for w, v in zip(nonempty, np.maximum.reduceat(local, starts).tolist()):
            out[w] = max(0.0, v)
        return out

    peak_n = [int(round(x)) for x in peak(sign)]
    peak_b = peak(*_stash_bytes(schedule, costs, kc_a, st_a)) if stash.any() else [float("nan")] * W

    # weight versions: half-open intervals [lo, hi) in program positions
    pos = np.arange(N, dtype=np.int64)
    comp = kc_a < 4
    key = w_a * S + st_a
    reads = pd.DataFrame({"k": key[comp], "v": np.asarray(ver, dtype=np.int64)[comp], "pos": pos[comp]})
    iv = reads.groupby(["k", "v"], sort=False)["pos"].agg(["min", "max"])
    k_iv = iv.index.get_level_values(0).to_numpy()
    v_iv = iv.index.get_level_values(1).to_numpy()
    lo = iv["min"].to_numpy(dtype=np.int64).copy()
    hi = iv["max"].to_numpy(dtype=np.int64) + 1
    w_iv = k_iv // S
    holds = np.zeros(W * S, dtype=bool)
    for s_, ws in enumerate(schedule.stage_workers):
        for w in ws:
            if 0 <= w < W:
                holds[w * S + s_] = True
    held = holds[k_iv]
    if held.any():
        sp = pos[kc_a == _STEP]
        sk = key[kc_a == _STEP]
        # the i-th STEP on (w, s) (program order) turns version i into i + 1
        order = np.lexsort((sp, sk))
        sk, sp = sk[order], sp[order]
        first = np.searchsorted(sk, sk, side="left")
        si = np.arange(len(sk)) - first
        stride = int(max(v_iv.max(initial=0), si.max(initial=0))) + 2
        step_pos = dict(zip((sk * stride + si).tolist(), sp.tolist()))
        wb = np.asarray(wbeg, dtype=np.int64)[w_iv]
        we = np.asarray(wend, dtype=np.int64)[w_iv]
        idx = np.flatnonzero(held)
        kv = (k_iv[idx] * stride + v_iv[idx]).tolist()
        born = np.array([step_pos.get(x - 1, -2) + 1 for x in kv], dtype=np.int64)  # -1: never born here
        born = np.where(v_iv[idx] == 0, wb[idx], born)
        dies = np.array([step_pos.get(x, -2) + 1 for x in kv], dtype=np.int64)
        dies = np.where(dies < 0, we[idx], dies)
        ok = born >= 0
        lo[idx[ok]] = np.minimum(lo[idx[ok]], born[ok])
        hi[idx[ok]] = np.maximum(hi[idx[ok]], dies[ok])
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
    return peak_n, peak_b, peak_v


def _stash_bytes(schedule: Schedule, costs: _Costs, kc_a, st_a):
    """Per-op change of a worker's stashed activation bytes, and bytes held only while the op runs.

    Without recompute F adds the stage's activations ``A_s`` (times the op's token share with
    segments) and B / BW frees them. With recompute F keeps only the stage input (the cut bytes of
    stage s-1; stage 0's input, the data, is not counted, as without recompute); B re-creates
    ``A_s`` for its duration (transient) and frees the input; split backward: BI re-creates
    ``A_s`` and holds it until BW frees it with the input."""
    flat = [op for ops in schedule.ops for op in ops]
    share = np.asarray([schedule.segment_share(op, "tokens") if k < _STEP else 0.0 for op, k in zip(flat, kc_a)])
    full = np.asarray(costs.act_stash_bytes, dtype=float)[st_a] * share
    if not schedule.recompute:
        sign = np.where(kc_a == _F, 1.0, np.where((kc_a == _B) | (kc_a == _BW), -1.0, 0.0))
        return sign * full, None
    cut = np.concatenate([[0.0], np.asarray(costs.cut_bytes, dtype=float)])[st_a] * share  # input of s
    delta = np.select([kc_a == _F, kc_a == _B, kc_a == _BI, kc_a == _BW], [cut, -cut, full, -(cut + full)], 0.0)
    return delta, np.where(kc_a == _B, full, 0.0)


def _peak_activation_share(schedule: Schedule) -> list[float]:
    """Peak per worker of the activations held, in units of one whole microbatch's activations of
    one stage: F adds its token share ``n_j / n`` (1 without segments), B / BW removes it. Equals
    ``peak_activations`` without segments; with recompute see ``peak_activation_bytes``."""
    out = []
    for ops in schedule.ops:
        held, peak = 0.0, 0.0
        for op in ops:
            if op.kind == "F":
                held += schedule.segment_share(op, "tokens")
                peak = max(peak, held)
            elif op.kind in ("B", "BW"):
                held -= schedule.segment_share(op, "tokens")
        out.append(peak)
    return out


def _worker_stats(schedule: Schedule, timeline: pd.DataFrame) -> pd.DataFrame:
    """``workbench.schedules.stats.worker_stats`` when available, else the same columns here."""
    try:
        from .schedules.stats import worker_stats
    except ImportError:
        worker_stats = None
    if worker_stats is not None:
        return worker_stats(schedule, timeline)
    return fallback_worker_stats(schedule, timeline)


def fallback_worker_stats(schedule: Schedule, timeline: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per-worker statistics as the "Unifying" document defines them (counts of receives):

    ``activation_transfers[w]`` = #compute ops on w whose producer ran on another worker,
    ``weight_transfers[w]`` = #F/B/BI/BW ops on w whose ``weights_worker`` is another worker,
    ``peak_activations[w]`` = most stage-microbatch pairs in flight, ``weight_storage[w]`` =
    #stages whose weights w holds, ``busy[w]`` = compute time in ``timeline`` (NaN without one)."""
    from .schedules.core import COMPUTE, in_flight_peak, producers

    where = schedule.where()
    rows = []
    for w, ops in enumerate(schedule.ops):
        acts = wts = 0
        for op in ops:
            if op.kind not in COMPUTE:
                continue
            acts += sum(1 for p in producers(schedule, w, op, where) if where.get(p, w) != w)
            if op.weights_worker is not None and op.weights_worker != w:
                wts += 1
        storage = sum(1 for ws in schedule.stage_workers if w in ws)
        rows.append({"peak_activations": in_flight_peak(ops), "activation_transfers": acts,
                     "weight_transfers": wts, "weight_storage": storage})
    df = pd.DataFrame(rows, columns=list(STAT_COLUMNS[:-1]))
    if timeline is not None:
        comp = timeline[timeline["lane"] == "compute"]
        busy = (comp["end"] - comp["start"]).groupby(comp["worker"]).sum()
        df["busy"] = busy.reindex(range(schedule.num_workers), fill_value=0.0).to_numpy()
    else:
        df["busy"] = float("nan")
    df.index.name = "worker"
    return df


def simulate_plan(plan, profile, topology=None, microbatches: int | None = None, *, latency_ms=0.0,
                  op_overhead_ms: float = 0.0, overlap_comm: bool = True) -> SimResult:
    """Simulate PipeDream's 1F1B schedule of ``plan`` with the plan's own warm-up (``plan.in_flight``,
    else NOAM) on ``topology`` (default: the topology stored in the plan), ``microbatches``
    minibatches (default: enough for a steady state)."""
    from .schedules import build

    if topology is None:
        topology = plan_topology(plan)
    if microbatches is None:
        microbatches = max(32, 4 * plan.in_flight_count * plan.stages[0].replicas)
    sched = build("pipedream", plan, int(microbatches), warmup=list(plan.in_flight) if plan.in_flight else None)
    return simulate(sched, profile=profile, plan=plan, topology=topology, latency_ms=latency_ms,
                    op_overhead_ms=op_overhead_ms, overlap_comm=overlap_comm)


def plan_topology(plan):
    """The :class:`~workbench.topology.Topology` a plan was partitioned for (``plan.meta``), or None."""
    from .topology import Topology

    levels = (plan.meta or {}).get("topology")
    if not levels:
        return None
    return Topology(tuple((int(c), float(b)) for c, b in levels), name=(plan.meta or {}).get("topology_name", ""))

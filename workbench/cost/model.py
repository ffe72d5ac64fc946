"""The one cost model: every modeled number of the workbench comes from a :class:`CostModel`.

The partitioner's dynamic program, the plan's closed-form prediction, the simulator's per-op charges
and the fidelity benchmark all call the methods below; no other module holds a cost formula.

Units: milliseconds, bytes, bandwidth in bytes/s.

Minibatch. The profile's numbers are per *minibatch* (the profile's batch, ``batch_size`` samples
when known). Every "time per minibatch" and throughput in the workbench counts these minibatches:
PipeDream and data parallelism run one minibatch per microbatch op (fraction 1); GPipe, Flush, 2BW,
interleaved and zero-bubble schedules split one minibatch into ``k`` microbatches of fraction
``1/k``, so one synchronous update consumes exactly one minibatch (data parallelism on ``r``
replicas: one update consumes ``r`` minibatches, one per replica).

Model
-----
* Compute of layers ``i..j`` on a fraction ``f`` of a minibatch:
  ``F = f·Σ fwd_ms``, ``B = f·Σ bwd_ms``; every op (F, B, BI, BW, STEP) also costs the per-op
  overhead ``o`` (``op_overhead_ms``, calibrated).
* Links, one per topology level k: ``(latency_k, B_k)``. A message of ``n`` bytes between workers
  whose innermost common level is k costs ``α_k + n / B_k`` (alpha-beta model). Links are **full
  duplex**: ``a -> b`` and ``b -> a`` are independent channels, each sending one message at a time
  (first come, first served). So an activation going forward and its gradient coming back over a
  cut do not share time: a cut costs ``α + a / B`` per direction, not PipeDream's ``2 a / B``.
* All-reduce (ring) of ``n`` bytes over ``r`` replicas: ``2 (r-1)/r · n / B_min + 2 (r-1) α_max``
  (the slowest link and latency in the ring). With ``overlap_allreduce`` (DDP buckets, wait-free
  backprop) it may start when the backward that produces the gradients starts and cannot end before
  that backward ends, so it costs ``max(0, AR - B)`` of exposed time per update; without overlap
  all of ``AR``. With ``allreduce_ready="backward-end"`` (DistributedDataParallel's buckets, one
  stage per bucket) it starts only once that backward has ended, when the bucket's last gradient
  exists: :meth:`CostModel.bucketed_round_ms` is the closed form of one such data-parallel round.
  A library whose all-reduce is slower than its links is calibrated on its own
  (``allreduce_bandwidth``, ``allreduce_latency_ms``: the ring's bus bandwidth and per-step latency).
* Per-message CPU time ``message_cpu_ms`` (LogP's overhead *o*; default 0): where communication
  runs on the compute cores (a CPU run), each activation or gradient message also takes that much
  time from the op that sends it and from the op that receives it.
* Weight fetch (sharded placements) of ``n`` bytes from ``a`` to ``b``: one message.

Plan closed form (PipeDream 1F1B, replicas round robin, one update per round): a replica of stage
``s`` with ``r_s`` replicas does, per round, ``F + B + 3o + exposed AR`` (ops F, B, STEP), so
``stage_ms(s) = (F_s + B_s + 3o + max(0, AR_s - (B_s + o))) / r_s`` per minibatch. Microbatch ``b``
goes from replica ``b mod r_s`` to replica ``b mod r_{s+1}``, so over ``L = lcm(r_s, r_{s+1})``
minibatches each used directed link carries one message: ``cut_ms(s) = max_links (α + a_s / B) / L``.
The predicted time per minibatch is ``max(max_s stage_ms, max_s cut_ms)``; :func:`in_flight` gives
the minibatches each stage must admit for the pipeline to reach it.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from workbench.cost.topology import Topology


def check_ms(name: str, value) -> float:
    """``value`` as a float of milliseconds, or one clear ValueError (finite and >= 0)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0 (ms), got {value!r}")
    return float(value)


def _per_level(name: str, value, levels: int) -> tuple[float, ...]:
    if isinstance(value, (list, tuple, np.ndarray)):
        vals = [check_ms(f"{name}[{k}]", v) for k, v in enumerate(value)]
        if len(vals) != levels:
            raise ValueError(
                f"{name} has {len(vals)} values for {levels} topology levels; give one per level or a number"
            )
        return tuple(vals)
    return (check_ms(name, value),) * levels


@dataclass(frozen=True)
class CostOptions:
    """How a :class:`CostModel` is calibrated beyond its profile and topology (the module docstring's
    symbols in brackets).

    * ``latency_ms`` (``α``): fixed cost of every message between workers, one number or one per
      topology level (innermost first);
    * ``op_overhead_ms`` (``o``): fixed cost of every F, B, BI, BW and STEP op;
    * ``overlap_allreduce``: the all-reduce overlaps the backward that produces its gradients
      (exposed ``max(0, AR - B)``) or follows it (exposed ``AR``);
    * ``allreduce_bandwidth`` / ``allreduce_latency_ms`` (one number or one per level): the ring
      all-reduce's own bus bandwidth and per-step latency where the library's collective is slower
      than its links (:func:`workbench.runtime.calibration.machine.measure_allreduce`); None: the links';
    * ``message_cpu_ms`` (LogP's ``o``): CPU time each activation/gradient message takes from the
      compute of the op that sends it and of the op that receives it
      (:func:`workbench.runtime.calibration.machine.measure_link` with ``busy=True``; where communication runs on the
      compute cores);
    * ``allreduce_curve``: a :func:`~workbench.runtime.calibration.machine.measure_allreduce` result (``sizes``, ``ms``,
      ``world_size``): all-reduces over that many replicas cost the measured time, interpolated in the
      size (gloo's time is not a line: 1 MiB took 0.6 to 3.8 ms here, 256 KiB 0.26 ms);
    * ``allreduce_buckets`` ``(first, cap)``: the gradients are all-reduced in buckets of ``first``
      bytes, then ``cap`` bytes each, as DistributedDataParallel does
      (``workbench.runtime.executors.ddp.DDP_BUCKETS``);
    * ``allreduce_ready``: when an overlapped all-reduce may start: ``"backward-start"`` (with the
      backward before it: wait-free backprop inside a stage) or ``"backward-end"`` (after it: a DDP
      bucket, whose gradients exist only when its backward has ended);
    * ``bucket_cap_bytes``: a replicated stage's gradients are all-reduced in buckets of whole layers
      (DistributedDataParallel's ``bucket_cap_mb``): filled from the stage's last layer backwards, a
      bucket closes once its parameters reach this many bytes (:meth:`CostModel.layer_buckets`);
      None: one bucket per stage.
    """

    latency_ms: float | Sequence[float] = 0.0
    op_overhead_ms: float = 0.0
    overlap_allreduce: bool = True
    allreduce_bandwidth: float | Sequence[float] | None = None
    allreduce_latency_ms: float | Sequence[float] | None = None
    message_cpu_ms: float = 0.0
    allreduce_curve: Mapping | None = None
    allreduce_buckets: Sequence[float] | None = None
    allreduce_ready: str = "backward-start"
    bucket_cap_bytes: float | None = None


ALLREDUCE_READY = ("backward-start", "backward-end")


@dataclass(frozen=True, eq=False)
class CostModel:
    """Per-layer compute (from a Profile), links (from a Topology), all-reduce and overheads.

    Build it with :meth:`from_profile`; every array is per layer in execution order.
    """

    fwd_ms: np.ndarray
    bwd_ms: np.ndarray
    act_bytes: np.ndarray
    param_bytes: np.ndarray
    topology: Topology | None = None  # workbench Topology; None: every link is free (infinite bandwidth)
    latency_ms: tuple[float, ...] = ()  # alpha per topology level, innermost first
    op_overhead_ms: float = 0.0
    overlap_allreduce: bool = True
    allreduce_ready: str = "backward-start"  # CostOptions.allreduce_ready
    allreduce: str = "ring"
    batch_size: int | None = None
    allreduce_bandwidth: tuple[float, ...] | None = None  # ring bus bandwidth per level; None: the link's
    allreduce_latency_ms: tuple[float, ...] | None = None  # ring per-step latency per level; None: the link's
    message_cpu_ms: float = 0.0  # CPU time a message between workers takes from each end's compute (LogP's o)
    allreduce_curve: tuple[tuple[float, float], ...] | None = (
        None  # measured ((bytes, ms), ...) of the library's all-reduce on ...
    )
    allreduce_curve_replicas: int = 0  # ... this many replicas (other counts use the ring formula)
    allreduce_buckets: tuple[float, float] | None = None  # (first, each further) bucket bytes: DDP's gradient buckets
    bwd_input_ms: np.ndarray | None = None  # measured split of the backward (zero-bubble BI / BW); None: half each
    bwd_weight_ms: np.ndarray | None = None
    grad_accumulate_ms: np.ndarray | None = None  # measured extra of a backward adding into a non-empty buffer
    bucket_cap_bytes: float | None = None  # CostOptions.bucket_cap_bytes: layer buckets of a replicated stage
    label: str = ""
    _prefix: dict = field(default_factory=dict, repr=False)

    # ---- construction ------------------------------------------------------------------
    @classmethod
    def from_profile(cls, profile, topology=None, options: CostOptions | None = None, **keywords: Any) -> CostModel:
        """The cost model of ``profile`` on ``topology`` (None: every link free), calibrated by
        ``options`` (:class:`CostOptions`; default: no latency, overhead or CPU time per message,
        the links' own ring all-reduce); keywords set single fields of it
        (``from_profile(p, topo, latency_ms=0.1)``) and override ``options``.

        Steps: the profile's per-layer columns (:func:`_layer_columns`), each calibration field
        checked and put in per-level form (:func:`_calibration`), the batch size and the label."""
        opts = dataclasses.replace(options or CostOptions(), **keywords)
        levels = max(1, len(getattr(topology, "levels", ())) if topology is not None else 1)
        lat = _per_level("latency_ms", opts.latency_ms, levels)
        calibration = _calibration(opts, levels)
        meta = profile.meta or {}
        bs = meta.get("batch_size") or meta.get("batch_size_if_imagenet")
        return cls(
            **_layer_columns(profile.layers),
            topology=topology,
            latency_ms=lat,
            op_overhead_ms=check_ms("op_overhead_ms", opts.op_overhead_ms),
            overlap_allreduce=bool(opts.overlap_allreduce),
            allreduce_ready=_check_ready(opts.allreduce_ready),
            batch_size=int(bs) if bs else None,
            label=_label(profile, topology, lat, opts.op_overhead_ms),
            message_cpu_ms=check_ms("message_cpu_ms", opts.message_cpu_ms),
            bucket_cap_bytes=_check_bucket_bytes(opts.bucket_cap_bytes),
            **calibration,
        )

    def __post_init__(self):
        for name in ("fwd_ms", "bwd_ms", "act_bytes", "param_bytes"):
            x = np.asarray(getattr(self, name), dtype=float)
            if not np.all(np.isfinite(x)) or np.any(x < 0):
                raise ValueError(f"cost model column {name!r} must be finite and >= 0 for every layer")
            object.__setattr__(self, name, x)
        if self.allreduce != "ring":
            raise ValueError(f"all-reduce algorithm {self.allreduce!r} is not modeled; use 'ring'")
        if not self.latency_ms:
            object.__setattr__(self, "latency_ms", (0.0,))
        for name in ("bwd_input_ms", "bwd_weight_ms", "grad_accumulate_ms"):
            x = getattr(self, name)
            if x is not None:
                x = np.asarray(x, dtype=float)
                if x.shape != self.bwd_ms.shape or not np.all(np.isfinite(x)) or np.any(x < 0):
                    raise ValueError(f"cost model column {name!r} must be finite and >= 0 for every layer")
                object.__setattr__(self, name, x)
        z = np.zeros(1)
        for name in (
            "fwd_ms",
            "bwd_ms",
            "act_bytes",
            "param_bytes",
            "bwd_input_ms",
            "bwd_weight_ms",
            "grad_accumulate_ms",
        ):
            if getattr(self, name) is not None:
                self._prefix[name] = np.concatenate([z, np.cumsum(getattr(self, name))])

    @property
    def num_layers(self) -> int:
        return len(self.fwd_ms)

    # ---- compute -------------------------------------------------------------------------
    def range_sum(self, column: str, first, last):
        """``Σ_{l=first..last} column_l`` (numpy broadcasting over first/last)."""
        p = self._prefix[column]
        return p[np.asarray(last) + 1] - p[np.asarray(first)]

    def stage_fwd_ms(self, first: int, last: int, fraction: float = 1.0) -> float:
        return float(fraction * self.range_sum("fwd_ms", first, last))

    def stage_bwd_ms(self, first: int, last: int, fraction: float = 1.0) -> float:
        return float(fraction * self.range_sum("bwd_ms", first, last))

    def stage_accumulate_ms(self, first: int, last: int) -> float | None:
        """The part of the stage's backward (``bwd_ms``, measured adding into a non-empty update
        buffer, as most backwards of an update do) that the first backward after a STEP does not
        pay: its weight gradient becomes the empty buffer (the runtime's non-flat buffers), no
        addition pass over the stage's parameters. Proportional to the parameters, not the
        microbatch (no ``fraction``). None when the profile did not measure it."""
        if self.grad_accumulate_ms is None:
            return None
        return float(self.range_sum("grad_accumulate_ms", first, last))

    def stage_split_bwd_ms(self, first: int, last: int, fraction: float = 1.0) -> tuple[float, float]:
        """(input-gradient half BI, weight-gradient half BW) of the stage's backward: the measured
        split when the profile has ``bwd_input_ms``/``bwd_weight_ms`` (the first stage's BI is
        almost nothing: no input gradient), else half of ``bwd_ms`` each."""
        if self.bwd_input_ms is None or self.bwd_weight_ms is None:
            half = self.stage_bwd_ms(first, last, fraction) / 2
            return half, half
        return (
            float(fraction * self.range_sum("bwd_input_ms", first, last)),
            float(fraction * self.range_sum("bwd_weight_ms", first, last)),
        )

    def op_ms(self, compute_ms: float) -> float:
        """Duration of one op on the compute stream: its compute plus the per-op overhead."""
        return compute_ms + self.op_overhead_ms

    # ---- links -------------------------------------------------------------------------------
    def level(self, a: int, b: int) -> int:
        """Innermost topology level joining workers a and b (0: the same worker)."""
        return link_level(self.topology, a, b)

    def link(self, a: int, b: int) -> tuple[float, float]:
        """``(latency_ms, bandwidth bytes/s)`` between workers a and b; (0, inf) for a == b."""
        k = self.level(a, b)
        if k == 0:
            return 0.0, math.inf
        lat = self.latency_ms[min(k, len(self.latency_ms)) - 1]
        bw = math.inf if self.topology is None else float(self.topology.bandwidth_between(a, b))
        return lat, bw

    def message_ms(self, nbytes: float, a: int, b: int) -> float:
        """``α + n / B`` for one message of ``nbytes`` from a to b (0 on one worker)."""
        lat, bw = self.link(a, b)
        return lat + (0.0 if bw == math.inf or nbytes == 0 else nbytes / bw * 1e3)

    def cut_bytes(self, last_layer: int, fraction: float = 1.0) -> float:
        """Bytes crossing the cut after ``last_layer`` (activations forward, gradients back)."""
        return float(fraction * self.act_bytes[last_layer])

    def allreduce_ms(self, nbytes: float, workers) -> float:
        """Ring all-reduce of ``nbytes`` over ``workers``: ``2 (r-1)/r · n / B_min + 2 (r-1) α_max``."""
        ws = list(workers)
        r = len(ws)
        if r <= 1:
            return 0.0
        parts = self.bucket_bytes(nbytes)
        if self.allreduce_curve is not None and r == self.allreduce_curve_replicas:
            return float(sum(self.curve_ms(b) for b in parts))
        links = [self.collective_link(ws[i], ws[(i + 1) % r]) for i in range(r)]
        bw, lat = min(b for _, b in links), max(a for a, _ in links)
        return float(sum(ring_allreduce_ms(b, r, bw, lat) for b in parts))

    def bucket_bytes(self, nbytes: float) -> list[float]:
        """The all-reduces one stage's gradients take: one of ``nbytes``, or DDP's buckets
        (``allreduce_buckets``: the first of ``first`` bytes, then ``cap`` bytes each)."""
        if self.allreduce_buckets is None or nbytes <= 0:
            return [float(nbytes)]
        first, cap = self.allreduce_buckets
        out = [min(float(nbytes), first)]
        rest = float(nbytes) - out[0]
        while rest > 0:
            out.append(min(rest, cap))
            rest -= out[-1]
        return out

    def curve_ms(self, nbytes: float) -> float:
        """The measured all-reduce time of ``nbytes``: linear interpolation between the measured
        sizes, the first time below them, the line through the last two above them."""
        if self.allreduce_curve is None:
            raise ValueError("curve_ms needs a measured allreduce_curve (CostModel.from_profile(allreduce_curve=...))")
        n = [p[0] for p in self.allreduce_curve]
        t = [p[1] for p in self.allreduce_curve]
        if nbytes <= n[-1]:
            return float(np.interp(nbytes, n, t))
        slope = (t[-1] - t[-2]) / (n[-1] - n[-2]) if n[-1] > n[-2] else 0.0
        return float(t[-1] + max(0.0, slope) * (nbytes - n[-1]))

    def level_collective(self, k: int, link: tuple[float, float] | None = None) -> tuple[float, float]:
        """``(latency_ms, bandwidth)`` of one all-reduce ring step across topology level k >= 1: the
        all-reduce's own calibration where it has one (``allreduce_latency_ms``/``_bandwidth``), else
        the level's link (``link``, or the level's latency and nominal bandwidth)."""
        if link is None:
            bw = float(self.topology.levels[k - 1][1]) if self.topology is not None else math.inf
            link = (self.level_latency_ms(k), bw)
        lat, bw = link
        if self.allreduce_latency_ms is not None:
            lat = self.allreduce_latency_ms[min(k, len(self.allreduce_latency_ms)) - 1]
        if self.allreduce_bandwidth is not None:
            bw = self.allreduce_bandwidth[min(k, len(self.allreduce_bandwidth)) - 1]
        return lat, bw

    def collective_link(self, a: int, b: int) -> tuple[float, float]:
        """``(latency_ms, bandwidth)`` of one ring step of an all-reduce from a to b
        (:meth:`level_collective` of their level; the link itself within one worker)."""
        k = self.level(a, b)
        return self.level_collective(k, self.link(a, b)) if k else self.link(a, b)

    def exposed_allreduce_ms(self, allreduce_ms, backward_op_ms):
        """All-reduce time the compute stream waits for: ``max(0, AR - B)`` with overlap, else AR
        (numpy broadcasting)."""
        return np.maximum(0.0, allreduce_ms - backward_op_ms) if self.overlap_allreduce else allreduce_ms

    def bucketed_round_ms(self, buckets: Sequence[tuple[int, int]], workers) -> dict:
        """One data-parallel round on ``workers`` with gradient ``buckets`` (``(first, last)`` layer
        ranges in layer order, each all-reduced on its own as DDP does): the forward of every layer,
        then the backward bucket by bucket from the last, each bucket's all-reduce queued on the one
        collective channel as soon as its gradients exist (``allreduce_ready``; overlapped as
        ``overlap_allreduce`` says); the round ends when both the backward and the last all-reduce
        have. Returns ``round_ms``, ``compute_ms`` (forward, backward and step of every bucket, with
        their per-op overheads) and ``exposed_ms = round_ms − compute_ms`` (what the all-reduces add)."""
        o = self.op_overhead_ms
        ws = list(workers)
        t = sum(self.stage_fwd_ms(a, b) + o for a, b in buckets)
        channel, done = 0.0, []
        for a, b in reversed(list(buckets)):
            start = t
            t += self.stage_bwd_ms(a, b) + o
            ready = start if self.overlap_allreduce and self.allreduce_ready == "backward-start" else t
            channel = max(max(channel, ready) + self.allreduce_ms(self.range_sum("param_bytes", a, b), ws), t)
            done.append(channel)
            if not self.overlap_allreduce:  # the compute stream waits for each all-reduce
                t = channel
        end = t
        for ar_end in done:  # then one STEP per bucket, each once its all-reduce has ended
            end = max(end, ar_end) + o
        pure = sum(self.stage_fwd_ms(a, b) + self.stage_bwd_ms(a, b) + 3 * o for a, b in buckets)
        return dict(round_ms=float(end), compute_ms=float(pure), exposed_ms=float(end - pure))

    def layer_buckets(self, first: int, last: int) -> list[tuple[int, int]]:
        """The gradient buckets of layers ``first..last`` as ``(first, last)`` ranges in layer order:
        filled from ``last`` backwards, a bucket closes once its parameter bytes reach
        ``bucket_cap_bytes`` (a larger layer is a bucket alone; DistributedDataParallel's rule); one
        bucket of the whole range when ``bucket_cap_bytes`` is None."""
        if self.bucket_cap_bytes is None:
            return [(int(first), int(last))]
        starts, size = [], 0.0
        for i in range(int(last), int(first) - 1, -1):
            size += float(self.param_bytes[i])
            if size >= self.bucket_cap_bytes and i > first:
                starts.append(i)
                size = 0.0
        bounds = [int(first)] + sorted(starts) + [int(last) + 1]
        return [(a, b - 1) for a, b in zip(bounds, bounds[1:])]

    def replicated_stage_ms(self, first: int, last: int, workers) -> float:
        """The one price of a stage of layers ``first..last`` on ``workers`` (its replicas), per
        minibatch: one round of every replica (:meth:`bucketed_round_ms` over :meth:`layer_buckets`,
        each bucket's all-reduce ready as ``allreduce_ready`` says) divided by the replicas. Every
        reader prices a replicated stage with it: :meth:`stage_ms` (the plan's prediction), data
        parallelism (one stage of every layer on every worker) and the partitioner's ranking of its
        candidates. With one bucket and ``allreduce_ready="backward-start"`` it is
        ``(F + B + 3o + exposed AR) / r`` (:meth:`round_ms`)."""
        ws = tuple(workers)
        buckets = self.layer_buckets(first, last) if len(ws) > 1 else [(int(first), int(last))]
        return self.bucketed_round_ms(buckets, ws)["round_ms"] / len(ws)

    def level_latency_ms(self, k: int) -> float:
        """``α_k`` of topology level k (1 = innermost)."""
        return self.latency_ms[min(k, len(self.latency_ms)) - 1]

    def round_ms(self, fwd_ms, bwd_ms, allreduce_ms):
        """One 1F1B round of a replica: ops F, B, STEP plus the exposed all-reduce,
        ``F + B + 3o + exposed(AR, B + o)`` (numpy broadcasting)."""
        o = self.op_overhead_ms
        return fwd_ms + bwd_ms + 3 * o + self.exposed_allreduce_ms(allreduce_ms, bwd_ms + o)

    def outer_round_ms(self, inner_ms, fwd_ms, allreduce_ms, inner_workers: int = 1):
        """Time per minibatch of a component of ``c = inner_workers`` workers (e.g. a server) that
        runs layers with forward compute ``fwd_ms`` in ``inner_ms`` per minibatch, replicated at an
        outer level (before the division by the m outer replicas). ``allreduce_ms`` is the one ring
        all-reduce per round over *all* ``m·c`` replicas (:meth:`outer_allreduce_ms`; it replaces
        the component's own inner all-reduce, as the runtime and the simulator do it): a round of
        c minibatches takes ``R = c·inner_ms`` on the component, of which all but the forward ops
        (``F + 2o``: ops F and STEP) may hide the all-reduce::

            t = (R + exposed(AR, R - F - 2o)) / c

        Exact for a one-worker component (``R = F + B + 3o``: :meth:`round_ms`) and for a component
        that is data parallel inside (it gives :meth:`stage_ms` over all ``m·c`` workers, so
        ``data_parallel_ms`` through any hierarchy is the flat formula). For a pipeline inside the
        component it is the partitioner's proxy (it charges the whole range's parameters to one ring);
        :meth:`predicted_ms` prices the plan's flat stages exactly. Numpy broadcasting."""
        c = float(inner_workers)
        rnd = c * np.asarray(inner_ms, dtype=float)
        hidden = np.maximum(0.0, rnd - (np.asarray(fwd_ms, dtype=float) + 2 * self.op_overhead_ms))
        hidden = np.where(np.isfinite(rnd), hidden, 0.0)  # no inf - inf
        return (rnd + self.exposed_allreduce_ms(allreduce_ms, hidden)) / c

    def outer_allreduce_ms(self, nbytes, k: int, m, inner_workers: int = 1):
        """The ring all-reduce of a level-k stage replicated on ``m`` components of ``c`` workers:
        one ring over all ``m·c`` replicas at the slowest bandwidth and latency of the levels it crosses
        (k, and every inner level with more than one component),
        ``2 (mc-1)/(mc) · n / B_min + 2 (mc-1) α_max`` (0 for m = 1: the component's own inner
        all-reduce stays). Numpy broadcasting over ``nbytes`` and ``m``."""
        levels = self.topology.levels[:k] if self.topology is not None else ()
        crossed = [j for j in range(1, k + 1) if j == k or int(levels[j - 1][0]) > 1] if levels else []
        steps = [self.level_collective(j) for j in crossed]
        bw = min((b for _, b in steps), default=math.inf)
        lat = max((a for a, _ in steps), default=0.0)
        m = np.asarray(m, dtype=float)
        ar = ring_allreduce_ms(nbytes, m * inner_workers, bw, lat)
        return np.where(m > 1, ar, 0.0) if np.ndim(ar) or np.ndim(m) else (ar if m > 1 else 0.0)

    def level_cut_ms(self, k: int) -> np.ndarray:
        """Per layer l, one message of the cut after l over a level-k link: ``α_k + a_l / B_k``."""
        bw = float(self.topology.levels[k - 1][1]) if self.topology is not None else math.inf
        return self.level_latency_ms(k) + (
            np.zeros_like(self.act_bytes) if bw == math.inf else self.act_bytes / bw * 1e3
        )

    def fetch_ms(self, nbytes: float, a: int, b: int) -> float:
        """Fetching ``nbytes`` of weights from worker a to b: one message."""
        return self.message_ms(nbytes, a, b)

    # ---- a flat plan in closed form ---------------------------------------------------------
    def stage_ms(self, first: int, last: int, workers) -> float:
        """Time per minibatch of a PipeDream stage: :meth:`replicated_stage_ms`, which is
        ``(F + B + 3o + exposed AR) / r`` with one bucket ready at the backward's start (module docstring)."""
        return self.replicated_stage_ms(first, last, workers)

    def cut_ms(self, last_layer: int, senders, receivers) -> float:
        """Time per minibatch of the cut after ``last_layer`` between two stages' replicas (round
        robin): the busiest directed link, ``max (α + a / B) / lcm(r, r')``."""
        r, rp = len(senders), len(receivers)
        L = math.lcm(r, rp)
        nbytes = self.cut_bytes(last_layer)
        worst = max(self.message_ms(nbytes, senders[b % r], receivers[b % rp]) for b in range(L))
        return worst / L

    def plan_times(self, plan) -> tuple[list[float], list[float]]:
        """(stage_ms per stage, cut_ms per cut) of a flat :class:`~workbench.cost.plan.Plan`."""
        S = plan.num_stages
        stages = [
            self.stage_ms(s.first, s.last, s.workers) + self.stage_message_cpu_ms(k, S) / s.replicas
            for k, s in enumerate(plan.stages)
        ]
        cuts = [self.cut_ms(a.last, a.workers, b.workers) for a, b in zip(plan.stages, plan.stages[1:])]
        return stages, cuts

    def stage_message_cpu_ms(self, k: int, num_stages: int) -> float:
        """CPU time of stage k's messages per minibatch: ``message_cpu_ms`` for each of the
        activation received and gradient sent (k > 0) and activation sent and gradient received
        (k < S - 1)."""
        return self.message_cpu_ms * (2 * (k > 0) + 2 * (k < num_stages - 1))

    def predicted_ms(self, plan) -> float:
        """Time per minibatch of ``plan`` under 1F1B: ``max(stage_ms, cut_ms)`` (module docstring)."""
        stages, cuts = self.plan_times(plan)
        return max(stages + cuts)

    def in_flight(self, plan, period_ms: float | None = None) -> list[int]:
        """Minibatches stage s admits before its first backward (1F1B warm-up ``K_s``) so that the
        pipeline runs at ``P = period_ms`` per minibatch (default: the prediction).

        A replica of stage s works in slots of ``r_s · P`` (one minibatch per slot). 1F1B runs
        B(i) right after F(i + K_s - 1), so the gradient of i must arrive within ``K_s`` slots of
        F(i)'s start. It arrives after F, the activation message, the downstream lag ``T_{s+1}``,
        the gradient message and B, so, from the last stage back::

            K_s = max(NOAM_s, ceil((F_s + B_s + 3o + 2 msg_s + T_{s+1} + (r_s - 1) P) / (r_s · P))),
            T_s = K_s · r_s · P,            NOAM_s = ceil(Σ_{s' >= s} r_s' / r_s)

        (``msg_s``: the slowest link of the cut after s; no message and ``T_S = 0`` for the last
        stage). ``(r_s - 1) P``: the replicas of a stage get the microbatches of one round up to
        ``r_s - 1`` minibatches apart (round robin), and the round's all-reduce waits for the last of
        them (only in a pipeline, S > 1: pure data parallelism starts every replica at once).
        Without communication and with balanced stages this is PipeDream's NOAM; every
        slow cut adds minibatches upstream of it. (A per-stage Little's-law count is not enough:
        the strict alternation of 1F1B gives each neighbour pair its own slack to fill.)"""
        P = self.predicted_ms(plan) if period_ms is None else float(period_ms)
        r = [s.replicas for s in plan.stages]
        S = plan.num_stages
        out, lag = [0] * S, 0.0
        for k in range(S - 1, -1, -1):
            st = plan.stages[k]
            need = float(self.round_ms(self.stage_fwd_ms(st.first, st.last), self.stage_bwd_ms(st.first, st.last), 0.0))
            need += self.stage_message_cpu_ms(k, S)
            if k + 1 < S:
                nxt = plan.stages[k + 1]
                nbytes = self.cut_bytes(st.last)
                need += 2 * max(self.message_ms(nbytes, a, b) for a in st.workers for b in nxt.workers) + lag
            if S > 1:
                need += (r[k] - 1) * P  # replicas of a round reach the all-reduce up to r - 1 minibatches apart
            noam = math.ceil(sum(r[k:]) / r[k])
            out[k] = max(noam, math.ceil(need / (r[k] * P) - 1e-9)) if P > 0 else noam
            lag = out[k] * r[k] * P
        return out

    def stage_memory_bytes(self, plan, in_flight, recompute: bool = False) -> list[float]:
        """Per worker of stage s: ``K_s · (weights + stashed activations of the stage)`` (one
        stashed weight version and the activations of each minibatch in flight); with
        ``recompute`` (re-materialization) ``K_s · (weights + stage input) + activations``."""
        out = []
        for s, k in zip(plan.stages, in_flight):
            w, a = self.range_sum("param_bytes", s.first, s.last), self.range_sum("act_bytes", s.first, s.last)
            a_in = float(self.act_bytes[s.first - 1]) if recompute and s.first > 0 else 0.0
            out.append(float(stage_memory(w, a, a_in, k, recompute)))
        return out


def stage_memory(weights, acts, act_in, in_flight, recompute: bool = False):
    """Bytes per worker of a stage whose layers hold ``weights`` bytes of parameters and ``acts``
    bytes of activations per minibatch, with ``in_flight`` minibatches in flight: one stashed weight
    version and the activations of each, ``K · (weights + acts)``; with ``recompute``
    (re-materialization) only the stage input ``act_in`` is stashed and the activations are rebuilt
    for one minibatch at a time, ``K · (weights + act_in) + acts``. Broadcasts over numpy arrays
    (the partitioner's dynamic program prices every candidate stage at once)."""
    k = np.asarray(in_flight)
    out = k * (weights + act_in) + acts if recompute else k * (weights + acts)
    return out


def _check_ready(value) -> str:
    if value not in ALLREDUCE_READY:
        raise ValueError(f"allreduce_ready must be one of {ALLREDUCE_READY}, got {value!r}")
    return str(value)


def _check_bucket_bytes(value) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise ValueError(
            f"bucket_cap_bytes must be a number of bytes > 0 (or None: one bucket per stage), got {value!r}"
        )
    return float(value)


def ring_allreduce_ms(nbytes, replicas, bandwidth: float, latency_ms: float):
    """Ring all-reduce: ``2 (r-1)/r · n / B + 2 (r-1) α`` (2 (r-1) messages in sequence; 0 for r = 1).
    Broadcasts over numpy arrays of ``nbytes`` and ``replicas`` (the partitioner's dynamic program)."""
    r = np.asarray(replicas, dtype=float)
    per_byte = 0.0 if bandwidth == math.inf else 2.0 * (r - 1.0) / r * (1e3 / bandwidth)
    out = per_byte * np.asarray(nbytes, dtype=float) + 2.0 * (r - 1.0) * latency_ms
    return float(out) if out.ndim == 0 else out


def link_level(topology, a: int, b: int) -> int:
    """The topology level whose link joins workers ``a`` and ``b`` (0: the same worker).

    Uses ``topology.level_between(a, b)`` when the topology has it (1 = innermost, e.g. inside a
    server); otherwise ``levels = [(count_1, B_1), ...]`` with level k grouping ``count_k``
    components of level k-1, numbered consecutively; 1 without a topology."""
    if a == b:
        return 0
    if topology is None:
        return 1
    fn = getattr(topology, "level_between", None)
    if callable(fn):
        return int(fn(a, b))
    size = 1
    levels = list(getattr(topology, "levels", []) or [])
    for k, (count, _) in enumerate(levels):
        size *= int(count)
        if a // size == b // size:
            return k + 1
    return max(len(levels), 1)


def _label(profile, topology, lat, over) -> str:
    meta = profile.meta or {}
    what = meta.get("model") or meta.get("name") or meta.get("source") or "unnamed"
    kind = meta.get("kind", "kind not recorded")
    dev = f" on {meta['device']}" if meta.get("device") else ""
    if topology is None:
        where = "none (communication free)"
    else:
        where = "[" + ", ".join(f"{int(c)}x@{float(b) / 1e9:g}GB/s" for c, b in topology.levels) + "]"
    text = f"modeled from the {kind} profile of {what}{dev} and topology {where}"
    if any(lat) or over:
        text += f", latency {'/'.join(f'{x:g}' for x in lat)} ms/message, overhead {over:g} ms/op"
    return text


def _layer_columns(df) -> dict:
    """The per-layer arrays of a profile's table: forward, backward, activation and parameter bytes,
    and the measured backward split (``bwd_input_ms`` and ``bwd_weight_ms``, both or neither) and
    ``grad_accumulate_ms`` where every layer has them."""
    cols = {c: df[c].to_numpy(dtype=float) for c in ("fwd_ms", "bwd_ms", "act_bytes", "param_bytes")}
    split = {
        c: df[c].to_numpy(dtype=float)
        for c in ("bwd_input_ms", "bwd_weight_ms")
        if c in df.columns and df[c].notna().all()
    }
    if len(split) < 2:
        split = {}
    if "grad_accumulate_ms" in df.columns and df["grad_accumulate_ms"].notna().all():
        split["grad_accumulate_ms"] = df["grad_accumulate_ms"].to_numpy(dtype=float)
    return cols | split


def _calibration(opts: CostOptions, levels: int) -> dict:
    """The all-reduce calibration of ``opts`` as :class:`CostModel` fields, each checked (one
    ValueError that names the field): per-level latency and bandwidth, the measured curve sorted by
    size, the DDP buckets."""
    ar_lat = (
        None
        if opts.allreduce_latency_ms is None
        else _per_level("allreduce_latency_ms", opts.allreduce_latency_ms, levels)
    )
    ar_bw = _allreduce_bandwidth(opts.allreduce_bandwidth, levels)
    curve, curve_r = _allreduce_curve(opts.allreduce_curve)
    return dict(
        allreduce_bandwidth=ar_bw,
        allreduce_latency_ms=ar_lat,
        allreduce_curve=curve,
        allreduce_curve_replicas=curve_r,
        allreduce_buckets=_allreduce_buckets(opts.allreduce_buckets),
    )


def _allreduce_bandwidth(value, levels: int) -> tuple[float, ...] | None:
    """One bus bandwidth (bytes/s, > 0) per topology level, from one number or one per level."""
    if value is None:
        return None
    vals = value if isinstance(value, (list, tuple, np.ndarray)) else [value] * levels
    if len(vals) != levels:
        raise ValueError(f"allreduce_bandwidth has {len(vals)} values for {levels} topology levels")
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, numbers.Real) or not float(v) > 0 or math.isnan(v):
            raise ValueError(f"allreduce_bandwidth must be > 0 bytes/s, got {v!r}")
    return tuple(float(v) for v in vals)


def _allreduce_curve(curve) -> tuple[tuple[tuple[float, float], ...] | None, int]:
    """``((bytes, ms), ...)`` sorted by size and the replica count of a measured all-reduce curve."""
    if curve is None:
        return None, 0
    try:
        pts = sorted((float(n), float(t)) for n, t in zip(curve["sizes"], curve["ms"]))
        replicas = int(curve["world_size"])
    except (KeyError, TypeError, ValueError):
        raise ValueError("allreduce_curve must be a measure_allreduce() result (sizes, ms, world_size)") from None
    if len(pts) < 2 or any(not (math.isfinite(t) and t >= 0 and n >= 0) for n, t in pts):
        raise ValueError("allreduce_curve needs at least 2 sizes with finite times >= 0")
    return tuple(pts), replicas


def _allreduce_buckets(buckets) -> tuple[float, float] | None:
    """DDP's ``(first bucket bytes, further bucket bytes)``, both > 0."""
    if buckets is None:
        return None
    values = tuple(float(b) for b in buckets)
    if len(values) != 2 or not all(b > 0 for b in values):
        raise ValueError(f"allreduce_buckets must be (first bytes, bucket bytes) > 0, got {buckets!r}")
    return (values[0], values[1])

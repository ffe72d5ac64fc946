"""Calibration of the simulator from measurements taken *apart from* the run it predicts.

Three independent measurements feed :func:`workbench.simulation.simulate`:

* **link** (:func:`measure_link`): a two-process ping-pong over ``torch.distributed``. For each
  message size ``n`` the one-way time is half the median round trip, and the "alpha-beta" model
  ``t(n) = α + n / β`` is fitted to those points (:func:`fit_link`): ``α`` = ``latency_ms`` (fixed
  cost per message), ``β`` = ``bandwidth_bytes_per_s``.
* **compute** (:func:`stage_profile`): the per-layer profile (:func:`workbench.profiling.measure.profile`)
  at the *microbatch* size with ``torch.set_num_threads(threads)``, the same size and thread count
  a rank of the runtime computes with; the *stage-level* forward and backward, timed through the
  runtime's own stage functions (the stage's layers run as one unit with their parameter tensors,
  several microbatches alive, weight gradients added into one update buffer: the way a rank runs
  them, unlike the per-layer profile's repeated calls of one layer); and the optimizer step of
  each stage (``W ← W − (lr / n) · g`` over the stage's parameters, as the runtime's STEP op does
  it: in place, and into new tensors where a stashed version stays alive).
  :meth:`StageProfile.as_profile` gives the simulator either level.
* **all-reduce** (:func:`measure_allreduce`): ``all_reduce`` timed on its own and expressed as the
  ring model's bus bandwidth and per-step latency (a library's collective is not its link: gloo's
  all-reduce here runs at about a quarter of the ping-pong bandwidth).
* **per-op overhead** (:func:`solve_overhead`): the executor's fixed cost per op, found from a run
  of a *different* model (tiny width, so compute is almost nothing) as the ``o`` that makes the
  simulated step time of that run equal its measured one. The simulated time is non-decreasing in
  ``o``, so bisection finds it.

:func:`modeled_step_ms` then simulates ``rounds`` back-to-back repetitions of a schedule (the
runtime runs the rounds of an epoch without a barrier between them, so rounds of a pipeline can
overlap) and returns the steady-state time per round: the median spacing of the rounds' first
op starts, the same statistic :func:`measured_step_ms` takes from a measured ``timeline.csv``.
"""

from __future__ import annotations

import functools
import math
import statistics
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from workbench.cost.model import CostModel
from workbench.cost.plan import Plan
from workbench.cost.topology import Topology
from workbench.profiling.measure import Profile, detach_input, layers_and_input, profile
from workbench.runtime.launch import warm
from workbench.runtime.launch.affinity import place_rank
from workbench.runtime.launch.lifetime import spawn
from workbench.runtime.launch.ports import free_port
from workbench.runtime.semantics import stages
from workbench.runtime.transport import shm
from workbench.runtime.transport.comm import Sender, uses_send_thread
from workbench.schedules.core import Op, Schedule
from workbench.simulation import simulate

DEFAULT_SIZES = (4, 1 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20)
ALLREDUCE_SIZES = (4, 16 << 10, 256 << 10, 1 << 20, 4 << 20, 8 << 20, 16 << 20)  # up to a stage's gradients


# ---------------------------------------------------------------------------------------------
# link: ping-pong and the alpha-beta fit
# ---------------------------------------------------------------------------------------------
def fit_link(sizes: Sequence[float], times_ms: Sequence[float], relative: bool = True) -> dict:
    """Fit ``t = α + n / β`` (``t`` ms, ``n`` bytes) to one-way times.

    Weighted least squares on relative error, ``min Σ ((α + n_i x − t_i) / t_i)²`` with
    ``x = 1e3 / β`` (ms per byte), so a 4-byte message and a 4 MiB message count alike (plain least
    squares would let the big messages decide α); ``relative=False``: plain least squares, where the
    big messages decide β (what matters for whole-stage gradients). Returns ``latency_ms`` = α,
    ``bandwidth_bytes_per_s`` = β and ``rel_rmse`` (root mean square relative residual)."""
    n = np.asarray(sizes, dtype=float)
    t = np.asarray(times_ms, dtype=float)
    if n.ndim != 1 or n.shape != t.shape or len(n) < 2:
        raise ValueError("fit_link needs two equally long 1-D sequences with at least 2 points")
    if len(np.unique(n)) < 2:
        raise ValueError("fit_link needs at least two different message sizes to separate latency and bandwidth")
    if (n < 0).any() or not np.isfinite(t).all() or (t <= 0).any():
        raise ValueError("sizes must be >= 0 bytes and times finite and > 0 ms")
    w = t if relative else np.ones_like(t)
    A = np.stack([np.ones_like(n), n], axis=1) / w[:, None]
    (alpha, x), *_ = np.linalg.lstsq(A, t / w, rcond=None)
    if x <= 0:
        raise ValueError("the timings do not grow with message size; measure larger messages")
    rel = (alpha + n * x - t) / t
    return dict(latency_ms=float(alpha), bandwidth_bytes_per_s=float(1e3 / x), rel_rmse=float(np.sqrt(np.mean(rel**2))))


def _busy_compute(stop, count: list) -> None:
    """Keep this process's core busy with matrix products until ``stop`` is set (a loaded link);
    ``count[0]``: products done so far (the compute the messages leave to it)."""

    a, w = torch.randn(32, 512), torch.randn(512, 512)
    while not stop.is_set():
        torch.mm(a, w)
        count[0] += 1


@dataclass(frozen=True)
class _Timing:
    """What every timed rank runs: messages of each of ``sizes`` bytes, ``warmup + repeats`` times,
    over ``backend`` with ``threads`` torch threads, every wait bounded by ``timeout_s``."""

    backend: str
    sizes: list[int]
    repeats: int
    warmup: int
    timeout_s: float
    threads: int


def _join(rank: int, port: int, t: _Timing, world: int):
    """Set up this timed rank as the runtime sets up its ranks (threads, pinning) and join the
    process group; returns the wait bound as a ``timedelta``."""

    torch.set_num_threads(t.threads)
    place_rank(rank, world, t.threads)
    tmo = timedelta(seconds=t.timeout_s)
    dist.init_process_group(t.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=tmo)
    return tmo


class _BusyCore:
    """A compute thread that keeps this process's core busy (:func:`_busy_compute`) and counts its
    products; its rate without messages is measured before the messages and again after them."""

    def __init__(self):

        self.stop_event, self.count, self.rates = threading.Event(), [0], []
        self.thread = threading.Thread(target=_busy_compute, args=(self.stop_event, self.count), daemon=True)

    def start(self) -> None:
        self.thread.start()
        time.sleep(0.05)
        self.rates.append(self._rate())

    def _rate(self, seconds: float = 0.5) -> float:
        """Products per second over ``seconds`` with no message."""
        c0, t0 = self.count[0], time.perf_counter()
        time.sleep(seconds)
        return (self.count[0] - c0) / (time.perf_counter() - t0)

    def cpu_ms_per_message(self, spans: dict, repeats: int) -> dict:
        """Per size: the compute time the ``2 * repeats`` messages of its span (seconds, products
        done) took from the core, ``(span - done / rate) / (2 * repeats)``, ``rate`` the mean rate
        without messages."""
        self.rates.append(self._rate())
        rate0 = statistics.fmean(self.rates)
        return {k: max(0.0, dt - done / rate0) * 1e3 / (2 * repeats) for k, (dt, done) in spans.items()}

    def stop(self) -> None:
        self.stop_event.set()
        if self.thread.ident is not None:
            self.thread.join()


class _PingPongLink:
    """The ping-pong's transport: the runtime's shared-memory channels of ``shm_token`` (a send is a
    copy into the peer's slot), or ``isend`` / ``irecv``, the sends through the runtime's sender
    thread with ``sender``."""

    def __init__(self, rank: int, t: _Timing, tmo, shm_token: str, sender: bool):

        self.dist, self.tmo, self.timeout_s = dist, tmo, t.timeout_s
        self.pending: list = []
        self.sender = (
            Sender(lambda key, tensors, dst: self.pending.append(dist.isend(tensors[0], dst))) if sender else None
        )
        self.chan: dict = {}
        self.count = {"tx": 0, "rx": 0}
        if shm_token:
            peer = 1 - rank
            self.chan = {
                "tx": shm.Channel(shm.channel_path(shm_token, rank, peer), 4, max(t.sizes), t.timeout_s),
                "rx": shm.Channel(shm.channel_path(shm_token, peer, rank), 4, max(t.sizes), t.timeout_s),
            }

    def send(self, buf, dst: int) -> None:
        if self.chan:
            self.chan["tx"].put(self.count["tx"], [buf], "ping-pong message")
            self.count["tx"] += 1
        elif self.sender is not None:
            self.sender.put(None, [buf], dst)
        else:
            self.pending.append(self.dist.isend(buf, dst))

    def recv(self, buf, src: int) -> None:
        if self.chan:
            (got,), _ = self.chan["rx"].get(self.count["rx"], [(tuple(buf.shape), buf.dtype)], "ping-pong message")
            self.count["rx"] += 1
            buf.copy_(got)
        else:
            work = self.dist.irecv(buf, src)
            assert work is not None  # a member of the default group
            work.wait(self.tmo)

    def drain(self) -> None:
        """Wait for every send."""
        if self.sender is not None:
            self.sender.drain(self.timeout_s)
            self.sender.close()
        for w in self.pending:
            w.wait(self.tmo)

    def close(self) -> None:
        for ch in self.chan.values():
            ch.close()


def _ping_pong(rank: int, port: int, t: _Timing, busy: bool, shm_token: str, *, q) -> None:
    """One side of the ping-pong: rank 0 sends and waits for the echo; rank 1 echoes. ``busy``: a
    compute thread keeps the core busy meanwhile and sends go through the runtime's send path
    (its sender thread, where the runtime uses one). ``shm_token``: through the runtime's
    shared-memory channels (:mod:`workbench.runtime.transport.shm`) of that token instead of ``backend``.
    Rank 0 puts ({bytes: one-way ms}, {bytes: CPU ms per message}, empty when idle) on ``q``."""

    tmo = _join(rank, port, t, 2)
    load, link = (_BusyCore() if busy else None), None
    try:
        if load is not None:
            load.start()
        link = _PingPongLink(rank, t, tmo, shm_token, sender=busy and uses_send_thread(t.backend) and not shm_token)
        out, spans = {}, {}
        for n in t.sizes:
            size, rtt, span = _round_trips(rank, link, n, t, load)
            # loaded: the mean, since every delay adds to a pipeline's critical path; idle: the median
            out[size] = (statistics.fmean(rtt) if busy else statistics.median(rtt)) / 2
            spans[size] = span
        cpu = load.cpu_ms_per_message(spans, t.repeats) if load is not None else {}
        link.drain()
        if rank == 0:
            q.put((out, cpu))
    finally:
        if load is not None:
            load.stop()
        if link is not None:
            link.close()
        dist.destroy_process_group()


def _round_trips(rank: int, link: _PingPongLink, n: int, t: _Timing, load: _BusyCore | None):
    """``warmup + repeats`` round trips of a float32 message of ``n`` bytes (at least one element):
    (its bytes, the timed round trips in ms, (seconds, busy products) over the timed ones)."""

    buf = torch.zeros(max(1, int(n) // 4), dtype=torch.float32)
    rtt = []
    count = load.count if load is not None else [0]
    c1, t1 = count[0], time.perf_counter()
    for i in range(t.warmup + t.repeats):
        if i == t.warmup:
            c1, t1 = count[0], time.perf_counter()
        t0 = time.perf_counter()
        if rank == 0:
            link.send(buf, 1)
            link.recv(buf, 1)
        else:
            link.recv(buf, 0)
            link.send(buf, 0)
        if i >= t.warmup:
            rtt.append((time.perf_counter() - t0) * 1e3)
    return int(buf.numel() * 4), rtt, (time.perf_counter() - t1, count[0] - c1)


def _all_reduce_timer(rank: int, port: int, t: _Timing, world: int, q) -> None:
    """One rank of the all-reduce timing: every rank all-reduces (sum) a float32 tensor of each size."""

    tmo = _join(rank, port, t, world)
    try:
        out = {}
        for n in t.sizes:
            buf = torch.ones(max(1, int(n) // 4), dtype=torch.float32)
            ts = []
            for i in range(t.warmup + t.repeats):
                dist.barrier()
                t0 = time.perf_counter()
                dist.all_reduce(buf, async_op=True).wait(tmo)
                if i >= t.warmup:
                    ts.append((time.perf_counter() - t0) * 1e3)
                buf.fill_(1.0)
            # the mean: gloo's times are bimodal (1 MiB: 0.6 or 3-4 ms)
            out[int(buf.numel() * 4)] = statistics.fmean(ts)
        if rank == 0:
            q.put(out)
    finally:
        dist.destroy_process_group()


def _run_ranks(fn, args: tuple, nprocs: int, timeout_s: float, what: str) -> dict:
    """Start ``nprocs`` processes ``fn(rank, port, *args, q)`` (warm ranks unless ``WORKBENCH_WARM=0``:
    :mod:`workbench.runtime.launch.warm`); rank 0's result from ``q``, or
    TimeoutError after ``timeout_s`` (processes stopped: :func:`workbench.runtime.launch.lifetime.spawn`)."""

    q = mp.get_context("spawn").SimpleQueue()
    spawn(
        functools.partial(fn, q=q), (free_port(), *args), nprocs, deadline_s=timeout_s, what=what, warm=warm.enabled()
    )
    if q.empty():
        raise RuntimeError(f"{what} finished without a result")
    return q.get()


def _check_sizes(sizes, repeats: int, warmup: int) -> list[int]:
    if repeats < 1 or warmup < 0:
        raise ValueError(f"repeats must be >= 1 and warmup >= 0 (got {repeats}, {warmup})")
    sizes = [int(n) for n in sizes]
    if len(set(max(4, n // 4 * 4) for n in sizes)) < 2:
        raise ValueError("a link measurement needs at least two different message sizes (bytes)")
    return sizes


def measure_link(
    backend: str = "gloo",
    sizes: Sequence[int] = DEFAULT_SIZES,
    repeats: int = 30,
    warmup: int = 5,
    timeout_s: float = 120.0,
    *,
    threads: int = 1,
    busy: bool = False,
    transport: str = "gloo",
) -> dict:
    """Ping-pong between two spawned processes on this machine; fit ``t = α + n / β``.

    For each size ``n`` (bytes, rounded down to whole float32 elements, at least one), rank 0
    ``isend``s a tensor and waits for rank 1 to echo it back, ``warmup + repeats`` times; the
    one-way time is half the median round trip. Every wait and the whole job are bounded by
    ``timeout_s`` (TimeoutError, processes terminated). Returns :func:`fit_link`'s dict plus
    ``sizes``, ``one_way_ms``, ``backend``, ``repeats``, ``busy``.

    ``busy``: the link as a training run sees it: each process keeps its core busy with a compute
    thread and sends through the runtime's send path; the one-way time is the *mean* (delays of a
    communication thread waiting for a busy core are rare but long, and each one adds to the
    critical path). On the 2-core CI machine a 64 KiB message took about 0.07 ms idle and 0.4 to
    1.1 ms on average loaded. Loaded, it also reports the compute time the messages took from the
    busy thread (its rate with and without messages): ``cpu_ms_per_message`` per size (per message
    sent or received) and ``message_cpu_ms``, their mean up to 256 KiB (the simulator's
    ``message_cpu_ms``, LogP's overhead *o*).

    ``transport="shm"``: the messages go through the runtime's shared-memory channels
    (:mod:`workbench.runtime.transport.shm`, as ``train(..., transport="shm")`` sends them; CPU, this
    machine) instead of ``backend``'s point-to-point; the process group still uses ``backend``.
    Its waiting receiver polls, so loaded, a message's CPU time includes the polling."""

    shm.check_transport(transport)
    sizes = _check_sizes(sizes, repeats, warmup)
    token = shm.new_token() if transport == "shm" else ""
    try:
        one_way, cpu = _run_ranks(
            _ping_pong,
            (_Timing(backend, sizes, repeats, warmup, timeout_s, threads), bool(busy), token),
            2,
            timeout_s,
            f"link ping-pong ({backend if not token else 'shm'})",
        )
    finally:
        if token:
            shm.remove_channels(token)
    n = sorted(one_way)
    try:
        fit = fit_link(n, [one_way[k] for k in n])
    except ValueError:
        if not busy:
            raise
        # loaded means are noisy: when they do not grow with the size, keep the latency and call the
        # bandwidth unresolved (infinite) rather than fail the calibration
        fit = dict(
            latency_ms=float(statistics.fmean(one_way.values())),
            bandwidth_bytes_per_s=math.inf,
            rel_rmse=float("nan"),
            note="loaded times did not grow with size: latency only",
        )
    out = dict(
        fit,
        sizes=n,
        one_way_ms=[one_way[k] for k in n],
        backend=backend,
        repeats=repeats,
        busy=bool(busy),
        transport=transport,
    )
    if busy:
        out["cpu_ms_per_message"] = [cpu[k] for k in n]
        small = [k for k in n if k <= 256 << 10] or n[:1]
        out["message_cpu_ms"] = statistics.fmean(cpu[k] for k in small)
    return out


def runtime_link(idle: dict, loaded: dict) -> dict:
    """The link a runtime message is charged: transit (latency, bandwidth) from the idle ping-pong,
    CPU time per message (``message_cpu_ms``, shared with the compute: the simulator's processor
    sharing) from the loaded one. The loaded ping-pong's latency is the time its receiving thread
    waits for a core that a compute thread holds; a runtime rank receives on its compute thread,
    which is idle while it waits, so a message on the critical path (one a rank waits for) sees
    the idle latency, and what the messages cost a busy core is their CPU time. Charged the loaded
    latency on every message, the model ran 5-23% high over gloo (``bench_fidelity.py``'s
    ``loaded transit`` column); not modeled: a sender that goes
    straight on to its next op delays its own send threads (PipeDream's steady state)."""
    if not loaded.get("busy") or idle.get("busy"):
        raise ValueError(
            "runtime_link(idle, loaded): pass measure_link(...) idle first, then measure_link(..., busy=True)"
        )
    return dict(
        loaded,
        latency_ms=idle["latency_ms"],
        bandwidth_bytes_per_s=idle["bandwidth_bytes_per_s"],
        loaded_latency_ms=loaded["latency_ms"],
        loaded_bandwidth_bytes_per_s=loaded["bandwidth_bytes_per_s"],
    )


def measure_allreduce(
    backend: str = "gloo",
    sizes: Sequence[int] = ALLREDUCE_SIZES,
    world_size: int = 2,
    repeats: int = 20,
    warmup: int = 5,
    *,
    timeout_s: float = 120.0,
    threads: int = 1,
) -> dict:
    """Time ``torch.distributed.all_reduce`` over ``world_size`` spawned processes on this machine
    (median per size, after a barrier) and express it in the ring model the :class:`CostModel` uses,
    ``t = 2 (r-1)/r · n / B_bus + 2 (r-1) α``: fit ``t = α' + n / β'`` (:func:`fit_link`), then the
    bus bandwidth ``B_bus = 2 (r-1)/r · β'`` (NCCL-tests' "busbw") and the per-step latency
    ``α = α' / (2 (r-1))``. Returns ``latency_ms`` = α, ``bandwidth_bytes_per_s`` = B_bus (pass them
    as ``allreduce_latency_ms`` / ``allreduce_bandwidth`` to the simulator), ``rel_rmse``, ``sizes``,
    ``ms``, ``world_size``, ``backend``. A library's all-reduce can be much slower than its
    point-to-point link (gloo on this 2-core machine: about a quarter, it also sums and copies on
    the CPU), so it is measured on its own."""
    if world_size < 2:
        raise ValueError(f"world_size must be >= 2, got {world_size}")
    sizes = _check_sizes(sizes, repeats, warmup)
    ms = _run_ranks(
        _all_reduce_timer,
        (_Timing(backend, sizes, repeats, warmup, timeout_s, threads), world_size),
        world_size,
        timeout_s,
        f"all-reduce timing ({backend})",
    )
    n = sorted(ms)
    # plain least squares: the MB-sized gradients of whole stages decide the bandwidth (gloo's time
    # for 1 MiB alone jumped between 0.6 and 3.8 ms from run to run here)
    fit = fit_link(n, [ms[k] for k in n], relative=False)
    r = world_size
    return dict(
        latency_ms=fit["latency_ms"] / (2 * (r - 1)),
        bandwidth_bytes_per_s=fit["bandwidth_bytes_per_s"] * 2 * (r - 1) / r,
        rel_rmse=fit["rel_rmse"],
        sizes=n,
        ms=[ms[k] for k in n],
        world_size=r,
        backend=backend,
        repeats=repeats,
    )


# ---------------------------------------------------------------------------------------------
# compute: per-layer profile at the microbatch size, optimizer step per stage
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StageProfile:
    """Compute costs of a partitioned model as one rank of the runtime sees them.

    ``profile``: per-layer :class:`~workbench.profiling.measure.Profile` at ``microbatch_size`` (so pass
    ``microbatch_fraction=1`` to the simulator); ``bounds[s] = (first, last)`` layers of stage s;
    ``step_ms[s]``: mean time of stage s's optimizer step in place right after a backward,
    ``step_copy_ms[s]`` into new tensors (a step that keeps the old version for stashed
    microbatches); ``fwd_ms[s]``/``bwd_ms[s]``: mean
    stage-level forward / backward (backward includes the input gradient for ``s > 0``, as in the
    runtime); ``bwd_input_ms[s]``/``bwd_weight_ms[s]``: the two halves of the split backward
    (zero-bubble BI, BW); ``grad_accumulate_ms[s]``: what ``bwd_ms`` (a backward adding its weight
    gradients into the update buffer) costs more than the first backward of an update (whose
    gradients become the empty buffer); ``threads``: torch threads used."""

    profile: Profile
    bounds: tuple[tuple[int, int], ...]
    step_ms: tuple[float, ...]
    microbatch_size: int
    threads: int
    fwd_ms: tuple[float, ...] = ()
    bwd_ms: tuple[float, ...] = ()
    meta: dict = field(default_factory=dict)
    step_copy_ms: tuple[float, ...] = ()
    bwd_input_ms: tuple[float, ...] = ()
    bwd_weight_ms: tuple[float, ...] = ()
    grad_accumulate_ms: tuple[float, ...] = ()

    def as_profile(self, level: str = "stage"):
        """``"layer"``: the per-layer profile; ``"stage"``: a Profile with one row per stage
        (stage-level fwd/bwd, the bytes of the stage's last layer output, the stage's parameter
        bytes), to simulate with one layer per stage."""

        if level == "layer":
            return self.profile
        if level != "stage":
            raise ValueError(f"level must be 'stage' or 'layer', got {level!r}")
        if len(self.fwd_ms) != len(self.bounds):
            raise ValueError("this StageProfile has no stage-level timings; measure it with stage_profile()")
        df = self.profile.layers
        rows = [
            dict(
                name=f"stage{s}[{a}..{z}]",
                fwd_ms=self.fwd_ms[s],
                bwd_ms=self.bwd_ms[s],
                act_bytes=float(df.act_bytes[z]),
                param_bytes=float(df.param_bytes[a : z + 1].sum()),
            )
            for s, (a, z) in enumerate(self.bounds)
        ]
        if len(self.bwd_input_ms) == len(rows) == len(self.bwd_weight_ms):  # the measured split backward
            for r, bi, bw in zip(rows, self.bwd_input_ms, self.bwd_weight_ms):
                r.update(bwd_input_ms=bi, bwd_weight_ms=bw)
        if len(self.grad_accumulate_ms) == len(rows):
            for r, ac in zip(rows, self.grad_accumulate_ms):
                r.update(grad_accumulate_ms=ac)
        return Profile(pd.DataFrame(rows), dict(self.profile.meta, kind="measured (stage level)"))

    def stage_ms(self) -> pd.DataFrame:
        """Per stage: fwd_ms, bwd_ms (sums over the stage's layers), step_ms, cut_bytes."""
        df = self.profile.layers
        rows = [
            dict(
                stage=s,
                first=a,
                last=z,
                layer_fwd_ms=float(df.fwd_ms[a : z + 1].sum()),
                layer_bwd_ms=float(df.bwd_ms[a : z + 1].sum()),
                stage_fwd_ms=self.fwd_ms[s] if self.fwd_ms else float("nan"),
                stage_bwd_ms=self.bwd_ms[s] if self.bwd_ms else float("nan"),
                step_ms=self.step_ms[s],
                step_copy_ms=self.step_copy_ms[s] if self.step_copy_ms else float("nan"),
                cut_bytes=float(df.act_bytes[z]),
            )
            for s, (a, z) in enumerate(self.bounds)
        ]
        return pd.DataFrame(rows).set_index("stage")


STAGE_TIMINGS = ("fwd_ms", "bwd_ms", "step_ms", "step_copy_ms", "bwd_input_ms", "bwd_weight_ms", "grad_accumulate_ms")


def on_ranks(
    profiles: Sequence[StageProfile], stage_ranks: Sequence[Sequence[int]], combine: Callable = max
) -> StageProfile:
    """One StageProfile from profiles measured at once in one process per rank (``profiles[r]``:
    the process pinned where rank ``r`` runs): each stage's timings from the rank(s) that run it,
    a replicated stage at its slowest replica (``combine``, default ``max``: a synchronous step waits
    for it). Cores of one machine
    need not be alike: on the 2-vCPU benchmark host the core that takes the block device's
    interrupts timed the same stage 2-10% slower in 7 of 7 paired profiles one hour, while in the
    fidelity runs after it the mean of the two cores modeled within -2..+5% of this, mostly within
    1% (``bench_fidelity.py``'s ``core mean``). The per-layer profile stays the first process's."""

    if len(stage_ranks) != len(profiles[0].bounds):
        raise ValueError(f"stage_ranks names {len(stage_ranks)} stages, the profiles have {len(profiles[0].bounds)}")
    for s, ranks in enumerate(stage_ranks):
        if not ranks or any(not 0 <= r < len(profiles) for r in ranks):
            raise ValueError(f"stage {s}: ranks {list(ranks)} must be a non-empty subset of 0..{len(profiles) - 1}")
    timings: dict[str, Any] = {}
    for attr in STAGE_TIMINGS:
        if all(len(getattr(p, attr)) == len(stage_ranks) for p in profiles):
            timings[attr] = tuple(
                combine([getattr(profiles[r], attr)[s] for r in ranks]) for s, ranks in enumerate(stage_ranks)
            )
    return replace(profiles[0], **timings, meta=dict(profiles[0].meta, stage_ranks=[list(r) for r in stage_ranks]))


def _bounds(plan_or_bounds, num_layers: int) -> tuple[tuple[int, int], ...]:
    if hasattr(plan_or_bounds, "stages"):
        b = [(int(s.first), int(s.last)) for s in plan_or_bounds.stages]
    else:
        try:
            b = [(int(a), int(z)) for a, z in plan_or_bounds]
        except (TypeError, ValueError):
            raise ValueError("plan_or_bounds must be a Plan or a list of (first, last) layer pairs") from None
    expect = 0
    for a, z in b:
        if a != expect or z < a:
            raise ValueError(f"stage bounds must be contiguous from layer 0; got {b}")
        expect = z + 1
    if expect != num_layers:
        raise ValueError(f"stage bounds cover {expect} layers but the model has {num_layers}")
    return tuple(b)


class StageOpTimes(NamedTuple):
    """Mean ms of one stage's ops as a rank of the runtime runs them (:func:`time_stage`): forward,
    backward, the split backward's halves (BI, BW), what a backward adding into the update buffer
    costs more than the update's first (``accumulate``), and STEP in place / into new tensors."""

    fwd: float
    bwd: float
    bwd_input: float
    bwd_weight: float
    accumulate: float
    step_in_place: float
    step_copy: float


def time_stage(
    layers: list,
    x,
    first: bool,
    iterations: int,
    warmup: int,
    *,
    microbatches: int = 4,
    last: tuple | None = None,
    lr: float = 1e-9,
) -> StageOpTimes:
    """Mean ms of the stage forward, backward, split backward (input-gradient half BI, then
    weight-gradient half BW, as zero-bubble schedules run it), and what the first backward of an
    update saves (its gradients become the empty buffer; the later ones add into it: B is theirs)
    as a rank of the runtime runs them: the layers as one stage module evaluated with its own
    parameter tensors (:func:`~workbench.runtime.semantics.stages.run_stage`), ``microbatches`` forwards and
    backwards (:func:`~workbench.runtime.semantics.stages.vjp`, cotangent of ones, the input gradient unless
    ``first``) in one-forward-one-backward order (F0 F1 B0 F2 B1 ... B(m-1), two microbatches
    alive, as the 1F1B schedules' steady state), adding the weight gradients into one update
    buffer, as the runtime's B ops of one update do (F is timed there); then ``microbatches``
    forwards and their split backwards. The last stage (``last = (model, target)``) also
    computes the loss and the metrics in its forward and starts its backward from the loss, as the
    runtime's last stage does. And the runtime's STEP (:func:`~workbench.runtime.semantics.stages.sgd_update`,
    ``lr`` so small the weights stay as they are) right after the last backward of each update, as
    the runtime runs it, in place and into new tensors (a step that keeps the replaced version for
    stashed microbatches) in turn. Returns (F, B, BI, BW, accumulation, STEP in place, STEP copy)
    as a :class:`StageOpTimes`.

    Cache and allocator effects of the real op sequence are in the figure: in a paired check on the
    2-vCPU benchmark host a forward of the MLP's last stage right after a backward took 7-16% longer
    than one after a forward (0.88-0.97 -> 1.02-1.09 ms; a later check split, -10% and +17%). With the forwards timed back to back
    (GPipe's order) the runtime's ranks computed 1.06-1.19x the profile in a shm
    fidelity run (``bench_fidelity.py``'s ``compute_ratio``); in 1F1B order 1.03-1.10x and
    0.96-1.05x in the two shm runs after. Means, not medians: a run pays every op (each op's mean
    was 1-5% above its median there). The STEP right after a backward took 0.13 ms in place and
    0.21-0.25 ms into new tensors for the MLP's last stage, 0.09-0.10 and 0.13-0.16 back to back
    (as the profile once timed them), and 0.14-0.16 / 0.19-0.20 ms timed inside the runtime's ranks."""
    timer = _StageTimer(layers, x, first, last, lr)
    for i in range(warmup + iterations):
        into = timer.one_f_one_b(microbatches)
        timer.step(into, in_place=i % 2 == 0)
        timer.split_backward(microbatches, into)
        if i < warmup:
            timer.reset()
    return timer.result()


class _StageTimer:
    """One stage's ops timed as the runtime runs them (:func:`time_stage`), with the runtime's stage
    functions (:mod:`workbench.runtime.semantics.stages`) on a copy of the layers' parameters."""

    def __init__(self, layers: list, x, first: bool, last: tuple | None, lr: float):

        self.torch, self.stages = torch, stages  # looked up per call, as the runtime's ranks call them
        self.mod = torch.nn.Sequential(*layers)
        self.params = {n: p.detach().clone().requires_grad_(True) for n, p in self.mod.named_parameters()}
        self.x, self.like, self.first, self.lr = x, isinstance(x, tuple), first, lr
        self.model, self.target = last if last is not None else (None, None)
        self.stashed: list = []  # the new versions of the last copying steps, kept alive as the runtime keeps them
        self.reset()

    def reset(self) -> None:
        """Forget the timings so far (after the warm-up)."""
        self.ms: dict[str, list[float]] = {k: [] for k in ("F", "B", "BI", "BW", "Bf", "S_in", "S_copy")}

    def start(self, y, loss) -> dict:
        """Where the backward starts: the loss (last stage) or the next stage's gradient (ones)."""
        if loss is not None:
            return dict(loss_fn=self.model.loss, target=self.target, loss=loss)
        yt = y if isinstance(y, tuple) else (y,)
        return dict(cot=tuple(self.torch.ones_like(t) for t in yt if t.is_floating_point()))

    def forward(self, split_next: bool) -> tuple:
        """One forward (timed as F unless a split backward follows); (inputs, output, loss, layers)."""
        st, torch = self.stages, self.torch
        xl = st.as_leaves(self.x, requires_grad=not self.first)
        t0 = time.perf_counter()
        layers = None
        if not split_next or self.first:
            y = st.run_stage(self.mod, self.params, st.from_tuple(xl, self.like))
        else:  # as the runtime's forward before a split backward (the first stage's is not split)
            y, layers = st.run_stage_layers(self.mod, self.params, st.from_tuple(xl, self.like))
        loss = None
        if self.model is not None:
            loss = self.model.loss(y, self.target)
            float(loss.detach()), self.model.correct(y.detach() if torch.is_tensor(y) else y, self.target)
        if not split_next:
            self.ms["F"].append((time.perf_counter() - t0) * 1e3)
        return xl, y, loss, layers

    def backward(self, rec: tuple, into: dict) -> None:
        """B of a forward's record, its weight gradients added into the update buffer ``into``; the
        first backward of an update (``into`` empty: its gradients become the buffer) is timed apart."""
        xl, y, loss, _ = rec
        kw = self.start(y, loss)
        fresh = not into
        t0 = time.perf_counter()
        self.stages.vjp(self.mod, self.params, xl, self.like, y, **kw, want_input=not self.first, into=into)
        self.ms["Bf" if fresh else "B"].append((time.perf_counter() - t0) * 1e3)

    def one_f_one_b(self, microbatches: int) -> dict:
        """F0 F1 B0 F2 B1 ... B(m-1) into one update buffer, which it returns."""
        into: dict = {}
        prev = self.forward(False)
        for _ in range(1, microbatches):
            cur = self.forward(False)
            self.backward(prev, into)
            prev = cur
        self.backward(prev, into)
        return into

    def step(self, into: dict, in_place: bool) -> None:
        """The update's STEP right after its last backward, in place or into new tensors."""
        grads = {n: into[n] if n in into else self.torch.zeros_like(p) for n, p in self.params.items()}
        t0 = time.perf_counter()
        new = self.stages.sgd_update(dict(self.params), grads, self.lr, in_place)
        self.ms["S_in" if in_place else "S_copy"].append((time.perf_counter() - t0) * 1e3)
        if not in_place:
            self.stashed = (self.stashed + [new])[-2:]

    def split_backward(self, microbatches: int, into: dict) -> None:
        """``microbatches`` forwards, then per microbatch (last first) BI (input gradient, keeps the
        graph) and BW: layer by layer as the runtime's BI / BW, or the whole stage twice where it
        cannot be split (the runtime's first stage, unsplittable stages)."""
        st, like = self.stages, self.like
        for xl, y, loss, layers in reversed([self.forward(True) for _ in range(microbatches)]):
            kw = self.start(y, loss)
            t0 = time.perf_counter()
            if layers is None:
                st.vjp(self.mod, self.params, xl, like, y, **kw, want_weights=False, retain_graph=True)
                t1 = time.perf_counter()
                st.vjp(self.mod, self.params, xl, like, y, **kw, want_input=False, into=into)
            else:
                roots, grads = st.stage_roots(y, loss=loss, cot=kw.get("cot"))
                _, cots = st.split_input_grad(layers, xl, roots, grads)
                t1 = time.perf_counter()
                st.split_weight_grad(layers, cots, roots, grads, self.params, into=into)
            self.ms["BI"].append((t1 - t0) * 1e3)
            self.ms["BW"].append((time.perf_counter() - t1) * 1e3)

    def result(self) -> StageOpTimes:
        """(F, B, BI, BW, accumulation, STEP in place, STEP copy): means in ms."""
        mean, ms = statistics.fmean, self.ms
        b = mean(ms["B"]) if ms["B"] else mean(ms["Bf"])  # one microbatch per update: every backward is the first
        s_in = mean(ms["S_in"]) if ms["S_in"] else 0.0
        return StageOpTimes(
            fwd=mean(ms["F"]),
            bwd=b,
            bwd_input=mean(ms["BI"]),
            bwd_weight=mean(ms["BW"]),
            accumulate=max(0.0, b - mean(ms["Bf"])),
            step_in_place=s_in,
            step_copy=mean(ms["S_copy"]) if ms["S_copy"] else s_in,
        )


def stage_profile(
    model,
    plan_or_bounds,
    microbatch_size: int,
    threads: int = 1,
    iterations: int = 20,
    *,
    warmup: int = 5,
    device: str = "cpu",
) -> StageProfile:
    """Measure per-layer fwd/bwd at ``microbatch_size`` with ``torch.set_num_threads(threads)``
    (restored afterwards) and each stage's optimizer-step time. ``model``: a LayerModel;
    ``plan_or_bounds``: a :class:`~workbench.cost.plan.Plan` or ``[(first, last), ...]``."""

    if microbatch_size < 1 or threads < 1:
        raise ValueError(f"microbatch_size and threads must be >= 1 (got {microbatch_size}, {threads})")
    layers = list(model.layers)
    bounds = _bounds(plan_or_bounds, len(layers))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        prof = profile(
            model,
            batch_size=microbatch_size,
            iterations=iterations,
            warmup=warmup,
            device=device,
            progress=False,
            flops=False,
        )

        _, _, _, x = layers_and_input(model, None, microbatch_size)
        times: list[StageOpTimes] = []
        for a, z in bounds:
            last = z == len(layers) - 1 and hasattr(model, "loss") and hasattr(model, "example_target")
            times.append(
                time_stage(
                    layers[a : z + 1],
                    x,
                    a == 0,
                    iterations,
                    warmup,
                    last=(model, model.example_target(microbatch_size)) if last else None,
                )
            )
            with torch.no_grad():
                for layer in layers[a : z + 1]:
                    x = layer(detach_input(x, False))
    finally:
        torch.set_num_threads(before)
    return StageProfile(
        profile=prof,
        bounds=bounds,
        step_ms=tuple(t.step_in_place for t in times),
        microbatch_size=int(microbatch_size),
        threads=int(threads),
        fwd_ms=tuple(t.fwd for t in times),
        bwd_ms=tuple(t.bwd for t in times),
        meta=dict(iterations=iterations, warmup=warmup, device=device),
        step_copy_ms=tuple(t.step_copy for t in times),
        bwd_input_ms=tuple(t.bwd_input for t in times),
        bwd_weight_ms=tuple(t.bwd_weight for t in times),
        grad_accumulate_ms=tuple(t.accumulate for t in times),
    )


# ---------------------------------------------------------------------------------------------
# simulation of back-to-back rounds, and the same statistic from a measured timeline
# ---------------------------------------------------------------------------------------------
def repeat_rounds(schedule: Schedule, rounds: int) -> Schedule:
    """``rounds`` copies of ``schedule`` run back to back on every worker (as the runtime runs the
    rounds of an epoch): round ``r`` shifts microbatch ids by ``r · M`` and weight versions and
    update indices of stage ``s`` by ``r · u_s`` (``u_s`` = ``schedule.updates_per_round[s]``)."""
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    M = schedule.microbatches
    per = schedule.updates_per_round
    ops = []
    for wops in schedule.ops:
        lst = []
        for r in range(rounds):
            for op in wops:
                if op.kind in ("AR", "STEP"):
                    lst.append(
                        Op(op.kind, op.stage, op.microbatch, op.version, op.step + r * per[op.stage], op.weights_worker)
                    )
                else:
                    lst.append(
                        Op(
                            op.kind,
                            op.stage,
                            op.microbatch + r * M,
                            op.version + r * per[op.stage],
                            op.step,
                            op.weights_worker,
                        )
                    )
        ops.append(lst)
    return Schedule(
        schedule.name,
        schedule.num_stages,
        schedule.num_workers,
        M * rounds,
        tuple(tuple(lst) for lst in ops),
        schedule.stage_workers,
        schedule.update,
        schedule.microbatches_per_step,
        None,
        dict(schedule.options),
    )


def _round_spacing(starts: Sequence[float]) -> float:
    d = np.diff(np.asarray(sorted(starts), dtype=float))
    if len(d) == 0:
        raise ValueError("need at least two rounds to measure their spacing")
    return float(np.median(d))


def _machine_model(stages: StageProfile, replicas: list[int], link: dict | None, level: str = "stage"):
    """(profile, plan, flat topology or None, latency ms) of a calibration: the stage profile at
    ``level`` as a plan with ``replicas`` per stage, on the measured link (None: free)."""

    if level == "stage":
        prof, plan = stages.as_profile("stage"), Plan.from_boundaries(list(range(len(stages.bounds))), replicas)
    else:
        prof, plan = stages.as_profile("layer"), Plan.from_boundaries([z for _, z in stages.bounds], replicas)
    topo = Topology.flat(plan.num_workers, link["bandwidth_bytes_per_s"]) if link else None
    return prof, plan, topo, max(0.0, float(link["latency_ms"])) if link else 0.0


def in_flight(stages: StageProfile, link: dict | None, replicas: Sequence[int] | None = None) -> list[int]:
    """The communication-aware 1F1B warm-up per stage (:meth:`CostModel.in_flight`, the figure a
    :class:`~workbench.cost.plan.Plan` reports) of a calibrated machine: the measured stage compute on
    the measured link (its latency and per-message CPU time). Pass it as a 1F1B schedule's
    ``warmup`` option (``pipedream``, ``pipedream-flush``)."""

    prof, plan, topo, lat = _machine_model(stages, list(replicas or [1] * len(stages.bounds)), link)
    cm = CostModel.from_profile(
        prof, topo, latency_ms=lat, message_cpu_ms=float(link.get("message_cpu_ms", 0.0)) if link else 0.0
    )
    return cm.in_flight(plan)


def modeled_step_ms(
    schedule: Schedule,
    stages: StageProfile,
    link: dict | None = None,
    op_overhead_ms: float = 0.0,
    rounds: int = 6,
    *,
    overlap_comm: bool = True,
    level: str = "stage",
    allreduce: dict | None = None,
    allreduce_buckets=None,
    microbatches: int | None = None,
) -> float:
    """Steady-state modeled ms per round: simulate :func:`repeat_rounds` with the profile at the
    microbatch size (``microbatch_fraction=1``), per-stage ``step_ms`` (``step_copy_ms`` for the
    STEPs that keep a stashed version), a flat topology at the link bandwidth plus ``latency_ms``
    per message and the link's ``message_cpu_ms`` at each end, if measured (``link=None``:
    communication free), the all-reduce of ``allreduce`` (:func:`measure_allreduce`: its measured
    times, interpolated; None: the link's ring) in ``allreduce_buckets`` (DDP's, for dp-bsp), ``overlap_comm`` (the all-reduce overlaps
    the backward or runs after it) and ``op_overhead_ms`` per op; return the median spacing of the
    rounds' first op starts. ``level``: compute costs from the stage-level timings (default) or the
    per-layer profile. ``microbatches``: per round (default the schedule's); a stream
    (``train(stream=True)``) is modeled as the schedule over several rounds' microbatches, ``rounds=1``,
    and ``microbatches`` = one round's."""

    if len(stages.bounds) != schedule.num_stages:
        raise ValueError(f"the stage profile has {len(stages.bounds)} stages, the schedule {schedule.num_stages}")
    prof, plan, topo, lat = _machine_model(stages, [len(ws) for ws in schedule.stage_workers], link, level)
    ar = (
        dict(
            allreduce_bandwidth=allreduce["bandwidth_bytes_per_s"],
            allreduce_latency_ms=max(0.0, float(allreduce["latency_ms"])),
            allreduce_curve=allreduce if "ms" in allreduce else None,
        )
        if allreduce and topo
        else {}
    )
    if allreduce_buckets is not None and topo:
        ar["allreduce_buckets"] = allreduce_buckets
    res = simulate(
        repeat_rounds(schedule, rounds),
        profile=prof,
        plan=plan,
        topology=topo,
        step_ms=list(stages.step_ms),
        step_copy_ms=list(stages.step_copy_ms) or None,
        microbatch_fraction=1.0,
        latency_ms=lat,
        op_overhead_ms=op_overhead_ms,
        overlap_comm=overlap_comm,
        message_cpu_ms=float(link.get("message_cpu_ms", 0.0)) if link else 0.0,
        **ar,
    )
    comp = res.compute
    M = microbatches or schedule.microbatches
    first = comp[comp.kind != "STEP"].assign(r=lambda d: d.microbatch // M).groupby("r").start.min()
    return _round_spacing(first.to_numpy())


def measured_step_ms(timeline: pd.DataFrame, skip: int = 2) -> float:
    """Steady-state measured ms per round from a runtime ``timeline.csv`` (columns ``step``,
    ``start``...): the median spacing of the rounds' first op starts, after ``skip`` rounds."""
    tl = timeline[timeline["round"] >= timeline["round"].min() + skip]
    return _round_spacing(tl.groupby("round").start.min().to_numpy())


def solve_overhead(predict: Callable[[float], float], target_ms: float, hi: float = 10.0, tol: float = 1e-4) -> float:
    """The ``o >= 0`` with ``predict(o) = target_ms`` by bisection (``predict`` non-decreasing in
    ``o``). Returns 0 when even ``predict(0) >= target_ms`` (nothing left to attribute to overhead);
    raises ValueError when ``predict(hi) < target_ms``."""
    if not math.isfinite(target_ms) or target_ms <= 0:
        raise ValueError(f"target_ms must be a positive number, got {target_ms!r}")
    if predict(0.0) >= target_ms:
        return 0.0
    if predict(hi) < target_ms:
        raise ValueError(f"even an overhead of {hi} ms per op predicts less than {target_ms} ms; raise hi")
    lo = 0.0
    while hi - lo > tol:
        mid = (lo + hi) / 2
        if predict(mid) < target_ms:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2

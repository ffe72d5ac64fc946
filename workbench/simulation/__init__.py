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
  buckets) it may start as soon as every replica *started* the backward just before it in its op
  list and cannot end before every replica finished that backward, and the compute stream does not
  wait for it, only the matching ``STEP`` does (exposed time ``max(0, AR - B)``,
  :meth:`~workbench.cost.model.CostModel.exposed_allreduce_ms`); with ``overlap_comm=False`` it starts
  after the backward and the worker blocks until it ends;
* ``STEP(s, t)`` waits for the worker's ``AR(s, t)`` when there is one, and (master family) for
  the weight gradients that B/BW ops of stage ``s`` with ``version == t`` computed on other workers
  push to it (``send_wgrad``, the stage's parameter bytes, on the link to the owner).

Costs
-----
Unit costs: forward ``fwd``, backward ``bwd`` (numbers, or one number per stage); with split
backward ``BI = BW = bwd / 2``; ``STEP = step_ms``; all-reduce ``allreduce`` (default 0),
activation/gradient transfer between different workers ``transfer`` (default 0), weight fetch
``weight_fetch`` (default 0).

Profile costs (``profile=``, optional ``plan=``, ``topology=``), all in ms, every one a method of
the one :class:`~workbench.cost.model.CostModel` (which the partitioner's plans use too):

* compute of stage ``s`` = ``f · Σ fwd_ms`` (``bwd_ms`` for B) over the stage's layers, where
  ``f`` (:func:`default_microbatch_fraction`) is the microbatch's share of the profile's
  minibatch: schedules that split a minibatch into ``m`` microbatches (GPipe, Flush, 2BW) run
  ``m`` ops of ``1/m`` the size; override with ``microbatch_fraction=``. Without a plan the
  stages are :meth:`Plan.even <workbench.cost.plan.Plan.even>` (the runtime's default split too);
* split backward: ``BI``/``BW`` from the profile's ``bwd_input_ms``/``bwd_weight_ms`` columns when
  it has them (measured: :func:`workbench.runtime.calibration.machine.stage_profile`), else ``bwd_ms / 2`` each;
* transfer across the cut after stage ``s`` between workers ``a != b``:
  ``f · act_bytes[last layer of s] / bandwidth_between(a, b)``;
* all-reduce of stage ``s`` over its ``r`` replicas (ring): ``2 (r - 1) / r · P_s / B_min``
  with ``P_s`` the stage's parameter bytes and ``B_min`` the slowest link in the ring;
* weight fetch of stage ``s`` from worker ``a`` to ``b``: ``P_s / bandwidth_between(a, b)``;
* a weight tied across stages (the profile's ``meta["tied"]``, e.g. GPT-2's input and output
  embedding): the STEP of every owning stage also pays the ring all-reduce of its bytes among the
  owners' workers (:func:`~workbench.simulation.costs.tied_allreduce_ms`), as the runtime combines them.

Overlapped pairs (DeepSeek-V3's DualPipe)
-----------------------------------------
``alltoall=a`` gives every F, B and BI of stage s an in-op all-to-all of ``a[s]`` (expert
parallelism's dispatch and combine inside a chunk), which the op's compute stream waits for: an op
alone takes ``c + a``. A schedule that lists overlapped F/B pairs
(:meth:`Schedule.overlapped_pairs <workbench.schedules.core.Schedule.overlapped_pairs>`, e.g.
``dualpipev``) runs each pair as one unit in which the all-to-all of one op proceeds while the other
computes: the pair takes ``c_F + c_B + max(0, a_F - c_B) + max(0, a_B - c_F)``
(:func:`~workbench.simulation.edges.exposed_alltoall`); ``overlap_pairs=False`` charges the same
order back to back. An op's compute row shows its compute; the exposed part follows it as an
``alltoall`` row on the comm lane (the op's outputs leave when it ends) and is reported in
``alltoall_exposed``. Point-to-point transfers need no pairing to be hidden: they run on link
channels beside the compute stream for every schedule (above).

Time per minibatch (``SimResult.time_per_minibatch_ms``): the steady-state completion rate of
microbatches (:func:`steady_state`, warm-up and drain excluded) divided by ``f``, so that every
schedule reports ms per *profile minibatch* (:mod:`workbench.cost.model` defines it once).

Fixed costs (both default 0, calibrated by :mod:`workbench.runtime.calibration.machine`; ``latency_ms`` may be one
number per topology level):

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

from collections.abc import Sequence
from typing import Any

from workbench.cost.model import CostOptions
from workbench.cost.topology import Topology
from workbench.schedules import build, gc_paused
from workbench.schedules.core import Schedule
from workbench.simulation.costs import (
    COMM_KINDS,
    KIND_CODES,
    KIND_NAMES,
    STAT_COLUMNS,
    TIMELINE_COLUMNS,
    CommKind,
    default_microbatch_fraction,
    simulation_costs,
)
from workbench.simulation.edges import EdgeKind, OpGraph, build_graph
from workbench.simulation.engine import CommRow, sweep
from workbench.simulation.options import SimOptions
from workbench.simulation.result import SimResult, assemble, steady_state


# ---------------------------------------------------------------------------------------------
# the simulator
# ---------------------------------------------------------------------------------------------
def simulate(
    schedule: Schedule,
    fwd: float | Sequence[float] = 1.0,
    bwd: float | Sequence[float] = 2.0,
    *,
    profile=None,
    plan=None,
    topology=None,
    options: SimOptions | None = None,
    **keywords: Any,
) -> SimResult:
    """Simulate ``schedule`` and return its timeline and metrics.

    Unit costs by default (``fwd``, ``bwd`` per stage or one number); with ``profile`` the costs
    come from the profile, ``plan`` (stage layer ranges) and ``topology`` (bandwidths) as described
    in the package docstring. Everything else is an option (:class:`SimOptions`, with the cost
    model's calibration in :class:`~workbench.cost.model.CostOptions`), given as ``options=`` or as
    flat keywords, which override ``options``: ``allreduce``, ``transfer``, ``weight_fetch`` and
    ``step_ms`` (unit costs; 0 by default); ``latency_ms`` (per message between workers) and
    ``op_overhead_ms`` (per F/B/BI/BW/STEP op), fixed costs in either mode (package docstring,
    "Fixed costs"); ``step_copy_ms`` (per stage or one number; default ``step_ms``): the cost of a
    STEP that writes new tensors because the version it replaces is still read
    (:meth:`Schedule.stashing_steps`, as the runtime decides); the others update in place at
    ``step_ms``; ``allreduce_bandwidth`` / ``allreduce_latency_ms``: the ring all-reduce's own
    calibration (or ``allreduce_curve``, its measured times, and ``allreduce_buckets``, DDP's
    buckets), ``message_cpu_ms`` the CPU time of a message at each end (profile costs only);
    ``alltoall`` (per stage or one number, in either mode): the in-op all-to-all of every F, B and
    BI (package docstring, "Overlapped pairs"); ``overlap_pairs=False`` charges the schedule's
    overlapped pairs back to back; ``overlap_comm`` (default True): all-reduces overlap the
    backward before them; ``microbatch_fraction`` (profile costs).

    Metrics (``result.metrics``), with ``L`` the makespan and ``W`` the workers:

    * ``iteration_time`` = L / steps (steps = most STEP ops of any stage on any worker, >= 1),
      ``steady_iteration_time``: mean spacing of the first worker's STEPs of its first stage;
    * ``time_per_minibatch_ms``: steady-state time per profile minibatch (:func:`steady_state`;
      ``steady_state`` False when the run is too short and the figure is L / minibatches),
      ``throughput_minibatches_per_s`` = 1000 / it, ``throughput_samples_per_s`` = batch size ×
      that (NaN when the profile does not know its batch size), ``minibatches`` = microbatches · f;
      ``time_unit``: "ms" (profile costs) or "unit" (unit costs: the same figures per time unit);
    * ``rho`` = Σ (F, B, BI, BW time) / (L · W), the mean
      compute utilisation (for F = B = 1 it is twice the "Unifying" document's
      ρ = S·B / (L·W), whose bound ``ρ ≤ M/S`` the tests check);
    * ``bubble_fraction[w]`` = 1 − busy_w / L (busy: compute ops incl. STEP), the bubble over the
      whole makespan (GPipe's and PipeDream's definition: a worker's wait before its first op counts);
    * ``span_bubble_fraction[w]`` = 1 − work_w / (last end_w − first start_w) over w's F, B, BI, BW
      ops: the bubble inside the worker's own span, which the zero-bubble papers' schedulers report
      (their bubble rate is its maximum over workers);
    * ``comm_stall[w]``: time worker w's compute stream waited although the producing ops had
      finished (transfers, all-reduces, weight fetches in flight); ``comm_wait_share[w]`` = it / L;
      ``bubble_fraction_mean`` over workers;
    * ``alltoall_exposed[w]``: all-to-all time worker w's compute stream waited for (counted in
      ``comm_stall``, not in ``busy``);
    * ``peak_activations[w]`` (stage-microbatch pairs forwarded but not yet backwarded) and
      ``peak_activation_bytes[w]`` (profile costs only);
    * ``weight_versions[w]``: most versions of one stage alive at once on w (the newest plus every
      version a forwarded microbatch still needs for its backward);
    * ``bytes_per_level``: bytes sent over links of each topology level (profile costs only).
    """
    opts = SimOptions.from_keywords(options, **keywords)
    if not isinstance(schedule, Schedule):
        raise ValueError(f"simulate() needs a workbench.schedules.Schedule, got {type(schedule).__name__}")
    costs = simulation_costs(schedule, fwd, bwd, profile, plan, topology=topology, options=opts)
    return _run(schedule, costs, opts.overlap_comm)


def _run(schedule: Schedule, costs, overlap_comm: bool) -> SimResult:
    """Build the op graph, sweep it, and assemble the timeline and metrics (with the cyclic garbage
    collector paused, as for building: the sweep allocates ~10^5 short-lived objects and no cycles)."""

    with gc_paused():
        graph = build_graph(schedule, costs)
        return assemble(schedule, costs, graph, sweep(graph, costs, overlap_comm, schedule.name))


def simulate_plan(
    plan,
    profile,
    topology=None,
    microbatches: int | None = None,
    *,
    latency_ms=0.0,
    op_overhead_ms: float = 0.0,
    overlap_comm: bool = True,
    allreduce_bandwidth=None,
    allreduce_latency_ms=None,
) -> SimResult:
    """Simulate PipeDream's 1F1B schedule of ``plan`` with the plan's own warm-up (``plan.in_flight``,
    else NOAM) on ``topology`` (default: the topology stored in the plan), ``microbatches``
    minibatches (default: enough for a steady state); the all-reduce calibrated on its own where
    ``allreduce_bandwidth`` / ``allreduce_latency_ms`` are given (:func:`simulate`)."""

    if topology is None:
        topology = plan_topology(plan)
    if microbatches is None:
        microbatches = steady_microbatches(plan)
    sched = build("pipedream", plan, int(microbatches), warmup=list(plan.in_flight) if plan.in_flight else None)
    return simulate(
        sched,
        profile=profile,
        plan=plan,
        topology=topology,
        latency_ms=latency_ms,
        op_overhead_ms=op_overhead_ms,
        overlap_comm=overlap_comm,
        allreduce_bandwidth=allreduce_bandwidth,
        allreduce_latency_ms=allreduce_latency_ms,
    )


def steady_microbatches(plan) -> int:
    """Minibatches for a steady state after 1F1B's warm-up and before its drain: three rounds of the
    input stage's in-flight minibatches (``steady_state`` skips one at each end), at least 32."""
    return max(32, 3 * plan.in_flight_count * plan.stages[0].replicas)


def plan_topology(plan):
    """The :class:`~workbench.cost.topology.Topology` a plan was partitioned for (``plan.meta``), or None."""

    levels = (plan.meta or {}).get("topology")
    if not levels:
        return None
    return Topology(tuple((int(c), float(b)) for c, b in levels), name=(plan.meta or {}).get("topology_name", ""))


__all__ = [
    "simulate",
    "SimOptions",
    "CostOptions",
    "simulate_plan",
    "steady_microbatches",
    "plan_topology",
    "SimResult",
    "steady_state",
    "default_microbatch_fraction",
    "KIND_CODES",
    "KIND_NAMES",
    "COMM_KINDS",
    "CommKind",
    "CommRow",
    "EdgeKind",
    "TIMELINE_COLUMNS",
    "STAT_COLUMNS",
    "OpGraph",
]

"""PipeDream's hardware claims, each on its own setting: data-parallel communication calibrated on
the papers' data-parallel measurements only, every PipeDream-side number then predicted.

Two versions of the paper report numbers on different machines (:data:`SETTINGS`):

* arXiv v1 (Harlap et al. 2018, arXiv:1806.03377): machines with **one GPU each**, Caffe workers,
  data parallelism through a sharded parameter server over ZeroMQ with wait-free backpropagation.
  Cluster-A: Titan X, 25 Gbps; Cluster-B: V100 (AWS p3.2xlarge), 10 Gbps (faster GPUs on a slower
  network).
* SOSP'19 (Narayanan et al.): servers of 4 V100 over PCIe with 10 Gbps between them (Cluster-A),
  8 V100 with NVLink and 25 Gbps (Cluster-B), one Titan X per server at 40 Gbps (Cluster-C);
  PyTorch with NCCL/Gloo data parallelism.

**One model of data parallelism, the workbench's one cost model** (:class:`~workbench.cost.model.CostModel`):
a round of ``m`` replicas runs the forward, then the backward bucket by bucket (DDP's gradient
buckets of the protocol's size, :func:`repro.dp_overhead.bucket_plan`), each
bucket's ring all-reduce ``2 (m−1)/m · w_b / B_AR + 2 (m−1) α_AR`` queued once its backward has
ended (:meth:`CostModel.bucketed_round_ms`, :func:`ddp_round`: the closed form of the simulated
``dp-bsp`` round that Fig. 1 reads, tested equal). Compute comes from PipeDream's published V100
profiles at the per-GPU minibatch PipeDream's runtime trains each model with (VGG-16: 64, its
graph.txt profiled at 128; recorded in ``data/pipedream/runtime_configs.json``), on a Titan X scaled
by the peak FLOP/s ratio (:data:`GPU_ALIAS`), both applied with :meth:`Profile.scaled` so that the
node DAG PipeDream's optimizer plans on is scaled alike; or from roofline projections.
Point-to-point links (a pipeline's activations and gradients) run at the setting's nominal rates.
The all-reduce's own parameters (the cost model's ``allreduce_bandwidth`` and
``allreduce_latency_ms``) come from:

* SOSP settings (PyTorch DDP over NCCL): the protocol (``data/protocol.toml``), fixed from
  published sources before any claim: each link class's efficiency (at most 1) and step latency;
  **nothing is fitted**, every SOSP number is a prediction;
* arXiv settings (Caffe workers, a sharded parameter server): the exchange's effective bandwidth
  ``B_AR`` and per-step latency ``α_AR``, fitted to the arXiv paper's data-parallel numbers only,
  inside their physical range (:func:`physical_bounds`: no faster than TCP on the machines' link).

Fitting (:func:`fit_group`) minimises the squared log errors of the in-sample numbers: BSP speedups
and communication shares (as ``1 − share``, the compute share, so that a share and a speedup weigh
alike). The PipeDream-side numbers are then predicted with no further fitting: the workbench
partitioner's plan on the setting's topology (``Plan.predicted_ms``, PipeDream 1F1B in the same cost
model), its speedup over one GPU and over BSP, straight pipelines, and the bytes each configuration
sends. Table 1's speedups are time to target accuracy: the modeled throughput ratio times the ratio
of epochs the protocol takes from the paper (``time_to_target``), each factor in the row's
explanation. Every row of ``claims.csv`` says ``fit`` (``in-sample``, ``out-of-sample``, ``none``),
its ``comparison`` and the ``protocol`` entries it used. A row more than 25% off names its cause in
its own numbers (:func:`_cause`): BSP's round (all-reduce against the backward it overlaps), the
plan's bottleneck, and on the SOSP settings the scale of the protocol's all-reduce bandwidth at
which the model would give the paper's number (:func:`eta_needed`, a diagnostic).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import torch
from torch import nn

from repro import dp_overhead as dpo
from repro import lr_grid as lg
from repro import protocol
from repro.common import (
    LazyRows,
    LazyTable,
    claim,
    fit_summary,
    paper_source,
    paper_value,
    read_data,
    save_table,
    with_interval,
)
from repro.pages import save_page
from workbench import schedules
from workbench.cost import GBPS, CostModel, Plan, Topology
from workbench.models import sequence
from workbench.partitioning import partition, pipedream_optimizer
from workbench.profiling import GPUS, Profile, analyze, authors_batch, authors_config, profiled_batch, project, shipped
from workbench.simulation import simulate

EXPERIMENT = "02_dp_communication_overhead"


@dataclass(frozen=True)
class Setting:
    """One paper's hardware: GPUs per machine, the links (nominal), the data-parallel system, the
    free parameters of its calibration and where the description comes from."""

    key: str
    title: str
    paper: str
    gpus_per_machine: int
    gpu: str
    inter_bytes_s: float
    intra_bytes_s: float | None
    dp_system: str
    free: str  # "bandwidth+latency" (its own two, fitted) or "none" (the protocol's links, nothing fitted)
    group: str
    source: str

    def topology(self, workers: int) -> Topology:
        """``workers`` GPUs at the links' nominal rates (``gpus_per_machine`` per machine)."""
        per = self.gpus_per_machine
        if per == 1 or workers > per:
            levels = [(per, float(self.intra_bytes_s or self.inter_bytes_s))] if per > 1 else []
            levels.append((math.ceil(workers / per), self.inter_bytes_s))
        else:
            levels = [(workers, float(self.intra_bytes_s or self.inter_bytes_s))]
        return Topology(tuple(levels), name=f"{self.key}x{workers}")

    def collective(self, topology: Topology, params: dict) -> dict:
        """The data-parallel all-reduce: the cost model's ``allreduce_bandwidth`` /
        ``allreduce_latency_ms`` (every level), the links untouched. Calibrated ``params`` for the
        arXiv parameter server; on the SOSP settings the protocol's efficiency and step latency of
        each link class (:func:`repro.protocol.collective`; ``params["efficiency"]``,
        1 in every modeled row, scales the efficiencies for :func:`eta_needed`'s diagnostic)."""
        if self.free == "bandwidth+latency":
            return dict(allreduce_bandwidth=params["bandwidth"], allreduce_latency_ms=params["latency_ms"])
        c = protocol.collective(self.key, topology.bandwidths, efficiency_scale=params.get("efficiency", 1.0))
        return dict(allreduce_bandwidth=c["allreduce_bandwidth"], allreduce_latency_ms=c["allreduce_latency_ms"])

    def pricing(self, topology: Topology, params: dict) -> dict:
        """The cost model's keywords of the one price of a replicated stage on ``topology``
        (:meth:`CostModel.replicated_stage_ms`): :meth:`collective` with DDP's buckets
        (``ddp.bucket_bytes``) each all-reduced once its backward has ended (``ddp.allreduce_ready``).
        The partitioner's candidates, the plan's prediction and data parallelism's round
        (:func:`ddp_round`) all take it, so a plan of one stage on every GPU is data parallelism."""
        return dict(
            self.collective(topology, params),
            allreduce_ready=str(protocol.value("ddp.allreduce_ready")),
            bucket_cap_bytes=float(dpo.ddp_bucket_bytes()),
        )

    def protocol_keys(self, topology: Topology) -> tuple[str, ...]:
        """The protocol entries this setting's data-parallel model reads on ``topology``."""
        keys = ("ddp.bucket_bytes", "ddp.allreduce_ready")
        if self.free == "bandwidth+latency":  # fitted, inside physical_bounds
            return keys + ("links.ethernet.payload_efficiency", "parameter_server.max_step_latency_ms")
        classes = protocol.link_classes(self.key)[: len(topology.bandwidths)]
        return keys + tuple(f"links.{c}.{x}" for c in classes for x in ("efficiency", "step_latency_ms"))


def load_settings(name: str = "settings.csv") -> dict[str, Setting]:
    """The papers' hardware settings from ``data/<name>``: one row per setting; links in Gbit/s between
    machines (``inter_Gbps``) and GB/s inside one (``intra_GBps``, empty for one GPU per machine), and
    ``source``, where in the paper the description comes from."""
    out = {}
    for r in read_data(name):
        out[r["key"]] = Setting(
            key=r["key"],
            title=r["title"],
            paper=r["paper"],
            gpus_per_machine=int(r["gpus_per_machine"]),
            gpu=r["gpu"],
            inter_bytes_s=int(r["inter_Gbps"]) * GBPS,
            intra_bytes_s=int(r["intra_GBps"]) * 1e9 if r["intra_GBps"] else None,
            dp_system=r["dp_system"],
            free=r["free"],
            group=r["group"],
            source=r["source"],
        )
    return out


#: The papers' settings by key (``data/settings.csv``, read on first use).
SETTINGS: Mapping[str, Setting] = LazyTable(load_settings)
#: The setting whose ``paper`` names each version of the paper (``ARXIV``, ``SOSP``: module attributes read on first use).
VERSION_SETTINGS = {"ARXIV": "arxiv-A", "SOSP": "sosp-A"}


def __getattr__(name: str) -> str:
    if name in VERSION_SETTINGS:
        return SETTINGS[VERSION_SETTINGS[name]].paper
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- the paper's numbers --------------------------------------------------------------------
@dataclass(frozen=True)
class PaperNumber:
    """One number a paper states. ``quantity``: ``bsp_speedup`` (over one GPU), ``comm_share`` (BSP's
    share of time communicating, %), ``fig1_max_share`` (the highest BSP share over Fig. 1's models at
    ``workers`` GPUs, %), ``pipedream_speedup`` (over one GPU), ``pipedream_over_bsp``,
    ``straight_speedup`` (straight pipeline over one GPU), ``pipedream_over_hybrid`` (PipeDream's
    configuration pipelined against the same stages run one minibatch at a time, intra-batch parallelism:
    the stages' and cuts' times add up instead of overlapping), ``comm_reduction`` (PipeDream's bytes per
    minibatch below BSP's, %), ``pipedream_over_mp_min`` / ``_max`` (PipeDream over model parallelism,
    the lowest / highest over :data:`FIG1_MODELS`), ``pipedream_over_gpipe`` (PipeDream's 1F1B over GPipe
    on the same straight plan, the highest over the models PipeDream's runtime runs straight; both
    :func:`intra_batch`). ``role``: ``dp`` numbers calibrate (in-sample), ``predict`` numbers are
    predicted (out-of-sample)."""

    setting: str
    model: str
    workers: int
    quantity: str
    paper: float
    role: str
    where: str
    stand_in: str = ""
    paper_config: str = ""


def load_paper_numbers(name: str = "paper_numbers.csv") -> tuple[PaperNumber, ...]:
    """The papers' numbers from ``data/<name>``, in file order: one row per number, with its paper's
    version (``paper_version``) and ``source`` (table, figure or section; :attr:`PaperNumber.where`)."""
    return tuple(
        PaperNumber(
            setting=r["setting"],
            model=r["model"],
            workers=int(r["workers"]),
            quantity=r["quantity"],
            paper=float(r["paper"]),
            role=r["role"],
            where=r["source"],
            stand_in=r["stand_in"],
            paper_config=r["paper_config"],
        )
        for r in read_data(name)
    )


#: The papers' numbers in file order (``data/paper_numbers.csv``, read on first use).
PAPER: Sequence[PaperNumber] = LazyRows(load_paper_numbers)

QUANTITY_TEXT = {
    "bsp_speedup": ("BSP speedup over 1 GPU", "x"),
    "comm_share": ("BSP share of time communicating", "%"),
    "pipedream_speedup": ("PipeDream speedup over 1 GPU", "x"),
    "pipedream_over_bsp": ("PipeDream speedup over data parallelism to target accuracy", "x"),
    "straight_speedup": ("straight pipeline speedup over 1 GPU", "x"),
    "pipedream_over_hybrid": ("PipeDream speedup over hybrid parallelism (its configuration, not pipelined)", "x"),
    "comm_reduction": ("PipeDream's communication below data parallelism's", "%"),
    "comm_reduction_bound": ("PipeDream's communication below data parallelism's, more than", "%"),
    "stall_reduction": ("PipeDream's communication stall time below data parallelism's", "%"),
    "pipedream_over_mp_min": ("PipeDream speedup over model parallelism, lowest over the models", "x"),
    "pipedream_over_mp_max": ("PipeDream speedup over model parallelism, highest over the models", "x"),
    "pipedream_over_gpipe": ("PipeDream speedup over GPipe on PipeDream's straight configuration", "x"),
}
#: Quantities over several models (a range or a maximum the paper states), not one model's number.
AGGREGATE_QUANTITIES = ("pipedream_over_mp_min", "pipedream_over_mp_max", "pipedream_over_gpipe")
#: Fig. 1's models, all with PipeDream's published V100 profiles; its V100 panels (Cluster-A and -B)
#: calibrate (its 1080 Ti panel would need roofline profiles of every model).
FIG1_MODELS = ("alexnet", "vgg16", "resnet50", "gnmt", "gnmt_large")


# ---- profiles -------------------------------------------------------------------------------
#: The profiler's GPU for a setting's GPU: the Titan X (Pascal) is the 1080 Ti's GP102 chip.
GPU_ALIAS = {"Titan X": "1080Ti"}
SHIPPED_V100 = ("vgg16", "resnet50", "alexnet", "inception_v3", "gnmt", "gnmt_large")


@cache
def model_profile(model: str, gpu: str = "V100") -> Profile:
    """``model``'s profile on ``gpu``: PipeDream's published GPU profile where one ships (measured on
    V100; at the per-GPU minibatch PipeDream's runtime trains the model with, VGG-16's 64 where its
    graph.txt was profiled at 128, :func:`workbench.profiling.pipedream.authors_batch`; on another GPU its
    compute scaled by the peak FLOP/s ratio of :data:`workbench.profiling.measure.GPUS`; both through
    :meth:`Profile.scaled`, so the node DAG PipeDream's optimizer reads is scaled alike),
    else the workbench's roofline projection (:mod:`repro.dp_overhead`): AWD-LM, and
    S2VT's stand-in, its published architecture (:func:`workbench.models.sequence.s2vt`: two LSTMs of
    1000 over 80 steps, VGG-16 fc7 features embedded to 500, 500-d words, a 13k vocabulary)."""

    target = GPU_ALIAS.get(gpu, gpu)
    if model in SHIPPED_V100:
        k = GPUS["V100"]["flops"] / GPUS[target]["flops"]
        profiled, runs = profiled_batch(model), authors_batch(model)
        samples = runs / profiled if runs and profiled else 1.0
        how = f", at {runs} per GPU as PipeDream's runtime runs it (profiled at {profiled})" if samples != 1 else ""
        how += f", compute x{k:.3g} for {gpu} (peak FLOP/s ratio)" if k != 1 else ""
        prof = shipped(model).scaled(compute=k, samples=samples, note=how)
        return Profile(prof.layers, {**prof.meta, "model": model, "batch_size": runs or profiled})
    if model == "s2vt":
        vocab, steps, b = (int(protocol.value(f"stand_ins.s2vt_{k}")) for k in ("vocab", "steps", "batch"))
        prof = project(s2vt_analysis(vocab, steps, b).copy(), target, batch_size=b)
        meta = {
            "model": "s2vt (published architecture, roofline stand-in)",
            "source": f"workbench.project(s2vt, {gpu})",
        }
        return Profile(prof.layers, {**prof.meta, **meta})
    name = {"gnmt": "gnmt8", "gnmt_large": "gnmt16"}.get(model, model)
    return dpo.projected_profile(name, dpo.analyses([name])[name], target)


@cache
def s2vt_analysis(vocab: int, steps: int, batch: int):
    """``analyze`` of S2VT's published architecture (meta device) at a vocabulary, frame count and
    per-GPU minibatch: all it reads, so it is counted once per size (kept when the caches drop);
    :func:`model_profile` projects a copy."""
    with torch.device("meta"):
        net = nn.Sequential(*sequence.s2vt(vocab_size=vocab)[0])
    x = (torch.empty(batch, steps, 4096, device="meta"), torch.zeros(batch, steps, dtype=torch.long, device="meta"))
    return analyze(net, x, batch_size=batch)


def _profile_for(setting: Setting, model: str) -> Profile:
    return model_profile(model, setting.gpu)


# ---- the model --------------------------------------------------------------------------------
def bsp(setting: Setting, model: str, workers: int, params: dict, profile: Profile | None = None) -> dict:
    """BSP (data parallelism) in the calibrated cost model: speedup over one GPU and the share of
    a round the GPU waits on communication, ``1 − (F + B) / round`` (``profile``: another profile of
    ``model`` than the setting's, :func:`fig1_token_sensitivity`)."""
    prof = profile if profile is not None else _profile_for(setting, model)
    r = ddp_round(setting, prof, workers, params)
    per_minibatch = r["round_ms"] / workers
    single = float(prof.total_ms)
    return dict(speedup=single / per_minibatch, share=100.0 * r["exposed_ms"] / r["round_ms"], round=r)


def ddp_round(setting: Setting, prof: Profile, workers: int, params: dict) -> dict:
    """One data-parallel round on ``workers`` GPUs of ``setting`` (:func:`dp_overhead.ddp_round`, the
    one model of data parallelism) over the setting's all-reduce (:meth:`Setting.collective`)."""
    topo = setting.topology(workers)
    return dpo.ddp_round(prof, topo, workers, setting.collective(topo, params))


_PLANS: dict[tuple, Plan] = {}


def pipedream_plan(setting: Setting, model: str, workers: int, params: dict, straight: bool = False) -> Plan:
    """The workbench partitioner's plan (PipeDream 1F1B) on the calibrated topology; planned once per
    setting, model, GPU count and parameters (several claims and the scaling figure read one plan)."""
    key = (setting.key, model, workers, straight, tuple(sorted(params.items())))
    if key not in _PLANS:
        prof = _profile_for(setting, model)
        topo = setting.topology(workers)
        _PLANS[key] = partition(prof, topo, straight=straight, **setting.pricing(topo, params))
    return _PLANS[key]


def straight_models(workers: int) -> tuple[str, ...]:
    """The models of :data:`FIG1_MODELS` that PipeDream's runtime runs as a straight pipeline (one GPU
    per stage) on ``workers`` GPUs (:func:`workbench.profiling.pipedream.authors_config`): the models
    GPipe, which cannot replicate a stage, can run with PipeDream's partition (GNMT-8 and GNMT-16)."""
    return tuple(m for m in FIG1_MODELS if set((authors_config(m, workers) or "2").split("-")) == {"1"})


_INTRA: dict[tuple, dict] = {}


def intra_batch(setting: Setting, model: str, workers: int, params: dict) -> dict:
    """PipeDream against the intra-batch schemes SOSP §5 compares it with on ``workers`` GPUs, in the
    calibrated cost model:

    * ``over_mp``: model parallelism, the best straight plan run one minibatch at a time (its stages'
      and cuts' times add up, :meth:`CostModel.plan_times`), against PipeDream's plan
      (:func:`pipedream_plan`, ``Plan.predicted_ms``).
    * ``over_gpipe``: GPipe with PipeDream's partition, the best straight plan, flushing every
      ``M = k S`` microbatches (the protocol's ``baselines.gpipe_microbatches_per_stage`` k: GPipe's
      own rule, the PipeDream papers do not state their M), against PipeDream's 1F1B on the same
      plan (with the plan's communication-aware in-flight count, ``Plan.in_flight``, as notebook 03
      runs PipeDream); both simulated (``workbench.simulate`` steady state), so only the schedule
      differs."""

    key = (setting.key, model, workers, tuple(sorted(params.items())))
    if key in _INTRA:
        return _INTRA[key]
    prof = _profile_for(setting, model)
    topo = setting.topology(workers)
    cost = setting.collective(topo, params)
    plan = pipedream_plan(setting, model, workers, params)
    straight = pipedream_plan(setting, model, workers, params, straight=True)
    stage_ms, cut_ms = CostModel.from_profile(prof, topo, **setting.pricing(topo, params)).plan_times(straight)
    mp_ms = sum(stage_ms) + sum(cut_ms)
    S = straight.num_stages
    gpipe = simulate(
        schedules.build("gpipe", straight, protocol.gpipe_microbatches(S), steps=4),
        profile=prof,
        plan=straight,
        topology=topo,
        **cost,
    )
    # the plan's in-flight count as 1F1B's warm-up
    warmup: dict[str, Any] = dict(warmup=list(straight.in_flight)) if straight.in_flight else {}
    pd_straight = simulate(
        schedules.build("pipedream", straight, 16 * S, weights="stash", **warmup),
        profile=prof,
        plan=straight,
        topology=topo,
        **cost,
    )
    single = float(prof.total_ms)
    gpipe_ms, pd_ms = (
        math.nan if r.time_per_minibatch_ms is None else r.time_per_minibatch_ms for r in (gpipe, pd_straight)
    )
    _INTRA[key] = out = dict(
        config="-".join(str(s.replicas) for s in plan.stages),
        straight_config="-".join(str(s.replicas) for s in straight.stages),
        pipedream_ms=plan.predicted_ms,
        mp_ms=mp_ms,
        mp_speedup=single / mp_ms,
        over_mp=mp_ms / plan.predicted_ms,
        gpipe_ms=gpipe_ms,
        pipedream_straight_ms=pd_ms,
        over_gpipe=gpipe_ms / pd_ms,
    )
    return out


def bytes_per_minibatch(plan: Plan, profile: Profile) -> float:
    """Bytes a plan puts on the network per minibatch: ``2 a`` per cut (activation and gradient)
    plus each replicated stage's ring all-reduce, ``2 (r−1)/r · w`` per minibatch. One stage on
    every worker: data parallelism's ``2 (W−1)/W · |w|``."""
    act = profile.layers["act_bytes"].to_numpy(float)
    par = profile.layers["param_bytes"].to_numpy(float)
    total = sum(2.0 * act[s.last] for s in plan.stages[:-1])
    for s in plan.stages:
        total += 2.0 * (s.replicas - 1) / s.replicas * par[s.first : s.last + 1].sum()
    return float(total)


def predict(num: PaperNumber, params: dict) -> tuple[float, str]:
    """Our value of ``num`` under the calibrated ``params`` and the configuration behind it."""
    setting = SETTINGS[num.setting]
    q, m = num.quantity, num.workers
    if q in ("bsp_speedup", "comm_share"):
        r = bsp(setting, num.model, m, params)
        return (r["speedup"] if q == "bsp_speedup" else r["share"]), f"1 stage x {m}"
    if q in ("pipedream_over_mp_min", "pipedream_over_mp_max", "pipedream_over_gpipe"):
        key = "over_gpipe" if q == "pipedream_over_gpipe" else "over_mp"
        models = straight_models(m) if q == "pipedream_over_gpipe" else FIG1_MODELS
        per = {mo: intra_batch(setting, mo, m, params) for mo in models}
        mo = (min if q == "pipedream_over_mp_min" else max)(per, key=lambda k: per[k][key])
        shape = "straight_config" if q == "pipedream_over_gpipe" else "config"
        each = ", ".join(f"{k} {v[key]:.2f} ({v[shape]})" for k, v in per.items())
        return per[mo][key], f"{mo}; per model: {each}"
    plan = pipedream_plan(setting, num.model, m, params, straight=q == "straight_speedup")
    shape = "-".join(str(s.replicas) for s in plan.stages)
    if q in ("pipedream_speedup", "straight_speedup"):
        return plan.single_worker_ms / plan.predicted_ms, shape
    if q == "pipedream_over_bsp":
        return plan.single_worker_ms / plan.predicted_ms / bsp(setting, num.model, m, params)["speedup"], shape
    if q == "pipedream_over_hybrid":  # the same stages one minibatch at a time: their times add up
        prof = _profile_for(setting, num.model)
        topo = setting.topology(m)
        stage_ms, cut_ms = CostModel.from_profile(prof, topo, **setting.pricing(topo, params)).plan_times(plan)
        return (sum(stage_ms) + sum(cut_ms)) / max(stage_ms + cut_ms), shape
    if q == "stall_reduction":
        return stall_reduction(setting, num.model, plan, params)
    if q in ("comm_reduction", "comm_reduction_bound"):
        prof = _profile_for(setting, num.model)
        dp_bytes = 2.0 * (m - 1) / m * float(prof.layers["param_bytes"].sum())
        cuts = sum(2.0 * float(prof.layers["act_bytes"].iloc[st.last]) for st in plan.stages[:-1])
        total = bytes_per_minibatch(plan, prof)
        detail = f"{shape}: {total / 1e6:.0f} MB per minibatch ({cuts / 1e6:.0f} MB across cuts) vs BSP's {dp_bytes / 1e6:.0f} MB"
        return 100.0 * (1.0 - total / dp_bytes), detail
    raise ValueError(f"unknown quantity {q!r}; choose one of {sorted(QUANTITY_TEXT)}")


def stall_reduction(setting: Setting, model: str, plan: Plan, params: dict) -> tuple[float, str]:
    """PipeDream's GPU time stalled on communication per minibatch below data parallelism's, %.
    Data parallelism: every GPU waits ``exposed_ms`` per round of one minibatch each, so
    ``exposed_ms`` of GPU time per minibatch (:func:`bsp`). PipeDream: a replica of stage s waits
    ``r_s · stage_ms_s − (F_s + B_s)`` per minibatch (its exposed all-reduce, the one price), plus, where
    a cut is the bottleneck, every GPU the cut's excess over the slowest stage."""
    prof = _profile_for(setting, model)
    workers = sum(s.replicas for s in plan.stages)
    topo = setting.topology(workers)
    cm = CostModel.from_profile(prof, topo, **setting.pricing(topo, params))
    stage_ms, cut_ms = cm.plan_times(plan)
    compute = [cm.stage_fwd_ms(s.first, s.last) + cm.stage_bwd_ms(s.first, s.last) for s in plan.stages]
    ours = sum(max(0.0, s.replicas * t - c) for s, t, c in zip(plan.stages, stage_ms, compute))
    ours += workers * max(0.0, max(cut_ms, default=0.0) - max(stage_ms))
    dp = bsp(setting, model, workers, params)["round"]["exposed_ms"]
    shape = "-".join(str(s.replicas) for s in plan.stages)
    return 100.0 * (1.0 - ours / dp), f"{shape}: {ours:.1f} ms of GPU time stalled per minibatch vs BSP's {dp:.1f} ms"


# ---- calibration ------------------------------------------------------------------------------
def _params(free: str, x) -> dict:
    if free == "bandwidth+latency":
        return dict(bandwidth=float(np.exp(x[0])), latency_ms=float(np.exp(x[1])))
    return dict(efficiency=float(np.exp(x[0])))


def _residual(num: PaperNumber, value: float) -> float:
    """Log error; a share compares as the compute share ``100 − share`` (weighs like a speedup)."""
    if num.quantity == "comm_share":
        value, paper = 100.0 - value, 100.0 - num.paper
    else:
        paper = num.paper
    return float(np.log(max(value, 1e-9) / paper))


def in_sample(group: str) -> list[PaperNumber]:
    """The data-parallel numbers that calibrate ``group``."""
    return [n for n in PAPER if n.role == "dp" and SETTINGS[n.setting].group == group]


def fit_group(group: str) -> dict:
    """Fit ``group``'s free parameters to its in-sample numbers (module docstring): least squares of
    the log errors, from the best point of a coarse grid, inside the physical range
    (:func:`physical_bounds`). A group whose settings are modeled from the protocol alone
    (``free == "none"``) fits nothing: ``efficiency`` 1 (the protocol's efficiencies as they are).
    Returns the parameters and the fit's RMS log error."""
    from scipy.optimize import least_squares

    settings = [s for s in SETTINGS.values() if s.group == group]
    if not settings:
        raise ValueError(f"unknown group {group!r}; groups: {sorted({s.group for s in SETTINGS.values()})}")
    free = settings[0].free
    nums = in_sample(group)
    if free == "none":
        return dict(group=group, free=free, efficiency=1.0, rms_log_error=math.nan, points=0)
    if not nums:
        raise ValueError(f"no data-parallel numbers calibrate {group!r}")

    def residuals(x):
        p = _params(free, x)
        return np.array([_residual(n, predict(n, p)[0]) for n in nums])

    lo, hi = (np.log(b) for b in physical_bounds(group))
    grid = [(b, a) for b in np.linspace(lo[0], hi[0], 9) for a in np.linspace(lo[1], hi[1], 6)]
    start = min(grid, key=lambda x: float(np.sum(residuals(x) ** 2)))
    x = least_squares(residuals, start, bounds=(lo, hi), x_scale=1.0).x
    r = residuals(x)
    return dict(
        group=group, free=free, **_params(free, x), rms_log_error=float(np.sqrt(np.mean(r**2))), points=len(nums)
    )


def physical_bounds(group: str) -> tuple[tuple[float, float], tuple[float, float]]:
    """The physical range of a parameter-server group's (bandwidth B/s, step latency ms):
    ``(lower, upper)`` per parameter. The bandwidth is at most what TCP carries on the slowest
    machine link of the group (the protocol's TCP payload efficiency x its nominal rate); the
    latency is bounded by the protocol's ``parameter_server.max_step_latency_ms``."""
    link = min(s.inter_bytes_s for s in SETTINGS.values() if s.group == group)
    top_bw = float(protocol.value("links.ethernet.payload_efficiency")) * link
    top_lat = float(protocol.value("parameter_server.max_step_latency_ms"))
    return (1e6, 1e-4), (top_bw, top_lat)


@cache
def fitted_params() -> dict[str, dict]:
    """Every group's fitted parameters (cached: the fit is deterministic)."""
    return {g: fit_group(g) for g in sorted({s.group for s in SETTINGS.values()})}


# ---- claims, configurations, figures ----------------------------------------------------------
# ---- why a row is off: causes computed from the row's own numbers ------------------------------
ETA_RANGE = (0.01, 10.0)


def eta_needed(num: PaperNumber, fitted_eta: float = 1.0, rel: float = 0.03, *, epochs: float = 1.0) -> float | None:
    """The scale ``η`` of the protocol's all-reduce bandwidth (every link's efficiency times ``η``;
    a diagnostic, nothing is fitted to it) at which the model gives the paper's number for ``num``: the roots of ``log(ours(η) / paper)`` over :data:`ETA_RANGE` (a log grid of
    13 points, then bisection in ``log η`` to 0.1% on each bracket with a sign change); of those
    within ``rel`` of the paper (a plan change can make ``ours`` jump past the paper's number), the
    one nearest ``fitted_eta``. ``None`` where no ``η`` in the range gives it. ``epochs``: the row's
    epochs ratio, which multiplies a Table 1 row's modeled throughput ratio."""
    f = _eta_gap(num, epochs)
    grid = np.geomspace(*ETA_RANGE, 13)
    vals = [f(e) for e in grid]
    roots = []
    for lo, hi, flo, fhi in zip(grid, grid[1:], vals, vals[1:]):
        if flo == 0 or flo * fhi < 0:
            while hi / lo > 1.001 and flo != 0:
                mid = math.sqrt(lo * hi)
                fmid = f(mid)
                lo, hi, flo = (mid, hi, fmid) if flo * fmid > 0 else (lo, mid, flo)
            roots.append(lo if abs(flo) < abs(f(hi)) else hi)
    good = [r for r in roots if abs(f(r)) < math.log1p(rel)]
    return min(good, key=lambda r: abs(math.log(r / fitted_eta))) if good else None


def _eta_gap(num: PaperNumber, epochs: float = 1.0):
    return lambda eta: math.log(max(epochs * predict(num, dict(efficiency=float(eta)))[0], 1e-12) / num.paper)


def _eta_text(num: PaperNumber, params: dict, epochs: float = 1.0) -> str:
    eta = eta_needed(num, 1.0, epochs=epochs)
    unit = QUANTITY_TEXT[num.quantity][1]
    if eta is not None:
        text = (
            f"a diagnostic, not a fit: the paper's {num.paper:g}{unit} needs the all-reduce at {eta:.3g}x the "
            f"protocol's bus bandwidth on every link ({eta:.3g} x its efficiency{' > 1: faster than the links' if eta * 0.8 > 1 else ''})"
        )
        return text + _known_limit_text(SETTINGS[num.setting], eta)
    ends = [epochs * predict(num, dict(efficiency=e))[0] for e in ETA_RANGE]
    return (
        f"a diagnostic: no scale of the protocol's all-reduce bandwidth in [{ETA_RANGE[0]:g}, {ETA_RANGE[1]:g}] gives "
        f"the paper's {num.paper:g}{unit} (the model gives {ends[0]:.2f}{unit} at {ETA_RANGE[0]:g}x and "
        f"{ends[1]:.2f}{unit} at {ETA_RANGE[1]:g}x)"
    )


def _known_limit_text(setting: Setting, eta: float) -> str:
    """Where a published limit of the setting's provider bears on the rate the paper's number needs
    (the protocol's ``known_limits``): on AWS, one TCP flow's cap against the needed inter-server
    all-reduce rate. Text only; nothing modeled changes."""
    if setting.key not in protocol.value("known_limits.aws_settings") or setting.gpus_per_machine < 1:
        return ""
    modeled = float(protocol.value("links.ethernet.efficiency")) * setting.inter_bytes_s / GBPS
    cap = float(protocol.value("known_limits.aws_single_flow_gbps"))
    return (
        f"; that is {eta * modeled:.1f} Gbps between servers where the protocol gives "
        f"{modeled:.1f}: AWS caps one TCP "
        f"flow at {cap:g} Gbps outside a cluster placement group (2x inside; "
        f"{protocol.source('known_limits.aws_single_flow_gbps').split(':')[0]}), so an all-reduce over one or two "
        "flows per server pair runs at about the rate the paper's number needs"
    )


def _bsp_text(setting: Setting, model: str, m: int, params: dict) -> str:
    """BSP's round in numbers: compute, the all-reduce (and its latency part) against the backward
    it overlaps, and the exposed remainder."""
    prof = _profile_for(setting, model)
    topo = setting.topology(m)
    cm = CostModel.from_profile(prof, topo, **setting.collective(topo, params))
    last = cm.num_layers - 1
    ar = cm.allreduce_ms(prof.total_param_bytes, range(m))
    lat = cm.allreduce_ms(0.0, range(m))
    bwd = cm.stage_bwd_ms(0, last)
    return (
        f"BSP round on {m} GPUs: compute {prof.total_ms:.0f} ms, all-reduce of {prof.total_param_bytes / 1e6:.0f} MB "
        f"{ar:.0f} ms ({lat:.0f} ms of it per-step latency) against a backward of {bwd:.0f} ms, "
        f"{max(0.0, ar - bwd):.0f} ms exposed"
    )


def _plan_text(setting: Setting, model: str, plan: Plan, params: dict) -> str:
    """A plan's bottleneck in numbers: the slowest stage or cut per minibatch against linear
    scaling, and the replicated stage whose all-reduce exceeds its backward most."""
    prof = _profile_for(setting, model)
    topo = setting.topology(plan.num_workers)
    cm = CostModel.from_profile(prof, topo, **setting.collective(topo, params))
    stage_ms, cut_ms = cm.plan_times(plan)
    k = int(np.argmax(stage_ms + cut_ms))
    what = f"stage {k} ({plan.stages[k].replicas} replicas)" if k < len(stage_ms) else f"cut {k - len(stage_ms)}"
    text = (
        f"bottleneck {what} {max(stage_ms + cut_ms):.1f} ms per minibatch vs {prof.total_ms / plan.num_workers:.1f} ms "
        f"at linear scaling of {prof.total_ms:.0f} ms"
    )
    rep = [s for s in plan.stages if s.replicas > 1]
    if rep:  # the bottleneck stage where it is replicated, else the replicated stage with the longest all-reduce
        ar = {s: cm.allreduce_ms(cm.range_sum("param_bytes", s.first, s.last), s.workers) for s in rep}
        st = plan.stages[k] if k < len(stage_ms) and plan.stages[k] in ar else max(rep, key=lambda s: ar[s])
        text += (
            f"; the {st.replicas}-replica stage's all-reduce {ar[st]:.0f} ms ({cm.allreduce_ms(0.0, st.workers):.0f} ms "
            f"of it per-step latency) vs its backward {cm.stage_bwd_ms(st.first, st.last):.0f} ms"
        )
    return text


def _cause(num: PaperNumber, ours: float, params: dict, *, epochs: tuple[float, float] = (1.0, 1.0)) -> str:
    """Why a row is more than 25% off, in the row's own numbers: on SOSP's settings the efficiency
    ``η`` the paper's number needs (:func:`eta_needed`); elsewhere BSP's round or the plan's
    bottleneck, and for the bytes the split between cuts and all-reduces. ``epochs``: a Table 1 row's
    epochs ratio and the paper's configuration's (its straight-pipeline bound reasons with the latter)."""
    setting = SETTINGS[num.setting]
    direction = "above" if ours > num.paper else "below"
    if num.quantity in ("pipedream_over_mp_min", "pipedream_over_mp_max", "pipedream_over_gpipe"):
        return _intra_batch_cause(num, ours, params)
    if num.quantity in ("bsp_speedup", "comm_share"):
        return f"ours {direction} the paper: {_bsp_text(setting, num.model, num.workers, params)}"
    plan = pipedream_plan(setting, num.model, num.workers, params, straight=num.quantity == "straight_speedup")
    parts = [] if setting.group != "sosp" else [_eta_text(num, params, epochs[0])]
    parts = [p for p in parts if p]
    parts.append(f"ours {direction} the paper: {_plan_text(setting, num.model, plan, params)}")
    if num.quantity in ("pipedream_speedup", "straight_speedup") and ours > num.paper:
        parts.append(
            f"the model's pipeline runs at {ours / num.workers:.0%} of linear, the paper measured "
            f"{num.paper / num.workers:.0%}: the real system's per-minibatch overheads (framework, serialization, "
            "stragglers) are not in the model"
        )
    if num.quantity == "pipedream_over_bsp":
        parts.append(_bsp_text(setting, num.model, num.workers, params))
        if num.paper_config == "straight" and ours < num.paper:
            parts.append(_straight_bound_text(setting, num, params, epochs[1]))
    if num.quantity in ("comm_reduction", "comm_reduction_bound"):
        dp = 2.0 * (num.workers - 1) / num.workers * _profile_for(setting, num.model).total_param_bytes
        parts.append(f"the paper's {num.paper:g}% needs under {(1 - num.paper / 100) * dp / 1e6:.0f} MB per minibatch")
    return "; ".join(parts)


def _straight_bound_text(setting: Setting, num: PaperNumber, params: dict, e: float) -> str:
    """What the paper's speedup over data parallelism asks of data parallelism when the paper ran a
    straight pipeline: that pipeline's modeled speed over one GPU ``s`` (at most the GPU count) times
    the epochs ratio ``e``, divided by the paper's number, is the throughput over one GPU its data
    parallelism had; ``s / paper`` is its speed to the target over one GPU (one GPU steps on the
    per-GPU minibatch, as the straight pipeline does)."""
    plan = pipedream_plan(setting, num.model, num.workers, params, straight=True)
    s = plan.single_worker_ms / plan.predicted_ms
    need, most = s * e / num.paper, num.workers * e / num.paper
    text = (
        f"the paper's straight pipeline runs at {s:.2f}x one GPU in this model (at most {num.workers}x at any balance), "
        f"so at the epochs ratio {e:.3g} its {num.paper:g}x needs data parallelism's throughput at {need:.2f}x one GPU's "
        f"(at most {most:.2f}x), where this model's runs at {bsp(setting, num.model, num.workers, params)['speedup']:.2f}x"
    )
    if most < 1:
        return text + f": data parallelism on {num.workers} GPUs slower than one GPU"
    return text + f", and at {s / num.paper:.2f}x one GPU's speed to the target"


def _intra_batch_cause(num: PaperNumber, ours: float, params: dict) -> str:
    """Why a model-parallelism or GPipe ratio is off, in the rows' times: model parallelism's speed
    against one GPU and what the paper's ratio needs of it; GPipe's flush against 1F1B."""
    setting = SETTINGS[num.setting]
    direction = "above" if ours > num.paper else "below"
    if num.quantity == "pipedream_over_gpipe":
        per = {m: intra_batch(setting, m, num.workers, params) for m in straight_models(num.workers)}
        return f"ours {direction} the paper: " + "; ".join(
            f"{m}: GPipe {v['gpipe_ms']:.0f} ms vs 1F1B {v['pipedream_straight_ms']:.0f} ms per minibatch"
            for m, v in per.items()
        )
    per = {m: intra_batch(setting, m, num.workers, params) for m in FIG1_MODELS}
    mo = min(per, key=lambda k: abs(per[k]["over_mp"] - ours))
    v = per[mo]
    need = v["mp_speedup"] * v["over_mp"] / num.paper
    return (
        f"ours {direction} the paper: on {mo} model parallelism runs at {v['mp_speedup']:.2f}x one GPU "
        f"({v['mp_ms']:.0f} ms per minibatch: its stages and cuts add up) and PipeDream's {v['config']} at "
        f"{v['mp_speedup'] * v['over_mp']:.2f}x; the paper's {num.paper:g}x needs model parallelism at {need:.2f}x one "
        "GPU with this PipeDream"
        + (
            ", faster than one GPU, which one minibatch at a time cannot be: the paper's PipeDream ran further below "
            "linear than the model's"
            if need > 1
            else " (its stages' compute alone gives 1x; the cuts' messages, at the nominal PCIe rate here, are the rest)"
        )
    )


_STAND_IN = (
    "stand-in: no S2VT profile exists; S2VT's published architecture (Venugopalan et al., ICCV 2015: two LSTMs of "
    "1000 over 80 steps, fc7 features and words embedded to 500, 150 MB of weights) as the workbench.project roofline "
    "projects it, not the paper's Caffe measurement"
)


def _label(setting: Setting, num: PaperNumber, params: dict) -> str:
    prof = _profile_for(setting, num.model) if num.quantity not in AGGREGATE_QUANTITIES else None
    topo = setting.topology(num.workers)
    models = straight_models(num.workers) if num.quantity == "pipedream_over_gpipe" else FIG1_MODELS
    src = prof.meta.get("source", "?") if prof is not None else f"PipeDream's GPU profiles of {', '.join(models)}"
    if setting.free == "none":
        dp = "data-parallel all-reduce from the protocol's link efficiencies and step latencies, nothing fitted"
    else:
        fitted = ", ".join(f"{k}={v:.4g}" for k, v in params.items() if k in ("bandwidth", "latency_ms"))
        dp = f"data-parallel exchange calibrated on the paper's data-parallel numbers: {fitted}"
    return f"modeled (profile: {src}; topology {topo.describe()} at nominal rates; {dp})"


def claim_rows(
    params_by_group: dict | None = None, *, measured_epochs: dict | None = None, explain: bool = True
) -> tuple[list[dict], pd.DataFrame]:
    """Every :data:`PAPER` number as a ``claims.csv`` row (``fit`` in-sample / out-of-sample), and
    the configurations table: the calibrated model's choice, PipeDream's optimizer's
    (``cost="pipedream"`` on the links at their nominal rates: its formulas have no separate all-reduce
    rate to calibrate) and the paper's where it names one. ``measured_epochs``: the epochs ratios
    measured for the rows :func:`epochs_measured` names, ``{(setting, model): {"ratio", "text"[,
    "paper": the same at the paper's configuration]}}`` (``time_to_accuracy.measured_epochs``); a row
    without one takes the protocol's ratio and says so."""
    fitted = params_by_group or fitted_params()
    rows: list[dict] = []
    configs: dict[tuple, dict] = {}
    # the rows an abstract's "up to" takes its maximum over: (setting, model, GPUs, ours, protocol keys)
    by_quantity: dict[str, list[tuple]] = {}
    for num in PAPER:
        setting = SETTINGS[num.setting]
        params = fitted[setting.group]
        ours, config = predict(num, params)
        text, unit = QUANTITY_TEXT[num.quantity]
        model = f"{num.model} ({num.stand_in} stand-in)" if num.stand_in else num.model
        err = ours / num.paper - 1
        why = [num.where, f"ours: {config}"]
        if num.paper_config:
            why.append(f"paper's configuration {num.paper_config}")
        if num.stand_in:
            why.append(_STAND_IN)
        if explain and num.quantity in ("pipedream_speedup", "pipedream_over_bsp"):
            where = (num.setting, num.model, num.workers)
            conf = configs[where] = configs.get(where) or configuration(num, params, config)
            why.append(
                f"PipeDream's own optimizer on the nominal links: {conf['pipedream_optimizer']}, "
                f"{conf['pipedream_optimizer_speedup_over_dp']:.2f}x over its data-parallel estimate"
            )
        epochs = (1.0, 1.0)  # the row's epochs ratio and the paper's configuration's, for its cause
        if num.quantity == "pipedream_over_bsp":
            ratio_e, source_e, epochs_keys = epochs_ratio(num, measured_epochs)
            at_paper = (measured_for(num, measured_epochs) or {}).get("paper", {})
            epochs = (ratio_e, float(at_paper.get("ratio", ratio_e)))
            why.insert(
                1,
                f"time to target = time per epoch x epochs: the modeled steady-state throughput ratio "
                f"{ours:.3g} x the epochs ratio {ratio_e:.3g} ({source_e})",
            )
            ours *= ratio_e
            err = ours / num.paper - 1
        if explain and (abs(err) > 0.25 or (COMPARISON.get(num.quantity) == "at least" and ours < num.paper)):
            why.append(_cause(num, ours, params, epochs=epochs))
        topo = setting.topology(num.workers)
        keys = setting.protocol_keys(topo)
        if num.quantity == "pipedream_over_bsp":
            keys += epochs_keys
        if num.quantity == "pipedream_over_gpipe":
            keys += ("baselines.gpipe_microbatches_per_stage",)
        if "AWS caps one TCP flow" in " ".join(why):
            keys += ("known_limits.aws_single_flow_gbps",)
        keys += dpo.STAND_IN_KEYS.get(num.model, ())
        if num.quantity in ("pipedream_over_bsp", "comm_reduction", "comm_reduction_bound", "stall_reduction"):
            by_quantity.setdefault(num.quantity.removesuffix("_bound").replace("stall", "comm"), []).append(
                (setting, model, num.workers, ours, keys)
            )
        rows.append(
            claim(
                EXPERIMENT,
                f"{model} {setting.title} {text}, {num.workers} GPUs",
                num.paper,
                ours,
                unit,
                label=_label(setting, num, params),
                explanation="; ".join(why),
                fit="in-sample" if num.role == "dp" else "out-of-sample",
                comparison=COMPARISON.get(num.quantity, "point"),
                protocol=protocol.used(*keys),
            )
        )
    rows += abstract_rows(by_quantity)
    rows += qualitative_rows(fitted["sosp"])
    rows += arxiv_statement_rows(fitted) + untestable_rows()
    return rows, pd.DataFrame(list(configs.values()))


def range_rows(rows: list[dict]) -> list[dict]:
    """Each claim the paper states as a range (:data:`RANGES`: SOSP's "2.6-15x" over model
    parallelism) as one ``range`` row in place of its two ends' rows: ours is the range over the
    models (``low`` the lowest, ``high`` the highest), consistent when it lies inside the paper's."""
    out = list(rows)
    for lo_q, hi_q in RANGES.items():
        lo_text, hi_text = QUANTITY_TEXT[lo_q][0], QUANTITY_TEXT[hi_q][0]
        lows = [r for r in out if lo_text in r["claim"]]
        for lo in lows:
            hi = next((r for r in out if r["claim"] == lo["claim"].replace(lo_text, hi_text)), None)
            if hi is None:
                continue
            row = claim(
                EXPERIMENT,
                lo["claim"].replace(lo_text, "PipeDream speedup over model parallelism, the range over the models"),
                lo["paper"],
                lo["ours"],
                lo["unit"],
                label=lo["label"],
                explanation=f"paper {lo['paper']:g}-{hi['paper']:g}x; ours {lo['ours']:.3g}-{hi['ours']:.3g}x; "
                + lo["explanation"],
                comparison="range",
                paper_high=hi["paper"],
                low=min(lo["low"], hi["low"]),
                high=max(lo["high"], hi["high"]),
                protocol=lo["protocol"],
            )
            out = [row if r is lo else r for r in out if r is not hi]
    return out


#: Each abstract's "up to" claim (``paper_claims.csv`` key): the prefix of its paper's settings'
#: keys, the quantity of the rows it is the maximum of, and the claim's words.
ABSTRACT_CLAIMS = {
    "arxiv_abstract_tta": (
        "arxiv",
        "pipedream_over_bsp",
        "PipeDream up to this much faster in time-to-accuracy than data parallelism (the maximum over its Table 1)",
        "x",
    ),
    "arxiv_abstract_comm": (
        "arxiv",
        "comm_reduction",
        "PipeDream's communication up to this much below data parallelism's (the maximum over its models)",
        "%",
    ),
    "sosp_abstract_tta": (
        "sosp",
        "pipedream_over_bsp",
        "PipeDream up to this much faster in time-to-accuracy than data parallelism (the maximum over its Table 1)",
        "x",
    ),
}


def abstract_rows(by_quantity: dict[str, list[tuple]]) -> list[dict]:
    """Each abstract's "up to" claim as an ``up to`` row: the maximum of its version's rows of that
    quantity (``by_quantity``: ``{quantity: [(setting, model, GPUs, ours, protocol keys)]}`` as
    :func:`claim_rows` computed them; a bound's rows count with their quantity), each listed, so the
    row adds no number of its own."""
    rows = []
    for key, (prefix, quantity, words, unit) in ABSTRACT_CLAIMS.items():
        mine = [t for t in by_quantity.get(quantity, []) if t[0].key.startswith(prefix)]
        if not mine:
            continue
        top = max(mine, key=lambda t: t[3])
        paper = "arXiv v1" if prefix == "arxiv" else "SOSP"
        rows.append(
            claim(
                EXPERIMENT,
                f"{paper} abstract: {words}",
                paper_value(key),
                top[3],
                unit,
                label=f"modeled (the maximum over {len(mine)} {paper} rows of this table, each labeled in its row)",
                explanation=f"{paper_source(key)}; the maximum is {top[1]} on {top[0].title} ({top[2]} GPUs); "
                + ", ".join(f"{m} {s.title} {g} GPUs {v:.3g}{unit}" for s, m, g, v, _ in mine),
                fit="out-of-sample",
                comparison="up to",
                protocol=protocol.used(*sorted({k for t in mine for k in t[4]})),
            )
        )
    return rows


A_NOTES = "seeds/001_2dbdb84593cb38a0.txt"
S_TEXT = "seeds/000_54f0ebaf14fd21aa.txt"
#: Claims the source documents make that nothing here can model: (claim, paper value, unit, where,
#: why untestable). Each is a row with no number of ours (``verdict`` untestable).
UNTESTABLE = (
    ("arXiv v1 notes: PipeDream 1.21x faster than BSP (the third of four speedups)", 1.21, "x",
     f"{A_NOTES}:22", "the notes list 1.45x, 5.12x, 1.21x and 6.76x without naming the model and cluster of the last two"),
    ("arXiv v1 notes: PipeDream 6.76x faster than BSP (the fourth of four speedups)", 6.76, "x",
     f"{A_NOTES}:22", "the notes list 1.45x, 5.12x, 1.21x and 6.76x without naming the model and cluster of the last two"),
    ("PipeDream's data parallelism at least as fast as GeePS", 1.0, "cases", f"{A_NOTES}:224",
     "GeePS is not modeled here, and the comparison's numbers are not in the source documents"),
    ("model parallelism with pipelining outperforms the fastest LARS data-parallel option", 1.0, "cases",
     f"{S_TEXT}:290-294", "LARS's large-minibatch statistical efficiency is not measured here"),
    ("FlexFlow (no pipelining) leaves up to 90% of performance on the table", 90.0, "%", f"{S_TEXT}:339-341",
     "FlexFlow's plans are not modeled here and SOSP §5.3, the experiment, is not in the source documents"),
)  # fmt: skip


def untestable_rows() -> list[dict]:
    """:data:`UNTESTABLE` as rows: the paper's value, no number of ours, the reason."""
    return [
        claim(
            EXPERIMENT,
            text,
            paper,
            math.nan,
            unit,
            label="untestable (no number of ours: the explanation says why)",
            explanation=f"{where}; untestable here: {why}",
            fit="none",
            kind="qualitative" if unit == "cases" else "measured",
        )
        for text, paper, unit, where, why in UNTESTABLE
    ]


def arxiv_statement_rows(fitted: dict) -> list[dict]:
    """The arXiv notes' statements on its own settings, as ``holds`` rows: the best configuration is
    neither data nor model parallelism (each arXiv row's plan; :data:`A_NOTES` line 230), and a lower
    ratio of compute to communication (Cluster-B: faster GPUs, slower network) gives PipeDream a
    larger gain over BSP (lines 219 and 236; VGG-16 and Inception-v3 on 8 machines)."""
    plans = {}
    for n in PAPER:
        if n.setting.startswith("arxiv") and n.quantity in ("pipedream_speedup", "pipedream_over_bsp"):
            s = SETTINGS[n.setting]
            plans[(n.setting, n.model, n.workers)] = pipedream_plan(s, n.model, n.workers, fitted[s.group])
    shape = {k: "-".join(str(st.replicas) for st in p.stages) for k, p in plans.items()}
    neither = {k: p.num_stages > 1 and any(st.replicas > 1 for st in p.stages) for k, p in plans.items()}
    gain = {}
    for model in ("vgg16", "inception_v3"):
        a, b = (
            predict(PaperNumber(k, model, 8, "pipedream_over_bsp", 1.0, "predict", ""), fitted[SETTINGS[k].group])[0]
            for k in ("arxiv-A", "arxiv-B")
        )
        gain[model] = (a, b)
    keys = SETTINGS["arxiv-A"].protocol_keys(SETTINGS["arxiv-A"].topology(8))
    label = "modeled (the arXiv settings' plans and throughput ratios, the one cost model)"
    return [
        claim(EXPERIMENT, "the best configuration is neither data nor model parallelism (arXiv settings' rows)",
              len(plans), sum(neither.values()), "configurations", label=label, comparison="holds",
              explanation=f"{A_NOTES}:230; our plans: " + ", ".join(f"{m} {k} {g} GPUs {shape[(k, m, g)]}"
                                                                      for (k, m, g) in plans),
              protocol=protocol.used(*keys)),
        claim(EXPERIMENT, "a lower compute-to-communication ratio (Cluster-B) gives PipeDream a larger gain over BSP",
              len(gain), sum(b > a for a, b in gain.values()), "models", label=label, comparison="holds",
              explanation=f"{A_NOTES}:219 and :236; throughput over BSP on Cluster-A -> -B, 8 machines: "
              + ", ".join(f"{m} {a:.2f}x -> {b:.2f}x" for m, (a, b) in gain.items()),
              protocol=protocol.used(*keys)),
    ]  # fmt: skip


def qualitative_rows(params: dict, setting: str = "sosp-A", workers: int = 4) -> list[dict]:
    """SOSP's qualitative statements on its own setting (4 GPUs of Cluster-A), as ``holds`` rows over
    Fig. 1's models (:func:`intra_batch`): naive model parallelism (one minibatch at a time) is no
    faster than one GPU; PipeDream's 1F1B has no pipeline flush in steady state, so its simulated
    time per minibatch on the straight plan is the plan's slowest stage or cut (within 1%)."""
    s = SETTINGS[setting]
    per = {m: intra_batch(s, m, workers, params) for m in FIG1_MODELS}
    topo = s.topology(workers)
    label = f"modeled (PipeDream's GPU profiles of {', '.join(FIG1_MODELS)}; topology {topo.describe()}; the one cost model)"
    keys = s.protocol_keys(topo)
    slow = {m: v["mp_speedup"] <= 1.0 + 1e-9 for m, v in per.items()}
    no_flush = {}
    for m in FIG1_MODELS:
        plan = pipedream_plan(s, m, workers, params, straight=True)
        stage_ms, cut_ms = CostModel.from_profile(_profile_for(s, m), topo, **s.collective(topo, params)).plan_times(
            plan
        )
        bottleneck = max(list(stage_ms) + list(cut_ms))
        no_flush[m] = (per[m]["pipedream_straight_ms"], bottleneck)
    flushless = {m: abs(a / b - 1) <= 0.01 for m, (a, b) in no_flush.items()}
    return [
        claim(
            EXPERIMENT,
            f"naive model parallelism is no faster than one GPU ({s.title}, {workers} GPUs)",
            len(per),
            sum(slow.values()),
            "models",
            label=label,
            comparison="holds",
            explanation="SOSP §2 (model parallelism keeps one worker busy at a time); its speed over one GPU: "
            + ", ".join(f"{m} {v['mp_speedup']:.2f}x" for m, v in per.items()),
            protocol=protocol.used(*keys),
        ),
        claim(
            EXPERIMENT,
            f"PipeDream's 1F1B has no pipeline flush in steady state ({s.title}, {workers} GPUs, straight plans)",
            len(no_flush),
            sum(flushless.values()),
            "models",
            label=label,
            comparison="holds",
            explanation="SOSP §3.2; simulated 1F1B time per minibatch against the plan's slowest stage or cut: "
            + ", ".join(f"{m} {a:.1f} vs {b:.1f} ms" for m, (a, b) in no_flush.items()),
            protocol=protocol.used(*keys),
        ),
        in_flight_row(s, workers, params, label),
    ]


def in_flight_row(s: Setting, workers: int, params: dict, label: str) -> dict:
    """SOSP's "PipeDream limits the in-pipeline minibatches to the minimum that keeps the pipeline
    full, reducing memory" (:data:`S_TEXT` lines 128-130) on each Fig. 1 model's plan: the memory of
    all its stages at its own in-flight counts (``Plan.in_flight``) against every stage admitting as many as
    the first. A ``formula`` row: the cost model's memory grows with the in-flight count by
    construction (:func:`workbench.cost.model.stage_memory`), so it checks the formula, not a
    measurement."""
    cm_rows = {}
    topo = s.topology(workers)
    for m in FIG1_MODELS:
        plan = pipedream_plan(s, m, workers, params)
        cm = CostModel.from_profile(_profile_for(s, m), topo, **s.pricing(topo, params))
        k = list(plan.in_flight or cm.in_flight(plan))
        limited = sum(cm.stage_memory_bytes(plan, k))
        unlimited = sum(cm.stage_memory_bytes(plan, [max(k)] * len(k)))
        if len(set(k)) > 1:  # a plan whose stages all admit as many has nothing limited
            cm_rows[m] = (limited, unlimited)
    return claim(
        EXPERIMENT,
        f"limiting the in-flight minibatches per stage reduces memory ({s.title}, {workers} GPUs, PipeDream's plans)",
        len(cm_rows),
        sum(a < b for a, b in cm_rows.values()),
        "models",
        label=label,
        comparison="holds",
        kind="formula",
        explanation=f"{S_TEXT}:128-130; memory of all stages at the plan's in-flight counts vs every stage at the "
        "first stage's (GB): "
        + ", ".join(f"{m} {a / 1e9:.2f} vs {b / 1e9:.2f}" for m, (a, b) in cm_rows.items())
        + "; the model's memory grows with the count by construction (a formula check); the models whose "
        "plan admits as many on every stage, nothing limited, are left out",
        protocol=protocol.used(*s.protocol_keys(topo)),
    )


#: How a quantity's paper words compare (``common.COMPARISONS``): VGG-16's ">90%" fewer bytes is a
#: bound; SOSP §5's "up to 15x" over model parallelism and GPipe's 1.7x are maxima over the models
#: (the abstracts' "up to" claims are :func:`abstract_rows`).
COMPARISON = {
    "comm_reduction_bound": "at least",
    "pipedream_over_hybrid": "up to",  # SOSP: "up to 1.9x" over hybrid parallelism
}
#: A claim stated as a range of two numbers (low quantity, high quantity): one ``range`` row.
RANGES = {"pipedream_over_mp_min": "pipedream_over_mp_max"}


def epochs_key(setting: Setting) -> str:
    """The protocol entry of the epochs ratio PipeDream vs data parallelism in ``setting``'s paper."""
    return "time_to_target.sosp_epochs_ratio" if setting.group == "sosp" else "time_to_target.arxiv_epochs_ratio"


#: The values of ``time_to_target.sosp_unstated``: its present rule (the epochs ratio measured at the
#: configuration of the row's time per epoch) and the one it held before (measured only where the
#: paper's configuration was an arm of the experiment, a straight pipeline; else the figure's ratio).
AT_ROWS_CONFIG = "measured at the row's configuration"
AT_PAPERS_ARM = "measured where the experiment has the configuration"
SOSP_UNSTATED_RULES = (AT_ROWS_CONFIG, AT_PAPERS_ARM)
#: The protocol entries a measured epochs ratio (``time_to_target.sosp_unstated``) reads.
MEASURED_EPOCHS_KEYS = (
    "time_to_target.sosp_unstated",
    "statistical_efficiency.seeds",
    "baselines.dp_global_batch",
    "statistical_efficiency.model",
    "statistical_efficiency.workers",
    "statistical_efficiency.samples_per_update",
    "statistical_efficiency.lr",
    "statistical_efficiency.stage_lr",
    "statistical_efficiency.target",
    "statistical_efficiency.dp_lr_multipliers",
    "statistical_efficiency.dp_lr_rule",
    "statistical_efficiency.dp_epochs",
)


def epochs_measured(num: PaperNumber) -> bool:
    """Whether a Table 1 row's epochs ratio is measured by the statistical-efficiency experiment
    (``time_to_target.sosp_unstated``): a SOSP speedup over data parallelism for a model its
    accuracy-vs-epoch figure does not show, on as many GPUs as the experiment has workers
    (``statistical_efficiency.workers``)."""
    return (
        num.quantity == "pipedream_over_bsp"
        and SETTINGS[num.setting].group == "sosp"
        and num.model not in protocol.value("time_to_target.sosp_epochs_figure_models")
        and num.workers == protocol.value("statistical_efficiency.workers")
    )


def _paper_replicas(num: PaperNumber) -> tuple[int, ...] | None:
    """The paper's configuration as replicas per stage (``straight``: one per GPU), None where it
    names none or it does not use the row's GPUs."""
    if not num.paper_config:
        return None
    if num.paper_config == "straight":
        return (1,) * num.workers
    shape = tuple(int(x) for x in num.paper_config.split("-"))
    return shape if sum(shape) == num.workers else None


def epochs_arms(params_by_group: dict | None = None) -> dict[tuple[str, str], dict]:
    """For every row whose epochs ratio is measured (:func:`epochs_measured`): the configuration of
    its time per epoch (``plan``: the calibrated model's replicas per stage) and the paper's
    (``paper``, or None), keyed by ``(setting, model)``: what the statistical-efficiency experiment
    runs (``time_to_accuracy.measured_epochs``)."""
    fitted = params_by_group or fitted_params()
    out = {}
    for num in PAPER:
        if epochs_measured(num):
            s = SETTINGS[num.setting]
            plan = pipedream_plan(s, num.model, num.workers, fitted[s.group])
            out[(num.setting, num.model)] = dict(
                plan=tuple(st.replicas for st in plan.stages), paper=_paper_replicas(num)
            )
    return out


def epochs_ratio(num: PaperNumber, measured: dict | None = None) -> tuple[float, str, tuple[str, ...]]:
    """A Table 1 row's ratio of epochs to target (data parallelism's over PipeDream's), where it comes
    from, and the protocol entries it read: the paper's figure (arXiv; SOSP's VGG-16 and GNMT-16) or
    the measurement in ``measured`` at the row's configuration (:func:`epochs_measured`; the paper's
    configuration's quoted beside it); a row with no measurement keeps the figure's ratio, said so."""
    setting = SETTINGS[num.setting]
    key = epochs_key(setting)
    ratio, src = float(protocol.value(key)), f"{key}: {protocol.source(key)}"
    if setting.group != "sosp":
        return ratio, src, (key,)
    if num.model in protocol.value("time_to_target.sosp_epochs_figure_models"):
        return ratio, src, (key, "time_to_target.sosp_epochs_figure_models")
    if not epochs_measured(num):
        why = f"SOSP states no epochs for {num.model} and the experiment has {protocol.value('statistical_efficiency.workers')} workers"
        return ratio, f"{key}: {why}, so the figure's ratio stands in", (key, "time_to_target.sosp_unstated")
    m = measured_for(num, measured)
    if m is None:
        return (
            ratio,
            f"{key}, not measured in this call (notebook 02 measures it: time_to_target.sosp_unstated)",
            (key,),
        )
    rule = protocol.value("time_to_target.sosp_unstated")
    if rule not in SOSP_UNSTATED_RULES:
        raise ValueError(f"time_to_target.sosp_unstated must be one of {SOSP_UNSTATED_RULES}, got {rule!r}")
    if rule == AT_PAPERS_ARM:  # the entry's value before it was changed (repro.ledger)
        if num.paper_config != "straight":
            why = f"the paper's configuration {num.paper_config} is no arm of the experiment ({AT_PAPERS_ARM})"
            return ratio, f"{key}: {why}, so the figure's ratio stands in", (key, *MEASURED_EPOCHS_KEYS)
        at = m.get("paper", m)
        return float(at["ratio"]), f"at the paper's configuration ({AT_PAPERS_ARM}), {at['text']}", MEASURED_EPOCHS_KEYS
    text = f"at this row's configuration, {m['text']}"
    if "paper" in m:
        text += f"; at the paper's configuration ({num.paper_config}), {m['paper']['text']}"
    return float(m["ratio"]), text, MEASURED_EPOCHS_KEYS


def measured_for(num: PaperNumber, measured: dict | None) -> dict | None:
    """The measured epochs entry of ``num``'s row (``time_to_accuracy.measured_epochs``) at the
    protocol's present target and seeds (its ``"at"`` variant while :func:`evaluate_at` moves one
    of them to an interval's end); the entry itself where that variant was not measured (a run at
    fewer seeds than the interval's end, or at a target of its own); None where none was measured."""
    m = (measured or {}).get((num.setting, num.model))
    if m is None:
        return None
    key = (
        float(protocol.value("statistical_efficiency.target")),
        tuple(protocol.value("statistical_efficiency.seeds")),
    )
    return (m.get("at") or {}).get(key, m)


_OPTIMIZER_PLANS: dict[tuple, Plan] = {}


def optimizer_plan(setting_key: str, model: str, workers: int) -> Plan:
    """PipeDream's own optimizer's plan of ``model`` on ``workers`` GPUs of the setting's nominal
    links (``cost="pipedream"``); planned once per setting, model and GPU count until the caches
    are dropped (:func:`drop_caches`: the profile reads protocol entries), as every claim row
    evaluation reads the same plans."""
    key = (setting_key, model, workers)
    if key not in _OPTIMIZER_PLANS:
        setting = SETTINGS[setting_key]
        prof = _profile_for(setting, model)
        over = "antichains" if len(prof.layers) < 200 else "layers"  # Inception-v3's DAG has > 20,000 antichains
        _OPTIMIZER_PLANS[key] = partition(
            prof, setting.topology(workers), cost="pipedream", pipedream=pipedream_optimizer.Settings(over=over)
        )
    return _OPTIMIZER_PLANS[key]


def configuration(num: PaperNumber, params: dict, ours: str) -> dict:
    """One row of ``configurations.csv``: replicas per stage chosen by each model, the paper's where
    it names one, and ``authors_runtime``, the configuration PipeDream's runtime ships for the model
    and GPU count (:func:`workbench.profiling.pipedream.authors_config`)."""
    pd_plan = optimizer_plan(num.setting, num.model, num.workers)
    return dict(
        setting=num.setting,
        model=num.model,
        gpus=num.workers,
        calibrated_model=ours,
        pipedream_optimizer="-".join(str(s.replicas) for s in pd_plan.stages),
        pipedream_optimizer_speedup_over_dp=pd_plan.meta["pipedream"]["data_parallel_s"]
        / pd_plan.meta["pipedream"]["pipeline_s"],
        paper=num.paper_config or "not named",
        authors_runtime=authors_config(num.model, num.workers) or "none shipped",
    )


def parameters_table(params_by_group: dict | None = None) -> pd.DataFrame:
    """Each group's data-parallel all-reduce: the fitted parameters (arXiv; with their physical
    bounds and the in-sample numbers they saw) or the protocol's entries (SOSP, nothing fitted)."""
    fitted = params_by_group or fitted_params()
    rows = []
    for g, p in fitted.items():
        fit = p["free"] != "none"
        bounds = physical_bounds(g) if fit else None
        rows.append(
            dict(
                group=g,
                settings=", ".join(s.key for s in SETTINGS.values() if s.group == g),
                free=p["free"],
                bandwidth_GBps=p.get("bandwidth", math.nan) / 1e9,
                bandwidth_max_GBps=bounds[1][0] / 1e9 if bounds else math.nan,
                latency_ms=p.get("latency_ms", math.nan),
                latency_max_ms=bounds[1][1] if bounds else math.nan,
                from_protocol="" if fit else "links.*.efficiency, links.*.step_latency_ms",
                points=p["points"],
                rms_log_error=p["rms_log_error"],
            )
        )
    return pd.DataFrame(rows)


def settings_table() -> pd.DataFrame:
    """Each setting, its data-parallel system and where its description comes from."""
    return pd.DataFrame(
        [
            dict(
                setting=s.key,
                paper=s.paper,
                gpus_per_machine=s.gpus_per_machine,
                gpu=s.gpu,
                inter_Gbps=s.inter_bytes_s / GBPS,
                data_parallelism=s.dp_system,
                calibration=s.free,
                source=s.source,
            )
            for s in SETTINGS.values()
        ]
    )


def fit_figure(claims: pd.DataFrame):
    """Paper (x) vs model (y), log-log, in-sample and out-of-sample marked, with y = x and ±25%."""

    df = claims[np.isfinite(claims["ratio"].astype(float)) & (claims["ours"].astype(float) > 0)]
    fig = go.Figure()
    for fit, symbol in (("in-sample", "circle"), ("out-of-sample", "diamond")):
        d = df[df["fit"] == fit]
        fig.add_scatter(x=d["paper"], y=d["ours"], mode="markers", name=fit, marker=dict(symbol=symbol, size=10),
                        text=d["claim"], hovertemplate="%{text}<br>paper %{x:.3g}, ours %{y:.3g}<extra></extra>")  # fmt: skip
    lo, hi = float(df[["paper", "ours"]].min().min()) / 1.5, float(df[["paper", "ours"]].max().max()) * 1.5
    for k, name, dash in ((1.0, "y = x", "solid"), (1.25, "+25%", "dot"), (0.75, "-25%", "dot")):
        fig.add_scatter(x=[lo, hi], y=[k * lo, k * hi], mode="lines", name=name, line=dict(dash=dash, color="gray"))
    fig.update_layout(
        title="PipeDream's numbers vs the calibrated model (modeled; in-sample = the calibration saw it)",
        xaxis=dict(title="paper", type="log"),
        yaxis=dict(title="ours (modeled)", type="log"),
    )
    return fig


def intra_batch_table(setting: str = "sosp-A", workers: int = 4) -> pd.DataFrame:
    """:func:`intra_batch` for every model of :data:`FIG1_MODELS` on ``setting``'s calibrated links:
    the numbers behind the model-parallelism and GPipe claims (GPipe only where PipeDream's runtime
    runs the model straight, :func:`straight_models`)."""
    s, params = SETTINGS[setting], fitted_params()[SETTINGS[setting].group]
    straight = straight_models(workers)
    rows = []
    for m in FIG1_MODELS:
        v = intra_batch(s, m, workers, params)
        gp = m in straight
        rows.append(
            dict(setting=setting, model=m, gpus=workers, **v)
            | dict(
                gpipe_ms=v["gpipe_ms"] if gp else math.nan,
                pipedream_straight_ms=v["pipedream_straight_ms"] if gp else math.nan,
                over_gpipe=v["over_gpipe"] if gp else math.nan,
                label=f"modeled ({_profile_for(s, m).meta.get('source', '?')}; {s.topology(workers).describe()}, "
                f"calibrated all-reduce; GPipe and straight 1F1B simulated)",
            )
        )
    return pd.DataFrame(rows)


def scaling_table(setting: str = "arxiv-A", model: str = "vgg16", workers=(1, 2, 4, 8, 12, 16)) -> pd.DataFrame:
    """BSP and PipeDream speedup over one GPU against the number of GPUs (modeled, calibrated)."""
    s, params = SETTINGS[setting], fitted_params()[SETTINGS[setting].group]
    rows = []
    for m in workers:
        plan = pipedream_plan(s, model, m, params)
        rows.append(
            dict(
                setting=setting,
                model=model,
                gpus=m,
                bsp=bsp(s, model, m, params)["speedup"] if m > 1 else 1.0,
                pipedream=plan.single_worker_ms / plan.predicted_ms,
                pipedream_config="-".join(str(x.replicas) for x in plan.stages),
            )
        )
    return pd.DataFrame(rows)


def scaling_figure(scaling: pd.DataFrame):
    """Speedup vs GPUs, the model's lines with the paper's points overlaid."""

    setting, model = scaling["setting"].iloc[0], scaling["model"].iloc[0]
    fig = go.Figure()
    for col, quantity in (("bsp", "bsp_speedup"), ("pipedream", "pipedream_speedup")):
        fig.add_scatter(x=scaling["gpus"], y=scaling[col], mode="lines+markers", name=f"{col} (modeled)")
        pts = [n for n in PAPER if n.setting == setting and n.model == model and n.quantity == quantity]
        fig.add_scatter(x=[n.workers for n in pts], y=[n.paper for n in pts], mode="markers", name=f"{col} (paper)",
                        marker=dict(symbol="x", size=12))  # fmt: skip
    fig.add_scatter(
        x=scaling["gpus"], y=scaling["gpus"], mode="lines", name="linear", line=dict(dash="dot", color="gray")
    )
    fig.update_layout(
        title=f"{model} on {SETTINGS[setting].title}: speedup over one GPU (modeled, calibrated links; paper's points)",
        xaxis_title="GPUs",
        yaxis_title="speedup over 1 GPU",
    )
    return fig


def drop_caches() -> None:
    """Forget every profile, fit and plan computed from the protocol (before and after
    :func:`evaluate_at` moves an entry)."""
    model_profile.cache_clear()
    fitted_params.cache_clear()
    _PLANS.clear()
    _INTRA.clear()
    _OPTIMIZER_PLANS.clear()
    dpo.MODELS.load.cache_clear()


def evaluate_at(values: dict, fn, *args, **keywords):
    """``fn(*args, **keywords)`` with the protocol's entries ``values`` in place
    (:func:`repro.protocol.overridden`), from fresh caches."""
    drop_caches()
    try:
        with protocol.overridden(values):
            return fn(*args, **keywords)
    finally:
        drop_caches()


def interval_ends(keys=None) -> list[dict]:
    """Each end of each protocol interval other than the point (:func:`repro.protocol.interval`),
    one entry moved at a time: ``[{key: value}, ...]``; ``keys``: only those entries' (None: all)."""
    out = []
    for key in protocol.intervals():
        if keys is not None and key not in keys:
            continue
        low, point, high = protocol.interval(key)
        out += [{key: end} for end in (low, high) if end != point]
    return out


def ours_at_ends(fn, *args, keys=None, **keywords) -> dict[str, list[float]]:
    """``{claim: [ours at each end of :func:`interval_ends` of ``keys``]}`` of the rows ``fn``
    returns (a list of claim rows, or a tuple whose first item is one)."""
    out: dict[str, list[float]] = {}
    for values in interval_ends(keys):
        rows = evaluate_at(values, fn, *args, **keywords)
        for r in rows[0] if isinstance(rows, tuple) else rows:
            out.setdefault(r["claim"], []).append(float(r["ours"]))
    return out


def rows_with_intervals(*, measured_epochs: dict | None = None) -> tuple[list[dict], pd.DataFrame]:
    """:func:`claim_rows` with each row's interval (ours at every end of :func:`interval_ends` of the
    entries its rows name) and the range claims as one row each (:func:`range_rows`): the rows
    notebook 02 writes."""
    rows, configs = claim_rows(measured_epochs=measured_epochs)
    read = {k for r in rows for k in protocol.parse_used(r.get("protocol", ""))}
    ends = ours_at_ends(claim_rows, measured_epochs=measured_epochs, explain=False, keys=read)
    tasks = task_ends(measured_epochs)
    rows = [with_task_ends(with_interval(r, ends.get(r["claim"], ())), tasks.get(r["claim"], ())) for r in rows]
    return range_rows(rows), configs


#: The second stand-in task's entries a row names when its epochs ratio is also measured there
#: (``time_to_accuracy.second_task``).
TASK_KEYS = lg.LM_ENTRIES


def task_ends(measured_epochs: dict | None) -> dict[str, list[tuple[str, str, float]]]:
    """``{claim: [(task, rule, ours), ...]}``: every row that reads a measured epochs ratio (its
    protocol cell names ``baselines.dp_global_batch``) computed again with each further stand-in
    task's ratios (``measured_epochs[key]["tasks"]``, ``time_to_accuracy.measured_epochs``) in place
    of the first task's, under each rule of ``time_to_target.sosp_unstated`` (the present one and the
    one it held before: the entry's interval). No further task: ``{}``."""
    by_task: dict[str, dict] = {}
    for key, m in (measured_epochs or {}).items():
        for task, entry in (m.get("tasks") or {}).items():
            by_task.setdefault(task, {})[key] = entry
    rule = "time_to_target.sosp_unstated"
    out: dict[str, list[tuple[str, str, float]]] = {}
    for task, measured in by_task.items():
        runs = [(protocol.value(rule), claim_rows(measured_epochs=measured, explain=False)[0])]
        for values in interval_ends({rule}):
            runs.append((values[rule], evaluate_at(values, claim_rows, measured_epochs=measured, explain=False)[0]))
        for name, rows in runs:
            for r in rows:
                if "baselines.dp_global_batch" in protocol.parse_used(r["protocol"]):
                    out.setdefault(r["claim"], []).append((task, name, float(r["ours"])))
    return out


def with_task_ends(row: dict, ends: Sequence[tuple[str, str, float]]) -> dict:
    """``row`` with its interval also over ours on the further stand-in tasks (:func:`task_ends`),
    one clause naming each value and its rule, and its protocol cell naming the second task's
    entries (:data:`TASK_KEYS`). No ends: ``row`` as it is."""
    if not ends:
        return row
    have = protocol.parse_used(row["protocol"])
    extra = protocol.used(*[k for k in TASK_KEYS if k not in have])
    words = "; ".join(f"{v:.3g} ({rule!r})" for _, rule, v in ends)
    tasks = ", ".join(dict.fromkeys(task for task, _, _ in ends))
    why = (
        f"{row['explanation']}; ours with the epochs ratio measured on the second stand-in task ({tasks}: the "
        f"char-level LSTM LM on pydocs, at its own lr and target by the protocol's rule; dp_global_batch.csv) under "
        f"each rule of time_to_target.sosp_unstated: {words}"
    )
    cell = "; ".join(c for c in (row["protocol"], extra) if c)
    low, high = row.get("low", row["ours"]), row.get("high", row["ours"])
    return with_interval(dict(row, explanation=why, protocol=cell), [low, high, *(v for _, _, v in ends)])


def run(out, *, measured_epochs: dict | None = None) -> dict:
    """Calibrate, predict, and write ``settings.csv``, ``calibration_parameters.csv``,
    ``configurations.csv``, ``intra_batch.csv``, ``scaling.csv``,
    ``calibration_errors.csv`` and ``calibration.html`` into ``out``; returns the
    tables and the claim rows (the notebook adds them to its ``claims.csv``)."""

    rows, configs = rows_with_intervals(measured_epochs=measured_epochs)
    claims = pd.DataFrame(rows)
    scaling = scaling_table()
    tables = dict(
        settings=settings_table(),
        calibration_parameters=parameters_table(),
        configurations=configs,
        intra_batch=intra_batch_table(),
        scaling=scaling,
        calibration_errors=fit_summary(claims),
    )
    for name, df in tables.items():
        save_table(df, out, name)
    figs = {"calibration": fit_figure(claims), "scaling": scaling_figure(scaling)}
    save_page(figs, out / "calibration.html", "PipeDream's claims on their own hardware: calibration and predictions")
    return dict(rows=rows, claims=claims, figures=figs, **tables)

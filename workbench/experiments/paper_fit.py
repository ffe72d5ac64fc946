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

**The calibrated model is the workbench's one cost model** (:class:`~workbench.cost.model.CostModel`),
not a new formula: a data-parallel round of ``m`` replicas costs ``F + B + max(0, AR − B)`` with
the ring all-reduce ``AR = 2 (m−1)/m · |w| / B_AR + 2 (m−1) α_AR`` (wait-free backprop: the
all-reduce overlaps the backward that produces its gradients); ``data_parallel_ms`` gives
it per minibatch. Compute comes from PipeDream's published V100 profiles at the per-GPU minibatch
PipeDream's runtime trains each model with (VGG-16: 64, its graph.txt profiled at 128; recorded in
``data/pipedream/runtime_configs.json``), on a Titan X scaled by the peak FLOP/s ratio
(:data:`GPU_ALIAS`), both applied with :meth:`Profile.scaled` so that the node DAG PipeDream's
optimizer plans on is scaled alike; or from roofline projections. Point-to-point links (a pipeline's
activations and gradients) run at the setting's nominal rates. A setting's free parameters (at most
two) are those of its **data-parallel collective** only (the cost model's ``allreduce_bandwidth`` and
``allreduce_latency_ms``):

* arXiv settings: the parameter server's effective bandwidth ``B_AR`` and per-step latency ``α_AR``;
* SOSP settings: one efficiency ``η`` shared by all of them: the all-reduce runs at ``η`` times the
  links' nominal rates (the topology presets of :mod:`workbench.cost.topology`), ``α_AR = 0``.

Fitting (:func:`calibrate`) minimises the squared log errors of the in-sample numbers: BSP speedups
(``speedup = single / data_parallel_ms``) and communication shares (as ``1 − share``, the compute
share, so that a share and a speedup weigh alike). The PipeDream-side numbers are then predicted with
no further fitting: the workbench partitioner's plan on the calibrated topology
(``Plan.predicted_ms``, PipeDream 1F1B in the same cost model), its speedup over one GPU and over
BSP, straight pipelines, and the bytes each configuration sends. Every row of ``claims.csv`` says
``fit``: ``in-sample``, ``out-of-sample`` or ``none``. A row more than 25% off names its cause in its
own numbers (:func:`_cause`): BSP's round (all-reduce against the backward it overlaps), the plan's
bottleneck, and on the SOSP settings the efficiency ``η`` at which the model would give the paper's
number (:func:`eta_needed`, by bisection), beside the fitted one.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from workbench import schedules
from workbench.cost.model import CostModel
from workbench.cost.plan import Plan
from workbench.cost.topology import GBPS, Topology
from workbench.experiments import dp_overhead as dpo
from workbench.experiments.common import claim, fit_summary, read_data, save_table
from workbench.experiments.pages import save_page
from workbench.models import zoo
from workbench.partitioning.dynamic_program import data_parallel_ms
from workbench.partitioning.pipedream_optimizer import Settings as PipeDreamSettings
from workbench.partitioning.search import partition
from workbench.profiling.measure import GPUS, Profile, analyze, project
from workbench.profiling.pipedream import authors_batch, authors_config, profiled_batch, shipped
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
    free: str  # "bandwidth+latency" (its own two) or "efficiency" (one, shared by the group)
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
        """The data-parallel all-reduce under the calibrated ``params``: the cost model's
        ``allreduce_bandwidth`` / ``allreduce_latency_ms`` (every level), the links untouched."""
        if self.free == "bandwidth+latency":
            return dict(allreduce_bandwidth=params["bandwidth"], allreduce_latency_ms=params["latency_ms"])
        return dict(
            allreduce_bandwidth=[b * params["efficiency"] for b in topology.bandwidths], allreduce_latency_ms=0.0
        )


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


SETTINGS = load_settings()
#: The two versions of the paper, as the settings name them.
ARXIV, SOSP = SETTINGS["arxiv-A"].paper, SETTINGS["sosp-A"].paper


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


PAPER = load_paper_numbers()

QUANTITY_TEXT = {
    "bsp_speedup": ("BSP speedup over 1 GPU", "x"),
    "comm_share": ("BSP share of time communicating", "%"),
    "fig1_max_share": ("highest data-parallel communication share (Fig. 1 models)", "%"),
    "pipedream_speedup": ("PipeDream speedup over 1 GPU", "x"),
    "pipedream_over_bsp": ("PipeDream speedup over data parallelism", "x"),
    "straight_speedup": ("straight pipeline speedup over 1 GPU", "x"),
    "pipedream_over_hybrid": ("PipeDream speedup over hybrid parallelism (its configuration, not pipelined)", "x"),
    "comm_reduction": ("PipeDream's communication below data parallelism's", "%"),
    "pipedream_over_mp_min": ("PipeDream speedup over model parallelism, lowest over the models", "x"),
    "pipedream_over_mp_max": ("PipeDream speedup over model parallelism, highest over the models", "x"),
    "pipedream_over_gpipe": ("PipeDream speedup over GPipe on PipeDream's straight configuration", "x"),
}
#: Quantities over several models (a range or a maximum the paper states), not one model's number.
AGGREGATE_QUANTITIES = ("fig1_max_share", "pipedream_over_mp_min", "pipedream_over_mp_max", "pipedream_over_gpipe")
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
    else the workbench's roofline projection (:mod:`workbench.experiments.dp_overhead`): AWD-LM, and
    S2VT's stand-in, an LSTM encoder-decoder of S2VT's size (2+2 LSTM layers of 1000, a 13k
    vocabulary, 80 steps)."""

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
        net = zoo.build("gnmt", "paper", device="meta", vocab_size=13000, hidden=1000, num_layers=2, seq_len=80)
        prof = project(analyze(net, batch_size=32), target, batch_size=32)
        return Profile(prof.layers, {**prof.meta, "model": "s2vt (LSTM encoder-decoder stand-in)"})
    name = {"gnmt": "gnmt8", "gnmt_large": "gnmt16"}.get(model, model)
    return dpo.projected_profile(name, dpo.analyses([name])[name], target)


def _profile_for(setting: Setting, model: str) -> Profile:
    return model_profile(model, setting.gpu)


# ---- the model --------------------------------------------------------------------------------
def bsp(setting: Setting, model: str, workers: int, params: dict, profile: Profile | None = None) -> dict:
    """BSP (data parallelism) in the calibrated cost model: speedup over one GPU and the share of
    a round the GPU waits on communication, ``1 − (F + B) / round`` (``profile``: another profile of
    ``model`` than the setting's, :func:`fig1_token_sensitivity`)."""
    prof = profile if profile is not None else _profile_for(setting, model)
    topo = setting.topology(workers)
    cm = CostModel.from_profile(prof, topo, **setting.collective(topo, params))
    per_minibatch = data_parallel_ms(prof, topo, cm)
    single = float(prof.total_ms)
    return dict(speedup=single / per_minibatch, share=100.0 * (1.0 - single / (workers * per_minibatch)))


_PLANS: dict[tuple, Plan] = {}


def pipedream_plan(setting: Setting, model: str, workers: int, params: dict, straight: bool = False) -> Plan:
    """The workbench partitioner's plan (PipeDream 1F1B) on the calibrated topology; planned once per
    setting, model, GPU count and parameters (several claims and the scaling figure read one plan)."""
    key = (setting.key, model, workers, straight, tuple(sorted(params.items())))
    if key not in _PLANS:
        prof = _profile_for(setting, model)
        topo = setting.topology(workers)
        _PLANS[key] = partition(prof, topo, straight=straight, **setting.collective(topo, params))
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
    * ``over_gpipe``: GPipe with PipeDream's partition, the best straight plan, flushing every ``S``
      microbatches (as many inputs in flight as PipeDream's 1F1B keeps on an ``S``-stage pipeline),
      against PipeDream's 1F1B on the same plan; both simulated (``workbench.simulate`` steady
      state), so only the schedule differs."""

    key = (setting.key, model, workers, tuple(sorted(params.items())))
    if key in _INTRA:
        return _INTRA[key]
    prof = _profile_for(setting, model)
    topo = setting.topology(workers)
    cost = setting.collective(topo, params)
    plan = pipedream_plan(setting, model, workers, params)
    straight = pipedream_plan(setting, model, workers, params, straight=True)
    stage_ms, cut_ms = CostModel.from_profile(prof, topo, **cost).plan_times(straight)
    mp_ms = sum(stage_ms) + sum(cut_ms)
    S = straight.num_stages
    gpipe = simulate(schedules.build("gpipe", straight, S, steps=4), profile=prof, plan=straight, topology=topo, **cost)
    pd_straight = simulate(
        schedules.build("pipedream", straight, 16 * S, weights="stash"),
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


def fig1_shares(num: PaperNumber, params: dict, profiles: dict | None = None) -> dict[tuple[str, str], float]:
    """BSP's share of time communicating for each of Fig. 1's models on each multi-GPU server of
    ``num``'s group at ``num.workers`` GPUs, keyed ``(model, setting)`` (``profiles``: model ->
    another profile to use)."""
    profiles = profiles or {}
    setting = SETTINGS[num.setting]
    return {
        (mo, s.key): bsp(s, mo, num.workers, params, profiles.get(mo))["share"]
        for s in SETTINGS.values()
        if s.group == setting.group and s.gpus_per_machine > 1
        for mo in FIG1_MODELS
    }


def predict(num: PaperNumber, params: dict) -> tuple[float, str]:
    """Our value of ``num`` under the calibrated ``params`` and the configuration behind it."""
    setting = SETTINGS[num.setting]
    q, m = num.quantity, num.workers
    if q == "fig1_max_share":
        (mo, key), v = max(fig1_shares(num, params).items(), key=lambda kv: kv[1])
        return v, f"{mo} on {key}"
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
        stage_ms, cut_ms = CostModel.from_profile(prof, topo, **setting.collective(topo, params)).plan_times(plan)
        return (sum(stage_ms) + sum(cut_ms)) / max(stage_ms + cut_ms), shape
    if q == "comm_reduction":
        prof = _profile_for(setting, num.model)
        dp_bytes = 2.0 * (m - 1) / m * float(prof.layers["param_bytes"].sum())
        cuts = sum(2.0 * float(prof.layers["act_bytes"].iloc[st.last]) for st in plan.stages[:-1])
        total = bytes_per_minibatch(plan, prof)
        detail = f"{shape}: {total / 1e6:.0f} MB per minibatch ({cuts / 1e6:.0f} MB across cuts) vs BSP's {dp_bytes / 1e6:.0f} MB"
        return 100.0 * (1.0 - total / dp_bytes), detail
    raise ValueError(f"unknown quantity {q!r}; choose one of {sorted(QUANTITY_TEXT)}")


# ---- calibration ------------------------------------------------------------------------------
def _params(free: str, x) -> dict:
    if free == "bandwidth+latency":
        return dict(bandwidth=float(np.exp(x[0])), latency_ms=float(np.exp(x[1])))
    return dict(efficiency=float(np.exp(x[0])))


def _residual(num: PaperNumber, value: float) -> float:
    """Log error; a share compares as the compute share ``100 − share`` (weighs like a speedup)."""
    if num.quantity in ("comm_share", "fig1_max_share"):
        value, paper = 100.0 - value, 100.0 - num.paper
    else:
        paper = num.paper
    return float(np.log(max(value, 1e-9) / paper))


def in_sample(group: str) -> list[PaperNumber]:
    """The data-parallel numbers that calibrate ``group``."""
    return [n for n in PAPER if n.role == "dp" and SETTINGS[n.setting].group == group]


def fit_group(group: str) -> dict:
    """Fit ``group``'s free parameters to its in-sample numbers (module docstring): least squares of
    the log errors, from the best point of a coarse grid. Returns the parameters and the fit's RMS
    log error."""
    from scipy.optimize import least_squares, minimize_scalar

    nums = in_sample(group)
    if not nums:
        raise ValueError(
            f"no data-parallel numbers calibrate {group!r}; groups: {sorted({s.group for s in SETTINGS.values()})}"
        )
    free = SETTINGS[nums[0].setting].free

    def residuals(x):
        p = _params(free, x)
        return np.array([_residual(n, predict(n, p)[0]) for n in nums])

    if free == "bandwidth+latency":
        grid = [(b, a) for b in np.log(np.geomspace(1e7, 1e11, 9)) for a in np.log(np.geomspace(1e-3, 1e2, 6))]
        start = min(grid, key=lambda x: float(np.sum(residuals(x) ** 2)))
        x = least_squares(residuals, start, x_scale=1.0).x
    else:
        res = minimize_scalar(
            lambda t: float(np.sum(residuals([t]) ** 2)), bounds=(np.log(1e-3), np.log(10.0)), method="bounded"
        )
        x = np.array([res.x])
    r = residuals(x)
    return dict(
        group=group, free=free, **_params(free, x), rms_log_error=float(np.sqrt(np.mean(r**2))), points=len(nums)
    )


@cache
def fitted_params() -> dict[str, dict]:
    """Every group's fitted parameters (cached: the fit is deterministic)."""
    return {g: fit_group(g) for g in sorted({s.group for s in SETTINGS.values()})}


# ---- Fig. 1's maximum and the sentence length of the GNMT profiles ------------------------------
def profiled_tokens(model: str) -> float | None:
    """Tokens per sample (sentence length) a translation profile was measured at: its first
    embedding's output bytes over (minibatch x embedding width x 4 B); ``None`` without an embedding."""
    prof = model_profile(model)
    for module, act in zip(prof.layers["module"], prof.layers["act_bytes"]):
        found = re.match(r"Embedding\((\d+), (\d+)", str(module))
        if found:
            return float(act) / (float(prof.meta["batch_size"]) * int(found.group(2)) * 4.0)
    return None


@cache
def fig1_token_sensitivity() -> pd.DataFrame:
    """The SOSP calibration again with GNMT-8's profile at GNMT-16's sentence length.

    PipeDream's two GNMT profiles were taken at different sentence lengths (:func:`profiled_tokens`:
    GNMT-8 at 24 tokens, GNMT-16 at 50), and Fig. 1's highest share, which fits ``η``, is GNMT-8's
    in the model: its compute per minibatch is that of short sentences while its parameters are not.
    Here GNMT-8's compute and activations are scaled to GNMT-16's length (compute taken as
    proportional to tokens, :meth:`Profile.scaled`), ``η`` is fitted to Fig. 1 again, and every SOSP
    number is predicted with it: how much of each SOSP gap the short sentences explain. **Modeled**;
    a sensitivity, not the calibration the claims use. Empty where no Fig. 1 number calibrates."""
    from scipy.optimize import minimize_scalar

    fig1 = [n for n in in_sample("sosp") if n.quantity == "fig1_max_share"]
    t8, t16 = profiled_tokens("gnmt"), profiled_tokens("gnmt_large")
    if not fig1 or not t8 or not t16:
        return pd.DataFrame()
    aligned = {"gnmt": model_profile("gnmt").scaled(samples=t16 / t8, note=f", at {t16:.0f}-token sentences")}

    def max_share(eta: float) -> float:
        return max(fig1_shares(fig1[0], dict(efficiency=eta), aligned).values())

    res = minimize_scalar(
        lambda t: _residual(fig1[0], max_share(float(np.exp(t)))) ** 2,
        bounds=(np.log(ETA_RANGE[0]), np.log(ETA_RANGE[1])),
        method="bounded",
    )
    fitted, eta = fitted_params()["sosp"], dict(efficiency=float(np.exp(res.x)))
    rows = []
    for n in PAPER:
        if SETTINGS[n.setting].group != "sosp" or n.role != "predict":
            continue
        ours, again = predict(n, fitted)[0], predict(n, eta)[0]
        rows.append(
            dict(
                setting=n.setting,
                model=n.model,
                quantity=n.quantity,
                workers=n.workers,
                paper=n.paper,
                gnmt8_tokens=t8,
                gnmt16_tokens=t16,
                eta_fitted=fitted["efficiency"],
                ours=ours,
                ratio=ours / n.paper,
                eta_gnmt8_at_gnmt16_tokens=eta["efficiency"],
                ours_gnmt8_at_gnmt16_tokens=again,
                ratio_gnmt8_at_gnmt16_tokens=again / n.paper,
                label="modeled (sensitivity: the SOSP calibration with GNMT-8's profile scaled to GNMT-16's "
                "sentence length; the claims use the profiles as published)",
            )
        )
    return pd.DataFrame(rows)


@cache
def _fig1_fitted_on() -> str:
    """``"<model> on <setting>"``: whose Fig. 1 share the fitted SOSP ``η`` rests on."""
    fig1 = next(n for n in in_sample("sosp") if n.quantity == "fig1_max_share")
    return predict(fig1, fitted_params()["sosp"])[1]


def _tokens_text(num: PaperNumber) -> str:
    """For a SOSP number: what GNMT-8's short profiled sentences explain of its gap
    (:func:`fig1_token_sensitivity`), where Fig. 1's fitted maximum is GNMT-8's; else ``""``."""
    df = fig1_token_sensitivity()
    if df.empty or not _fig1_fitted_on().startswith("gnmt on"):
        return ""
    row = df[(df["setting"] == num.setting) & (df["model"] == num.model) & (df["quantity"] == num.quantity)]
    if row.empty:
        return ""
    r = row.iloc[0]
    return (
        f"Fig. 1's fitted maximum is GNMT-8's, whose profile has {r.gnmt8_tokens:.0f}-token sentences "
        f"(GNMT-16's {r.gnmt16_tokens:.0f}); with GNMT-8 at {r.gnmt16_tokens:.0f} tokens eta fits to "
        f"{r.eta_gnmt8_at_gnmt16_tokens:.2f} and this row gives {r.ours_gnmt8_at_gnmt16_tokens:.2f} "
        f"({r.ratio_gnmt8_at_gnmt16_tokens:.2f} of the paper's; fig1_sensitivity.csv)"
    )


# ---- claims, configurations, figures ----------------------------------------------------------
# ---- why a row is off: causes computed from the row's own numbers ------------------------------
ETA_RANGE = (0.01, 10.0)


def eta_needed(num: PaperNumber, fitted_eta: float = 1.0, rel: float = 0.03) -> float | None:
    """The all-reduce efficiency ``η`` (SOSP's free parameter) at which the model gives the paper's
    number for ``num``: the roots of ``log(ours(η) / paper)`` over :data:`ETA_RANGE` (a log grid of
    13 points, then bisection in ``log η`` to 0.1% on each bracket with a sign change); of those
    within ``rel`` of the paper (a plan change can make ``ours`` jump past the paper's number), the
    one nearest ``fitted_eta``. ``None`` where no ``η`` in the range gives it."""
    f = _eta_gap(num)
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


def _eta_gap(num: PaperNumber):
    return lambda eta: math.log(max(predict(num, dict(efficiency=float(eta)))[0], 1e-12) / num.paper)


def _eta_text(num: PaperNumber, params: dict) -> str:
    fitted = params.get("efficiency", math.nan)
    eta = eta_needed(num, fitted)
    unit = QUANTITY_TEXT[num.quantity][1]
    if eta is not None:
        return (
            f"paper's {num.paper:g}{unit} needs eta={eta:.3g} (the all-reduce at {eta:.0%} of the nominal links), "
            f"fitted eta={fitted:.2f} from Fig. 1"
        )
    ends = [predict(num, dict(efficiency=e))[0] for e in ETA_RANGE]
    return (
        f"paper's {num.paper:g}{unit}: none in [{ETA_RANGE[0]:g}, {ETA_RANGE[1]:g}] (the model gives "
        f"{ends[0]:.2f}{unit} at eta={ETA_RANGE[0]:g} and {ends[1]:.2f}{unit} at eta={ETA_RANGE[1]:g}; fitted "
        f"eta={fitted:.2f} from Fig. 1)"
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


def _cause(num: PaperNumber, ours: float, params: dict) -> str:
    """Why a row is more than 25% off, in the row's own numbers: on SOSP's settings the efficiency
    ``η`` the paper's number needs (:func:`eta_needed`); elsewhere BSP's round or the plan's
    bottleneck, and for the bytes the split between cuts and all-reduces."""
    setting = SETTINGS[num.setting]
    if num.quantity == "fig1_max_share":
        return f"Fig. 1's highest share is {ours:.0f}% against the paper's {num.paper:.0f}%"
    direction = "above" if ours > num.paper else "below"
    if num.quantity in ("pipedream_over_mp_min", "pipedream_over_mp_max", "pipedream_over_gpipe"):
        return _intra_batch_cause(num, ours, params)
    if num.quantity in ("bsp_speedup", "comm_share"):
        return f"ours {direction} the paper: {_bsp_text(setting, num.model, num.workers, params)}"
    plan = pipedream_plan(setting, num.model, num.workers, params, straight=num.quantity == "straight_speedup")
    parts = [] if setting.group != "sosp" else [_eta_text(num, params), _tokens_text(num)]
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
    if num.quantity == "comm_reduction":
        dp = 2.0 * (num.workers - 1) / num.workers * _profile_for(setting, num.model).total_param_bytes
        parts.append(f"the paper's {num.paper:g}% needs under {(1 - num.paper / 100) * dp / 1e6:.0f} MB per minibatch")
    return "; ".join(parts)


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
    "stand-in: no S2VT profile exists; an LSTM encoder-decoder of S2VT's size (workbench.project roofline) "
    "has a different compute-to-parameter ratio than the paper's Caffe S2VT, so its data-parallel share differs"
)


def _label(setting: Setting, num: PaperNumber, params: dict) -> str:
    prof = _profile_for(setting, num.model) if num.quantity not in AGGREGATE_QUANTITIES else None
    topo = setting.topology(num.workers)
    models = straight_models(num.workers) if num.quantity == "pipedream_over_gpipe" else FIG1_MODELS
    src = prof.meta.get("source", "?") if prof is not None else f"PipeDream's GPU profiles of {', '.join(models)}"
    fitted = ", ".join(f"{k}={v:.4g}" for k, v in params.items() if k in ("bandwidth", "latency_ms", "efficiency"))
    return f"modeled (profile: {src}; topology {topo.describe()} at nominal rates; data-parallel all-reduce calibrated: {fitted})"


def claim_rows(params_by_group: dict | None = None) -> tuple[list[dict], pd.DataFrame]:
    """Every :data:`PAPER` number as a ``claims.csv`` row (``fit`` in-sample / out-of-sample), and
    the configurations table: the calibrated model's choice, PipeDream's optimizer's
    (``cost="pipedream"`` on the links at their nominal rates: its formulas have no separate all-reduce
    rate to calibrate) and the paper's where it names one."""
    fitted = params_by_group or fitted_params()
    rows: list[dict] = []
    configs: dict[tuple, dict] = {}
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
        if num.quantity in ("pipedream_speedup", "pipedream_over_bsp"):
            where = (num.setting, num.model, num.workers)
            conf = configs[where] = configs.get(where) or configuration(num, params, config)
            why.append(
                f"PipeDream's own optimizer on the nominal links: {conf['pipedream_optimizer']}, "
                f"{conf['pipedream_optimizer_speedup_over_dp']:.2f}x over its data-parallel estimate"
            )
        if abs(err) > 0.25:
            why.append(_cause(num, ours, params))
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
            )
        )
    return rows, pd.DataFrame(list(configs.values()))


def configuration(num: PaperNumber, params: dict, ours: str) -> dict:
    """One row of ``configurations.csv``: replicas per stage chosen by each model, the paper's where
    it names one, and ``authors_runtime``, the configuration PipeDream's runtime ships for the model
    and GPU count (:func:`workbench.profiling.pipedream.authors_config`)."""
    setting = SETTINGS[num.setting]
    prof = _profile_for(setting, num.model)
    topo = setting.topology(num.workers)
    over = "antichains" if len(prof.layers) < 200 else "layers"  # Inception-v3's DAG has > 20,000 antichains
    pd_plan = partition(prof, topo, cost="pipedream", pipedream=PipeDreamSettings(over=over))
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
    """The fitted parameters per group, with the in-sample numbers they saw."""
    fitted = params_by_group or fitted_params()
    rows = []
    for g, p in fitted.items():
        rows.append(
            dict(
                group=g,
                settings=", ".join(s.key for s in SETTINGS.values() if s.group == g),
                free=p["free"],
                bandwidth_GBps=p.get("bandwidth", math.nan) / 1e9,
                latency_ms=p.get("latency_ms", math.nan),
                efficiency=p.get("efficiency", math.nan),
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


def run(out) -> dict:
    """Calibrate, predict, and write ``settings.csv``, ``calibration_parameters.csv``,
    ``configurations.csv``, ``intra_batch.csv``, ``fig1_sensitivity.csv``, ``scaling.csv``,
    ``calibration_errors.csv`` and ``calibration.html`` into ``out``; returns the
    tables and the claim rows (the notebook adds them to its ``claims.csv``)."""

    rows, configs = claim_rows()
    claims = pd.DataFrame(rows)
    scaling = scaling_table()
    tables = dict(
        settings=settings_table(),
        calibration_parameters=parameters_table(),
        configurations=configs,
        intra_batch=intra_batch_table(),
        fig1_sensitivity=fig1_token_sensitivity(),
        scaling=scaling,
        calibration_errors=fit_summary(claims),
    )
    for name, df in tables.items():
        save_table(df, out, name)
    figs = {"calibration": fit_figure(claims), "scaling": scaling_figure(scaling)}
    save_page(figs, out / "calibration.html", "PipeDream's claims on their own hardware: calibration and predictions")
    return dict(rows=rows, claims=claims, figures=figs, **tables)

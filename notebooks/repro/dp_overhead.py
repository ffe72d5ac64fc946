"""PipeDream (SOSP'19) Figure 1: the share of data-parallel training time stalled on communication.

Setting of the paper: weak scaling (the per-GPU minibatch stays fixed as GPUs are added), PyTorch
DDP with NCCL, fp32, on three server types: 8x GTX 1080 Ti per server over PCIe with 25 Gbps
between servers; 4x V100 per server over PCIe with 10 Gbps (Cluster-A); 8x V100 with NVLink and
25 Gbps (Cluster-B). Models: AlexNet, VGG-16, ResNet-50, GNMT-8, GNMT-16.

How we model it (one cost model: the workbench simulator, nothing re-derived here):

* per-layer profiles: ``workbench.project`` of the zoo's paper-size model for the server's GPU
  (roofline from FLOPs and bytes); for the V100 servers also PipeDream's own measured GPU profiles
  of AlexNet, VGG-16 and ResNet-50 (``pipedream_graph.shipped``) as a second source. GNMT-16 is the
  zoo's ``gnmt`` (8 encoder + 8 decoder LSTM layers of 1024, vocabulary 32k, 50 tokens); GNMT-8 is
  the same with ``num_layers=4`` (4 + 4);
* the layers are grouped into DDP gradient buckets of ``bucket_bytes`` (the protocol's 25 MiB,
  PyTorch's default), contiguous from the output side; the ``dp-bsp`` schedule all-reduces bucket
  ``s`` once its backward has ended (the protocol's ``ddp.allreduce_ready``), overlapping the rest
  of the backward, as DDP does, and steps when all are done;
* the simulator (``workbench.cost.model.CostModel``) charges each bucket's ring all-reduce
  ``2 (r-1)/r · P_s / B_min + 2 (r-1) α`` (slowest link of the ring: the inter-server link once
  training spans servers) on one collective channel per GPU, one bucket at a time, with each link
  class's bus bandwidth = the protocol's efficiency (at most 1) x the preset's nominal rate and its
  step latency ``α`` (:func:`server_collective`); :meth:`CostModel.bucketed_round_ms` is the same
  round in closed form (the papers' BSP rows, :mod:`repro.paper_fit`);
* ``comm_share`` = the cost model's ``comm_wait_share``: the fraction of the run in which the GPU
  waits for communication, ``1 − C / T`` with ``C`` the compute (forward + backward) of one
  minibatch and ``T`` the time per iteration (data parallelism has no warm-up).

Measured here: the same share for small zoo models trained for real with ``workbench.runtime.train``
(``dp-bsp`` through DistributedDataParallel on gloo CPU ranks), from the measured timelines of a
1-rank and an N-rank run with the same per-rank minibatch: ``1 − T_1 / T_N``.

The text's four takeaways are checked on the modeled table by the protocol's rules
(:func:`observations`, :func:`takeaway_claims`).

Bytes per sample (PipeDream §5.5, Figure 17: PipeDream's plan sends far less than data
parallelism for VGG-16 and AWD-LM): simulated bytes on all links divided by workers and samples,
for PipeDream's plan (``workbench.partition`` + the ``pipedream`` schedule) and for ``dp-bsp``.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from repro import protocol
from repro.common import LazyTable, claim, paper_value
from workbench import models as zoo
from workbench import schedules
from workbench.cost import CostModel, Plan, Stage, Topology
from workbench.partitioning import partition
from workbench.profiling import SHIPPED, Profile, analyze, project, shipped
from workbench.runtime import train
from workbench.simulation import simulate

#: server type -> GPU of its profile (topology presets: workbench/cost/topology.py, with their sources)
SERVERS = {"8x1080Ti-pcie-25g": "1080Ti", "4xV100-pcie-10g": "V100", "8xV100-nvlink-25g": "V100"}
SERVER_LABELS = {
    "8x1080Ti-pcie-25g": "8x1080Ti/server, PCIe, 25 Gbps",
    "4xV100-pcie-10g": "4xV100/server, PCIe, 10 Gbps (Cluster-A)",
    "8xV100-nvlink-25g": "8xV100/server, NVLink, 25 Gbps (Cluster-B)",
}
GPU_COUNTS = (1, 2, 4, 8, 16, 32)


def ddp_bucket_bytes() -> float:
    """DDP's gradient bucket in bytes, the protocol's ``ddp.bucket_bytes`` (``DistributedDataParallel(bucket_cap_mb=25)``);
    also the module attribute ``DDP_BUCKET_BYTES`` (read on first use)."""
    return float(protocol.value("ddp.bucket_bytes"))


@dataclass(frozen=True)
class ModelSpec:
    """A Figure-1 model: zoo name, options, per-GPU minibatch (samples)."""

    zoo: str
    options: tuple = ()
    batch_size: int = 64


#: The protocol entries of each stand-in model's size (``stand_ins.*``): the rows that read its
#: profile list them.
STAND_IN_KEYS = {
    "awd-lstm": ("stand_ins.awd_lstm_vocab", "stand_ins.awd_lstm_seq_len", "stand_ins.awd_lstm_batch"),
    "s2vt": ("stand_ins.s2vt_vocab", "stand_ins.s2vt_steps", "stand_ins.s2vt_batch"),
}


#: per-GPU minibatches from the protocol (``fig1.batch_*``, with their sources); AWD-LM, not a Fig. 1
#: model (the bytes-per-sample experiment's and SOSP Table 1's), at the protocol's ``stand_ins.awd_lstm_*``.
def load_models() -> dict[str, ModelSpec]:
    """:data:`MODELS` from the protocol."""
    return {
        "alexnet": ModelSpec("alexnet", (), int(protocol.value("fig1.batch_alexnet"))),
        "vgg16": ModelSpec("vgg16", (), int(protocol.value("fig1.batch_vgg16"))),
        "resnet50": ModelSpec("resnet50", (), int(protocol.value("fig1.batch_resnet50"))),
        "gnmt8": ModelSpec("gnmt", (("num_layers", 4),), int(protocol.value("fig1.batch_gnmt"))),
        "gnmt16": ModelSpec("gnmt", (), int(protocol.value("fig1.batch_gnmt"))),
        "awd-lstm": ModelSpec(
            "awd-lstm",
            (
                ("vocab_size", int(protocol.value("stand_ins.awd_lstm_vocab"))),
                ("seq_len", int(protocol.value("stand_ins.awd_lstm_seq_len"))),
            ),
            int(protocol.value("stand_ins.awd_lstm_batch")),
        ),
    }


#: model name -> its :class:`ModelSpec` (read from the protocol on first use)
MODELS: Mapping[str, ModelSpec] = LazyTable(load_models)


def __getattr__(name: str) -> float:
    if name == "DDP_BUCKET_BYTES":
        return ddp_bucket_bytes()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


FIGURE1_MODELS = ("alexnet", "vgg16", "resnet50", "gnmt8", "gnmt16")
#: Fig. 1's models with fully-connected (AlexNet, VGG-16) or LSTM (GNMT) layers.
DENSE_MODELS = ("alexnet", "vgg16", "gnmt8", "gnmt16")
SOSP_TEXT = "seeds/000_54f0ebaf14fd21aa.txt"


def check_params(models_: list[str], servers: list[str], gpu_counts: list[int]) -> None:
    """Raise ``ValueError`` with one line saying what is wrong (unknown model/server, bad count)."""
    for m in models_:
        if m not in MODELS:
            raise ValueError(f"unknown model {m!r} for Figure 1; choose from {sorted(MODELS)}")
    for s in servers:
        if s not in SERVERS:
            raise ValueError(f"unknown server type {s!r}; choose from {sorted(SERVERS)}")
    for g in gpu_counts:
        if isinstance(g, bool) or not isinstance(g, (int, np.integer)) or g < 1:
            raise ValueError(f"GPU counts must be integers >= 1, got {g!r}")


QUICK: dict[str, Any] = dict(
    models=["alexnet", "vgg16", "resnet50", "gnmt8"], measured_models=["mlp"], measured_steps=6, repeats=1
)
FULL: dict[str, Any] = dict(
    models=list(FIGURE1_MODELS), measured_models=["mlp", "vgg16", "resnet50", "awd-lstm"], measured_steps=12, repeats=2
)


def settings(
    quick: bool,
    models=None,
    servers=None,
    gpu_counts=None,
    measured_models=None,
    *,
    ranks: int = 2,
    measured_steps=None,
) -> dict:
    """The notebook's parameters: ``None`` takes the quick or full default; validated (one-line
    ``ValueError``)."""
    base = QUICK if quick else FULL
    cfg: dict[str, Any] = dict(
        models=list(models or base["models"]),
        servers=list(servers or SERVERS),
        gpu_counts=[int(g) for g in (gpu_counts or GPU_COUNTS)],
        measured_models=list(base["measured_models"] if measured_models is None else measured_models),
        ranks=ranks,
        measured_steps=int(measured_steps or base["measured_steps"]),
        repeats=base["repeats"],
    )
    check_params(cfg["models"], cfg["servers"], cfg["gpu_counts"])
    for m in cfg["measured_models"]:
        zoo.config(m)  # raises "unknown model ..." for a name the zoo does not have
    if measured_steps is not None and (
        isinstance(measured_steps, bool) or not isinstance(measured_steps, int) or measured_steps < 3
    ):
        raise ValueError(f"measured_steps must be an integer >= 3 (the first step is dropped), got {measured_steps!r}")
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 2:
        raise ValueError(f"ranks must be an integer >= 2 (the measured run compares N ranks with 1), got {ranks!r}")
    return cfg


def validate_params(
    quick: bool,
    models=None,
    servers=None,
    gpu_counts=None,
    measured_models=None,
    *,
    ranks: int = 2,
    measured_steps=None,
    **_ignored,
) -> None:
    """``workbench reproduce``'s check of the notebook's parameters (one-line ``ValueError``)."""
    settings(quick, models, servers, gpu_counts, measured_models, ranks=ranks, measured_steps=measured_steps)


# ---- profiles ---------------------------------------------------------------------------------
def analyses(names) -> dict[str, pd.DataFrame]:
    """FLOPs and bytes per layer (``workbench.profiling.measure.analyze``) of each paper-size model."""
    return {name: spec_analysis(MODELS[name]) for name in names}


_ANALYSES: dict[ModelSpec, pd.DataFrame] = {}


def spec_analysis(spec: ModelSpec) -> pd.DataFrame:
    """``analyze`` of the paper-size model ``spec`` describes, on the meta device: counted once per
    spec (zoo name, options, per-GPU minibatch: all it reads), so a protocol entry moved to an
    interval's end recounts only the models whose spec it changes; a copy each call."""
    if spec not in _ANALYSES:
        model = zoo.build(spec.zoo, "paper", device="meta", **dict(spec.options))
        _ANALYSES[spec] = analyze(model, batch_size=spec.batch_size)
    return _ANALYSES[spec].copy()


def projected_profile(name: str, frame: pd.DataFrame, gpu: str) -> Profile:
    """``workbench.project`` of model ``name``'s analysis for ``gpu`` (a modeled profile)."""
    prof = project(frame, gpu, batch_size=MODELS[name].batch_size)
    return Profile(prof.layers, {**prof.meta, "model": name, "source": f"workbench.project({name}, {gpu})"})


def profiles(names, gpus, frames: dict, with_shipped: bool = True) -> dict[tuple[str, str, str], Profile]:
    """{(model, gpu, source): Profile}: projected for every GPU, plus PipeDream's shipped GPU
    profile for the CNNs (source ``pipedream``; used for the V100 servers)."""
    out = {}
    for name in names:
        for gpu in gpus:
            out[(name, gpu, "projected")] = projected_profile(name, frames[name], gpu)
        if with_shipped and name in SHIPPED and "V100" in gpus:
            prof = shipped(name)
            out[(name, "V100", "pipedream")] = Profile(prof.layers, {**prof.meta, "model": name})
    return out


# ---- the data-parallel communication share ----------------------------------------------------
def bucket_plan(profile: Profile, bucket_bytes: float | None = None) -> Plan:
    """Contiguous layer groups (DDP gradient buckets) filled from the last layer backwards: a bucket
    closes once its parameter bytes reach ``bucket_bytes`` (a larger layer is a bucket alone;
    default :func:`ddp_bucket_bytes`)."""
    bucket_bytes = ddp_bucket_bytes() if bucket_bytes is None else bucket_bytes
    par = profile.layers["param_bytes"].to_numpy(float)
    firsts, size = [], 0.0
    for i in range(len(par) - 1, -1, -1):
        size += par[i]
        if size >= bucket_bytes and i > 0:
            firsts.append(i)
            size = 0.0
    lasts = sorted(f - 1 for f in firsts) + [len(par) - 1]
    first = [0] + [x + 1 for x in lasts[:-1]]
    stages = tuple(Stage(a, z, 1, (k,)) for k, (a, z) in enumerate(zip(first, lasts)))
    return Plan(stages, method="ddp-buckets", meta={"bucket_bytes": bucket_bytes})


def server_topology(server: str, gpus: int) -> Topology:
    """The preset ``server`` with as many servers as ``gpus`` GPUs need (the first ``gpus`` are used)."""
    per = Topology.preset(server).counts[0]
    return Topology.preset(server, servers=max(1, math.ceil(gpus / per)))


def dp_comm_share(
    profile: Profile,
    topology: Topology,
    gpus: int,
    rounds: int = 3,
    bucket_bytes: float | None = None,
    *,
    collective: dict | None = None,
) -> dict:
    """Simulated data-parallel training on ``gpus`` workers of ``topology`` (``rounds`` iterations):
    ``comm_share`` = the cost model's ``comm_wait_share`` (time a GPU waits on communication /
    makespan; data parallelism has no warm-up, so every iteration is alike), ``iteration_ms`` =
    ``gpus × time_per_minibatch_ms`` (one minibatch per GPU per iteration, steady state),
    ``compute_ms`` = fwd + bwd of one minibatch; ``comm_share = 1 − compute_ms / iteration_ms``."""
    plan = bucket_plan(profile, bucket_bytes)
    sched = schedules.build("dp-bsp", plan, gpus * rounds, workers=gpus)
    res = simulate(sched, profile=profile, plan=plan, topology=topology, **(collective or {}))
    return dict(
        iteration_ms=gpus * float(res.metrics["time_per_minibatch_ms"]),
        compute_ms=float(profile.total_ms),
        comm_share=float(np.mean(res.metrics["comm_wait_share"])),
        buckets=plan.num_stages,
        label=res.label,
    )


def ddp_round(profile: Profile, topology: Topology, workers: int, collective: dict) -> dict:
    """One data-parallel round in closed form (:meth:`CostModel.bucketed_round_ms`, equal to the
    simulated ``dp-bsp`` round of :func:`dp_comm_share`): DDP's buckets (:func:`bucket_plan`), each
    all-reduced once its backward has ended (the protocol's ``ddp.allreduce_ready``), over the
    all-reduce ``collective`` (the cost model's ``allreduce_bandwidth`` / ``allreduce_latency_ms``)."""
    options = {
        **collective,
        "allreduce_ready": protocol.value("ddp.allreduce_ready"),
        "bucket_cap_bytes": ddp_bucket_bytes(),
    }
    cm = CostModel.from_profile(profile, topology, **options)
    ws = range(workers)
    buckets = cm.layer_buckets(0, cm.num_layers - 1) if workers > 1 else [(0, cm.num_layers - 1)]
    return cm.bucketed_round_ms(buckets, ws)


def server_collective(server: str, topology: Topology) -> dict:
    """Data parallelism's all-reduce on ``server``'s links (:func:`repro.protocol.collective`:
    the protocol's efficiency and step latency per link class, DDP's bucket readiness)."""
    return protocol.collective(server, topology.bandwidths)


def figure1_table(profs: dict, servers, gpu_counts) -> pd.DataFrame:
    """One row per (model, source, server, gpus): the simulated communication share."""
    rows = []
    for (name, gpu, source), prof in profs.items():
        for server in servers:
            if SERVERS[server] != gpu:
                continue
            per = Topology.preset(server).counts[0]
            for g in gpu_counts:
                topo = server_topology(server, g)
                r = dp_comm_share(prof, topo, g, collective=server_collective(server, topo))
                r.pop("label")
                rows.append(
                    dict(
                        model=name,
                        source=source,
                        server=server,
                        gpu=gpu,
                        gpus=g,
                        servers_used=math.ceil(g / per),
                        gpus_per_server=per,
                        **r,
                        label=f"modeled (profile: {_profile_text(prof, source)}; topology "
                        f"{server} x{topo.counts[1]}: {topo.describe()})",
                    )
                )
    return pd.DataFrame(rows)


def _profile_text(prof: Profile, source: str) -> str:
    if source == "pipedream":
        return "PipeDream's measured GPU profile (graph.txt)"
    return f"workbench.project roofline for {prof.meta.get('device', '?')}, batch {prof.meta.get('batch_size')}"


# ---- bytes per sample: PipeDream's configurations vs data parallelism -----------------------------
def non_dp_plans(profile: Profile, topology: Topology) -> dict[str, Plan]:
    """Non-data-parallel configurations on the ``W`` workers of ``topology``, by name: the
    partitioner's optimal straight pipeline (``straight``) and every two-stage hybrid
    ``front{r}-back{W-r}@l`` (layers ``0..l`` replicated on ``r`` workers, the rest on ``W − r``)."""
    W, N = topology.num_workers, len(profile)
    plans = {"straight": partition(profile, topology, straight=True)} if N >= W else {}
    for l in range(N - 1):
        for r in range(1, W):
            plans[f"front{r}-back{W - r}@{l}"] = Plan.from_boundaries([l, N - 1], [r, W - r])
    return plans


def _sent_per_sample(res, workers: int, minibatches: int, batch: int) -> float:
    return sum(res.metrics["bytes_per_level"].values()) / workers / (minibatches * batch)


def config_table(profile: Profile, topology: Topology, minibatches: int = 16) -> pd.DataFrame:
    """Simulated time per minibatch and bytes sent per sample (``sum(bytes_per_level) / W /
    (minibatches · batch)``, i.e. per sample and worker) of data parallelism (``dp-bsp`` over DDP
    buckets) and of every :func:`non_dp_plans` configuration run with PipeDream's 1F1B schedule."""
    W, batch = topology.num_workers, int(profile.meta.get("batch_size") or 1)
    buckets = bucket_plan(profile)
    runs = {"data-parallel": (buckets, schedules.build("dp-bsp", buckets, minibatches, workers=W))}
    runs |= {k: (p, schedules.build("pipedream", p, minibatches)) for k, p in non_dp_plans(profile, topology).items()}
    rows = []
    for name, (plan, sched) in runs.items():
        res = simulate(sched, profile=profile, plan=plan, topology=topology)
        rows.append(
            dict(
                config=name,
                ms_per_minibatch=res.makespan / minibatches,
                bytes_per_sample=_sent_per_sample(res, W, minibatches, batch),
                stages=" | ".join(f"layers {s.first}-{s.last} x{s.replicas}" for s in plan.stages),
            )
        )
    df = pd.DataFrame(rows)
    df["reduction_vs_dp"] = 1.0 - df["bytes_per_sample"] / df["bytes_per_sample"].iloc[0]
    return df


def pick_configs(configs: pd.DataFrame, workers: int, front_last: int) -> dict[str, pd.Series]:
    """The configurations compared with DP: the ``fastest`` non-DP one (simulated time), the
    ``straight`` pipeline (PipeDream's Table-1 configuration for AWD-LM) and the ``{W-1}-1``
    hybrid split after layer ``front_last`` (the shape of its VGG-16 configurations, "15-1": a
    replicated front, the large FC layers on one worker)."""
    non_dp = configs.iloc[1:]
    out = {"fastest": non_dp.loc[non_dp["ms_per_minibatch"].idxmin()]}
    for kind, name in (("straight", "straight"), (f"{workers - 1}-1", f"front{workers - 1}-back1@{front_last}")):
        hit = non_dp[non_dp["config"] == name]
        if len(hit):
            out[kind] = hit.iloc[0]
    return out


def bytes_table(
    profs: dict, server: str = "4xV100-pcie-10g", gpus: int = 4, names=("vgg16", "awd-lstm")
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(all configurations, the picked ones: :func:`pick_configs`) for each model on ``gpus`` GPUs
    of one ``server``; the hybrid's split is the first stage of ``partition`` on 4 such servers."""
    topo = server_topology(server, gpus)
    every, picked = [], []
    for n in names:
        prof = profs[(n, "V100", "projected")]
        cfg = config_table(prof, topo).assign(model=n, server=server, gpus=gpus)
        every.append(cfg)
        front_last = partition(prof, server_topology(server, 4 * topo.counts[0])).stages[0].last
        label = f"modeled (profile: {_profile_text(prof, 'projected')}; topology {server} x1: {topo.describe()})"
        for kind, row in pick_configs(cfg, gpus, front_last).items():
            picked.append(
                dict(
                    model=n,
                    pick=kind,
                    config=row["config"],
                    stages=row["stages"],
                    ms_per_minibatch=row["ms_per_minibatch"],
                    bytes_per_sample=row["bytes_per_sample"],
                    dp_bytes_per_sample=cfg["bytes_per_sample"].iloc[0],
                    dp_ms_per_minibatch=cfg["ms_per_minibatch"].iloc[0],
                    reduction=row["reduction_vs_dp"],
                    label=label,
                )
            )
    return pd.concat(every, ignore_index=True), pd.DataFrame(picked)


# ---- measured on this machine -------------------------------------------------------------------
def _step_ms(out: Path) -> float:
    """Median per-step wall time of a finished run (from its measured ``timeline.csv``, steps after
    the first): the span from the first op to the last op of the round over all ranks."""
    tl = pd.read_csv(out / "timeline.csv")
    span = tl.groupby("round").agg(start=("start", "min"), end=("end", "max"))
    span = span.iloc[1:] if len(span) > 2 else span
    return float((span["end"] - span["start"]).median())


def measured_share(
    model: str,
    workers: int = 2,
    steps: int = 12,
    batch_per_rank: int = 32,
    seed: int = 0,
    *,
    repeats: int = 1,
    timeout_s: float = 120.0,
) -> dict:
    """Train the zoo's mini ``model`` with ``dp-bsp`` for real on 1 rank and on ``workers`` gloo
    CPU ranks (same per-rank minibatch, 1 thread per rank), alternating ``repeats`` times, and
    return ``comm_share = 1 − T_1 / T_N`` with ``T_n`` the smallest median step time of the n-rank
    runs (the least disturbed by other load on the machine)."""

    times: dict[int, list[float]] = {1: [], workers: []}
    load = os.getloadavg()[0]
    for _ in range(repeats):
        for n in (1, workers):
            with tempfile.TemporaryDirectory() as tmp:
                train(
                    model,
                    "dp-bsp",
                    workers=n,
                    microbatches=n,
                    steps=steps,
                    batch_size=batch_per_rank * n,
                    seed=seed,
                    out=tmp,
                    evaluate=False,
                    progress=False,
                    threads=1,
                    timeout_s=timeout_s,
                    schedule_options={"workers": n},
                )
                times[n].append(_step_ms(Path(tmp)))
    t1, tn = min(times[1]), min(times[workers])
    return dict(
        model=model,
        size="mini",
        ranks=workers,
        batch_per_rank=batch_per_rank,
        steps=steps,
        repeats=repeats,
        step_ms_1=t1,
        step_ms_n=tn,
        comm_share=1.0 - t1 / tn,
        label=f"measured (this machine: {workers} CPU gloo ranks vs 1, 1 thread each, DDP dp-bsp, "
        f"best of {repeats} median(s) of {steps - 1} steps; 1-min load {load:.1f} on "
        f"{os.cpu_count()} cores)",
    )


def measured_table(names, workers: int = 2, steps: int = 12, repeats: int = 1) -> pd.DataFrame:
    return pd.DataFrame([measured_share(n, workers, steps, repeats=repeats) for n in names])


# ---- figures ---------------------------------------------------------------------------------------
def figure1(fig1: pd.DataFrame):
    """Figure 1 as plotly: one panel per server type, comm. share (%) vs GPUs, a line per model
    (solid: projected profile; dashed: PipeDream's measured GPU profile)."""

    servers = [s for s in SERVERS if s in set(fig1.server)]
    titles = [SERVER_LABELS[s].replace(", ", "<br>", 1) for s in servers]  # two short lines: no overlap
    fig = make_subplots(rows=1, cols=len(servers), shared_yaxes=True, subplot_titles=titles, horizontal_spacing=0.06)
    fig.update_annotations(font_size=12)
    colors = {m: qualitative.Plotly[i % 10] for i, m in enumerate(MODELS)}
    shown: set[tuple[str, str]] = set()  # a legend entry per line style, wherever it first appears
    for col, server in enumerate(servers, start=1):
        for (model, source), g in fig1[fig1.server == server].groupby(["model", "source"], sort=False):
            fig.add_trace(
                go.Scatter(
                    x=g.gpus,
                    y=100 * g.comm_share,
                    mode="lines+markers",
                    name=f"{model} ({source})",
                    legendgroup=f"{model}{source}",
                    showlegend=(model, source) not in shown,
                    line=dict(color=colors[model], dash="dash" if source == "pipedream" else "solid"),
                ),
                row=1,
                col=col,
            )
            shown.add((model, source))
        fig.update_xaxes(type="log", title_text="GPUs", tickvals=sorted(set(fig1.gpus)), row=1, col=col)
    fig.update_yaxes(title_text="% of DP iteration stalled on communication (modeled)", row=1, col=1)
    fig.update_layout(
        title="PipeDream Fig. 1 reproduced: data-parallel communication overhead, weak scaling "
        "(modeled: simulator, ring all-reduce of DDP buckets)",
        title_font_size=14,
        height=520,
        margin=dict(t=120),
        legend=dict(title_text="solid: projected profile; dashed: PipeDream's GPU profile"),
    )
    return fig


def bytes_figure(configs: pd.DataFrame):
    """Time per minibatch vs bytes per sample of every configuration (DP highlighted), per model."""

    df = configs.assign(
        kind=np.where(
            configs["config"] == "data-parallel",
            "data parallel",
            np.where(configs["config"] == "straight", "straight pipeline", "2-stage hybrid"),
        )
    )
    fig = px.scatter(
        df,
        x="bytes_per_sample",
        y="ms_per_minibatch",
        color="kind",
        facet_col="model",
        hover_data=["config", "stages"],
        log_x=True,
        title="Bytes sent per sample and worker vs time per minibatch (modeled, 4 V100, one server)",
    )
    fig.update_xaxes(matches=None)
    fig.update_yaxes(matches=None)
    return fig


# ---- the four takeaways and the claims -------------------------------------------------------------
TAKEAWAYS = {
    1: "is high for many models despite multi-GPU servers and NCCL",
    2: "spikes, then plateaus, once training spans servers",
    3: "grows with the number of workers for every model, even with NVLink",
    4: "is higher on V100s than on 1080 Tis",
}


def observations(fig1: pd.DataFrame, source: str = "projected") -> pd.DataFrame:
    """The text's four takeaways (SOSP §2.1), each checked on the modeled figure by the rule the
    protocol fixes (``fig1.*``), one row per server type (takeaway 4: per model and GPU count that
    spans servers) with the numbers behind the verdict:

    1. at the most GPUs, at least ``fig1.many_models`` models stall at least ``fig1.high_share``;
    2. the mean share over the models rises by at least ``fig1.spike_points`` from the last
       one-server count to the first multi-server one, then changes by at most half that rise;
    3. every model's share never falls as GPUs are added and is higher at the most GPUs than at 2;
    4. at every count that spans servers, each model's share on 8x V100 (NVLink, 25 Gbps) is at
       least its share on 8x 1080 Ti (PCIe, 25 Gbps): the same servers' size and network, a faster GPU."""
    f = fig1[fig1.source == source]
    high, many = float(protocol.value("fig1.high_share")), int(protocol.value("fig1.many_models"))
    spike_min = float(protocol.value("fig1.spike_points"))
    rows = []
    for server, g in f.groupby("server"):
        s = 100 * g.pivot_table(index="gpus", columns="model", values="comm_share")
        gmax, per = int(s.index.max()), int(g.gpus_per_server.iloc[0])
        top = s.loc[gmax]
        n_high = int((top >= high).sum())
        rows.append(dict(takeaway=1, server=server, holds=n_high >= many,
                         value=f"{n_high} of {len(top)} models at >= {high:g}% on {gmax} GPUs ("
                         + ", ".join(f"{m} {v:.0f}%" for m, v in top.items()) + ")"))  # fmt: skip
        one = [x for x in s.index if x <= per]
        multi = [x for x in s.index if x > per]
        if one and multi:
            mean = s.mean(axis=1)
            spike = mean[multi[0]] - mean[max(one)]
            after = mean[max(multi)] - mean[multi[0]]
            rows.append(dict(takeaway=2, server=server, holds=bool(spike >= spike_min and abs(after) <= spike / 2),
                             value=f"mean {mean[max(one)]:.1f}% at {max(one)} GPUs -> {mean[multi[0]]:.1f}% at "
                             f"{multi[0]} (+{spike:.1f} pts) -> {mean[max(multi)]:.1f}% at {max(multi)} "
                             f"({after:+.1f} pts)"))  # fmt: skip
        if 2 in s.index and gmax > 2:
            never_falls = (s.diff().iloc[1:] >= -1e-9).all()
            rises = s.loc[gmax] > s.loc[2]
            ok = never_falls & rises
            rows.append(dict(takeaway=3, server=server, holds=bool(ok.all()),
                             value=", ".join(f"{m} {s.loc[2, m]:.1f}->{s.loc[gmax, m]:.1f}%" for m in s.columns)
                             + ("" if ok.all() else f"; fails for {', '.join(ok[~ok].index)}")))  # fmt: skip
    v100, ti = f[f.server == "8xV100-nvlink-25g"], f[f.server == "8x1080Ti-pcie-25g"]
    if len(v100) and len(ti):
        both = v100.merge(ti, on=["model", "gpus"], suffixes=("_v100", "_1080ti"))
        both = both[both.gpus > both.gpus_per_server_v100]
        for r in both.itertuples():
            rows.append(dict(takeaway=4, server=f"{r.model} on {r.gpus} GPUs",
                             holds=bool(r.comm_share_v100 >= r.comm_share_1080ti),
                             value=f"V100 {100 * r.comm_share_v100:.1f}% vs 1080 Ti {100 * r.comm_share_1080ti:.1f}%"))  # fmt: skip
    out = pd.DataFrame(rows, columns=["takeaway", "server", "holds", "value"])
    out.insert(1, "statement", out["takeaway"].map(TAKEAWAYS))
    return out


def takeaway_claims(fig1: pd.DataFrame, source: str = "projected") -> list[dict]:
    """One ``holds`` row per takeaway (:func:`observations`): the cases the paper states it over
    (server types; for takeaway 4 the (model, GPU count) pairs that span servers) against those it
    holds in on the modeled figure; and Fig. 1's maximum against the paper's "up to 90%"."""
    obs = observations(fig1, source)
    f = fig1[fig1.source == source]
    label = (
        f"modeled (Fig. 1 table, {source} profiles; every server type's links at the protocol's "
        "all-reduce efficiency and step latency; DDP buckets)"
    )
    keys = {
        1: ("fig1.high_share", "fig1.many_models"),
        2: ("fig1.spike_points",),
        3: (),
        4: (),
    }
    rows = []
    common = ("ddp.bucket_bytes", "ddp.allreduce_ready", "links.nvlink.efficiency", "links.pcie.efficiency",
              "links.ethernet.efficiency")  # fmt: skip
    for k, statement in TAKEAWAYS.items():
        o = obs[obs.takeaway == k]
        if o.empty:
            continue
        fails = "; ".join(f"{r.server}: {r.value}" for r in o.itertuples() if not r.holds)
        rows.append(
            claim(
                "PipeDream Fig. 1 (DP communication overhead)",
                f"takeaway {k}: the overhead {statement}",
                len(o),
                int(o.holds.sum()),
                "server types" if k < 4 else "(model, GPU count) pairs across servers",
                label=label,
                comparison="holds",
                explanation=f"SOSP §2.1; rule in the protocol (fig1.*); holds in {int(o.holds.sum())} of {len(o)}"
                + (f"; where it does not: {fails}" if fails else "; observations.csv has the numbers"),
                protocol=protocol.used(*keys[k], *common),
            )
        )
    rows += resnet_rows(f, label, common)
    top = f.loc[f["comm_share"].idxmax()]
    rows.append(
        claim(
            "PipeDream Fig. 1 (DP communication overhead)",
            "data-parallel communication stalls up to this share of training time (max over Fig. 1)",
            paper_value("fig1_up_to_share"),
            100 * float(top["comm_share"]),
            "%",
            label=label,
            comparison="up to",
            explanation=f"the maximum over Fig. 1's {f.model.nunique()} models, {f.server.nunique()} server types "
            f"and GPU counts: {top['model']} on {int(top['gpus'])} GPUs of {top['server']}",
            protocol=protocol.used(*common),
        )
    )
    return rows


def resnet_rows(f: pd.DataFrame, label: str, common: tuple) -> list[dict]:
    """SOSP §2.1's ResNet-50 statements on Fig. 1's table ``f`` at its largest GPU count: ResNet-50
    has the lowest overhead of the models, and the models with LSTM or fully-connected layers
    (:data:`DENSE_MODELS`) a higher one than ResNet-50, as ``holds`` rows."""
    rows: list[dict] = []
    gmax = int(f.gpus.max())
    at = f[f.gpus == gmax].pivot_table(index="server", columns="model", values="comm_share")
    if "resnet50" in at.columns:
        lowest = at["resnet50"] <= at.min(axis=1) + 1e-12
        rows.append(
            claim(
                "PipeDream Fig. 1 (DP communication overhead)",
                "data parallelism scales well for ResNet-50 (the lowest overhead of Fig. 1's models)",
                len(at),
                int(lowest.sum()),
                "server types",
                label=label,
                comparison="holds",
                explanation=f"SOSP §2.1 (compact convolutional weights); ResNet-50's share on {gmax} GPUs: "
                + ", ".join(
                    f"{srv} {100 * at.loc[srv, 'resnet50']:.1f}% (lowest other {100 * at.loc[srv].drop('resnet50').min():.1f}%)"
                    for srv in at.index
                ),
                protocol=protocol.used(*common),
            )
        )
        dense = [m for m in DENSE_MODELS if m in at.columns]
        pairs = [(srv, m) for srv in at.index for m in dense]
        worse = [(srv, m) for srv, m in pairs if at.loc[srv, m] > at.loc[srv, "resnet50"]]
        rows.append(
            claim(
                "PipeDream Fig. 1 (DP communication overhead)",
                "models with LSTM or fully-connected layers scale less well than ResNet-50 (a higher overhead)",
                len(pairs),
                len(worse),
                "(server, model) pairs",
                label=label,
                comparison="holds",
                explanation=f"SOSP §2.1 ({SOSP_TEXT}:246-249, dense weights of LSTM and fully-connected layers); "
                f"on {gmax} GPUs, models {', '.join(dense)}; not above ResNet-50: "
                + (", ".join(f"{m} on {srv}" for srv, m in pairs if (srv, m) not in worse) or "none"),
                protocol=protocol.used(*common),
            )
        )
    return rows


def share_at(fig1: pd.DataFrame, model: str, server: str, gpus: int, source: str = "projected") -> float:
    row = fig1[(fig1.model == model) & (fig1.server == server) & (fig1.gpus == gpus) & (fig1.source == source)]
    return float(row["comm_share"].iloc[0]) if len(row) else math.nan


_BYTES_NOTE = {
    "fastest": "Our fastest non-DP config may still replicate big layers (more all-reduce) because the "
    "modeled all-reduce is cheap on 12 GB/s PCIe.",
    "straight": "A straight pipeline sends every cut's activations and gradients (for VGG-16 the large early "
    "conv activations: more than DP).",
    "3-1": "Front = the first stage of our partitioner's plan for Cluster-A (4 servers x 4 V100), "
    "i.e. the layers PipeDream replicates.",
}
#: which picked configuration is PipeDream's own for each model (Table 1 shapes)
PAPER_CONFIG = {"vgg16": "3-1", "awd-lstm": "straight"}


def claims(fig1: pd.DataFrame, bytes_df: pd.DataFrame, measured: pd.DataFrame | None = None) -> list[dict]:
    """The paper's numbers beside ours (``claims.csv`` rows)."""
    rows = takeaway_claims(fig1)
    exp2 = "PipeDream Fig. 17 (bytes per sample, 4 GPUs Cluster-A)"
    fastest = bytes_df[bytes_df["pick"] == "fastest"].set_index("model")
    for r in bytes_df.itertuples():
        if r.pick != PAPER_CONFIG.get(r.model):  # the paper's configuration; the others stay in the CSV
            continue
        other = (
            f" Our model's fastest non-DP configuration on this server, {fastest.loc[r.model, 'config']}, saves "
            f"{100 * fastest.loc[r.model, 'reduction']:.0f}% (bytes_per_sample.csv). {_BYTES_NOTE['fastest']}"
            if r.model in fastest.index
            else ""
        )
        rows.append(
            claim(
                exp2,
                f"{r.model}: bytes/sample saved vs DP, {r.pick} non-DP config",
                paper_value("fig17_bytes_reduction_bound"),
                100 * r.reduction,
                "%",
                label=r.label,
                comparison="at least",
                protocol=protocol.used("ddp.bucket_bytes", *STAND_IN_KEYS.get(r.model, ())),
                explanation="paper: 'more than 85%' less (a lower bound) for its best non-DP config, the configuration it ran "
                f"({r.pick}); ours: simulated bytes of {r.config} ({r.stages}) vs DP's ring all-reduce. "
                + _BYTES_NOTE.get(r.pick, "")
                + other,
            )
        )
    if measured is not None:
        for r in measured.itertuples():
            rows.append(
                claim(
                    "PipeDream Fig. 1, measured here",
                    f"{r.model} (mini) DP comm. share, {r.ranks} CPU ranks",
                    math.nan,
                    100 * r.comm_share,
                    "%",
                    label=r.label,
                    explanation="no paper counterpart (tiny CPU models on one host, shared 2-core machine); "
                    "shows the measurement path, not the GPU numbers",
                )
            )
    return rows


def claims_over_intervals(fig1_profs: dict, servers, gpu_counts, bytes_df: pd.DataFrame, measured=None) -> list[dict]:
    """:func:`claims` with each row's interval: Fig. 1 recomputed (:func:`figure1_table`) at each end
    of every protocol interval of the links its rows read (:func:`repro.protocol.interval`, one entry
    moved at a time), so that its takeaways are evaluated at both ends. The other rows keep
    ``low = high = ours``: ``bytes_df`` is computed once, so the AWD-LM bytes row does not follow
    its stand-in's intervals."""
    from repro.common import with_interval

    fig1 = figure1_table(fig1_profs, servers, gpu_counts)
    rows = claims(fig1, bytes_df, measured)
    read = {k for r in rows for k in protocol.parse_used(r["protocol"])}
    ends: dict[str, list[float]] = {}
    for key in protocol.intervals():
        if key not in read or not key.startswith("links."):  # Fig. 1 reads the links' entries only
            continue
        low, point, high = protocol.interval(key)
        for end in (low, high):
            if end == point:
                continue
            with protocol.overridden({key: end}):
                moved = claims(figure1_table(fig1_profs, servers, gpu_counts), bytes_df, measured)
            for r in moved:
                if key in protocol.parse_used(r["protocol"]):
                    ends.setdefault(r["claim"], []).append(float(r["ours"]))
    return [with_interval(r, ends.get(r["claim"], ())) for r in rows]

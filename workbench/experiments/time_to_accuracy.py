"""PipeDream (SOSP'19) §5.2-5.5: time to a target accuracy = epochs to target × time per epoch.

    TTA(scheme) = E(scheme) · T_epoch(scheme)

* ``E`` (statistical efficiency) comes from REAL training runs (the runtime of :func:`workbench.runtime.train`,
  gloo CPU ranks) of a mini model on an offline data set, several seeds per scheme: per seed the first
  epoch whose test accuracy reaches ``target``; per scheme the mean over seeds, +inf when any seed
  never reaches it. Setting ``main``: every scheme at ``lr``; setting ``ablation``: PipeDream's weight
  rules (stash, no-stash, vertical sync) again at ``ablation_lr``, where staleness bites. Where
  PipeDream's plan for a cluster is one stage replicated on every GPU it *is* BSP (same update rule)
  and takes BSP's ``E``; otherwise its ``E`` comes from the 1F1B pipeline runs here (``workers``
  stages), an approximation of the plan's own depth and replication.
* ``T_epoch`` (hardware efficiency) two ways:
  - measured: the runs' own wall clock per epoch on this machine;
  - modeled: the paper's cluster (``Topology.preset``) and PipeDream's published GPU profile
    (``pipedream_graph.shipped``), each scheme's schedule simulated (:func:`workbench.simulate`,
    the one ``CostModel``) on its plan: its steady-state ``time_per_minibatch_ms`` (warm-up and
    drain excluded; a minibatch is the profile's batch), ``speedup = single-GPU ms / that``, and the
    modeled time to target in *single-GPU epochs* ``E / speedup``. The planner's prediction
    (``Plan.predicted_ms``) is reported beside it.

Schemes (one update rule each, same data, microbatch size and learning rate): PipeDream 1F1B with
weight stashing, without it (``no-stash``) and with vertical sync; GPipe (one update per
``M`` microbatches); model parallelism (one microbatch in flight, straight plan); BSP data
parallelism (one update per ``W`` microbatches, all-reduced); ASP data parallelism (Hogwild on shared
memory: each replica steps on its own gradient).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .common import claim, out_folder, save_figure, save_table, write_claims

EXPERIMENT = "03_time_to_accuracy"
# scheme label -> (schedule name, schedule options)
SCHEMES: dict[str, tuple[str, dict]] = {
    "pipedream": ("pipedream", {"weights": "stash"}),
    "pipedream-no-stash": ("pipedream", {"weights": "no-stash"}),
    "pipedream-vertical-sync": ("pipedream", {"weights": "vertical-sync"}),
    "gpipe": ("gpipe", {}),
    "model-parallel": ("model-parallel", {}),
    "dp-bsp": ("dp-bsp", {}),
    "dp-asp": ("dp-asp", {}),
}
# modeled only: PipeDream's 1F1B on the straight (unreplicated) optimal plan, the paper's "straight pipeline"
HARDWARE_SCHEMES: dict[str, tuple[str, dict]] = {**SCHEMES, "pipedream-straight": ("pipedream", {"weights": "stash"})}
CLUSTER_A = "4xV100-pcie-10g"


@dataclass(frozen=True)
class Config:
    """One experiment's parameters (the notebook's ``parameters`` cell fills it)."""

    model: str = "mlp"
    workers: int = 4
    microbatches: int = 8
    batch_size: int = 64
    lr: float = 0.05
    epochs: int = 8
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    target: float = 0.9
    schemes: tuple[str, ...] = tuple(SCHEMES)
    # the weight-stashing ablation: PipeDream's variants again at a learning rate where staleness bites
    ablation_lr: float = 0.1
    ablation_schemes: tuple[str, ...] = ("pipedream", "pipedream-no-stash", "pipedream-vertical-sync")
    ablation_seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    profile: str = "vgg16"
    preset: str = CLUSTER_A
    gpus: tuple[int, ...] = (4, 8, 16)
    timeout_s: float = 120.0
    model_options: dict = field(default_factory=lambda: {"in_features": 64, "width": 128})  # digits

    def __post_init__(self):
        bad = sorted((set(self.schemes) | set(self.ablation_schemes)) - set(SCHEMES))
        if bad:
            raise ValueError(f"unknown scheme(s) {bad}; choose from {list(SCHEMES)}")
        if self.workers < 2:
            raise ValueError(f"workers must be >= 2 to compare parallel schemes, got {self.workers}")
        if not 0 < self.target <= 1:
            raise ValueError(f"target is a test accuracy in (0, 1], got {self.target}")
        if not self.seeds:
            raise ValueError("give at least one seed")
        if any(g < 1 for g in self.gpus):
            raise ValueError(f"gpus must be positive GPU counts, got {self.gpus}")
        if self.preset not in _presets():
            raise ValueError(f"unknown topology preset {self.preset!r}; choose one of {sorted(_presets())}")


def _presets() -> dict:
    from ..topology import Topology

    return Topology.presets()


# ---- statistical efficiency: real runs ---------------------------------------------------------
def run_list(cfg: Config) -> list[tuple[str, str, int, float]]:
    """(setting, scheme, seed, lr) of every training run: ``main`` (every scheme at ``cfg.lr``) and
    ``ablation`` (PipeDream's weight rules at ``cfg.ablation_lr``)."""
    main = [("main", sc, seed, cfg.lr) for sc in cfg.schemes for seed in cfg.seeds]
    return main + [("ablation", sc, seed, cfg.ablation_lr) for sc in cfg.ablation_schemes for seed in cfg.ablation_seeds]


def train_runs(cfg: Config, out_dir) -> pd.DataFrame:
    """Train every run of :func:`run_list` for ``cfg.epochs`` epochs with the runtime (one spawn for
    all jobs: they share the worker count) into ``out_dir/runs/<setting>-<scheme>-s<seed>``. Returns
    the learning curves: one row per (setting, scheme, seed, epoch) with ``test_accuracy``,
    ``test_loss`` and ``wall_s`` (measured seconds since the run's start at the end of that epoch,
    test evaluation included)."""
    from ..runtime import prepare, run_jobs

    runs = run_list(cfg)
    jobs = []
    for setting, scheme, seed, lr in runs:
        name, opts = SCHEMES[scheme]
        out = Path(out_dir) / "runs" / f"{setting}-{scheme}-s{seed}"
        jobs.append(prepare(cfg.model, name, workers=cfg.workers, microbatches=cfg.microbatches, epochs=cfg.epochs,
                            batch_size=cfg.batch_size, lr=lr, seed=seed, out=out, progress=False,
                            schedule_options=dict(opts), allow_oversubscribe=True, timeout_s=cfg.timeout_s,
                            **cfg.model_options))
    summaries = run_jobs(jobs)
    curves = pd.concat([_curve(s, r) for s, r in zip(summaries, runs)], ignore_index=True)
    drop_checkpoints(summaries)
    return curves


def drop_checkpoints(summaries) -> None:
    """Remove the runs' resume checkpoints (weights per epoch: not results, and megabytes per run);
    metrics.csv, timeline.csv and summary.json stay."""
    import shutil

    for s in summaries:
        shutil.rmtree(Path(s["out"]) / "checkpoints", ignore_errors=True)


def _curve(summary: dict, run: tuple[str, str, int, float]) -> pd.DataFrame:
    m = pd.read_csv(Path(summary["out"]) / "metrics.csv")
    ends = m.dropna(subset=["test_accuracy"])
    return pd.DataFrame(dict(setting=run[0], scheme=run[1], seed=run[2], epoch=ends["epoch"].astype(int).to_numpy() + 1,
                             test_accuracy=ends["test_accuracy"].to_numpy(float),
                             test_loss=ends["test_loss"].to_numpy(float),
                             wall_s=ends["wall_ms"].to_numpy(float) / 1e3,
                             schedule=summary["schedule"], update=summary["update"], workers=summary["workers"],
                             stages=summary["stages"], lr=summary["lr"]))


def epochs_to_target(curves: pd.DataFrame, target: float) -> pd.DataFrame:
    """Per (setting, scheme, seed): the first epoch whose test accuracy is >= ``target`` (NaN: never),
    the best and final accuracy, and ``diverged`` (a non-finite test loss)."""
    rows = []
    for (setting, scheme, seed), g in curves.groupby(["setting", "scheme", "seed"], sort=False):
        g = g.sort_values("epoch")
        hit = g[g["test_accuracy"] >= target]
        rows.append(dict(setting=setting, scheme=scheme, seed=seed, lr=float(g["lr"].iloc[0]), target=target,
                         epochs_to_target=float(hit["epoch"].iloc[0]) if len(hit) else math.nan,
                         wall_s_to_target=float(hit["wall_s"].iloc[0]) if len(hit) else math.nan,
                         wall_s_per_epoch=float(g["wall_s"].iloc[-1] / g["epoch"].iloc[-1]),
                         best_accuracy=float(g["test_accuracy"].max()),
                         final_accuracy=float(g["test_accuracy"].iloc[-1]),
                         diverged=bool(not np.isfinite(g["test_loss"]).all())))
    return pd.DataFrame(rows)


def statistical_summary(per_seed: pd.DataFrame) -> pd.DataFrame:
    """Per scheme over seeds: ``epochs_to_target`` = the mean over seeds, +inf when any seed never
    reaches the target (a scheme that fails for some seeds has no dependable time to target); how many
    reached, min / max / mean epochs over the seeds that reached, mean and spread of the final
    accuracy, measured seconds per epoch."""
    g = per_seed.assign(e=per_seed["epochs_to_target"].fillna(math.inf)).groupby(["setting", "scheme"], sort=False)
    return pd.DataFrame(dict(lr=g["lr"].first(),
        seeds=g.size(), reached=g["epochs_to_target"].count(), epochs_to_target=g["e"].mean(),
        epochs_mean_reached=g["epochs_to_target"].mean(), epochs_min=g["epochs_to_target"].min(),
        epochs_max=g["epochs_to_target"].max(), final_accuracy=g["final_accuracy"].mean(),
        final_accuracy_min=g["final_accuracy"].min(), final_accuracy_max=g["final_accuracy"].max(),
        wall_s_per_epoch=g["wall_s_per_epoch"].mean(), diverged=g["diverged"].sum(),
    )).reset_index()


# ---- hardware efficiency: modeled on the paper's cluster -------------------------------------
def _plan_for(scheme: str, profile, topology):
    """The plan a scheme runs on ``topology``: PipeDream's optimal plan for the PipeDream variants,
    the straight (one worker per stage) optimum for GPipe and model parallelism, one stage for data
    parallelism."""
    import workbench as wb
    from ..plan import Plan

    name = HARDWARE_SCHEMES[scheme][0]
    if scheme == "pipedream-straight" or name in ("gpipe", "model-parallel"):
        return wb.partition(profile, topology, straight=True)
    if name == "pipedream":
        return wb.partition(profile, topology)
    return Plan.from_boundaries([len(profile.layers) - 1])


def _schedule_for(scheme: str, plan, workers: int):
    """The scheme's schedule, long enough for a steady state: PipeDream with the plan's
    communication-aware warm-up (``Plan.in_flight``), GPipe with ``4 S`` microbatches per flush."""
    from .. import schedules

    name, opts = HARDWARE_SCHEMES[scheme]
    S = plan.num_stages
    if name == "gpipe":
        return schedules.build(name, plan, 4 * S, steps=4)
    if name in ("dp-bsp", "dp-asp"):
        return schedules.build(name, plan, 8 * workers, workers=workers)
    if name == "pipedream" and plan.in_flight:
        opts = dict(opts, warmup=list(plan.in_flight))
    return schedules.build(name, plan, 16 * workers, **opts)


def modeled_hardware(profile_name: str = "vgg16", preset: str = CLUSTER_A, gpus=(4, 8, 16),
                     schemes=tuple(HARDWARE_SCHEMES)) -> pd.DataFrame:
    """Per (scheme, GPUs): the simulated steady-state ms per minibatch (the profile's minibatch; the
    cost model's ``SimResult.time_per_minibatch_ms``), speedup over one GPU, mean share of time
    waiting on communication, and the planner's own prediction (``Plan.predicted_ms``; BSP:
    ``partition.data_parallel_ms``) for the schemes it models."""
    from .. import pipedream_graph
    from ..topology import Topology

    profile = pipedream_graph.shipped(profile_name)
    per_gpu = Topology.preset(preset, 1).counts[0]
    rows = []
    for n in gpus:
        if n % per_gpu:
            raise ValueError(f"{n} GPUs is not a whole number of {preset} servers ({per_gpu} GPUs each)")
        topo = Topology.preset(preset, n // per_gpu)
        for scheme in schemes:
            rows.append(_hardware_row(scheme, profile, topo, profile_name))
    return pd.DataFrame(rows)


def _hardware_row(scheme, profile, topo, profile_name) -> dict:
    import workbench as wb

    plan = _plan_for(scheme, profile, topo)
    res = wb.simulate(_schedule_for(scheme, plan, topo.num_workers), profile=profile, plan=plan, topology=topo)
    single = _single_gpu_ms(profile)
    ms = res.time_per_minibatch_ms
    return dict(scheme=scheme, gpus=topo.num_workers, servers=topo.counts[-1], stages=plan.num_stages,
                plan=_plan_text(plan, scheme), ms_per_minibatch_modeled=ms, speedup_modeled=single / ms,
                comm_share_modeled=float(np.mean(res.metrics["comm_wait_share"])),
                steady_state=bool(res.metrics["steady_state"]),
                planner_speedup=_planner_speedup(scheme, plan, profile, topo),
                label=f"modeled (profile {profile_name}: PipeDream's GPU graph.txt; topology {topo.name}; "
                      f"workbench.simulate steady state)")


def _single_gpu_ms(profile) -> float:
    """The planner's time of one minibatch on one GPU (all layers, forward + backward)."""
    import workbench as wb
    from ..topology import Topology

    return wb.partition(profile, Topology.flat(1, 1e9)).single_worker_ms


def _plan_text(plan, scheme) -> str:
    if HARDWARE_SCHEMES[scheme][0] in ("dp-bsp", "dp-asp"):
        return "1 stage on every GPU"
    return "-".join(str(s.replicas) for s in plan.stages)


def _planner_speedup(scheme, plan, profile, topo) -> float:
    """The planner's predicted speedup over one GPU (``Plan.predicted_ms``; BSP: ``data_parallel_ms``)."""
    from ..partition import data_parallel_ms

    name = HARDWARE_SCHEMES[scheme][0]
    if name == "dp-bsp":
        return _single_gpu_ms(profile) / data_parallel_ms(profile, topo)
    if name == "pipedream":
        return _single_gpu_ms(profile) / plan.predicted_ms
    return math.nan

"""PipeDream (SOSP'19) §5.2-5.5: time to a target accuracy = epochs to target × time per epoch.

    TTA(scheme) = E(scheme) · T_epoch(scheme)

* ``E`` (statistical efficiency): a small 1-D CNN on MNIST-1D (:mod:`repro.convergence`:
  every scheme at the same learning rate, every optimizer step averaging the same number of samples,
  several seeds). The deterministic weight rules (PipeDream with stashing, without it, with
  vertical sync, as one stream per epoch as PipeDream runs; GPipe; model parallelism; BSP) come from
  the single-process semantic reference (``engine="reference"``); ASP (Hogwild on shared memory:
  its staleness is decided by timing) from the real runtime (``engine="runtime"``). Seed 0 of every
  deterministic scheme also runs through the real runtime for ``check_epochs`` epochs: its weights
  and test accuracy against the reference's (``runtime_check.csv``), and its measured time per epoch.
  Per scheme: the first epoch at or above ``target`` per seed, the mean with a 95% Student-t
  interval, the median (``epochs_median``, finite while at least half the seeds reach), and
  two-sided Mann-Whitney U tests against PipeDream and BSP. ASP is compared the paper's way ("7.4x
  faster than ASP to 48% accuracy", the level ASP reaches): at the best accuracy of ASP's median
  curve over seeds, with median epochs on both sides (a seed of ASP that never gets there makes the
  mean inf, not the median).
  Where PipeDream's plan for a cluster is one stage replicated on every GPU it *is* BSP (same update
  rule) and takes BSP's ``E``.
* ``T_epoch`` (hardware efficiency) two ways:
  - measured: the real runs' wall clock per epoch on this machine (CPU gloo ranks);
  - modeled: the paper's setting calibrated on its data-parallel numbers
    (:mod:`repro.paper_fit`; default the arXiv version's Cluster-A, one GPU per
    machine) and PipeDream's published GPU profile (``paper_fit.model_profile``: on a Titan X scaled by
    the peak FLOP/s ratio), each scheme's
    schedule simulated (:func:`workbench.simulate`, the one ``CostModel``) on its plan: its steady-state ``time_per_minibatch_ms`` (warm-up and
    drain excluded; a minibatch is the profile's batch), ``speedup = single-GPU ms / that``, and the
    modeled time to target in *single-GPU epochs* ``E / speedup``. The planner's prediction
    (``Plan.predicted_ms``) is reported beside it.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from repro import convergence as cv
from repro import dp_overhead as dpo
from repro import lr_grid as lg
from repro import protocol
from repro.common import check_config, claim, out_folder, paper_value, save_table, with_interval, write_claims
from repro.convergence import ASP, BSP, PIPEDREAM, SCHEMES
from repro.pages import save_page, slim_runs
from repro.paper_fit import SETTINGS, fitted_params, model_profile
from workbench import schedules
from workbench.partitioning import partition
from workbench.runtime import stage_lrs
from workbench.schedules import spec
from workbench.simulation import simulate
from workbench.viz import PALETTE

EXPERIMENT = "03_time_to_accuracy"
#: modeled only: PipeDream's 1F1B on the straight (unreplicated) optimal plan, the paper's "straight pipeline"
STRAIGHT = "pipedream-straight"
HARDWARE_SCHEMES: dict[str, tuple[str, dict]] = {**SCHEMES, STRAIGHT: ("pipedream", {"weights": "stash"})}
SETTING = "arxiv-A"  # the arXiv version's Cluster-A, calibrated (repro.paper_fit)


def _from_protocol(name: str, convert=None):
    """A dataclass field whose default is the protocol's value of ``statistical_efficiency.<name>``
    (``data/protocol.toml``, read when a :class:`Config` is built, not when this module is imported),
    passed through ``convert`` when given."""

    def default():
        value = protocol.value(f"statistical_efficiency.{name}")
        return value if convert is None else convert(value)

    return field(default_factory=default)


@dataclass(frozen=True)
class Config:
    """One experiment's parameters (the notebook's ``parameters`` cell fills it)."""

    model: str = _from_protocol("model")
    model_options: dict = field(default_factory=dict)
    dataset_options: dict = field(default_factory=dict)  # the zoo's data set loader's (the second task's)
    workers: int = _from_protocol("workers")  # pipeline stages / data-parallel replicas
    microbatches: int = _from_protocol("microbatches")
    samples_per_update: int = _from_protocol(
        "samples_per_update"
    )  # every scheme's optimizer step averages this many samples
    lr: float = _from_protocol("lr")
    stage_lr: str = _from_protocol("stage_lr")  # a replicated stage's learning rate in the PipeDream arms
    epochs: int = _from_protocol("epochs")
    seeds: tuple[int, ...] = _from_protocol("seeds", tuple)
    target: float = _from_protocol("target")
    schemes: tuple[str, ...] = tuple(SCHEMES)
    check_epochs: int = 2  # seed 0 of every deterministic scheme through the real runtime (0: none)
    grid: bool = True  # every weight rule over the whole lr grid, on both stand-in tasks (repro.lr_grid)
    lr_grid_every: int = 1  # the grids at every n-th learning rate of the protocol's (1: all of them)
    lm_epochs: int = _from_protocol("lm_epochs")  # the second task's budget
    processes: int = _from_protocol("processes")  # the grid's reference curves run this many at a time
    profile: str = "vgg16"
    setting: str = SETTING
    gpus: tuple[int, ...] = (4, 8, 16)
    timeout_s: float = 600.0

    def __post_init__(self):
        bad = sorted(set(self.schemes) - set(SCHEMES))
        if bad:
            raise ValueError(f"unknown scheme(s) {bad}; choose from {list(SCHEMES)}")
        for need in (PIPEDREAM, BSP):
            if need not in self.schemes:
                raise ValueError(f"schemes must include {need!r}: the others are compared with it")
        if self.workers < 2:
            raise ValueError(f"workers must be >= 2 to compare parallel schemes, got {self.workers}")
        if not 0 < self.target <= 1:
            raise ValueError(f"target is a test accuracy in (0, 1], got {self.target}")
        if not self.seeds:
            raise ValueError("give at least one seed")
        if not 0 <= self.check_epochs <= self.epochs:
            raise ValueError(f"check_epochs must be in 0..epochs ({self.epochs}), got {self.check_epochs}")
        if min(self.lm_epochs, self.processes, self.lr_grid_every) < 1:
            raise ValueError(
                f"lm_epochs, processes and lr_grid_every must be >= 1, got {self.lm_epochs}, {self.processes} "
                f"and {self.lr_grid_every}"
            )
        if any(g < 1 for g in self.gpus):
            raise ValueError(f"gpus must be positive GPU counts, got {self.gpus}")
        if self.setting not in _settings():
            raise ValueError(f"unknown hardware setting {self.setting!r}; choose one of {sorted(_settings())}")

    @property
    def setup(self) -> cv.Setup:
        return cv.Setup(
            model=self.model,
            workers=self.workers,
            microbatches=self.microbatches,
            samples_per_update=self.samples_per_update,
            lr=self.lr,
            stage_lr=self.stage_lr,
            epochs=self.epochs,
            model_options=tuple(sorted(self.model_options.items())),
            dataset_options=tuple(sorted(self.dataset_options.items())),
            timeout_s=self.timeout_s,
        )


def _settings() -> Mapping:
    return SETTINGS


# ---- statistical efficiency ----------------------------------------------------------------------
def statistical_efficiency(cfg: Config, out, grid: dict | None = None) -> dict[str, pd.DataFrame]:
    """Learning curves of every (scheme, seed) (reference for the deterministic rules, runtime for
    ASP), the real-runtime check runs, and the statistics at ``cfg.target`` and at ASP's own target.
    ``grid`` (:func:`repro.lr_grid.run_grid` of the first task, which ran ``cfg.lr`` over
    ``cfg.seeds``): its curves at ``cfg.lr`` are these, not run again (the check runs' reference
    weights are: ``check_epochs`` epochs of seed 0)."""
    setup = cfg.setup
    det = [sc for sc in cfg.schemes if cv.deterministic(setup, sc)]
    checks = [(sc, cfg.seeds[0], cfg.check_epochs) for sc in det] if cfg.check_epochs else []
    keep = {(sc, seed): e for sc, seed, e in checks}
    if grid is None:
        ref, kept = cv.reference_sweep(setup, det, cfg.seeds, Path(out) / "scratch", keep=keep)
        asp_runs_ = [(sc, seed, cfg.epochs) for sc in cfg.schemes if sc not in det for seed in cfg.seeds]
    else:
        g = grid["curves"]
        ref = g[(g["lr"] == cfg.lr) & g["arm"].isin(det)][
            ["epoch", "test_accuracy", "test_loss", "scheme", "seed", "engine"]
        ]
        short = replace(setup, epochs=max(cfg.check_epochs, 1))
        kept = cv.reference_sweep(short, det, cfg.seeds[:1], Path(out) / "scratch", keep=keep)[1] if checks else {}
        asp_runs_ = []
    real, summaries = (
        cv.runtime_runs(setup, checks + asp_runs_, Path(out) / "runs") if checks + asp_runs_ else (pd.DataFrame(), [])
    )
    if grid is not None and grid["asp_summaries"]:
        g = grid["curves"]
        cols = ["epoch", "test_accuracy", "test_loss", "wall_s", "scheme", "seed", "engine"]
        real = pd.concat([real, g[(g["lr"] == cfg.lr) & (g["arm"] == ASP)][cols]], ignore_index=True)
        summaries = summaries + grid["asp_summaries"].get(cfg.lr, [])
    slim_runs(summaries, drop=("checkpoints", "timeline.csv", "weights.pt"))
    asp = real[~real["scheme"].isin(det)] if len(real) else real
    curves = pd.concat([ref, asp.drop(columns="wall_s", errors="ignore")], ignore_index=True)
    check = cv.runtime_check(real[real["scheme"].isin(det)], curves, summaries, kept) if checks else pd.DataFrame()
    speed = _seconds_per_epoch(real)
    per_seed = cv.epochs_to_target(curves, cfg.target)
    tables = dict(
        curves=curves,
        epochs_to_target=per_seed,
        statistical=_with_speed(cv.scheme_summary(per_seed), speed),
        significance=pd.concat([cv.compare(per_seed, PIPEDREAM), cv.compare(per_seed, BSP)], ignore_index=True),
        runtime_check=check,
    )
    if ASP in cfg.schemes:
        tables["asp_target"] = asp_target_table(curves, speed)
        tables["asp_runs"] = asp_runs(per_seed, summaries)
    return tables


def asp_runs(per_seed: pd.DataFrame, summaries: list[dict]) -> pd.DataFrame:
    """Per ASP seed: the staleness its replicas measured (updates of a stage written by the other
    replicas between a replica's pull and its write: mean and max over its updates, from the run's
    ``summary.json``) beside its best and final test accuracy and whether it diverged."""
    by_name = {Path(s["out"]).name: s for s in summaries}
    rows = per_seed[per_seed["scheme"] == ASP][["seed", "best_accuracy", "final_accuracy", "diverged"]].copy()
    run = [by_name.get(f"{ASP}-s{seed}", {}) for seed in rows["seed"]]
    rows["staleness_mean"] = [r.get("staleness_mean", math.nan) for r in run]
    rows["staleness_max"] = [r.get("staleness_max", math.nan) for r in run]
    rows["label"] = "measured (this machine: the real runtime's Hogwild replicas on shared memory)"
    return rows.reset_index(drop=True)


def asp_target_table(curves: pd.DataFrame, speed: pd.Series) -> pd.DataFrame:
    """Every scheme's statistics (:func:`~repro.convergence.scheme_summary`, with the
    measured seconds per epoch ``speed``) at ASP's own target
    (:func:`~repro.convergence.slow_scheme_target`: the best accuracy of ASP's median
    curve), with its ratio to ASP (``ratio``: means, ``ratio_median``: medians) and the two-sided
    Mann-Whitney p-value against ASP."""
    at_asp = cv.epochs_to_target(curves, cv.slow_scheme_target(curves, ASP))
    versus = cv.compare(at_asp, ASP)[["scheme", "ratio", "ratio_median", "p_mannwhitney", "p_welch"]]
    return _with_speed(cv.scheme_summary(at_asp), speed).merge(versus, on="scheme", how="left")


def asp_delay_table(delay_curves: pd.DataFrame, curves: pd.DataFrame, hardware: pd.DataFrame) -> pd.DataFrame:
    """PipeDream against ASP at each GPU count ``g`` of ``delay_curves`` (:func:`convergence.asp_delay_sweep`:
    ASP on ``g`` replicas, delay ``g - 1``, protocol ``baselines.asp_delay``), the paper's way: at
    ASP's own target there (the best accuracy of its median curve), median epochs of ASP and of
    PipeDream (``curves``' PipeDream arm), their ratio, times the modeled time per epoch at ``g``
    (``hardware``: PipeDream's simulated speedup / ASP's); the U test of ASP against PipeDream."""
    rows = []
    hw = hardware.set_index(["scheme", "gpus"])["speedup_modeled"]
    for g, d in delay_curves.groupby("gpus", sort=True):
        target = cv.slow_scheme_target(d, ASP)
        both = pd.concat([d.drop(columns=["gpus", "delay"]), curves[curves["scheme"] == PIPEDREAM]], ignore_index=True)
        per_seed = cv.epochs_to_target(both, target)
        st = cv.scheme_summary(per_seed).set_index("scheme")
        vs = cv.compare(per_seed, PIPEDREAM).set_index("scheme")
        e_pd = st.loc[PIPEDREAM, "epochs_median"]
        e_x = st.loc[ASP, "epochs_median"] / e_pd if math.isfinite(e_pd) else math.nan
        hw_x = float(hw.get((PIPEDREAM, g), math.nan) / hw.get((ASP, g), math.nan))
        a = per_seed[per_seed["scheme"] == ASP]
        rows.append(
            dict(
                gpus=int(g),
                delay=int(d["delay"].iloc[0]),
                target=target,
                asp_epochs_median=st.loc[ASP, "epochs_median"],
                asp_reached=int(st.loc[ASP, "reached"]),
                asp_best_accuracy_median=float(a["best_accuracy"].median()),
                asp_diverged=int(a["diverged"].sum()),
                pipedream_epochs_median=st.loc[PIPEDREAM, "epochs_median"],
                pipedream_reached=int(st.loc[PIPEDREAM, "reached"]),
                seeds=int(st.loc[ASP, "seeds"]),
                epochs_factor=e_x,
                hardware_factor=hw_x,
                x_vs_pipedream_modeled=e_x * hw_x,
                p_mannwhitney=float(vs.loc[ASP, "p_mannwhitney"]),
                label="modeled (epochs: ASP's bounded-delay model on the statistical-efficiency task, the semantic "
                "reference; time per epoch: simulated speedups)",
            )
        )
    return pd.DataFrame(rows)


# ---- data parallelism at the papers' global batch (protocol baselines.dp_global_batch) ----------
def dp_lr_candidates(cfg: Config) -> list[tuple[str, float]]:
    """Data parallelism's candidate learning rates at the papers' global batch: each multiple of
    ``cfg.lr`` that ``statistical_efficiency.dp_lr_multipliers`` names, as (name, lr)."""
    named = {"1": 1.0, "sqrt(workers)": math.sqrt(cfg.workers), "workers": float(cfg.workers)}
    out = []
    for tok in (t.strip() for t in str(protocol.value("statistical_efficiency.dp_lr_multipliers")).split(",")):
        if tok not in named:
            raise ValueError(f"statistical_efficiency.dp_lr_multipliers: unknown multiple {tok!r}; use {sorted(named)}")
        out.append((tok, named[tok] * cfg.lr))
    return out


def config_text(replicas) -> str:
    """Replicas per stage as the papers write a configuration: ``(1, 1, 2)`` -> ``"1-1-2"``."""
    return "-".join(str(int(r)) for r in replicas)


def task_words(cfg: Config) -> str:
    """How a row names the stand-in task ``cfg`` trains: the first (the protocol's
    ``statistical_efficiency.model``) or the second (:func:`second_task`'s LM)."""
    if cfg.model == protocol.value("statistical_efficiency.lm_model"):
        return f"{cfg.model}, the second stand-in task (char-level LSTM LM on pydocs, lr {cfg.lr:g} by the protocol's rule)"
    return f"{cfg.model}, the stand-in task"


def dp_global_batch(cfg: Config, configs=((),)) -> pd.DataFrame:
    """Epochs to ``cfg.target``, per seed, of data parallelism as the papers ran it
    (``baselines.dp_global_batch``: each of ``cfg.workers`` replicas takes the per-GPU minibatch, so a
    step averages ``workers x samples_per_update`` samples) at each candidate learning rate
    (:func:`dp_lr_candidates`), and of PipeDream at each configuration of ``configs`` (replicas per
    stage, ``()``: a straight pipeline of ``cfg.workers`` stages; every microbatch
    ``samples_per_update`` samples, at ``cfg.lr``, a replicated stage's by ``cfg.stage_lr``; one
    stage on every GPU is data parallelism and is not run), every arm within ``workers x epochs`` epochs (``statistical_efficiency.dp_epochs``: as
    many steps as the budget gives at ``samples_per_update``, counted at data parallelism's batch).
    The semantic reference, each curve stopped at the target; one row per (scheme,
    configuration, lr, seed), ``chosen`` marking the learning rate each side's ratio uses (data
    parallelism's by :func:`choose_dp_lr`)."""
    W, u = cfg.workers, cfg.samples_per_update
    budget = W * cfg.epochs  # statistical_efficiency.dp_epochs, every arm's
    dp = replace(cfg.setup, samples_per_update=W * u, epochs=budget)
    shapes = dict.fromkeys(tuple(c) or (1,) * W for c in configs if len(tuple(c)) != 1)
    pipe = replace(cfg.setup, epochs=budget)
    arms = [(PIPEDREAM, replace(pipe, replicas=c), config_text(c), "pipeline lr", cfg.lr) for c in shapes]
    arms += [(BSP, dp, "data parallel", m, lr) for m, lr in dp_lr_candidates(cfg)]
    targets = target_ends(cfg)
    frames = []
    with tempfile.TemporaryDirectory(prefix="wb-dp-batch-") as scratch:
        for scheme, setup, config, multiple, lr in arms:
            where = Path(scratch) / f"{scheme}-{config}-{lr:g}"
            curves, _ = cv.reference_sweep(replace(setup, lr=lr), [scheme], cfg.seeds, where, stop_at=max(targets))
            for t in targets:  # a curve stopped at the highest target holds the first epoch at every lower one
                per = cv.epochs_to_target(curves, t).assign(
                    config=config,
                    lr=lr,
                    stage_lr=setup.stage_lr if scheme == PIPEDREAM else "",
                    lr_multiple=multiple,
                    samples_per_update=setup.samples_per_update,
                    budget=setup.epochs,
                )
                frames.append(per)
    table = pd.concat(frames, ignore_index=True)
    at = table["target"] == cfg.target
    dp_lr = choose_dp_lr(table[at & (table["scheme"] == BSP)])
    table["chosen"] = at & ((table["scheme"] == PIPEDREAM) | (table["lr"] == dp_lr))
    table["label"] = (
        f"measured (this machine: the semantic reference on {task_words(cfg)}; each curve stopped at "
        f"the target {max(targets):g}; rows at each target of {list(targets)}, the protocol's "
        "statistical_efficiency.target and its interval's ends)"
    )
    return table[
        [
            "scheme",
            "config",
            "lr_multiple",
            "lr",
            "stage_lr",
            "samples_per_update",
            "seed",
            "target",
            "epochs_to_target",
            "budget",
        ]
        + ["best_accuracy", "final_accuracy", "diverged", "chosen", "label"]
    ]


def _pipeline_lr_text(cfg: Config, shape: tuple[int, ...]) -> str:
    """The learning rates of PipeDream's arm at ``shape`` (replicas per stage) as a row quotes them."""
    lrs = stage_lrs([range(r) for r in shape], cfg.lr, cfg.stage_lr)
    if len(set(lrs)) == 1:
        return f"lr {lrs[0]:g}"
    return (
        f"lr {'-'.join(f'{x:g}' for x in lrs)} by stage: {cfg.lr:g} x its replicas / the first stage's, "
        f"as the authors' runtime sets it"
    )


def choose_dp_lr(per_seed: pd.DataFrame) -> float:
    """The protocol's rule for data parallelism's learning rate (``statistical_efficiency.dp_lr_rule``)
    over rows of (``lr``, ``seed``, ``epochs_to_target``; NaN: not reached): the most seeds at the
    target, then the fewest mean epochs over them, then the smaller lr."""
    g = per_seed.groupby("lr")["epochs_to_target"]
    score = pd.DataFrame(dict(reached=g.count(), mean=g.mean().fillna(math.inf)))
    score = score.reset_index().sort_values(["reached", "mean", "lr"], ascending=[False, True, True])
    return float(score["lr"].iloc[0])


def target_ends(cfg: Config) -> tuple[float, ...]:
    """The targets :func:`dp_global_batch` reads epochs at: ``cfg.target`` and, where it is the
    protocol's ``statistical_efficiency.target``, that entry's interval ends (:func:`repro.protocol.interval`)."""
    key = "statistical_efficiency.target"
    if cfg.target != float(protocol.value(key)):
        return (float(cfg.target),)
    return tuple(sorted({float(cfg.target), *(float(x) for x in protocol.interval(key))}))


def seeds_ends(cfg: Config) -> tuple[tuple[int, ...], ...]:
    """The seed sets :func:`measured_epochs` reads ratios over: ``cfg.seeds`` and the ends of
    :func:`interval_seeds`, fewest seeds first."""
    return tuple(sorted({tuple(cfg.seeds), *interval_seeds(cfg)}, key=len))


def dp_global_batch_ratio(
    table: pd.DataFrame, cfg: Config, config=(), *, target: float | None = None, seeds=None
) -> dict:
    """Data parallelism's mean epochs to the target at its chosen lr over PipeDream's at ``config``
    (replicas per stage, ``()`` straight; :func:`convergence.compare`: inf where a seed of data
    parallelism does not reach it, NaN where one of PipeDream's does not; its two-sided Mann-Whitney
    U p-value), with the text a claim row quotes: ``ratio``, ``p``, ``dp_epochs``,
    ``pipedream_epochs``, ``dp_lr``, ``config``, ``text``. One stage on every GPU is data
    parallelism's own update rule: ratio 1, nothing measured. ``target`` (default ``cfg.target``)
    and ``seeds`` (default every seed of the table) select the table's rows; data parallelism's lr is
    chosen again over them (:func:`choose_dp_lr`)."""
    t = float(cfg.target if target is None else target)
    if "target" in table.columns:
        if not (table["target"] == t).any():
            raise ValueError(f"no rows at the target {t:g} in the table (it has {sorted(set(table['target']))})")
        table = table[table["target"] == t]
    if seeds is not None:
        table = table[table["seed"].isin(list(seeds))]
    dp_rows = table[table["scheme"] == BSP]
    dp_lr = choose_dp_lr(dp_rows) if len(dp_rows) else math.nan
    table = table.assign(chosen=(table["scheme"] == PIPEDREAM) | (table["lr"] == dp_lr))
    cfg = replace(cfg, target=t)
    W, u = cfg.workers, cfg.samples_per_update
    shape = tuple(config) or (1,) * W
    name = config_text(shape)
    if len(shape) == 1:
        text = f"the configuration {name} is one stage on every GPU: data parallelism's own update rule, epochs ratio 1"
        return dict(ratio=1.0, p=math.nan, dp_epochs=math.nan, pipedream_epochs=math.nan, dp_lr=math.nan,
                    config=name, text=text)  # fmt: skip
    pick = table[table["chosen"] & ((table["scheme"] == BSP) | (table["config"] == name))]
    if not (pick["scheme"] == PIPEDREAM).any():
        raise ValueError(f"no PipeDream arm at {name} in the table; run dp_global_batch with that configuration")
    c = cv.compare(pick, PIPEDREAM).iloc[0]
    e = {k: pick[pick["scheme"] == k]["epochs_to_target"] for k in (BSP, PIPEDREAM)}
    mean = {k: float(v.mean()) if v.notna().all() else math.inf for k, v in e.items()}
    dp = pick[pick["scheme"] == BSP].iloc[0]
    n = len(e[BSP])
    others = ", ".join(dict.fromkeys(str(x) for x in table.loc[table["scheme"] == BSP, "lr_multiple"]))
    text = (
        f"measured here on {task_words(cfg)} (the semantic reference, {n} seed(s), target {cfg.target:g}): "
        f"data parallelism as the paper ran it ({W} x {u} samples per step, lr {dp['lr']:g} = {dp['lr_multiple']} x "
        f"{cfg.lr:g}, the most favourable of {others}) reaches it in {mean[BSP]:.1f} epochs (mean, "
        f"{int(e[BSP].notna().sum())}/{n} seeds within {int(dp['budget'])}), PipeDream at {name} ({u} per microbatch, "
        f"{_pipeline_lr_text(cfg, shape)}) in {mean[PIPEDREAM]:.1f} ({int(e[PIPEDREAM].notna().sum())}/{n} seeds): epochs ratio {c['ratio']:.2f} (Mann-Whitney p = {c['p_mannwhitney']:.3g})"
    )
    return dict(
        ratio=float(c["ratio"]),
        p=float(c["p_mannwhitney"]),
        dp_epochs=mean[BSP],
        pipedream_epochs=mean[PIPEDREAM],
        dp_lr=float(dp["lr"]),
        config=name,
        text=text,
    )


def measured_epochs(cfg: Config, arms: dict, *, tasks=()) -> tuple[pd.DataFrame, dict]:
    """The epochs ratios the SOSP rows without stated epochs take (protocol
    ``time_to_target.sosp_unstated``): ``arms`` maps a row's key to ``{"plan": replicas per stage of
    its time per epoch, "paper": the paper's configuration or None}``
    (``paper_fit.epochs_arms``); returns :func:`dp_global_batch`'s table over every configuration
    (``task``: the model it trained) and, per key, :func:`dp_global_batch_ratio` at the plan's
    configuration, with the paper's under ``"paper"`` where it differs, and under ``"at"`` the same
    at each end of the protocol's target and seeds intervals, ``{(target, seeds): ...}``
    (``paper_fit.measured_for`` picks one). ``tasks``: further stand-in tasks as :class:`Config`
    (:func:`second_task`), each measured the same way at its own lr and target (no interval ends)
    under ``"tasks"``, ``{model: ...}``."""
    configs = [c for a in arms.values() for c in (a["plan"], a["paper"]) if c]
    table = dp_global_batch(cfg, configs).assign(task=cfg.model)
    variants = [(t, tuple(cfg.seeds)) for t in target_ends(cfg)]
    variants += [(float(cfg.target), s) for s in seeds_ends(cfg) if s != tuple(cfg.seeds)]
    out = {}
    for key, at in _ratios(table, cfg, arms, variants).items():
        out[key] = dict(at[(float(cfg.target), tuple(cfg.seeds))], at=at, tasks={})
    frames = [table]
    for other in tasks:
        t2 = dp_global_batch(other, configs).assign(task=other.model)
        frames.append(t2)
        for key, at in _ratios(t2, other, arms, [(float(other.target), tuple(other.seeds))]).items():
            out[key]["tasks"][other.model] = next(iter(at.values()))
    return pd.concat(frames, ignore_index=True), out


def _ratios(table: pd.DataFrame, cfg: Config, arms: dict, variants) -> dict:
    """Per key of ``arms``, ``{(target, seeds): dp_global_batch_ratio at the plan's configuration}``
    for each of ``variants``, the paper's configuration's under ``"paper"`` where it differs."""
    out = {}
    for key, a in arms.items():
        at = {}
        for t, seeds in variants:
            m = dp_global_batch_ratio(table, cfg, a["plan"], target=t, seeds=seeds)
            if a["paper"] and tuple(a["paper"]) != tuple(a["plan"]):
                m["paper"] = dp_global_batch_ratio(table, cfg, a["paper"], target=t, seeds=seeds)
            at[(t, seeds)] = m
        out[key] = at
    return out


def second_task(cfg: Config) -> tuple[Config, pd.DataFrame]:
    """The second stand-in task (:func:`repro.lr_grid.tasks`' LM, the protocol's ``lm_*`` entries,
    on ``cfg``'s workers, microbatches, stage lr and seeds) as a :class:`Config` at the lr and target
    the protocol's rule picks on its BSP curves over ``lm_lr_grid`` within ``lm_epochs``
    (:func:`repro.convergence.lr_rule`: notebook 03's rule on the same deterministic curves, so the
    same lr and target), and the rule's table (``task``: the model)."""
    task = lg.tasks(cfg.setup, cfg.seeds, cfg.lm_epochs, cfg.lr_grid_every)[1]
    s = task.setup
    with tempfile.TemporaryDirectory(prefix="wb-lm-rule-") as scratch:
        curves = cv.grid_sweep(s, [cv.Arm(BSP, BSP)], task.lrs, task.seeds, scratch, processes=cfg.processes)
    table, lr, target = cv.lr_rule(curves, s.epochs, s.model)
    lm = replace(
        cfg,
        model=s.model,
        model_options=dict(s.model_options),
        dataset_options=dict(s.dataset_options),
        samples_per_update=s.samples_per_update,
        epochs=s.epochs,
        lr=lr,
        target=target,
    )
    return lm, table.assign(task=s.model)


def _seconds_per_epoch(real: pd.DataFrame) -> pd.Series:
    """Measured seconds per epoch per scheme on this machine: the real runs' wall clock at their last
    epoch / epochs, mean over the scheme's runs."""
    if real.empty:
        return pd.Series(dtype=float)
    last = real.sort_values("epoch").groupby(["scheme", "seed"]).tail(1)
    return (last["wall_s"] / last["epoch"]).groupby(last["scheme"]).mean()


def _with_speed(stats: pd.DataFrame, speed: pd.Series) -> pd.DataFrame:
    return stats.assign(s_per_epoch_measured=stats["scheme"].map(speed))


# ---- hardware efficiency: modeled on the paper's cluster -------------------------------------
def _spec(scheme: str):
    """The registration of the schedule a hardware scheme runs (what it knows decides the plan)."""

    return spec(HARDWARE_SCHEMES[scheme][0])


def _pipelined_with_data_parallel_plans(scheme: str) -> bool:
    """Whether a hardware scheme is a pipeline schedule whose plans may replicate stages (its
    registration's ``data_parallel_plan``): with a one-stage plan it *is* BSP."""
    sp = _spec(scheme)
    return sp.family != "data-parallel" and sp.data_parallel_plan


def _plan_for(scheme: str, profile, topology, cost: dict | None = None):
    """The plan a scheme runs on ``topology``: PipeDream's optimal plan for the PipeDream variants,
    the straight (one worker per stage) optimum for GPipe and model parallelism, one stage for data
    parallelism."""

    sp = _spec(scheme)
    if sp.family == "data-parallel":  # one stage per DDP gradient bucket, every bucket on every GPU
        return dpo.bucket_plan(profile)
    price = {**(cost or {}), **one_price()}  # the partitioner prices a replicated stage as DDP's round
    if scheme == STRAIGHT or not sp.data_parallel_plan:  # stages cannot be replicated
        return partition(profile, topology, straight=True, **price)
    return partition(profile, topology, **price)


def one_price() -> dict:
    """The cost model's keywords that make a replicated stage cost what data parallelism's round
    costs (:meth:`workbench.cost.CostModel.replicated_stage_ms`): DDP's buckets of the protocol's
    ``ddp.bucket_bytes``, each all-reduced once its backward has ended (``ddp.allreduce_ready``)."""
    return dict(allreduce_ready=str(protocol.value("ddp.allreduce_ready")), bucket_cap_bytes=dpo.ddp_bucket_bytes())


def _schedule_for(scheme: str, plan, workers: int):
    """The scheme's schedule, long enough for a steady state: PipeDream with the plan's
    communication-aware warm-up (``Plan.in_flight``), GPipe with ``k S`` microbatches per flush (the
    protocol's ``baselines.gpipe_microbatches_per_stage`` k)."""

    name, opts = HARDWARE_SCHEMES[scheme]
    sp, S = _spec(scheme), plan.num_stages
    if sp.flushes:
        return schedules.build(name, plan, protocol.gpipe_microbatches(S), steps=4)
    if sp.family == "data-parallel":
        return schedules.build(name, plan, 3 * workers, workers=workers)
    if plan.in_flight and any(o.name == "warmup" for o in sp.options):
        opts = dict(opts, warmup=list(plan.in_flight))
    return schedules.build(name, plan, 16 * workers, **opts)


def modeled_hardware(
    profile_name: str = "vgg16", setting: str = SETTING, gpus=(4, 8, 16), schemes=tuple(HARDWARE_SCHEMES)
) -> pd.DataFrame:
    """Per (scheme, GPUs): the simulated steady-state ms per minibatch (the profile's minibatch; the
    cost model's ``SimResult.time_per_minibatch_ms``), speedup over one GPU, mean share of time
    waiting on communication, and the planner's own prediction (``Plan.predicted_ms``; BSP:
    ``partition.data_parallel_ms``) for the schemes it models, on ``setting``'s calibrated links."""

    if setting not in SETTINGS:
        raise ValueError(f"unknown hardware setting {setting!r}; choose one of {sorted(SETTINGS)}")
    s = SETTINGS[setting]
    params = fitted_params()[s.group]

    profile = model_profile(profile_name, s.gpu)
    rows = []
    for n in gpus:
        if n > s.gpus_per_machine and n % s.gpus_per_machine:
            raise ValueError(f"{n} GPUs is not a whole number of {setting} machines ({s.gpus_per_machine} GPUs each)")
        topo = s.topology(n)
        cost = s.collective(topo, params)
        what = f"{profile_name}; {s.title} calibrated"
        row = {sc: _hardware_row(sc, profile, topo, cost, what) for sc in schemes if sc != ASP}
        if ASP in schemes:  # no communication overhead (the protocol): compute alone
            row[ASP] = _asp_row(profile, topo, what)
        rows += [row[sc] for sc in schemes]
    return pd.DataFrame(rows)


def _asp_row(profile, topo, what) -> dict:
    """ASP's hardware row: as the protocol says (``baselines.asp_communication``, the arXiv text:
    "ASP has no communication overhead"), each worker's minibatch costs its compute alone, so ``W``
    workers run ``W`` times one GPU's rate."""
    if protocol.value("baselines.asp_communication") != "none":
        raise ValueError("baselines.asp_communication: only 'none' (the arXiv text) is modeled")
    n = topo.num_workers
    ms = _single_gpu_ms(profile) / n
    return dict(
        scheme=ASP,
        gpus=n,
        stages=1,
        plan="1 stage on every GPU",
        ms_per_minibatch_modeled=ms,
        speedup_modeled=float(n),
        comm_share_modeled=0.0,
        steady_state=True,
        planner_speedup=math.nan,
        label=f"modeled (profile {what}: compute alone, no communication overhead, protocol "
        f"baselines.asp_communication: {protocol.source('baselines.asp_communication')})",
    )


def _hardware_row(scheme, profile, topo, cost: dict, what) -> dict:
    """``cost``: the calibrated all-reduce (``allreduce_bandwidth``, ``allreduce_latency_ms``); data
    parallelism runs DDP's buckets, each all-reduced once its backward has ended (the protocol)."""
    plan = _plan_for(scheme, profile, topo, cost)
    sim_cost = dict(cost)
    sim_plan, sched = plan, None
    if _spec(scheme).family != "data-parallel" and plan.num_stages == 1 and topo.num_workers > 1:
        # the partitioner's plan is one stage on every GPU: data parallelism, simulated as BSP is
        sim_plan = dpo.bucket_plan(profile)
        sched = schedules.build("dp-bsp", sim_plan, 3 * topo.num_workers, workers=topo.num_workers)
    if _spec(scheme).family == "data-parallel" or sched is not None:
        sim_cost["allreduce_ready"] = protocol.value("ddp.allreduce_ready")
    sched = sched or _schedule_for(scheme, plan, topo.num_workers)
    res = simulate(sched, profile=profile, plan=sim_plan, topology=topo, **sim_cost)
    single = _single_gpu_ms(profile)
    ms = res.time_per_minibatch_ms
    return dict(
        scheme=scheme,
        gpus=topo.num_workers,
        stages=plan.num_stages,
        plan=_plan_text(plan, scheme),
        ms_per_minibatch_modeled=ms,
        speedup_modeled=math.nan if ms is None else single / ms,
        comm_share_modeled=float(np.mean(res.metrics["comm_wait_share"])),
        steady_state=bool(res.metrics["steady_state"]),
        planner_speedup=_planner_speedup(scheme, plan, profile, topo, cost),
        label=f"modeled (profile {what}: PipeDream's GPU graph.txt; topology {topo.describe()} at nominal rates, "
        "data-parallel all-reduce calibrated; workbench.simulate steady state)",
    )


def _single_gpu_ms(profile) -> float:
    """One minibatch on one GPU: all layers, forward + backward (the profile's total, as the
    notebook 02's BSP speedup, :func:`repro.paper_fit.bsp`, counts it; no partition needed for one worker)."""
    return float(profile.total_ms)


def _plan_text(plan, scheme) -> str:
    if _spec(scheme).family == "data-parallel":
        return "1 stage on every GPU"
    return "-".join(str(s.replicas) for s in plan.stages)


def _planner_speedup(scheme, plan, profile, topo, cost: dict | None = None) -> float:
    """The planner's predicted speedup over one GPU (``Plan.predicted_ms``; BSP: the closed form of
    DDP's bucketed round, :func:`dp_overhead.ddp_round`)."""

    sp = _spec(scheme)
    if sp.executor == "ddp":
        r = dpo.ddp_round(profile, topo, topo.num_workers, cost or {})
        return _single_gpu_ms(profile) / (r["round_ms"] / topo.num_workers)
    if sp.data_parallel_plan:  # the partitioner's plan and its closed-form prediction
        return _single_gpu_ms(profile) / plan.predicted_ms
    return math.nan


# ---- time to target: statistical x hardware efficiency -------------------------------------------
def time_to_target(stats: pd.DataFrame, hardware: pd.DataFrame, epochs: str = "epochs_mean") -> pd.DataFrame:
    """Per (scheme, GPUs): modeled time to target in single-GPU epochs, ``E / speedup_modeled``, and
    its ratio to PipeDream's (``x_vs_pipedream`` > 1: PipeDream is faster; NaN where PipeDream's seeds
    did not all reach the target); measured seconds to target
    on this machine, ``E x s_per_epoch_measured``, beside it (the same for every GPU count: the real
    runs used ``cfg.workers`` ranks). ``E`` is the scheme's ``epochs`` column of ``stats``
    (``epochs_mean``, or ``epochs_median`` for ASP's comparison; ``epochs_statistic`` names it; the
    ``engine`` column which runs gave it).

    Where PipeDream's plan for that cluster is one stage replicated on every GPU, PipeDream *is* BSP
    (same update rule: all-reduce, then one step per round of W microbatches) and its ``E`` is BSP's
    (``epochs_source`` says which runs gave ``E``)."""
    if epochs not in ("epochs_mean", "epochs_median"):
        raise ValueError(f"epochs must be 'epochs_mean' or 'epochs_median', got {epochs!r}")
    st = stats.rename(columns={epochs: "epochs_to_target"}).set_index("scheme")
    df = hardware.merge(
        stats.rename(columns={epochs: "epochs_to_target"})[
            ["scheme", "engine", "epochs_to_target", "reached", "seeds", "s_per_epoch_measured"]
        ],
        on="scheme",
        how="inner",
    )
    df["epochs_statistic"] = epochs
    df["epochs_source"] = df["scheme"] + " (" + df["engine"] + ")"
    same = df["scheme"].map(_pipelined_with_data_parallel_plans).astype(bool) & (df["stages"] == 1)
    df.loc[same, "epochs_to_target"] = st["epochs_to_target"].get(BSP, math.nan)
    df.loc[same, "epochs_source"] = "dp-bsp (the plan is data parallel)"
    df["tta_single_gpu_epochs_modeled"] = df["epochs_to_target"] / df["speedup_modeled"]
    df["tta_s_measured"] = df["scheme"].map(st["epochs_to_target"] * st["s_per_epoch_measured"])
    pd_tta = df[df["scheme"] == PIPEDREAM].set_index("gpus")["tta_single_gpu_epochs_modeled"]
    df["x_vs_pipedream_modeled"] = df["tta_single_gpu_epochs_modeled"] / df["gpus"].map(_finite(pd_tta))
    pd_measured = (st["epochs_to_target"] * st["s_per_epoch_measured"]).get(PIPEDREAM, math.nan)
    df["x_vs_pipedream_measured"] = df["tta_s_measured"] / (pd_measured if math.isfinite(pd_measured) else math.nan)
    return df


def _finite(x: pd.Series) -> pd.Series:
    """``x`` with inf as NaN: no ratio to a time PipeDream never reached."""
    return x.where(np.isfinite(x))


def learning_curves_modeled(curves: pd.DataFrame, hardware: pd.DataFrame, gpus: int) -> pd.DataFrame:
    """The learning curves on the modeled cluster's clock: ``epoch / speedup_modeled`` single-GPU epochs."""
    hw = hardware[hardware["gpus"] == gpus].set_index("scheme")["speedup_modeled"]
    out = curves[curves["scheme"].isin(hw.index)].copy()
    out["single_gpu_epochs_modeled"] = out["epoch"] / out["scheme"].map(hw)
    return out


# ---- the paper's claims beside ours ------------------------------------------------------------
_OTHER_CLAIMS = (  # (scheme, claim, paper_claims.csv key): measured on this machine; modeled in notebook 02
    ("model-parallel", "PipeDream faster than model parallelism (low end)", "over_model_parallel_low"),
    ("gpipe", "PipeDream faster than GPipe", "over_gpipe"),
)
ASP_CLAIM = "PipeDream faster than ASP to target accuracy"
_CPU_NOTE = (
    "CPU ranks share the machine's cores: the measured clock reflects Python/gloo overheads, not GPU compute vs network"
)
_MODELED_ELSEWHERE = (
    "the paper's number is a throughput ratio on 4 GPUs of SOSP's Cluster-A, modeled in notebook 02 "
    "(repro.paper_fit.intra_batch); time_to_target.csv has this run's modeled time-to-target ratios on {setting}"
)


def tta_claims(
    tta: pd.DataFrame,
    tta_asp: pd.DataFrame | None,
    stats: pd.DataFrame,
    asp: pd.DataFrame | None,
    cfg: Config,
    *,
    delay: pd.DataFrame | None = None,
) -> list[dict]:
    """Time-to-target ratios (other scheme / PipeDream) measured here, at ``cfg.target`` with mean
    epochs; ASP's at its own target, modeled on the paper's cluster and measured here
    (:func:`asp_claims`). Model parallelism and GPipe against PipeDream on the paper's hardware are
    throughput ratios on SOSP's Cluster-A (notebook 02's rows); their modeled time-to-target ratios on
    ``cfg.setting`` stay in ``time_to_target.csv`` (``x_vs_pipedream_modeled``)."""
    rows = asp_claims(tta_asp, asp, cfg, delay) if asp is not None and tta_asp is not None else []
    for scheme, c, key in _OTHER_CLAIMS:
        paper = paper_value(key)
        if scheme not in set(stats["scheme"]):
            continue
        note = f"statistical efficiency from a small {cfg.model}, not {cfg.profile} on ImageNet; {_reach_text(stats)}"
        xm = tta.loc[tta["scheme"] == scheme, "x_vs_pipedream_measured"]
        ours_m = float(xm.iloc[0]) if len(xm) else math.nan
        why = f"{_CPU_NOTE}; {note}; " + _MODELED_ELSEWHERE.format(setting=cfg.setting)
        rows.append(
            claim(
                EXPERIMENT,
                c + " (this machine)",
                paper,
                ours_m,
                "x",
                label=_measured_label(cfg),
                explanation=why,
                protocol=_protocol(cfg),
            )
        )
    return rows


def _protocol(cfg: Config, *keys: str) -> str:
    """The ``protocol`` cell of a row: the statistical-efficiency choices this run used (a notebook
    parameter may differ from the protocol's; tests/test_protocol.py flags a committed one that does)."""
    used = {
        f"statistical_efficiency__{k}": getattr(cfg, k)
        for k in ("model", "lr", "target", "epochs", "seeds", "workers", "samples_per_update", "microbatches")
    }
    return protocol.used(*keys, **used)


def _modeled_label(epochs: str, cfg: Config) -> str:
    return (
        f"modeled ({epochs} from {cfg.model} on MNIST-1D, {len(cfg.seeds)} seeds, x simulated "
        f"{cfg.profile} hardware speedup on {cfg.setting})"
    )


def _measured_label(cfg: Config) -> str:
    return f"measured (this machine: {cfg.workers} CPU gloo ranks, {cfg.model}, {len(cfg.seeds)} seeds)"


def asp_claims(tta_asp: pd.DataFrame, asp: pd.DataFrame, cfg: Config, delay: pd.DataFrame | None = None) -> list[dict]:
    """PipeDream vs ASP the paper's way ("7.4x faster than ASP to 48% accuracy"), modeled and measured:
    time to ASP's own target (``asp``'s, the best accuracy of ASP's median curve) with *median* epochs
    on both sides (``tta_asp`` from ``time_to_target(asp, hardware, "epochs_median")``), finite while
    at least half of each side's seeds reach it. Each explanation says how many seeds reached, the
    Mann-Whitney p of ASP against BSP and PipeDream at that target, and splits the ratio into its
    epochs factor and its time-per-epoch factor (modeled: the simulated speedups; measured: the real
    runs' seconds per epoch here). With ``delay`` (:func:`asp_delay_table`) the modeled row takes ASP's
    epochs at each GPU count from the bounded-delay model (protocol ``baselines.asp_delay``) instead of
    this machine's 4 Hogwild ranks, whose ratio its explanation gives beside it."""
    st = asp.set_index("scheme")
    if not {ASP, PIPEDREAM} <= set(st.index):
        return []
    a = tta_asp[tta_asp["scheme"] == ASP].set_index("gpus")
    common = _asp_statistics_text(st)
    s_a, s_p = st.loc[ASP, "s_per_epoch_measured"], st.loc[PIPEDREAM, "s_per_epoch_measured"]
    e_xm = st.loc[ASP, "epochs_median"] / st.loc[PIPEDREAM, "epochs_median"]
    measured_why = (
        f"{e_xm:.2f}x from median epochs x {s_a / s_p:.2f}x from measured seconds per epoch (ASP {s_a:.3f} s, "
        f"PipeDream {s_p:.3f} s); {_CPU_NOTE}; {common}"
    )
    keys: tuple[str, ...] = ()
    if delay is not None and delay["x_vs_pipedream_modeled"].notna().any():
        ours, label, modeled_why = _delay_claim(delay.set_index("gpus"), a, common, cfg)
        keys = ("baselines.asp_delay",)
    else:
        ours, label, modeled_why = _hogwild_claim(tta_asp, a, st, common, cfg)
    return [
        claim(EXPERIMENT, ASP_CLAIM, paper_value("asp_time_to_accuracy"), ours, "x", label=label, explanation=modeled_why,
              protocol=_protocol(cfg, "baselines.asp_communication", "baselines.gpipe_microbatches_per_stage", *keys)),
        claim(EXPERIMENT, ASP_CLAIM + " (this machine)", paper_value("asp_time_to_accuracy"), float(a["x_vs_pipedream_measured"].iloc[0]), "x",
              label=_measured_label(cfg), explanation=measured_why, protocol=_protocol(cfg)),
    ]  # fmt: skip


def _hogwild_claim(tta_asp: pd.DataFrame, a: pd.DataFrame, st: pd.DataFrame, common: str, cfg: Config):
    """The modeled ASP row from this machine's Hogwild epochs at every GPU count: (ours, label, why)."""
    pd_ = tta_asp[tta_asp["scheme"] == PIPEDREAM].set_index("gpus")
    ratio = a["x_vs_pipedream_modeled"]
    g = asp_row_gpus(tta_asp)
    e_x = a.loc[g, "epochs_to_target"] / pd_.loc[g, "epochs_to_target"]
    hw_x = pd_.loc[g, "speedup_modeled"] / a.loc[g, "speedup_modeled"]
    why = (
        f"at {g} GPUs (the max over {list(cfg.gpus)}): {e_x:.2f}x from median epochs x {hw_x:.2f}x from the modeled time "
        f"per epoch (PipeDream's simulated speedup {pd_.loc[g, 'speedup_modeled']:.2f} / ASP's "
        f"{a.loc[g, 'speedup_modeled']:.2f}: no communication overhead, protocol baselines.asp_communication); "
        f"{common}; statistical efficiency from a small {cfg.model}, not {cfg.profile} on ImageNet"
    )
    t = float(st["target"].iloc[0])
    return float(ratio.max()), _modeled_label(f"median epochs to {t:.0%}", cfg), why


def _delay_claim(d: pd.DataFrame, a: pd.DataFrame, common: str, cfg: Config):
    """The modeled ASP row from the delay model (``d``: :func:`asp_delay_table` by GPU count), the
    Hogwild ratio (``a``) beside it: (ours, label, why)."""
    g = asp_row_gpus(a.reset_index(), d.reset_index())
    why = (
        f"at {g} GPUs (the max over {list(cfg.gpus)}): {_delay_text(d, g)}; per GPU count: "
        + ", ".join(
            f"{k}: {r.x_vs_pipedream_modeled:.3g}x (ASP's level {r.target:.2f}, its median best accuracy "
            f"{r.asp_best_accuracy_median:.3g}, {int(r.asp_diverged)}/{int(r.seeds)} seeds diverged)"
            for k, r in d.iterrows()
        )
        + _degenerate_text(d)
        + (
            f"; with the epochs of the {cfg.workers} Hogwild ranks measured here instead: "
            f"{float(a.loc[g, 'x_vs_pipedream_modeled']):.3g}x (time_to_asp_target.csv; {common})"
            if g in a.index
            else ""
        )
        + f"; statistical efficiency from a small {cfg.model}, not {cfg.profile} on ImageNet"
    )
    label = _modeled_label("median epochs to ASP's level at each GPU count (ASP: the bounded-delay model)", cfg)
    return float(d.loc[g, "x_vs_pipedream_modeled"]), label, why


def asp_row_gpus(tta_asp: pd.DataFrame, delay: pd.DataFrame | None = None) -> int:
    """The GPU count the modeled ASP row is read at: where its ratio is largest over the run's GPU
    counts, the delay model's (``delay``: :func:`asp_delay_table`) where it has a finite one, else
    the Hogwild ranks' (``tta_asp``'s ASP rows; the largest GPU count where none is finite)."""
    if delay is not None and delay["x_vs_pipedream_modeled"].notna().any():
        return int(delay.set_index("gpus")["x_vs_pipedream_modeled"].idxmax())
    ratio = tta_asp[tta_asp["scheme"] == ASP].set_index("gpus")["x_vs_pipedream_modeled"]
    return int(ratio.idxmax() if ratio.notna().any() else ratio.index.max())


def _degenerate_text(d: pd.DataFrame) -> str:
    """Where ASP's level is reached after the first epoch by ASP and PipeDream alike, ASP did not
    learn at that delay: a ratio of 1 epoch to 1 epoch is not the paper's comparison; say so."""
    flat = [int(g) for g, r in d.iterrows() if r["asp_epochs_median"] == 1 and r["pipedream_epochs_median"] == 1]
    if not flat:
        return ""
    return (
        f"; at {', '.join(map(str, flat))} GPUs ASP's level is what both reach after one epoch: ASP does not learn at "
        "that delay and learning rate, so the ratio there is not the paper's comparison"
    )


def _delay_text(d: pd.DataFrame, g: int) -> str:
    """One GPU count's row of ``asp_delay.csv`` in words."""
    r = d.loc[g]
    return (
        f"ASP on {g} replicas, each gradient on weights {int(r['delay'])} updates old (protocol baselines.asp_delay; "
        f"asp_delay.csv); its level, the best accuracy of its median curve over seeds, {r['target']:.2f}; median "
        f"epochs to it: ASP {r['asp_epochs_median']:g} ({int(r['asp_reached'])}/{int(r['seeds'])} seeds reached, "
        f"{int(r['asp_diverged'])} diverged), PipeDream {r['pipedream_epochs_median']:g} ({int(r['pipedream_reached'])}/"
        f"{int(r['seeds'])}), Mann-Whitney p = {r['p_mannwhitney']:.3g}: {r['epochs_factor']:.2f}x from epochs x "
        f"{r['hardware_factor']:.2f}x from the modeled time per epoch (PipeDream's simulated speedup over ASP's, which "
        "has no communication overhead: protocol baselines.asp_communication)"
    )


def _asp_statistics_text(st: pd.DataFrame) -> str:
    """ASP's target, how many seeds of ASP, PipeDream and BSP reached it, their median epochs, and the
    two-sided Mann-Whitney p of ASP against BSP and PipeDream there (``asp_target.csv``'s rows; the
    test is symmetric, so the BSP row's p against ASP is ASP's against BSP)."""

    def one(s: str) -> str:
        return f"{s} {st.loc[s, 'epochs_median']:g} ({st.loc[s, 'reached']}/{st.loc[s, 'seeds']} seeds reached)"

    t = float(st["target"].iloc[0])
    shown = [s for s in (ASP, PIPEDREAM, BSP) if s in st.index]
    p = {s: st.loc[s, "p_mannwhitney"] for s in (BSP, PIPEDREAM) if s in st.index}
    return (
        f"target {t:.2f} = the best accuracy of ASP's median learning curve over seeds (the paper's way: the level ASP "
        f"reaches, 48% for VGG-16); median epochs to it: {', '.join(one(s) for s in shown)}; epochs to it, two-sided "
        "Mann-Whitney over seeds: "
        + ", ".join(f"ASP vs {s} p = {v:.3g}" for s, v in p.items())
        + (
            f"; ASP seeds that diverged (a non-finite loss; Hogwild, timing-dependent): "
            f"{int(st.loc[ASP, 'diverged'])}/{st.loc[ASP, 'seeds']} (asp_runs.csv: each seed's best and final accuracy "
            "and measured staleness)"
            if "diverged" in st.columns and ASP in st.index
            else ""
        )
    )


def _reach_text(stats: pd.DataFrame) -> str:
    return "seeds reaching the target: " + ", ".join(f"{r.scheme} {r.reached}/{r.seeds}" for r in stats.itertuples())


# ---- figures ---------------------------------------------------------------------------------
def curve_figure(curves: pd.DataFrame, x: str, title: str, x_title: str, target: float | None = None):
    """Test accuracy vs ``x`` per scheme: the mean over seeds (line) and the min-max band."""

    fig = go.Figure()
    for i, (scheme, g) in enumerate(curves.groupby("scheme", sort=False)):
        agg = (
            g.groupby("epoch")
            .agg(
                x=(x, "mean"), mean=("test_accuracy", "mean"), lo=("test_accuracy", "min"), hi=("test_accuracy", "max")
            )
            .reset_index()
        )
        color = PALETTE[i % len(PALETTE)]
        fig.add_trace(
            go.Scatter(
                x=list(agg["x"]) + list(agg["x"][::-1]),
                y=list(agg["hi"]) + list(agg["lo"][::-1]),
                fill="toself",
                line=dict(width=0),
                fillcolor=color,
                opacity=0.15,
                legendgroup=scheme,
                showlegend=False,
                hoverinfo="skip",
            )
        )
        fig.add_trace(
            go.Scatter(
                x=agg["x"], y=agg["mean"], mode="lines+markers", name=scheme, legendgroup=scheme, line=dict(color=color)
            )
        )
    if target is not None:
        fig.add_hline(y=target, line_dash="dot", annotation_text=f"target {target:.0%}")
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title="test accuracy", height=450)
    return fig


def figures(curves: pd.DataFrame, modeled_curves: pd.DataFrame, speed: pd.Series, cfg: Config, gpus: int) -> dict:
    """Time-to-accuracy curves, mean over seeds with the min-max band: by epoch, by measured time
    on this machine (epoch x the scheme's measured seconds per epoch), by modeled single-GPU epochs
    on the paper's cluster."""
    n = (
        f"{cfg.model} on MNIST-1D, {cfg.workers} workers, lr {cfg.lr}, {cfg.samples_per_update} samples per update, "
        f"{len(cfg.seeds)} seeds, mean and min-max"
    )
    timed = curves.assign(time_s=curves["epoch"] * curves["scheme"].map(speed))
    return {
        "accuracy_vs_epoch": curve_figure(
            curves,
            "epoch",
            f"Statistical efficiency (trained: semantic reference, ASP on the real runtime; {n})",
            "epoch",
            cfg.target,
        ),
        "accuracy_vs_time_measured": curve_figure(
            timed.dropna(subset=["time_s"]),
            "time_s",
            f"Time to accuracy on this machine: epochs x measured s/epoch of real runs ({cfg.workers} CPU gloo ranks)",
            "seconds (measured per epoch)",
            cfg.target,
        ),
        "accuracy_vs_time_modeled": curve_figure(
            modeled_curves,
            "single_gpu_epochs_modeled",
            f"Modeled: epochs / simulated speedup of {cfg.profile} on {cfg.setting}, {gpus} GPUs",
            "time in single-GPU epochs (modeled)",
            cfg.target,
        ),
    }


# ---- every claim row, at the protocol's values and at its intervals' ends -----------------------
def target_tables(cfg: Config, curves: pd.DataFrame, speed: pd.Series, hardware: pd.DataFrame,
                  delay_curves: pd.DataFrame | None = None) -> dict:  # fmt: skip
    """The tables the time-to-target and ASP rows read, from learning curves the run has (nothing
    run): ``statistical`` (per scheme at ``cfg.target``, with the measured seconds per epoch
    ``speed``) and its ``time_to_target`` on ``hardware``; with ASP, ``asp_target`` (at ASP's own
    target) and ``time_to_asp_target`` (else None); with ``delay_curves``
    (:func:`repro.convergence.asp_delay_sweep`), ``asp_delay``."""
    stats = _with_speed(cv.scheme_summary(cv.epochs_to_target(curves, cfg.target)), speed)
    out = dict(statistical=stats, time_to_target=time_to_target(stats, hardware), time_to_asp_target=None)
    if ASP in cfg.schemes:
        out["asp_target"] = asp_target_table(curves, speed)
        out["time_to_asp_target"] = time_to_target(out["asp_target"], hardware, "epochs_median")
    if delay_curves is not None:
        out["asp_delay"] = asp_delay_table(delay_curves, curves, hardware)
    return out


def claims_at(cfg: Config, curves: pd.DataFrame, speed: pd.Series, hardware: pd.DataFrame, grids: Mapping,
              delay_curves: pd.DataFrame | None = None) -> tuple[list[dict], dict]:  # fmt: skip
    """Every claim row notebook 03 writes, from learning curves the run has: the time-to-target and
    ASP rows (:func:`tta_claims` on :func:`target_tables`) and each grid's
    (:func:`repro.lr_grid.claim_rows`; ``grids``: name -> :func:`repro.lr_grid.run_grid`'s dict with
    its ``task`` and ``used``, its rows' protocol cell). Returns the rows and the tables they read."""
    t = target_tables(cfg, curves, speed, hardware, delay_curves)
    rows = tta_claims(t["time_to_target"], t["time_to_asp_target"], t["statistical"], t.get("asp_target"), cfg,
                      delay=t.get("asp_delay"))  # fmt: skip
    rows += [r for g in grids.values() for r in lg.claim_rows(g["task"], g, g["used"])]
    return rows, t


def interval_seeds(cfg: Config) -> tuple[tuple[int, ...], ...]:
    """The seed sets notebook 03's rows are read over besides ``cfg.seeds``: each end of the
    protocol's ``statistical_efficiency.seeds`` interval that is a strict subset of ``cfg.seeds``,
    where ``cfg.seeds`` is that entry's present value (a run at seeds of its own, quick mode's among
    them, has no end)."""
    key = "statistical_efficiency.seeds"
    if tuple(cfg.seeds) != tuple(protocol.value(key)):
        return ()
    return tuple(dict.fromkeys(tuple(e) for e in protocol.interval(key) if set(e) < set(cfg.seeds)))


def seeds_text(seeds) -> str:
    """Seeds as a row writes them: ``0-4`` for a run of consecutive ones, else ``0, 2, 5``."""
    s = sorted(int(x) for x in seeds)
    return f"{s[0]}-{s[-1]}" if len(s) > 1 and s == list(range(s[0], s[-1] + 1)) else ", ".join(map(str, s))


def claim_ends(cfg: Config, curves: pd.DataFrame, speed: pd.Series, hardware: pd.DataFrame, grids: Mapping,
               delay_curves: pd.DataFrame | None = None) -> dict[str, list[dict]]:  # fmt: skip
    """:func:`claims_at` at each end of the protocol's ``statistical_efficiency.seeds`` and
    ``statistical_efficiency.target`` intervals, from the same curves (nothing run): ``{"seeds 0-4":
    rows, "target 0.88": rows}``. At a seeds end (:func:`interval_seeds`) every curve (the grids',
    ASP's delay model's) is restricted to those seeds, the lr and target as the run chose them and
    the seconds per epoch as measured; at a target end (:func:`target_ends` but ``cfg.target``) the
    rows are read at that target, the grids' only where their rows name the entry and the grid's
    target is ``cfg.target`` (the other task's target is its own: its rows are left out there)."""
    names = lambda g, key: key in protocol.parse_used(g["used"])  # noqa: E731
    ends = {}
    for seeds in interval_seeds(cfg):
        keep = lambda df: None if df is None else df[df["seed"].isin(seeds)]  # noqa: E731
        sub = {k: lg.read_at(g["task"], g, seeds=seeds) for k, g in grids.items()
               if names(g, "statistical_efficiency.seeds")}  # fmt: skip
        at = replace(cfg, seeds=seeds)
        ends[f"seeds {seeds_text(seeds)}"] = claims_at(at, keep(curves), speed, hardware, sub, keep(delay_curves))[0]
    for t in target_ends(cfg):
        if t == float(cfg.target):
            continue
        sub = {k: lg.read_at(g["task"], g, target=t) for k, g in grids.items()
               if names(g, "statistical_efficiency.target") and float(g["target"]) == float(cfg.target)}  # fmt: skip
        ends[f"target {t:g}"] = claims_at(replace(cfg, target=t), curves, speed, hardware, sub, delay_curves)[0]
    return ends


def with_ends(rows: list[dict], ends: Mapping[str, list[dict]]) -> list[dict]:
    """Each of ``rows`` with its interval over ``ends`` (:func:`claim_ends`: ours at each end, the
    row matched by its ``claim``; an end without the row, or with NaN there, adds nothing:
    :func:`repro.common.with_interval`), its explanation naming ours at each end that has it."""
    at = {name: {r["claim"]: float(r["ours"]) for r in end} for name, end in ends.items()}
    out = []
    for r in rows:
        vals = {name: a[r["claim"]] for name, a in at.items() if r["claim"] in a}
        if not vals:
            out.append(r)
            continue
        words = ", ".join(f"{name}: {v:.3g}" if math.isfinite(v) else f"{name}: none" for name, v in vals.items())
        why = f"{r['explanation']}; ours at the protocol's interval ends (repro.ledger): {words}"
        out.append(with_interval(dict(r, explanation=why), vals.values()))
    return out


def task_asp_ratio(grid: Mapping, hardware: pd.DataFrame, gpus: int) -> tuple[float, str]:
    """Ours of the modeled ASP row on another task's grid (:func:`repro.lr_grid.run_grid`'s dict) at
    its chosen ``lr``, the Hogwild row's way (:func:`_hogwild_claim`): ASP's level there (the best
    test accuracy of ASP's median curve), median epochs of ASP and PipeDream to it
    (:func:`time_to_target` of :func:`asp_target_table`), times the modeled time per epoch at
    ``gpus`` (``hardware``: PipeDream's simulated speedup / ASP's). NaN where the grid has no ASP
    or PipeDream curves at that lr or both reach the level after one epoch. Returns (ours, words)."""
    c = grid["curves"]
    c = c[(c["lr"] == grid["lr"]) & (c["arm"] == c["scheme"])]  # each rule's own arm (not dp-bsp-global)
    if not {ASP, PIPEDREAM} <= set(c["scheme"]):
        return math.nan, f"none (its grid has no {ASP} and {PIPEDREAM} curves at lr {grid['lr']:g})"
    st = asp_target_table(c, pd.Series(dtype=float))
    t = time_to_target(st, hardware[hardware["gpus"] == gpus], "epochs_median").set_index("scheme")
    st = st.set_index("scheme")
    e_a, e_p = t.loc[ASP, "epochs_to_target"], t.loc[PIPEDREAM, "epochs_to_target"]
    hw_x = t.loc[PIPEDREAM, "speedup_modeled"] / t.loc[ASP, "speedup_modeled"]
    head = (
        f"at lr {grid['lr']:g}, ASP's level (the best test accuracy of its median curve; next-character accuracy "
        f"on the LM) {float(st['target'].iloc[0]):.2f}; median epochs to it: ASP {e_a:g} "
        f"({st.loc[ASP, 'reached']}/{st.loc[ASP, 'seeds']} seeds reached), PipeDream {e_p:g} "
        f"({st.loc[PIPEDREAM, 'reached']}/{st.loc[PIPEDREAM, 'seeds']})"
    )
    if e_a == 1 and e_p == 1:
        return math.nan, f"none ({head}: ASP does not learn there, so a ratio of one epoch to one is not the paper's)"
    ours = float(t.loc[ASP, "x_vs_pipedream_modeled"])
    if not math.isfinite(ours):
        return math.nan, f"none ({head}: no finite ratio)"
    return ours, f"{ours:.3g}x ({head}: {e_a / e_p:.2f}x from epochs x {hw_x:.2f}x from the modeled time per epoch)"


def with_task_end(rows: list[dict], cfg: Config, tables: Mapping, hardware: pd.DataFrame, grids: Mapping) -> list[dict]:
    """``rows`` with the modeled ASP row's interval also over ours on the second stand-in task
    (:func:`task_asp_ratio` on the second of ``grids`` at the GPU count of the row,
    :func:`asp_row_gpus` of ``tables``: :func:`claims_at`'s), one clause naming it, and its protocol
    cell naming the second task's ``lm_*`` entries (:data:`LM_KEYS`; ``lm_epochs`` as the run has
    it). Without a second grid or ASP rows, ``rows`` as they are."""
    if len(grids) < 2 or tables.get("time_to_asp_target") is None:
        return rows
    second = list(grids.values())[1]
    gpus = asp_row_gpus(tables["time_to_asp_target"], tables.get("asp_delay"))
    ours, words = task_asp_ratio(second, hardware, gpus)
    out = []
    for r in rows:
        if r["claim"] != ASP_CLAIM:
            out.append(r)
            continue
        have = protocol.parse_used(r["protocol"])
        # the LM's own entries (its seeds are the row's; the margin, alpha and claim rule do not enter)
        keys = [k for k in lg.LM_ENTRIES if k != "statistical_efficiency.lm_epochs"]
        lm = protocol.used(*[k for k in keys if k not in have], statistical_efficiency__lm_epochs=cfg.lm_epochs)
        cell = "; ".join([r["protocol"], lm])
        why = (
            f"{r['explanation']}; ours on the second stand-in task (task: {second['task'].title}), at {gpus} GPUs as "
            f"above: {words}"
        )
        low, high = r.get("low", r["ours"]), r.get("high", r["ours"])
        out.append(with_interval(dict(r, explanation=why, protocol=cell), [low, high, ours]))
    return out


def interval_claims(cfg: Config, curves: pd.DataFrame, speed: pd.Series, hardware: pd.DataFrame, grids: Mapping,
                    delay_curves: pd.DataFrame | None = None) -> tuple[list[dict], dict]:  # fmt: skip
    """:func:`claims_at` at the run's values, each row with its interval over :func:`claim_ends`
    (:func:`with_ends`), the modeled ASP row's also over the second task (:func:`with_task_end`);
    the rows and the tables they read at the run's values."""
    rows, tables = claims_at(cfg, curves, speed, hardware, grids, delay_curves)
    rows = with_ends(rows, claim_ends(cfg, curves, speed, hardware, grids, delay_curves))
    return with_task_end(rows, cfg, tables, hardware, grids), tables


# ---- the notebook's entry point ----------------------------------------------------------------
#: The quick run's budget: each grid at every other learning rate of the protocol's (where the
#: protocol's lr is among them, the time-to-target rows read the grid's curves; else they run their own).
QUICK = dict(epochs=3, seeds=(0, 1), target=0.3, check_epochs=1, lm_epochs=3, lr_grid_every=2)


def quick_config(**params) -> Config:
    """``params`` with the quick-mode budget (:data:`QUICK`: fewer epochs, seeds and learning rates, a lower target)
    on top: for CI and ``workbench reproduce --quick``."""
    return Config(**(params | QUICK))


def run(cfg: Config, out_dir, *, lr_selection: pd.DataFrame | None = None, lr_rule: bool = False) -> dict:
    """Everything the notebook shows: runs, tables, claims and figures written into ``out_dir``
    (a fresh folder, see :func:`~repro.common.out_folder`). With ``cfg.grid``: first every weight
    rule over the whole lr grid on both stand-in tasks (:func:`repro.lr_grid.run_grid`), whose
    first task's curves at ``cfg.lr`` are the time-to-target rows' (not run again); ``lr_rule``:
    ``cfg.lr`` and ``cfg.target`` from the protocol's rule on that grid's BSP curves
    (``lr_selection.csv``). ``lr_selection``: a table to write as ``lr_selection.csv`` where no
    grid ran. Returns the tables."""
    out = out_folder(out_dir)
    t0 = time.perf_counter()
    grids = _grids(cfg, out, lr_rule) if cfg.grid else {}
    first = grids.get(cfg.model)
    if first is not None:
        if lr_rule:
            cfg = replace(cfg, lr=first["lr"], target=first["target"])
        lr_selection = pd.concat([g["lr_selection"] for g in grids.values()], ignore_index=True)
    reuse = first if first is not None and cfg.lr in set(first["curves"]["lr"]) else None
    tables = statistical_efficiency(cfg, out, reuse)
    if lr_selection is not None:
        tables["lr_selection"] = lr_selection
    tables.update(_grid_tables(grids))
    tables["vertical_sync_check"] = cv.vertical_sync_check(cfg.setup, cfg.seeds[0], 4 * cfg.workers)
    tables["staleness"] = cv.staleness(cfg.setup)
    hardware = modeled_hardware(cfg.profile, cfg.setting, cfg.gpus)
    if ASP in cfg.schemes:  # ASP at each GPU count of the modeled rows (protocol baselines.asp_delay)
        tables["asp_delay_curves"] = cv.asp_delay_sweep(cfg.setup, cfg.gpus, cfg.seeds, out / "scratch-asp-delay")
    speed = tables["statistical"].set_index("scheme")["s_per_epoch_measured"]
    rows, read = interval_claims(cfg, tables["curves"], speed, hardware, grids, tables.get("asp_delay_curves"))
    claims = pd.DataFrame(rows)
    big = max(cfg.gpus)
    tables.update(read, hardware=hardware, claims=claims)
    numeric = dict(tables)
    if len(cfg.seeds) < lg.reading().min_seeds:  # no spread worth a number: say so (protocol min_seeds)
        tables.update({k: not_computed(v, SPREAD_COLUMNS) for k, v in tables.items() if k in SPREAD_TABLES})
    for name, df in tables.items():
        if name != "claims" and df is not None:
            save_table(df, out, name)
    write_claims(claims, out)
    figs = figures(numeric["curves"], learning_curves_modeled(numeric["curves"], hardware, big), speed, cfg, big)
    for t in grids.values():
        figs[f"grid_{t['task'].name}"] = lg.grid_figure(
            t["summary"], f"Every weight rule over the lr grid: {t['task'].title}"
        )
    save_page(figs, out / "figures.html", "Time to accuracy: learning curves, measured and modeled time")
    (out / "config.json").write_text(pd.Series(asdict(cfg)).to_json(indent=1))
    (out / "seconds.txt").write_text(f"{time.perf_counter() - t0:.1f}\n")
    return dict(out=out, figures=figs, cfg=cfg, **tables)


#: Statistics that need a spread over seeds, and the tables that hold them: ``not computed`` with
#: fewer seeds than the protocol's ``statistical_efficiency.min_seeds``.
SPREAD_COLUMNS = ("ci_low", "ci_high", "p_mannwhitney", "p_welch", "p_final_accuracy")
SPREAD_TABLES = ("statistical", "significance", "asp_target", "asp_delay")


def not_computed(df: pd.DataFrame | None, columns=SPREAD_COLUMNS) -> pd.DataFrame | None:
    """``df`` with the ``columns`` it has replaced by the words ``not computed``."""
    if df is None:
        return None
    return df.assign(**{c: "not computed" for c in columns if c in df.columns})


def _grids(cfg: Config, out: Path, lr_rule: bool) -> dict:
    """:func:`repro.lr_grid.run_grid` of both stand-in tasks, with the task (``task``) and its claim
    rows' protocol cell (``used``; the rows: :func:`claims_at`); the first task at ``cfg``'s lr and
    target unless ``lr_rule``."""
    grids = {}
    for i, task in enumerate(lg.tasks(cfg.setup, cfg.seeds, cfg.lm_epochs, cfg.lr_grid_every)):
        fixed = (cfg.lr, cfg.target) if i == 0 and not lr_rule else None
        g = lg.run_grid(task, cfg.schemes, out, processes=cfg.processes, lr_target=fixed)
        slim_runs(
            [s for runs in g["asp_summaries"].values() for s in runs],
            drop=("checkpoints", "timeline.csv", "weights.pt"),
        )
        used = _protocol(cfg, "statistical_efficiency.lr_grid", "statistical_efficiency.equivalence_margin",
                         "statistical_efficiency.claim_rule", "statistical_efficiency.alpha")  # fmt: skip
        if i == 1:
            used = protocol.used(*[f"statistical_efficiency.{k}" for k in LM_KEYS])
        grids[task.name] = g | dict(task=task, used=used)
    return grids


#: The second task's protocol entries (its claim rows' protocol cell).
LM_KEYS = ("lm_model", "lm_model_options", "lm_dataset_options", "lm_lr_grid", "lm_epochs", "lm_samples_per_update",
           "seeds", "equivalence_margin", "claim_rule", "alpha", "min_seeds")  # fmt: skip


def _grid_tables(grids: dict) -> dict:
    """The grids' tables over both tasks: ``grid`` (per task, arm and lr: the seeds' spread),
    ``grid_comparisons`` (each arm against its baseline at every lr) and ``grid_seeds`` (per seed:
    what the comparisons read; the per-epoch curves stay in memory, the run's size bounded)."""
    if not grids:
        return {}
    cat = lambda k: pd.concat([g[k] for g in grids.values()], ignore_index=True)  # noqa: E731
    seeds = pd.concat(
        [lg.per_seed(g["curves"], g["target"]).assign(task=k) for k, g in grids.items()], ignore_index=True
    )
    return dict(grid=cat("summary"), grid_comparisons=cat("comparisons"), grid_seeds=seeds)


def validate_params(quick: bool, **params) -> None:
    """``workbench reproduce``'s check of the notebook's parameters before anything runs (one-line
    ``ValueError``): the configuration they make, and the model and its options in the zoo."""
    check_config(Config, quick_config, quick, params)

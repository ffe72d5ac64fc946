"""Statistical efficiency over the whole learning-rate grid, on two stand-in tasks of different families.

Every weight rule of notebook 03 (BSP, GPipe, model parallelism, PipeDream with weight stashing,
with vertical sync, without stashing, ASP) and data parallelism at the papers' global batch
(``workers x samples_per_update`` samples per step) runs at every learning rate of the task's grid
(protocol ``statistical_efficiency.lr_grid`` / ``lm_lr_grid``) over every seed; the result is the
curve over the grid, per rule, with the seeds' spread (``grid_summary``), and each statistical claim
is read at every learning rate where its baseline learns (``claim_rule``), on both tasks:

* ``cnn1d``: a small 1-D CNN on MNIST-1D (the protocol's ``model``);
* ``awd-lstm``: a character-level LSTM language model on the pydocs corpus (the standard library's
  docstrings; ``lm_model``, ``lm_model_options``, ``lm_dataset_options``), next-character accuracy.

Each task's learning rate and target come from BSP alone (:func:`repro.convergence.lr_rule`, on the
grid's BSP curves). Deterministic rules run on the semantic reference, ASP on the real runtime.
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

from repro import convergence as cv
from repro import protocol
from repro.common import claim, paper_value
from repro.convergence import ASP, BSP, PIPEDREAM
from workbench.viz import PALETTE

EXPERIMENT = "03_time_to_accuracy"
GLOBAL = "dp-bsp-global"  # data parallelism at the papers' global batch: workers x samples_per_update per step
VSYNC, NO_STASH, MODEL_PARALLEL = "pipedream-vertical-sync", "pipedream-no-stash", "model-parallel"


@dataclass(frozen=True)
class StatClaim:
    """A statistical claim read on the grid: ``arm`` against ``baseline`` on best accuracy; the
    verdicts that make it hold and those that contradict it; its ``paper_claims.csv`` key."""

    arm: str
    baseline: str
    key: str
    words: str
    holds: frozenset
    opposite: frozenset


CLAIMS = (
    StatClaim(VSYNC, PIPEDREAM, "vertical_sync_negligible",
              "vertical sync's effect on statistical efficiency is negligible",
              frozenset({"equivalent"}), frozenset({"lower", "higher"})),
    StatClaim(NO_STASH, BSP, "no_stash_below_dp",
              "naive pipelining (no weight stashing) does not reach data parallelism's accuracy",
              frozenset({"lower"}), frozenset({"equivalent", "higher"})),
    StatClaim(PIPEDREAM, BSP, "statistical_efficiency_comparable_dp",
              "PipeDream's statistical efficiency is comparable to data parallelism's",
              frozenset({"equivalent", "higher"}), frozenset({"lower"})),
    StatClaim(MODEL_PARALLEL, GLOBAL, "model_parallel_smaller_minibatches",
              "model parallelism beats data parallelism through smaller minibatches",
              frozenset({"higher"}), frozenset({"lower", "equivalent"})),
)  # fmt: skip


@dataclass(frozen=True)
class Task:
    """One stand-in task: its name, words for the rows, the shared setup, its grid and seeds."""

    name: str
    title: str
    setup: cv.Setup
    lrs: tuple[float, ...]
    seeds: tuple[int, ...]


#: The protocol entries of the second task's model, data, grid, budget and batch (:func:`tasks`' LM):
#: what a row measured on it names.
LM_ENTRIES = tuple(
    f"statistical_efficiency.{k}"
    for k in ("lm_model", "lm_model_options", "lm_dataset_options", "lm_lr_grid", "lm_epochs", "lm_samples_per_update")
)


def tasks(setup: cv.Setup, seeds, lm_epochs: int, every: int = 1) -> list[Task]:
    """The two stand-in tasks on ``setup``'s workers, microbatches and stage lr: the first task as
    ``setup`` has it (the protocol's ``model``), the LSTM LM from the protocol's ``lm_*`` entries;
    each at every ``every``-th learning rate of its protocol grid (the quick run's: 2)."""
    v = protocol.value
    first = Task(setup.model, f"{setup.model} on MNIST-1D" if setup.model == "cnn1d" else setup.model, setup,
                 tuple(v("statistical_efficiency.lr_grid"))[::every], tuple(seeds))  # fmt: skip
    lm_setup = replace(
        setup,
        model=v("statistical_efficiency.lm_model"),
        model_options=tuple(sorted(v("statistical_efficiency.lm_model_options").items())),
        dataset_options=tuple(sorted(v("statistical_efficiency.lm_dataset_options").items())),
        samples_per_update=int(v("statistical_efficiency.lm_samples_per_update")),
        epochs=int(lm_epochs),
    )
    lm = Task(lm_setup.model, "char-level LSTM LM on pydocs", lm_setup,
              tuple(v("statistical_efficiency.lm_lr_grid"))[::every], tuple(seeds))  # fmt: skip
    return [first, lm]


def reading() -> cv.Reading:
    """The protocol's way of reading a comparison (level, margin with its ends, fewest seeds)."""
    v = protocol.value
    return cv.Reading(
        alpha=float(v("statistical_efficiency.alpha")),
        margins=tuple(float(x) for x in protocol.interval("statistical_efficiency.equivalence_margin")),
        min_seeds=int(v("statistical_efficiency.min_seeds")),
    )


def pairs(arms) -> list[tuple[str, str]]:
    """Every arm against BSP, and each claim's own pair."""
    out = [(a, BSP) for a in arms if a != BSP]
    return list(dict.fromkeys(out + [(c.arm, c.baseline) for c in CLAIMS if {c.arm, c.baseline} <= set(arms)]))


def run_grid(task: Task, schemes, out, *, processes: int = 1, lr_target=None) -> dict:
    """Every arm of ``schemes`` (and :data:`GLOBAL`) at every lr of ``task``'s grid over its seeds;
    the task's lr and target by the protocol's rule on the grid's BSP curves, unless ``lr_target``
    (lr, target) is given. Returns the curves, ``lr_selection``, ``lr``, ``target``, ``majority``,
    ``summary`` (:func:`repro.convergence.grid_summary`), ``comparisons``
    (:func:`repro.convergence.grid_comparisons`) and the ASP runs' summaries by lr."""
    s = task.setup
    det = [cv.Arm(sc, sc) for sc in schemes if cv.deterministic(s, sc)]
    det.append(cv.Arm(GLOBAL, BSP, s.workers * s.samples_per_update))
    curves = cv.grid_sweep(s, det, task.lrs, task.seeds, Path(out) / f"scratch-grid-{task.name}", processes=processes)
    asp_summaries: dict = {}
    if ASP in schemes:  # the runs' folders are scratch: their curves and per-seed results are in the tables
        with tempfile.TemporaryDirectory(prefix=f"wb-grid-{task.name}-") as runs:
            asp, asp_summaries = cv.grid_runtime(s, [cv.Arm(ASP, ASP)], task.lrs, task.seeds, runs)
        curves = pd.concat([curves, asp], ignore_index=True)
    table, lr, target = cv.lr_rule(curves[curves["arm"] == BSP], s.epochs, s.model)
    if lr_target is not None:
        lr, target = lr_target
        table["chosen"] = table["lr"] == lr
    majority = cv.majority_accuracy(s)
    return dict(
        curves=curves.assign(task=task.name),
        lr_selection=table.assign(task=task.name),
        lr=lr,
        target=target,
        majority=majority,
        **grid_tables(task, curves, target, majority),
        asp_summaries=asp_summaries,
    )


def grid_tables(task: Task, curves: pd.DataFrame, target: float, majority: float) -> dict:
    """What :func:`claim_rows` reads from a grid's ``curves`` at ``target``: ``summary``
    (:func:`repro.convergence.grid_summary`) and ``comparisons``
    (:func:`repro.convergence.grid_comparisons` of :func:`pairs` of the curves' arms), each with
    ``task``'s name."""
    arms = list(dict.fromkeys(curves["arm"]))
    return dict(
        summary=cv.grid_summary(curves, target, majority).assign(task=task.name),
        comparisons=cv.grid_comparisons(curves, pairs(arms), target, reading()).assign(task=task.name),
    )


def read_at(task: Task, grid: dict, *, seeds=None, target: float | None = None) -> dict:
    """``grid`` (:func:`run_grid`'s) read again from its own curves, nothing run: restricted to
    ``seeds`` (default all of them) and at ``target`` (default the grid's), its ``summary`` and
    ``comparisons`` recomputed (:func:`grid_tables`): the grid at an end of a protocol interval."""
    curves = grid["curves"]
    if seeds is not None:
        curves = curves[curves["seed"].isin(list(seeds))]
    t = float(grid["target"] if target is None else target)
    return grid | dict(curves=curves, target=t, **grid_tables(task, curves, t, grid["majority"]))


def per_seed(curves: pd.DataFrame, target: float) -> pd.DataFrame:
    """Per (arm, lr, seed) of a grid: best and final test accuracy, epochs to ``target``, diverged and
    the curve's CPU seconds: everything :func:`repro.convergence.grid_comparisons` reads, so a
    reader can recompute every statistic of ``grid_comparisons.csv`` from it."""
    frames = [
        cv.epochs_to_target(g, target).assign(
            arm=arm, lr=lr, cpu_s=g.groupby("seed", sort=False)["cpu_s"].first().to_numpy()
        )
        for (arm, lr), g in curves.groupby(["arm", "lr"], sort=False)
    ]
    cols = ["arm", "scheme", "lr", "seed", "engine", "target", "best_accuracy", "final_accuracy", "epochs_to_target",
            "budget", "diverged", "cpu_s"]  # fmt: skip
    return pd.concat(frames, ignore_index=True)[cols]


def claim_rows(task: Task, grid: dict, used: str) -> list[dict]:
    """One ``holds`` row per claim of :data:`CLAIMS` on ``task`` (value 1 holds, 0 contradicted, NaN
    inconclusive, not computed or untestable; protocol ``statistical_efficiency.claim_rule`` at the
    margin's point), its explanation giving the verdict at every lr with the shift, its interval,
    p and Cliff's delta, and the claim's reading at the margin's two ends. ``used``: the row's
    protocol cell."""
    comp, summ = grid["comparisons"], grid["summary"]
    rows = []
    for c in CLAIMS:
        mine = comp[(comp["arm"] == c.arm) & (comp["baseline"] == c.baseline)]
        if mine.empty:
            continue
        base = summ[summ["arm"] == c.baseline]
        learns = dict(zip(base["lr"], base["learns"]))
        ends = {e: cv.claim_verdict(mine, learns, c.holds, c.opposite, f"verdict_margin_{e}")
                for e in ("low", "point", "high")}  # fmt: skip
        value = {"holds": 1.0, "contradicted": 0.0}.get(ends["point"], math.nan)
        why = (
            f"{task.title}, {int(mine['seeds'].min())} seeds per arm, every lr of the grid {list(task.lrs)}: "
            f"{c.arm} against {c.baseline} on each seed's best test accuracy within {task.setup.epochs} epochs: "
            f"{ends['point']} at the margin {reading().margins[1]:g} ({ends['low']} at {reading().margins[0]:g}, "
            f"{ends['high']} at {reading().margins[2]:g}; protocol statistical_efficiency.claim_rule, "
            "equivalence_margin); per lr: "
            + "; ".join(_lr_text(r, learns) for r in mine.itertuples())
            + "; each at its own best lr of the grid: "
            + ", ".join(_best_text(summ, a) for a in (c.arm, c.baseline))
        )
        rows.append(
            claim(
                EXPERIMENT,
                f"{c.words} ({task.title})",
                paper_value(c.key),
                value,
                "statement",
                label=f"measured (this machine, the semantic reference{', ASP on the runtime' if ASP in (c.arm, c.baseline) else ''}: "
                f"{task.title}, {int(mine['seeds'].min())} seeds, {len(task.lrs)} learning rates)",
                comparison="holds",
                explanation=why,
                protocol=used,
            )  # fmt: skip
        )
    return rows


def _best_text(summary: pd.DataFrame, arm: str) -> str:
    """An arm's highest median best accuracy over the grid and the lr it is at."""
    g = summary[summary["arm"] == arm]
    r = g.loc[g["best_accuracy_median"].idxmax()]
    return f"{arm} {r['best_accuracy_median']:.3f} at lr {r['lr']:g}"


def _lr_text(r, learns: dict) -> str:
    """One lr of a claim's comparison in words."""
    head = f"lr {r.lr:g} ({'baseline learns' if learns.get(r.lr) else 'baseline does not learn: not read'})"
    if r.verdict_margin_point == "not computed":
        return f"{head}: not computed (fewer than {reading().min_seeds} seeds a side)"
    return (
        f"{head}: {r.verdict_margin_point}, median best accuracy {r.best_accuracy_median:.3f} vs "
        f"{r.baseline_best_accuracy_median:.3f}, shift {r.shift:+.3f} [{r.shift_low:+.3f}, {r.shift_high:+.3f}], "
        f"Mann-Whitney p = {r.p_best_accuracy:.2g}, Cliff's delta {r.cliffs_delta_best_accuracy:+.2f}; epochs to "
        f"the target p = {r.p_epochs:.2g}, delta {r.cliffs_delta_epochs:+.2f}"
    )


def summary_view(summary: pd.DataFrame, min_seeds: int) -> pd.DataFrame:
    """``grid_summary`` rows for reading: the spread of seeds as ``not computed`` where an arm has
    fewer than ``min_seeds`` seeds (two seeds have no spread worth a number), the rest as numbers."""
    out = summary.copy().astype({"best_accuracy_min": object, "best_accuracy_max": object})
    few = out["seeds"] < min_seeds
    out.loc[few, ["best_accuracy_min", "best_accuracy_max"]] = "not computed"
    return out


def grid_figure(summary: pd.DataFrame, title: str):
    """Best test accuracy against the learning rate, per arm: the median over seeds (line) and the
    min-max band over seeds."""
    fig = go.Figure()
    for i, (arm, g) in enumerate(summary.groupby("arm", sort=False)):
        g = g.sort_values("lr")
        color = PALETTE[i % len(PALETTE)]
        fig.add_trace(go.Scatter(x=list(g["lr"]) + list(g["lr"][::-1]),
                                 y=list(g["best_accuracy_max"]) + list(g["best_accuracy_min"][::-1]),
                                 fill="toself", line=dict(width=0), fillcolor=color, opacity=0.12,
                                 legendgroup=arm, showlegend=False, hoverinfo="skip"))  # fmt: skip
        fig.add_trace(go.Scatter(x=g["lr"], y=g["best_accuracy_median"], mode="lines+markers", name=arm,
                                 legendgroup=arm, line=dict(color=color)))  # fmt: skip
    fig.update_layout(title=title, xaxis_title="learning rate", xaxis_type="log",
                      yaxis_title="best test accuracy (median over seeds, min-max band)", height=450)  # fmt: skip
    return fig

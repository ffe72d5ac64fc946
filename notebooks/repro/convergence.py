"""Statistical efficiency of the parallel schemes: learning curves, epochs to target, their spread.

Every scheme trains the same model on the same data with the same learning rate, and every
optimizer step averages the gradients of the same number of samples ``u`` (``samples_per_update``):
a scheme whose step averages ``m`` microbatches (``Schedule.microbatches_per_step``: BSP's ``W``
replicas, GPipe's ``M``) runs microbatches of ``u / m`` samples. The schemes then differ only in
*which weights* each gradient is computed on (the schedule's weight rule):

* sync (model parallelism, GPipe, BSP): ``W(t+1) = W(t) - lr grad f(W(t))`` -- one trajectory of
  minibatch SGD, up to the order of the samples;
* PipeDream with weight stashing (``n`` stages): ``grad f(w_1^(t-n+1), ..., w_n^(t))``;
* vertical sync: ``grad f(w_1^(t-n+1), ..., w_n^(t-n+1))``;
* no stashing: the backward of stage ``k`` reads a newer version than its forward;
* ASP (Hogwild on shared memory): each replica reads whatever weights are current.

Two engines give the curves (the ``engine`` column says which):

* ``reference``: :func:`workbench.runtime.reference_train`, the single-process semantic reference
  that applies the schedule's weight rule literally (tested equal to the runtime to 1e-12); used
  for every deterministic rule, one epoch at a time; the pipelines without a flush (PipeDream's
  1F1B, model parallelism) as one stream per epoch (``train(stream=True)``: no drain between
  minibatches), as PipeDream runs;
* ``runtime``: :func:`workbench.runtime.train` with gloo CPU ranks; ASP has no deterministic
  reference (its staleness is decided by timing), so its seeds always run here.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from torch.func import functional_call

from workbench import Plan
from workbench.runtime import (
    DataOrder,
    build_model,
    microbatch,
    prepare,
    reference_train,
    run_jobs,
    run_stage,
    schedule_for_workers,
    stage_module,
    stage_params,
)
from workbench.schedules import spec

#: The experiment's arms by role (scheme labels, keys of :data:`SCHEMES`, not schedule names):
#: every scheme is compared with PipeDream and BSP; ASP also at its own target.
PIPEDREAM, BSP, ASP = "pipedream", "dp-bsp", "dp-asp"

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


def streams(name: str) -> bool:
    """Whether schedule ``name`` runs an epoch as one stream (``train(stream=True)``: a pipeline
    without a flush, as PipeDream runs; the registry's ``microbatches="in total"``)."""

    sp = spec(name)
    return sp.family == "pipeline" and sp.microbatches == "in total"


@dataclass(frozen=True)
class Setup:
    """What every scheme's run shares."""

    model: str = "cnn1d"
    workers: int = 4
    microbatches: int = 4
    samples_per_update: int = 32
    lr: float = 0.1
    epochs: int = 20
    model_options: tuple = ()  # (name, value) pairs for the zoo builder
    dataset_options: tuple = ()  # (name, value) pairs for the zoo's data set loader
    timeout_s: float = 600.0  # of a real run's collectives
    replicas: tuple[int, ...] = ()  # a pipeline's replicas per stage (layers split evenly); () = one per worker
    stage_lr: str = "same"  # a replicated stage's learning rate (workbench.runtime.semantics.stages.stage_lrs)


def job_for(setup: Setup, scheme: str, seed: int, out):
    """The runtime's :class:`~workbench.runtime.Job` of ``scheme`` (not started): microbatches of
    ``samples_per_update / microbatches_per_step`` samples, ``microbatches`` per minibatch."""

    name, opts = SCHEMES[scheme]
    plan = _plan(setup, name)
    mps = schedule_for_workers(name, setup.workers, plan, setup.microbatches, dict(opts)).microbatches_per_step
    if setup.samples_per_update % mps:
        raise ValueError(
            f"samples_per_update {setup.samples_per_update} is not divisible by {scheme}'s "
            f"{mps} microbatches per update; pick a multiple of {mps}"
        )
    batch = setup.microbatches * setup.samples_per_update // mps
    return prepare(
        setup.model,
        name,
        workers=setup.workers,
        microbatches=setup.microbatches,
        epochs=setup.epochs,
        batch_size=batch,
        lr=setup.lr,
        stage_lr=setup.stage_lr,
        seed=seed,
        out=out,
        progress=False,
        schedule_options=dict(opts),
        allow_oversubscribe=True,
        stream=streams(name),
        timeout_s=setup.timeout_s,
        model_options=dict(setup.model_options),
        dataset_options=dict(setup.dataset_options) or None,
        plan=plan,
    )


def _plan(setup: Setup, schedule: str) -> Plan | None:
    """The plan of ``setup.replicas`` (the model's layers split evenly over its stages, stage ``s`` on
    ``replicas[s]`` workers) for a pipeline schedule; None without replicas."""
    if not setup.replicas:
        return None
    if sum(setup.replicas) != setup.workers or min(setup.replicas) < 1:
        raise ValueError(
            f"replicas {setup.replicas} must be positive and use the {setup.workers} workers; give counts summing to {setup.workers}"
        )
    if spec(schedule).family != "pipeline":
        raise ValueError(f"replicas shape a pipeline; {schedule!r} is not one")
    layers = len(build_model(setup.model, **dict(setup.model_options)).layers)
    even = Plan.even(layers, len(setup.replicas))
    return Plan.from_boundaries([st.last for st in even.stages], setup.replicas)


def evaluate(job, model, weights: list[dict]) -> tuple[float, float]:
    """(test loss, test accuracy) of the stage ``weights`` over the test split, as the runtime's
    evaluation computes them (mean loss over samples, argmax accuracy)."""

    test = job.dataset_fn(split="test")
    mods = [stage_module(model.layers, a, z) for a, z in job.bounds]
    n = len(test)
    with torch.no_grad():
        x, y = microbatch(test, torch.arange(n))
        for m, w in zip(mods, weights):
            x = run_stage(m, w, x)
        return float(model.loss(x, y)), model.correct(x, y) / y.numel()


def reference_curve(
    job, epochs: int, keep: tuple[int, ...] = (), *, stop_at: float | None = None
) -> tuple[pd.DataFrame, dict]:
    """Test accuracy after every epoch of ``job`` under its schedule's weight rule, computed by the
    semantic reference: drained runs apply the schedule once per minibatch; stream runs
    (``job.stream``) apply the schedule over all the epoch's microbatches as one pass, which reads
    the epoch's samples in the runtime's order (``DataOrder`` slices are contiguous). Plain SGD (no
    momentum: each epoch restarts the reference from the last weights). Weights that
    are no longer finite stay so: the remaining epochs repeat that row. With ``stop_at``, the curve
    ends at the first epoch whose test accuracy reaches it (the epochs to that target are all a
    caller needs). Returns the curve and ``{epoch: stage weights}`` for the epochs in ``keep``."""

    model, ds = job.model_fn(), job.dataset_fn()
    M = job.schedule.microbatches
    rpe = DataOrder(len(ds), job.optim.batch_size, M, job.optim.seed).rounds_per_epoch
    weights, rows, kept, t0 = None, [], {}, time.perf_counter()
    for e in range(epochs):
        if job.stream is not None:
            kw = dict(schedule=job.stream(rpe * M), batch_size=rpe * job.optim.batch_size, rounds=1, start_round=e)
        else:
            kw = dict(schedule=job.schedule, batch_size=job.optim.batch_size, rounds=rpe, start_round=e * rpe)
        weights = reference_train(
            model=model,
            bounds=job.bounds,
            dataset=ds,
            lr=job.optim.lr,
            stage_lr=job.optim.stage_lr,
            seed=job.optim.seed,
            init=weights,
            **kw,
        )
        loss, acc = evaluate(job, model, weights)
        rows.append(dict(epoch=e + 1, test_accuracy=acc, test_loss=loss, compute_s=time.perf_counter() - t0))
        if e + 1 in keep:
            kept[e + 1] = weights
        if stop_at is not None and acc >= stop_at:
            break
        if not all(torch.isfinite(w).all() for ws in weights for w in ws.values()):  # diverged: stays so
            rows += [dict(rows[-1], epoch=k + 1) for k in range(e + 1, epochs)]
            break
    return pd.DataFrame(rows), kept


# ---- ASP at a given delay (the protocol's bounded-delay model) ----------------------------------
def delayed_sgd(
    job, delay: int, epochs: int, *, curve: bool = True, updates: int | None = None
) -> tuple[pd.DataFrame, list[dict]]:
    """ASP on ``W = delay + 1`` equal replicas, deterministically (protocol ``baselines.asp_delay``):
    update ``t`` applies to the newest weights the gradient of its microbatch computed on the weights
    ``delay`` updates older, ``w(t+1) = w(t) - lr grad f(w(t - delay))`` (``w(<0) = w(0)``); plain SGD,
    the microbatches in the order the runtime's replicas take them (``DataOrder`` of ``job``, a
    one-stage ``dp-asp`` job: microbatch ``b`` of round ``r`` is update ``t = r M + b``). ``delay=0``
    is minibatch SGD on those microbatches. Returns the learning curve (one row per epoch, as
    :func:`reference_curve`'s; empty when ``curve`` is false) and the final weights (one stage), after
    ``updates`` updates where given.
    Weights that stop being finite stay so: the remaining epochs repeat that row."""
    if delay < 0:
        raise ValueError(f"delay must be >= 0 updates, got {delay}")
    if len(job.bounds) != 1:
        raise ValueError(f"delayed_sgd trains one stage on every replica; the job has {len(job.bounds)} stages")
    model, ds = job.model_fn(), job.dataset_fn()
    mod = stage_module(model.layers, *job.bounds[0])
    order = DataOrder(len(ds), job.optim.batch_size, job.schedule.microbatches, job.optim.seed)
    kept = [stage_params(mod)]  # kept[0] = w(t - delay) once delay + 1 versions exist; kept[-1] = w(t)
    rows: list[dict] = []
    t0, lr, done = time.perf_counter(), job.optim.lr, 0
    for e in range(epochs):
        perm = order.permutation(e)
        for r in range(order.rounds_per_epoch):
            for b in range(order.microbatches):
                x, y = microbatch(ds, order.indices(perm, r, b))
                read = {n: p.detach().requires_grad_(True) for n, p in kept[0].items()}
                grads = torch.autograd.grad(model.loss(run_stage(mod, read, x), y), list(read.values()))
                kept.append({n: p - lr * g for (n, p), g in zip(kept[-1].items(), grads)})
                if len(kept) > delay + 1:
                    kept.pop(0)
                done += 1
                if done == updates:
                    return pd.DataFrame(rows), [kept[-1]]
        if curve:
            loss, acc = evaluate(job, model, [kept[-1]])
            rows.append(dict(epoch=e + 1, test_accuracy=acc, test_loss=loss, compute_s=time.perf_counter() - t0))
            if not all(torch.isfinite(w).all() for w in kept[-1].values()):  # diverged: stays so
                rows += [dict(rows[-1], epoch=k + 1) for k in range(e + 1, epochs)]
                break
    return pd.DataFrame(rows), [kept[-1]]


def asp_delay_sweep(setup: Setup, gpus, seeds, scratch) -> pd.DataFrame:
    """ASP's learning curves at every GPU count of ``gpus`` (:func:`delayed_sgd`, delay ``g - 1``),
    every seed: one row per (gpus, seed, epoch), ``scheme="dp-asp"``, ``engine="delay model"``."""
    torch.set_num_threads(1)
    frames = []
    for g in gpus:
        for seed in seeds:
            job = job_for(setup, ASP, seed, Path(scratch) / f"asp-delay-{g}-s{seed}")
            curve, _ = delayed_sgd(job, g - 1, setup.epochs)
            frames.append(curve.assign(scheme=ASP, seed=seed, gpus=g, delay=g - 1, engine="delay model"))
    return pd.concat(frames, ignore_index=True)


# ---- the sweep ---------------------------------------------------------------------------------
def deterministic(setup: Setup, scheme: str) -> bool:
    """Whether the scheme's weight rule fixes every version (all but ASP's ``async``)."""

    name, opts = SCHEMES[scheme]
    return schedule_for_workers(name, setup.workers, None, setup.microbatches, dict(opts)).update != "async"


def reference_sweep(
    setup: Setup, schemes, seeds, scratch, keep: dict | None = None, *, stop_at: float | None = None
) -> tuple[pd.DataFrame, dict]:
    """Learning curves of every (scheme, seed) from the semantic reference: one row per (scheme,
    seed, epoch) with ``test_accuracy``, ``test_loss``, ``engine="reference"``; and the weights
    ``{(scheme, seed): stage weights}`` after ``keep[(scheme, seed)]`` epochs. ``stop_at``: each
    curve ends once it reaches that test accuracy (:func:`reference_curve`)."""
    torch.set_num_threads(1)
    keep = keep or {}
    frames, weights = [], {}
    for scheme in schemes:
        for seed in seeds:
            job = job_for(setup, scheme, seed, Path(scratch) / f"{scheme}-s{seed}")
            at = keep.get((scheme, seed))
            curve, kept = reference_curve(job, setup.epochs, () if at is None else (at,), stop_at=stop_at)
            frames.append(curve.assign(scheme=scheme, seed=seed, engine="reference"))
            if at is not None:
                weights[(scheme, seed)] = kept[at]
    return pd.concat(frames, ignore_index=True), weights


def runtime_runs(setup: Setup, runs: list[tuple[str, int, int]], out) -> tuple[pd.DataFrame, list[dict]]:
    """Real runs (:func:`workbench.runtime.run_jobs`: gloo CPU ranks, one spawn) of ``(scheme, seed,
    epochs)``: their learning curves (``engine="runtime"``, ``wall_s`` measured since the run's start
    at each epoch's end, test evaluation included) and summaries (with final weights)."""

    jobs = []
    for scheme, seed, epochs in runs:
        job = job_for(replace(setup, epochs=epochs), scheme, seed, Path(out) / f"{scheme}-s{seed}")
        jobs.append(replace(job, run=replace(job.run, return_weights=True)))
    summaries = run_jobs(jobs)
    frames = []
    for (scheme, seed, _), s in zip(runs, summaries):
        m = pd.read_csv(Path(s["out"]) / "metrics.csv").dropna(subset=["test_accuracy"])
        frames.append(
            pd.DataFrame(
                dict(
                    epoch=m["epoch"].astype(int).to_numpy() + 1,
                    test_accuracy=m["test_accuracy"].to_numpy(float),
                    test_loss=m["test_loss"].to_numpy(float),
                    wall_s=m["wall_ms"].to_numpy(float) / 1e3,
                    scheme=scheme,
                    seed=seed,
                    engine="runtime",
                )
            )
        )
    return pd.concat(frames, ignore_index=True), summaries


def runtime_check(runs: pd.DataFrame, curves: pd.DataFrame, summaries: list[dict], references: dict) -> pd.DataFrame:
    """Per real run of a deterministic scheme: its test accuracy per epoch against the reference
    curve of the same (scheme, seed) (``max_abs_accuracy_diff``) and its final weights against the
    reference's after the same epochs (``max_abs_weight_diff``; float32 on both sides), and the
    measured seconds per epoch on this machine."""
    rows = []
    for (scheme, seed), g in runs.groupby(["scheme", "seed"], sort=False):
        ref = curves[(curves["scheme"] == scheme) & (curves["seed"] == seed)].set_index("epoch")["test_accuracy"]
        acc = g.set_index("epoch")["test_accuracy"]
        both = acc.index.intersection(ref.index)
        w = references.get((scheme, seed))
        summary = next(s for s in summaries if Path(s["out"]).name == f"{scheme}-s{seed}")
        rows.append(
            dict(
                scheme=scheme,
                seed=seed,
                epochs=int(g["epoch"].max()),
                max_abs_accuracy_diff=float((acc[both] - ref[both]).abs().max()) if len(both) else math.nan,
                max_abs_weight_diff=_max_diff(summary["weights"], w) if w is not None else math.nan,
                s_per_epoch_measured=float(g["wall_s"].max() / g["epoch"].max()),
            )
        )
    return pd.DataFrame(rows)


def _max_diff(runtime_weights: dict, reference_weights: list[dict]) -> float:
    """Largest |runtime - reference| over every stage's parameters."""
    return max(
        float((runtime_weights[s][n] - w).abs().max()) for s, ws in enumerate(reference_weights) for n, w in ws.items()
    )


# ---- statistics ----------------------------------------------------------------------------------
def epochs_to_target(curves: pd.DataFrame, target: float) -> pd.DataFrame:
    """Per (scheme, seed): ``epochs_to_target`` = the first epoch whose test accuracy is >= ``target``
    (NaN: not within the run's epochs), the best and final test accuracy, ``diverged`` (a non-finite
    test loss) and the epochs run (``budget``)."""
    rows = []
    for (scheme, seed), g in curves.groupby(["scheme", "seed"], sort=False):
        g = g.sort_values("epoch")
        hit = g[g["test_accuracy"] >= target]
        rows.append(
            dict(
                scheme=scheme,
                seed=seed,
                target=target,
                engine=g["engine"].iloc[0],
                epochs_to_target=float(hit["epoch"].iloc[0]) if len(hit) else math.nan,
                budget=int(g["epoch"].max()),
                best_accuracy=float(g["test_accuracy"].max()),
                final_accuracy=float(g["test_accuracy"].iloc[-1]),
                diverged=bool(not np.isfinite(g["test_loss"]).all()),
            )
        )
    return pd.DataFrame(rows)


def mean_ci(x, level: float = 0.95) -> tuple[float, float, float]:
    """(mean, lower, upper): Student-t interval ``mean -+ t_{(1+level)/2, n-1} s / sqrt(n)`` over the
    values ``x``; the bounds are NaN for fewer than two values, and all three are inf when any value is
    (a seed that never reached the target: no finite mean)."""
    from scipy import stats

    x = np.asarray(x, float)
    if len(x) == 0:
        return math.nan, math.nan, math.nan
    if not np.isfinite(x).all():
        return math.inf, math.inf, math.inf
    m = float(x.mean())
    if len(x) < 2:
        return m, math.nan, math.nan
    h = float(stats.t.ppf((1 + level) / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return m, m - h, m + h


def lower_median(x) -> float:
    """The ``ceil(n/2)``-th smallest of the ``n`` values ``x`` (NaN counts as inf: a seed that never
    reached the target): the median for odd ``n``, the lower of the two middle values for even ``n``.
    Finite exactly when at least half the values are, so a scheme whose seeds reach a target at
    least half the time has a finite typical epoch count where its mean is inf. NaN for no values."""
    v = np.asarray(x, float)
    v = np.sort(np.where(np.isnan(v), math.inf, v))
    return float(v[(len(v) - 1) // 2]) if len(v) else math.nan


def scheme_summary(per_seed: pd.DataFrame, level: float = 0.95) -> pd.DataFrame:
    """Per scheme: seeds, how many reached the target, ``epochs_mean`` with its ``level`` interval
    (:func:`mean_ci`; a seed that did not reach counts as inf), ``epochs_median``
    (:func:`lower_median`: finite while at least half the seeds reached), the min / max over seeds,
    and the final accuracy's mean, min and max."""
    rows = []
    for scheme, g in per_seed.groupby("scheme", sort=False):
        e = g["epochs_to_target"].fillna(math.inf).to_numpy(float)
        m, lo, hi = mean_ci(e, level)
        rows.append(
            dict(
                scheme=scheme,
                engine=g["engine"].iloc[0],
                target=g["target"].iloc[0],
                seeds=len(g),
                reached=int(np.isfinite(e).sum()),
                epochs_mean=m,
                ci_low=lo,
                ci_high=hi,
                epochs_median=lower_median(e),
                epochs_min=float(e.min()),
                epochs_max=float(e.max()),
                budget=int(g["budget"].max()),
                final_accuracy=float(g["final_accuracy"].mean()),
                final_accuracy_min=float(g["final_accuracy"].min()),
                final_accuracy_max=float(g["final_accuracy"].max()),
                diverged=int(g["diverged"].sum()),
            )
        )
    return pd.DataFrame(rows)


def compare(per_seed: pd.DataFrame, baseline: str) -> pd.DataFrame:
    """Each scheme's epochs to target against ``baseline``'s over their seeds: two-sided
    Mann-Whitney U (``p_mannwhitney``, exact permutation p-value; a seed that never reached the
    target ranks last, so censored seeds are handled), and Welch's t-test (``p_welch``; NaN unless
    every seed of both reached); ``p_final_accuracy``: the same U test on the final test accuracy.
    ``ratio`` = scheme mean / baseline mean (inf when only the scheme has a seed that never reached);
    ``ratio_median`` = scheme / baseline :func:`lower_median` (finite while at least half the seeds of
    both reached). With 5 seeds a side the smallest possible U p-value is 2/252 = 0.008."""
    mine = per_seed[per_seed["scheme"] == baseline]
    base = mine["epochs_to_target"].fillna(math.inf).to_numpy(float)
    rows = []
    for scheme, g in per_seed.groupby("scheme", sort=False):
        if scheme == baseline:
            continue
        x = g["epochs_to_target"].fillna(math.inf).to_numpy(float)
        finite = bool(np.isfinite(x).all() and np.isfinite(base).all())
        rows.append(
            dict(
                scheme=scheme,
                baseline=baseline,
                ratio=float(x.mean() / base.mean()) if finite else (math.inf if np.isfinite(base).all() else math.nan),
                ratio_median=_ratio(lower_median(x), lower_median(base)),
                p_mannwhitney=mannwhitney_p(x, base),
                p_welch=_welch(x, base) if finite else math.nan,
                p_final_accuracy=mannwhitney_p(
                    g["final_accuracy"].to_numpy(float), mine["final_accuracy"].to_numpy(float)
                ),
            )
        )
    return pd.DataFrame(rows)


def _ratio(a: float, b: float) -> float:
    """``a / b`` for epoch counts: inf when only ``a`` is inf, NaN when ``b`` is (no finite baseline)."""
    return a / b if math.isfinite(b) and b > 0 else math.nan


def _welch(x: np.ndarray, y: np.ndarray) -> float:
    """Welch's two-sided t-test p-value; NaN with fewer than two values a side or no spread at all."""
    from scipy import stats

    if len(x) < 2 or len(y) < 2 or (x.std() == 0 and y.std() == 0):
        return math.nan
    return float(stats.ttest_ind(x, y, equal_var=False).pvalue)


def mannwhitney_p(x: np.ndarray, y: np.ndarray) -> float:
    """Two-sided Mann-Whitney U p-value from the exact permutation distribution of U (every way to
    split the pooled values into groups of ``len(x)`` and ``len(y)``; mid-ranks for ties; inf values
    rank last): ``P(|U - nm/2| >= |U_obs - nm/2|)``, counted by a dynamic program over the doubled
    ranks (integers), so ten seeds a side (184,756 splits) cost no more than five."""

    from scipy import stats

    big = max(np.nanmax(np.where(np.isfinite(x), x, 0)), np.nanmax(np.where(np.isfinite(y), y, 0))) + 1
    a, b = np.where(np.isfinite(x), x, big), np.where(np.isfinite(y), y, big)
    n, m = len(a), len(b)
    if n == 0 or m == 0:
        return math.nan
    twice = np.rint(2 * stats.rankdata(np.concatenate([a, b]))).astype(int)
    top = int(twice.sum())
    ways = np.zeros((n + 1, top + 1))  # ways[k, s]: subsets of k values whose doubled ranks sum to s
    ways[0, 0] = 1.0
    for w in twice:
        ways[1:, w:] += ways[:-1, : top + 1 - w].copy()
    centre = n * (n + m + 1)  # twice the mean rank sum of the first group
    dev = abs(int(twice[:n].sum()) - centre)
    return float(ways[n][np.abs(np.arange(top + 1) - centre) >= dev].sum() / ways[n].sum())


def cliffs_delta(x, y) -> float:
    """Cliff's delta ``P(x > y) - P(x < y)`` over all pairs (inf counts as larger than any finite
    value, two infs tie): the Mann-Whitney effect size, in [-1, 1]."""
    a, b = np.asarray(x, float)[:, None], np.asarray(y, float)[None, :]
    return float(np.mean(np.sign(np.where(a == b, 0.0, a - b)))) if a.size and b.size else math.nan


def hodges_lehmann(x, y, alpha: float = 0.05) -> tuple[float, float, float]:
    """(shift, low, high): the Hodges-Lehmann estimate of ``x - y`` (the median of the pairwise
    differences) and its ``1 - alpha`` interval (Moses: the ``k``-th smallest and largest pairwise
    difference, ``k = floor(nm/2 - z_{1-alpha/2} sqrt(nm(n+m+1)/12))``); NaN bounds where ``k < 1``."""
    from scipy import stats

    a, b = np.asarray(x, float), np.asarray(y, float)
    d = np.sort((a[:, None] - b[None, :]).ravel())
    n, m = len(a), len(b)
    if not len(d):
        return math.nan, math.nan, math.nan
    k = math.floor(n * m / 2 - stats.norm.ppf(1 - alpha / 2) * math.sqrt(n * m * (n + m + 1) / 12))
    shift = float(np.median(d))
    if k < 1:
        return shift, math.nan, math.nan
    return shift, float(d[k - 1]), float(d[len(d) - k])


def verdict(low: float, high: float, p: float, margin: float, alpha: float) -> str:
    """The protocol's reading of a shift's interval (``statistical_efficiency.equivalence_margin``):
    ``equivalent`` when ``[low, high]`` lies within ``+-margin``; ``lower`` / ``higher`` when the
    Mann-Whitney ``p < alpha`` and the whole interval lies beyond ``-margin`` / ``+margin``;
    ``inconclusive`` otherwise (also when a bound is NaN)."""
    if not (math.isfinite(low) and math.isfinite(high)):
        return "inconclusive"
    if -margin <= low and high <= margin:
        return "equivalent"
    if p < alpha and high < -margin:
        return "lower"
    if p < alpha and low > margin:
        return "higher"
    return "inconclusive"


def slow_scheme_target(per_seed_curves: pd.DataFrame, scheme: str, step: float = 0.01) -> float:
    """The paper's way of comparing with a scheme that plateaus lower ("7.4x faster than ASP to 48%
    accuracy": the level its ASP run reaches): the best test accuracy of ``scheme``'s *median*
    learning curve over seeds (median per epoch, max over epochs; a non-finite accuracy counts as 0),
    rounded down to ``step``. At that epoch at least half the seeds are at or above the median, so at
    least half reach the target and its :func:`lower_median` epochs to target is finite; one seed
    that collapses (diverged Hogwild) moves the median curve by one rank, where it would pull the mean
    curve, and with it the target, down. A seed that stays below is censored (ranked last by
    :func:`compare`)."""
    g = per_seed_curves[per_seed_curves["scheme"] == scheme]
    if g.empty:
        raise ValueError(f"no runs of {scheme!r} to define its target from")
    acc = g["test_accuracy"].where(np.isfinite(g["test_accuracy"]), 0.0)
    best = acc.groupby(g["epoch"]).median().max()
    return math.floor(best / step + 1e-9) * step


# ---- vertical sync: the rule written out by hand -------------------------------------------------
def vertical_sync_by_hand(job, count: int, dtype: torch.dtype = torch.float64) -> list[dict]:
    """PipeDream's vertical-sync rule on the whole model, written without the schedule machinery:
    microbatch ``t`` (the first ``count`` of epoch 0's stream, ``n`` stages) is evaluated -- forward
    and backward, at every stage -- at the one model version the input stage used,
    ``w^(max(0, t-n+1))``, and its gradient is applied to the newest weights:

        w^(t+1) = w^(t) - lr * grad f(w_1^(t-n+1), ..., w_n^(t-n+1); x_t, y_t)

    Returns the weights after ``count`` updates, split into the job's stages (names as
    :func:`~workbench.runtime.semantics.stages.stage_params` gives them)."""

    model, ds = job.model_fn(), job.dataset_fn()
    net = model.sequential().to(dtype)
    n, mb = job.schedule.num_stages, job.optim.batch_size // job.schedule.microbatches
    perm = DataOrder(len(ds), job.optim.batch_size, job.schedule.microbatches, job.optim.seed).permutation(0)
    history = [{k: p.detach().clone() for k, p in net.named_parameters()}]
    for t in range(count):
        x, y = microbatch(ds, perm[t * mb : (t + 1) * mb], dtype=dtype)
        read = {k: p.clone().requires_grad_(True) for k, p in history[max(0, t - n + 1)].items()}
        grads = torch.autograd.grad(model.loss(functional_call(net, read, (x,)), y), list(read.values()))
        history.append({k: w - job.optim.lr * g for (k, w), g in zip(history[-1].items(), grads)})
    out: list[dict] = [{} for _ in job.bounds]
    for name, w in history[-1].items():
        layer, rest = name.split(".", 1)
        s = next(i for i, (a, z) in enumerate(job.bounds) if a <= int(layer) <= z)
        out[s][f"{int(layer) - job.bounds[s][0]}.{rest}"] = w
    return out


def vertical_sync_check(setup: Setup, seed: int, count: int) -> pd.DataFrame:
    """:func:`vertical_sync_by_hand` against the semantic reference (which the runtime is tested
    equal to) on the stream schedules of PipeDream's three weight rules, all in float64 over the first
    ``count`` microbatches of epoch 0: one row per rule with ``max_abs_weight_diff`` (vertical sync
    must agree to rounding; stashing and no stashing must not: the comparison can fail)."""

    hand = vertical_sync_by_hand(job_for(setup, "pipedream-vertical-sync", seed, None), count)
    rows = []
    for scheme in ("pipedream-vertical-sync", "pipedream", "pipedream-no-stash"):
        job = job_for(setup, scheme, seed, None)
        mb = job.optim.batch_size // job.schedule.microbatches
        model = job.model_fn()
        init = [{k: v.to(torch.float64) for k, v in w.items()} for w in _stage_weights(model, job.bounds)]
        ref = reference_train(
            job.stream(count),
            model,
            job.bounds,
            job.dataset_fn(),
            batch_size=count * mb,
            lr=job.optim.lr,
            seed=job.optim.seed,
            init=init,
            dtype=torch.float64,
        )
        rows.append(
            dict(
                rule=SCHEMES[scheme][1]["weights"],
                microbatches=count,
                stages=job.schedule.num_stages,
                max_abs_weight_diff=max(
                    float((ref[s][k] - w).abs().max()) for s, ws in enumerate(hand) for k, w in ws.items()
                ),
            )
        )
    return pd.DataFrame(rows)


def _stage_weights(model, bounds) -> list[dict]:

    return [stage_params(stage_module(model.layers, a, z)) for a, z in bounds]


def staleness(
    setup: Setup, schemes=("pipedream", "pipedream-no-stash", "pipedream-vertical-sync"), count: int = 64
) -> pd.DataFrame:
    """Per (scheme, stage): how many updates older than the one its gradient is applied to are the
    weights its forward and its backward read, averaged over the microbatches of a ``count``-long
    stream after the warm-up (from the schedule's op versions: update ``t`` of a stage applies
    microbatch ``t``'s gradient to version ``t``)."""
    rows = []
    for scheme in schemes:
        sched = job_for(setup, scheme, 0, None).stream(count)
        v = {(op.kind, op.stage, op.microbatch): op.version for _, op in sched if op.kind in ("F", "B")}
        S = sched.num_stages
        steady = range(S, count)
        for s in range(S):
            rows.append(
                dict(
                    scheme=scheme,
                    stage=s,
                    forward_delay=float(np.mean([b - v[("F", s, b)] for b in steady])),
                    backward_delay=float(np.mean([b - v[("B", s, b)] for b in steady])),
                )
            )
    return pd.DataFrame(rows)


def lr_rule(
    bsp: pd.DataFrame, epochs: int, model: str, *, budget_share: float = 0.8
) -> tuple[pd.DataFrame, float, float]:
    """The rule on BSP's curves ``bsp`` (rows of (lr, seed, epoch, test_accuracy)): the chosen ``lr``
    is the one whose worst seed reaches the highest accuracy within the first ``budget_share`` of
    the ``epochs``, and the target is that accuracy rounded down to 0.01 (every seed of BSP reaches
    it within that share of the budget). Returns the table (one row per ``lr``), the ``lr`` and the
    target."""
    horizon = max(1, int(budget_share * epochs))
    rows = []
    for lr, g in bsp.groupby("lr", sort=True):
        early = g[g["epoch"] <= horizon].groupby("seed")["test_accuracy"].max().fillna(0.0)
        rows.append(
            dict(
                lr=float(lr),
                worst_seed_best_accuracy=float(early.min()),
                best_accuracy_per_seed=", ".join(f"{v:.3f}" for v in early),
                within_epochs=horizon,
                label=f"measured (this machine: BSP on {model}, the semantic reference, {len(early)} seeds)",
            )
        )
    table = pd.DataFrame(rows)
    best = table.loc[table["worst_seed_best_accuracy"].idxmax()]
    target = math.floor(100 * float(best["worst_seed_best_accuracy"]) + 1e-9) / 100
    table["chosen"] = table["lr"] == best["lr"]
    return table, float(best["lr"]), target


# ---- every weight rule over the whole learning-rate grid ----------------------------------------
@dataclass(frozen=True)
class Arm:
    """One arm of the grid: a scheme of :data:`SCHEMES` at ``samples_per_update`` samples per step
    (None: the setup's); ``label`` names it in the tables."""

    label: str
    scheme: str
    samples_per_update: int | None = None


def _grid_curve(task: tuple) -> pd.DataFrame:
    """One reference curve of the grid (a process pool's unit of work): ``task`` is (setup, arm,
    seed, scratch); the curve's rows carry the arm, lr, seed and the CPU seconds this curve took."""
    setup, arm, seed, scratch = task
    torch.set_num_threads(1)
    if arm.samples_per_update:
        setup = replace(setup, samples_per_update=arm.samples_per_update)
    cpu = time.process_time()
    job = job_for(setup, arm.scheme, seed, Path(scratch) / f"{arm.label}-lr{setup.lr:g}-s{seed}")
    curve, _ = reference_curve(job, setup.epochs)
    return curve.assign(
        arm=arm.label, scheme=arm.scheme, lr=setup.lr, seed=seed, engine="reference", cpu_s=time.process_time() - cpu
    )


def grid_sweep(setup: Setup, arms, lrs, seeds, scratch, *, processes: int = 1) -> pd.DataFrame:
    """Learning curves of every deterministic ``arms`` x ``lrs`` x ``seeds`` from the semantic
    reference, ``processes`` at a time (each curve is deterministic and independent: the count
    changes the wall clock, not a number). One row per (arm, lr, seed, epoch) with ``cpu_s``, the
    CPU seconds of that whole curve (the per-run cost, independent of other load on the machine)."""
    tasks = [(replace(setup, lr=float(lr)), arm, seed, scratch) for arm in arms for lr in lrs for seed in seeds]
    if processes > 1 and len(tasks) > 1:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(processes) as pool:
            frames = pool.map(_grid_curve, tasks, chunksize=1)
    else:
        frames = [_grid_curve(t) for t in tasks]
    return pd.concat(frames, ignore_index=True)


def grid_runtime(setup: Setup, arms, lrs, seeds, out) -> tuple[pd.DataFrame, dict]:
    """The non-deterministic ``arms`` (ASP: Hogwild, its staleness decided by timing) over ``lrs`` x
    ``seeds`` on the real runtime (:func:`runtime_runs`, one spawn per lr); rows as
    :func:`grid_sweep`'s, ``engine="runtime"``, ``cpu_s`` NaN and ``wall_s`` the run's clock; and the
    runs' summaries by lr."""
    frames, summaries = [], {}
    for lr in lrs:
        for arm in arms:
            s = replace(setup, lr=float(lr), samples_per_update=arm.samples_per_update or setup.samples_per_update)
            runs = [(arm.scheme, seed, setup.epochs) for seed in seeds]
            curves, summaries[float(lr)] = runtime_runs(s, runs, Path(out) / f"{arm.label}-lr{lr:g}")
            frames.append(curves.assign(arm=arm.label, lr=float(lr), cpu_s=math.nan))
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), summaries


def majority_accuracy(setup: Setup) -> float:
    """Test accuracy of predicting the training split's most frequent label (or token) everywhere:
    the level below which a curve has not learned."""
    job = job_for(setup, BSP, 0, None)
    train, test = job.dataset_fn(), job.dataset_fn(split="test")
    y = train.tensors[-1].flatten()
    return float((test.tensors[-1].flatten() == torch.mode(y).values).double().mean())


def grid_summary(curves: pd.DataFrame, target: float, majority: float) -> pd.DataFrame:
    """Per (arm, lr): seeds, best test accuracy over the budget (median, min, max over seeds), final
    accuracy (median), epochs to ``target`` (median: :func:`lower_median`; min, max; how many seeds
    reached), diverged seeds, ``learns`` (median best accuracy at least halfway from ``majority`` to
    ``target``: protocol ``statistical_efficiency.claim_rule``) and the mean CPU seconds per curve."""
    rows = []
    for (arm, lr), g in curves.groupby(["arm", "lr"], sort=False):
        per = epochs_to_target(g, target)
        best, e = per["best_accuracy"], per["epochs_to_target"].fillna(math.inf)
        rows.append(
            dict(
                arm=arm,
                scheme=g["scheme"].iloc[0],
                lr=lr,
                engine=g["engine"].iloc[0],
                seeds=len(per),
                best_accuracy_median=float(best.median()),
                best_accuracy_min=float(best.min()),
                best_accuracy_max=float(best.max()),
                final_accuracy_median=float(per["final_accuracy"].median()),
                target=target,
                reached=int(np.isfinite(e).sum()),
                epochs_median=lower_median(e),
                epochs_min=float(e.min()),
                epochs_max=float(e.max()),
                diverged=int(per["diverged"].sum()),
                learns=bool(best.median() >= majority + (target - majority) / 2),
                cpu_s_per_curve=float(g.groupby("seed")["cpu_s"].first().mean()),
            )
        )
    return pd.DataFrame(rows)


@dataclass(frozen=True)
class Reading:
    """How the grid's comparisons are read (protocol ``statistical_efficiency``): the level, the
    equivalence margin's (low, point, high) and the fewest seeds a side a statistic needs."""

    alpha: float = 0.05
    margins: tuple[float, float, float] = (0.01, 0.02, 0.03)
    min_seeds: int = 5


def grid_comparisons(curves: pd.DataFrame, pairs, target: float, reading: Reading) -> pd.DataFrame:
    """Per (arm, baseline) of ``pairs`` and per lr both ran: each seed's best test accuracy over the
    budget, arm against baseline: the Hodges-Lehmann shift with its ``1 - alpha`` interval, the
    two-sided exact Mann-Whitney p, Cliff's delta, and the verdict at the margin's low, point and
    high (:func:`verdict`); the epochs to ``target`` beside it (p, Cliff's delta, a seed that never
    reached ranking last). With fewer than ``min_seeds`` seeds a side every statistic is NaN and the
    verdicts read ``not computed``."""
    per = {
        key: epochs_to_target(g, target).assign(arm=key[0], lr=key[1])
        for key, g in curves.groupby(["arm", "lr"], sort=False)
    }
    rows = []
    for arm, base in pairs:
        for lr in sorted({lr for a, lr in per if a == arm} & {lr for a, lr in per if a == base}):
            x, y = per[(arm, lr)], per[(base, lr)]
            row = dict(arm=arm, baseline=base, lr=lr, seeds=len(x), baseline_seeds=len(y),
                       best_accuracy_median=float(x["best_accuracy"].median()),
                       baseline_best_accuracy_median=float(y["best_accuracy"].median()))  # fmt: skip
            rows.append(row | _pair_statistics(x, y, reading))
    return pd.DataFrame(rows)


def _pair_statistics(x: pd.DataFrame, y: pd.DataFrame, reading: Reading) -> dict:
    """The statistics of one comparison of :func:`grid_comparisons` (or ``not computed``)."""
    names = ("shift", "shift_low", "shift_high", "p_best_accuracy", "cliffs_delta_best_accuracy",
             "p_epochs", "cliffs_delta_epochs")  # fmt: skip
    verdicts = [f"verdict_margin_{end}" for end in ("low", "point", "high")]
    if min(len(x), len(y)) < reading.min_seeds:
        return dict.fromkeys(names, math.nan) | dict.fromkeys(verdicts, "not computed")
    bx, by = x["best_accuracy"].to_numpy(float), y["best_accuracy"].to_numpy(float)
    ex, ey = (d["epochs_to_target"].fillna(math.inf).to_numpy(float) for d in (x, y))
    shift, lo, hi = hodges_lehmann(bx, by, reading.alpha)
    p = mannwhitney_p(bx, by)
    out = dict(zip(names, (shift, lo, hi, p, cliffs_delta(bx, by), mannwhitney_p(ex, ey), cliffs_delta(ex, ey))))
    return out | {v: verdict(lo, hi, p, m, reading.alpha) for v, m in zip(verdicts, reading.margins)}


def claim_verdict(comparisons: pd.DataFrame, learns: dict, holds: set, opposite: set, column: str) -> str:
    """The protocol's ``claim_rule`` on one (arm, baseline)'s rows of :func:`grid_comparisons`:
    ``holds`` when the verdict in ``column`` is in ``holds`` at every lr where the baseline learns
    (``learns``: lr -> bool), ``contradicted`` when it is in ``opposite`` at one of them,
    ``inconclusive`` otherwise; ``not computed`` when a statistic was not, ``untestable`` when the
    baseline learns at no lr of the grid."""
    rows = comparisons[comparisons["lr"].map(lambda lr: bool(learns.get(lr, False)))]
    if rows.empty:
        return "untestable"
    v = set(rows[column])
    if "not computed" in v:
        return "not computed"
    if v & opposite:
        return "contradicted"
    return "holds" if v <= holds else "inconclusive"

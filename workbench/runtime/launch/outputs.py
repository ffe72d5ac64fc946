"""Run outputs: checkpoints, metrics.csv, timeline.csv, summary.json (all written atomically).

* ``metrics.csv``  one row per minibatch (``step``): loss, accuracy (training microbatches), samples/s,
  wall ms, and at the end of each epoch the test loss/accuracy
* ``timeline.csv`` measured ops ``worker, stage, microbatch, kind, start, end, version, round, wait_ms,
  send_ms, data_ms, send_at, step`` (ms since a barrier-synchronised t0; ``round`` = the minibatch round R, ``step`` the same
  number, see :mod:`workbench.io.timeline`), merged from all ranks on rank 0
* ``checkpoints/round{R}/stage{s}_replica{r}.pt`` written by each stage replica itself (weights,
  optimizer state, step, rng); ``COMPLETE`` marks a checkpoint all ranks finished
* ``summary.json`` throughput, wall time, final loss/accuracy, per-rank peak memory and stash depth;
  ``steps`` counts every minibatch of the run, ``steps_trained`` those of this invocation (a resumed
  run starts at ``resumed_at``)
* ``options.json`` the run as asked for (model, schedule, sizes, optimizer, length): ``--resume``
  refuses a changed option (:data:`KEPT_ON_RESUME`) and states a changed length

Units and words (the same for every schedule): a *minibatch* (one ``step``, one row of metrics.csv)
is one pass of the schedule over ``batch_size`` samples, split into ``microbatches`` equal
*microbatches* of ``microbatch_size = batch_size / microbatches`` samples (a data-parallel schedule
hands them round-robin to its replicas). How many optimizer updates one pass makes is the schedule's
weight rule, reported as ``updates_per_step`` (first stage): 1 for gpipe / flush / 2BW-style
accumulation over the minibatch, one per microbatch for PipeDream (its paper calls each of them a
minibatch), ``ceil(microbatches / replicas)`` for dp-bsp. ``samples_per_s``
= samples / wall seconds of this invocation (start-up included); ``samples_per_s_steady`` = batch_size
/ mean time per minibatch after the first; ``minibatch_ms_steady`` = that mean time per minibatch
(ms), ``minibatch_ms`` the mean over all minibatches of this invocation, start-up included.
``accuracy`` = argmax hits / targets (samples for a classifier, tokens for a language model).

Every file is written under a temporary name and renamed into place, so a failed run leaves its
earlier complete checkpoints and never a half-written file.
"""

from __future__ import annotations

import csv
import html
import io
import json
import os
import resource
from dataclasses import dataclass
from pathlib import Path

import torch

from workbench.io.cards import card, one_line
from workbench.runtime.executors.record import RECORD_COLUMNS, OpRecord
from workbench.runtime.launch.job import Job

TIMELINE_COLUMNS = RECORD_COLUMNS + ["step"]  # step: a copy of round (workbench.io.timeline)
METRIC_COLUMNS = [
    "step",
    "epoch",
    "loss",
    "accuracy",
    "samples",
    "samples_per_s",
    "wall_ms",
    "test_loss",
    "test_accuracy",
]


#: what a resumed run must keep from the run it continues (each changes what a step computes); its
#: length (``--epochs`` / ``--steps``) may change, and the resume says so
KEPT_ON_RESUME = (
    "model",
    "model_options",
    "dtype",
    "schedule",
    "schedule_options",
    "workers",
    "bounds",
    "microbatches",
    "batch_size",
    "lr",
    "stage_lr",
    "momentum",
    "seed",
)
OPTIONS_FILE = "options.json"


def run_options(job: Job) -> dict:
    """The options a run folder records (:data:`OPTIONS_FILE`), as JSON values."""
    o = job.optim
    return jsonable(
        dict(
            model=job.options.get("model"),
            model_options=job.options.get("model_options", {}),
            dtype=job.dtype,
            schedule=job.schedule.name,
            schedule_options=job.options.get("schedule_options", {}),
            workers=job.schedule.num_workers,
            bounds=[list(b) for b in job.bounds],
            microbatches=job.schedule.microbatches,
            batch_size=o.batch_size,
            lr=o.lr,
            stage_lr=o.stage_lr,
            momentum=o.momentum,
            seed=o.seed,
            minibatches=job.rounds_total,
        )
    )


def resume_notes(out: Path, job: Job) -> list[str]:
    """Before a resumed run starts: a ValueError line for the first option of :data:`KEPT_ON_RESUME`
    that differs from the run in ``out``; else the lines to state (a changed length, or no record)."""
    path = Path(out) / OPTIONS_FILE
    if not path.exists():
        return [f"resume: {out} records no options ({OPTIONS_FILE}), so changed options cannot be checked"]
    old, new = json.loads(path.read_text()), run_options(job)
    for key in KEPT_ON_RESUME:
        if old.get(key) != new[key]:
            raise ValueError(
                f"resume: {key} changed since the run in {out} was started ({old.get(key)!r}, now {new[key]!r}); "
                "resume with the run's options, or start afresh in a new --out folder"
            )
    if old.get("minibatches") != new["minibatches"]:
        return [
            f"resume: the run now trains {new['minibatches']} minibatches in all, not the "
            f"{old.get('minibatches')} it was started with (--epochs/--steps changed)"
        ]
    return []


def record_options(out: Path, job: Job) -> None:
    atomic_text(json.dumps(run_options(job), indent=1), Path(out) / OPTIONS_FILE)


def atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def atomic_text(text: str, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def latest_checkpoint(out: Path) -> Path | None:
    """The newest checkpoint folder every rank finished (``COMPLETE`` present)."""
    root = Path(out) / "checkpoints"
    done = sorted(p for p in root.glob("round*") if (p / "COMPLETE").exists()) if root.exists() else []
    return done[-1] if done else None


def load_stage(ckpt: Path, stage: int, replica: int) -> dict:
    path = ckpt / f"stage{stage}_replica{replica}.pt"
    if not path.exists():
        path = ckpt / f"stage{stage}_replica0.pt"
    return torch.load(path, weights_only=False)


def jsonable(d):
    return json.loads(json.dumps(d, default=str))


def peak_rss() -> int:

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def append_outputs(out: Path, gathered, job: Job, truncate_from: int) -> None:
    """Merge the ranks' per-step rows and timeline rows and add them to the CSVs (rank 0).

    The new rows are appended (one write per file): the cost of an epoch end does not grow with the
    epochs already written (rewriting both files every epoch took 5 ms at the first epoch end and
    20 ms at the fourth of the 2-rank mlp benchmark, all of it on the pipeline's critical path).
    ``truncate_from >= 0`` (the first write after a resume) rewrites them instead, without the rows
    of step ``truncate_from`` and later, to a temporary file moved into place."""
    steps: dict[int, StepTotals] = {}
    timeline: list[OpRecord] = []
    for rows, tl in gathered:
        timeline.extend(OpRecord(*r) for r in tl)
        for r in rows:
            steps.setdefault(r["step"], StepTotals(r["step"], r["epoch"])).add(r)
    metrics_path, tl_path = out / "metrics.csv", out / "timeline.csv"
    rewrite = truncate_from >= 0
    old = _read_rows(metrics_path, truncate_from) if rewrite else []
    last = old[-1] if old else (None if rewrite else _last_row(metrics_path, METRIC_COLUMNS))
    prev_end = float(last["wall_ms"]) if last is not None and not rewrite else 0.0
    new = []
    per_sample = job.options.get("targets_per_sample", 1)  # tokens per sequence for a language model
    for st in sorted(steps):
        new.append(steps[st].metrics_row(job.optim.batch_size, per_sample, since_ms=prev_end))
        prev_end = steps[st].end_ms
    timeline.sort(key=lambda r: (r.start, r.worker))
    tl_rows = [r._asdict() | {"step": r.round} for r in timeline]
    if rewrite:
        old_tl = [r for r in _read_rows(tl_path, None) if int(r["round"]) < truncate_from]
        _write_csv(metrics_path, METRIC_COLUMNS, old + new)
        _write_csv(tl_path, TIMELINE_COLUMNS, old_tl + tl_rows)
    else:
        _append_csv(metrics_path, METRIC_COLUMNS, new)
        _append_csv(tl_path, TIMELINE_COLUMNS, tl_rows)


@dataclass(slots=True)
class StepTotals:
    """One minibatch's training metrics summed over the ranks' rows (rank 0 merges them): the last
    stage's summed ``loss`` over ``n`` microbatches, ``correct`` hits over ``samples``, the latest
    ``end_ms`` of a rank's last op of it, and the epoch end's test metrics ("" where none)."""

    step: int
    epoch: int
    loss: float = 0.0
    n: int = 0
    correct: int = 0
    samples: int = 0
    end_ms: float = 0.0
    test_loss: float | str = ""
    test_accuracy: float | str = ""

    def add(self, row: dict) -> None:
        """Add one rank's row of this minibatch (``loss``, ``n``, ``correct``, ``samples``, ``end_ms``,
        and on rank 0 at an epoch end ``test_loss`` / ``test_accuracy``)."""
        self.loss += row["loss"]
        self.n += row["n"]
        self.correct += row["correct"]
        self.samples += row["samples"]
        if "test_loss" in row:
            self.test_loss = row["test_loss"]
        if "test_accuracy" in row:
            self.test_accuracy = row["test_accuracy"]
        self.end_ms = max(self.end_ms, row["end_ms"])

    def metrics_row(self, batch_size: int, per_sample: int, *, since_ms: float) -> dict:
        """The ``metrics.csv`` row (:data:`METRIC_COLUMNS`): mean loss, accuracy over the targets
        (``per_sample`` per sample), and samples/s since the previous minibatch ended at ``since_ms``."""
        dt = max(self.end_ms - since_ms, 1e-9)
        return dict(
            step=self.step,
            epoch=self.epoch,
            loss=self.loss / max(self.n, 1),
            accuracy=self.correct / max(self.samples * per_sample, 1),
            samples=batch_size,
            samples_per_s=batch_size / dt * 1e3,
            wall_ms=self.end_ms,
            test_loss=self.test_loss,
            test_accuracy=self.test_accuracy,
        )


def _read_rows(path: Path, truncate_from: int | None) -> list[dict]:
    """The rows of a CSV (none when absent), without those of step ``truncate_from`` and later and
    without a torn last line (fields missing: a write that a crash cut short)."""
    if not path.exists():
        return []
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if None not in r.values()]
    return [r for r in rows if truncate_from is None or int(r["step"]) < truncate_from]


def _last_row(path: Path, columns) -> dict | None:
    """The last complete row of a CSV, read from its tail (the file can be long)."""
    if not path.exists():
        return None
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 4096))
        lines = f.read().decode().splitlines()
    for line in reversed(lines):
        vals = next(csv.reader([line]), [])
        if len(vals) == len(columns) and vals[0] != columns[0]:
            return dict(zip(columns, vals))
    return None


def _append_csv(path: Path, columns, rows) -> None:
    """Append ``rows`` in one write (the header first when the file is new)."""
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=columns)
    if not path.exists():
        w.writeheader()
    w.writerows(rows)
    with open(path, "a", newline="") as f:
        f.write(buf.getvalue())


def _write_csv(path: Path, columns, rows) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=columns)
        w.writeheader()
        w.writerows(rows)
    os.replace(tmp, path)


def write_summary(out: Path, job: Job, gathered) -> None:
    infos = [g[0] for g in gathered]
    rows = []
    if (out / "metrics.csv").exists():
        with open(out / "metrics.csv") as f:
            rows = list(csv.DictReader(f))
    wall_s = max(i["wall_s"] for i in infos)
    samples = max(i["samples"] for i in infos)
    walls = [float(r["wall_ms"]) for r in rows]
    k = len(walls) - 1
    while k > 0 and walls[k - 1] < walls[k]:  # this invocation's steps (wall clock restarts on resume)
        k -= 1
    start = min(int(infos[0].get("start_round", 0)), len(rows))  # a resumed run's first minibatch
    steady = (len(walls) - 1 - k) * job.optim.batch_size / (walls[-1] - walls[k]) * 1e3 if len(walls) - k > 1 else None
    minibatch_ms = (walls[-1] - walls[k]) / (len(walls) - 1 - k) if len(walls) - k > 1 else None
    summary = dict(
        schedule=job.schedule.name,
        update=job.schedule.update,
        workers=job.schedule.num_workers,
        stages=job.schedule.num_stages,
        microbatches=job.schedule.microbatches,
        batch_size=job.optim.batch_size,
        lr=job.optim.lr,
        stage_lr=job.optim.stage_lr,
        momentum=job.optim.momentum,
        seed=job.optim.seed,
        steps=len(rows),
        steps_trained=len(rows) - start,
        resumed_at=start if start else None,
        bounds=[list(b) for b in job.bounds],
        backend=job.run.backend,
        transport=job.run.transport,
        stream=job.stream is not None,
        device=job.run.device,
        wall_s=wall_s,
        samples_per_s=samples / wall_s if wall_s > 0 else None,
        samples_per_s_steady=steady,
        minibatch_ms_steady=minibatch_ms,
        minibatch_ms=wall_s * 1e3 / max(len(rows) - k, 1) if rows else None,
        microbatch_size=job.optim.batch_size // max(job.schedule.microbatches, 1),
        updates_per_step=job.schedule.updates_per_round[0],
        final_loss=float(rows[-1]["loss"]) if rows else None,
        final_accuracy=float(rows[-1]["accuracy"]) if rows else None,
        final_test_accuracy=float(rows[-1]["test_accuracy"]) if rows and rows[-1].get("test_accuracy") else None,
        final_test_loss=float(rows[-1]["test_loss"]) if rows and rows[-1].get("test_loss") else None,
        ranks=infos,
        options=jsonable(job.options),
    )
    if job.schedule.update == "async":
        st = [m for i in infos for m in i["memory"].values()]
        n = sum(s["updates"] for s in st)
        summary["staleness_mean"] = sum(s["staleness_mean"] * s["updates"] for s in st) / max(n, 1)
        summary["staleness_max"] = max(s["staleness_max"] for s in st)
    atomic_text(json.dumps(summary, indent=2, default=str), out / "summary.json")
    if job.run.return_weights:
        weights: dict = {}
        for _, w in gathered:
            for s, ws in (w or {}).items():
                weights.setdefault(s, ws)
        atomic_save(weights, out / "weights.pt")


class RunResult(dict):
    """The summary of a run (the dict of ``summary.json``) with Jupyter manners: a one-line repr
    and an HTML card of the measured figures (units in the names) with a link to the timeline."""

    def _rows(self) -> list:
        return [
            ("schedule", self.get("schedule"), ""),
            ("workers", self.get("workers"), ""),
            ("minibatches", self.get("steps"), f"x {self.get('batch_size')} samples"),
            ("throughput", self.get("samples_per_s_steady") or self.get("samples_per_s"), "samples/s"),
            ("time per minibatch", self.get("minibatch_ms_steady") or self.get("minibatch_ms"), "ms"),
            ("final loss", self.get("final_loss"), ""),
            ("train accuracy", self.get("final_accuracy"), ""),
        ]

    def __repr__(self) -> str:

        return one_line("RunResult", self._rows() + [("out", self.get("out"), "")])

    def _repr_html_(self) -> str:

        out = Path(str(self.get("out", "")))
        page = next((p for p in ("timeline.html", "timeline.csv") if (out / p).exists()), None)
        link = (
            f"<div><a href='{html.escape(str(out / page))}' target='_blank'>measured timeline ({page})</a></div>"
            if page
            else ""
        )
        label = (
            f"measured on {self.get('workers')} {self.get('backend', '')} ranks ({self.get('device', '')}); "
            f"steady = after the first minibatch; folder {out}"
        )
        return card(
            f"Training run: {self.get('options', {}).get('model', '')} with {self.get('schedule')}",
            self._rows(),
            label=label,
            extra_html=link,
        )

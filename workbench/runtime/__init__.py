"""Real pipelined training: execute a :class:`~workbench.schedules.core.Schedule` with torch.distributed.

    train(model, schedule, workers, microbatches, ...)  -> summary dict   (launch.py: spawn or torchrun)
    reference_train(schedule, model, bounds, dataset, ...) -> weights      (reference.py: the oracle)

Modules: ``launch`` (parent side: validate, spawn, collect), ``lifetime`` (the ranks' processes: start,
watch, stop on a signal or a rank's death), ``rank`` (one rank's program), ``worker``
(executors of a rank's op list: pipeline with versioned weights, DDP, Hogwild), ``comm`` (pre-posted
point-to-point transfers), ``fetch`` (remote weights of the master family: fetches from the owner,
gradient pushes back), ``tied`` (weights tied across stages: gradients combined among the owners),
``segment_executor`` (schedules with segments, Seq1F1B), ``stages`` (stage functions, deterministic
data order), ``record`` (one timeline row per op), ``outputs`` (checkpoints, CSVs, summary), ``jobspec``
(the run as asked for: keyword groups), ``job`` (the picklable run description), ``cli`` (``workbench train``).
"""

import importlib

#: public name -> the module that defines it, imported on first use (PEP 562), so that
#: ``workbench train --help`` builds its parser without importing torch
_EXPORTS = {
    "Job": ".job",
    "JobSpec": ".jobspec",
    "build_job": ".launch",
    "prepare": ".launch",
    "run_job": ".launch",
    "run_jobs": ".launch",
    "train": ".launch",
    "latest_checkpoint": ".outputs",
    "reference_train": ".reference",
    "updates_per_round": ".reference",
}

__all__ = [
    "train",
    "prepare",
    "build_job",
    "JobSpec",
    "run_job",
    "run_jobs",
    "Job",
    "latest_checkpoint",
    "reference_train",
    "updates_per_round",
]


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'workbench.runtime' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name], __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))

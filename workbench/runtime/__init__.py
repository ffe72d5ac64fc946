"""Real pipelined training: execute a :class:`~workbench.schedules.core.Schedule` with torch.distributed.

    train(model, schedule, workers, microbatches, ...)  -> summary dict   (launch.py: spawn or torchrun)
    reference_train(schedule, model, bounds, dataset, ...) -> weights      (reference.py: the oracle)

Modules: ``launch`` (parent side: validate, spawn, collect), ``lifetime`` (the ranks' processes: start,
watch, stop on a signal or a rank's death), ``rank`` (one rank's program), ``worker``
(executors of a rank's op list: pipeline with versioned weights, DDP, Hogwild), ``comm`` (pre-posted
point-to-point transfers), ``fetch`` (remote weights of the master family: fetches from the owner,
gradient pushes back), ``stages`` (stage functions, deterministic data order), ``outputs``
(checkpoints, CSVs, summary), ``job`` (the picklable run description), ``cli`` (``workbench train``).
"""
from .job import Job
from .launch import prepare, run_job, run_jobs, train
from .outputs import latest_checkpoint
from .reference import reference_train, updates_per_round

__all__ = ["train", "prepare", "run_job", "run_jobs", "Job", "latest_checkpoint", "reference_train", "updates_per_round"]

"""Real pipelined training: execute a :class:`~workbench.schedules.core.Schedule` with torch.distributed.

``train(...)`` spawns one process per worker (or joins torchrun); ``reference_train(...)`` is the
single-process semantic oracle the runtime is tested against.
"""
from .launch import Job, latest_checkpoint, prepare, run_job, run_jobs, train
from .reference import reference_train, updates_per_round

__all__ = ["train", "prepare", "run_job", "run_jobs", "Job", "latest_checkpoint", "reference_train", "updates_per_round"]

"""Real pipelined training: execute a :class:`~workbench.schedules.core.Schedule` with torch.distributed.

    train(model, schedule, workers, microbatches, ...)  -> summary dict        (launch: spawn or torchrun)
    reference_train(schedule, model, bounds, dataset, ...) -> weights           (semantics: the oracle)

The runtime's rooms, lowest first:

    semantics/    what a step computes: stages as functions of their weights, the deterministic data
                  order, the single-process semantic reference every executor is tested against
    transport/    how tensors move between ranks: pre-posted point-to-point transfers, the NCCL
                  matching and blocking check, shared memory on one machine
    executors/    a rank's op list run: the pipeline with versioned weights, DDP, Hogwild, segments
                  (Seq1F1B), remote weights, tied weights, the measured timeline's rows and clock
    launch/       the parent side and the ranks' lifetime: the run as asked for (JobSpec) and as
                  described (Job), spawn or torchrun, signals and a rank's death, ports, outputs
    calibration/  this machine's links, all-reduce and stage timings; tiny models for checks

Everything a caller outside the runtime needs is named here (imported on first use, PEP 562, so that
``workbench train --help`` builds its parser without importing torch).
"""

from workbench.io.lazy import lazy_exports

#: public name -> the module that defines it
_EXPORTS = {
    "Job": ".launch.job",
    "JobSpec": ".launch.jobspec",
    "build_job": ".launch.driver",
    "prepare": ".launch.driver",
    "run_job": ".launch.driver",
    "run_jobs": ".launch.driver",
    "train": ".launch.driver",
    "schedule_for_workers": ".launch.driver",
    "build_model": ".launch.job",
    "RankFailed": ".launch.lifetime",
    "latest_checkpoint": ".launch.outputs",
    "reference_train": ".semantics.reference",
    "updates_per_round": ".semantics.reference",
    "DataOrder": ".semantics.stages",
    "microbatch": ".semantics.stages",
    "run_stage": ".semantics.stages",
    "stage_module": ".semantics.stages",
    "stage_params": ".semantics.stages",
    "stage_lrs": ".semantics.stages",
    "STAGE_TIMINGS": ".calibration.machine",
    "StageProfile": ".calibration.machine",
    "measured_step_ms": ".calibration.machine",
    "modeled_step_ms": ".calibration.machine",
    "repeat_rounds": ".calibration.machine",
    "stage_profile": ".calibration.machine",
    "measure_link": ".calibration.machine",
    "measure_allreduce": ".calibration.machine",
}

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

"""What the user asks of a training run, before it is checked: :class:`JobSpec`, four frozen groups of
the keywords of :func:`~workbench.runtime.launch.train` / :func:`~workbench.runtime.launch.prepare`.

* :class:`ModelSpec`: what is trained, on which data (a zoo name or a user's model, data set, dtype);
* :class:`PipelineSpec`: how it is parallelised (schedule, workers, microbatches, plan, stream);
* :class:`OptimSpec`: the optimizer and how long (SGD ``lr`` and heavy-ball ``momentum``, minibatch
  size, steps or epochs, the seed of the data order and of the model, test evaluation);
* :class:`RunSpec`: where and how the ranks run (output folder, device, backend, transport, threads,
  timeouts, resume, fault injection).

A keyword's name is its field's name, so the keywords a caller may pass are these fields; any other
keyword is a model option of a zoo model (``depth=3``). :func:`workbench.runtime.launch.build_job`
turns a spec into the picklable, checked :class:`~workbench.runtime.job.Job` the ranks receive.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

DEFAULT_LR = 0.05


@dataclass(frozen=True)
class ModelSpec:
    """The model and its data: ``model`` a zoo name, an ``nn.Module``, a factory,
    ``"package.module:function"`` or a LayerModel; ``dataset`` (a user model needs one; the zoo's
    default: its own); ``model_seed`` (default: the job's ``seed``); ``model_options`` (zoo only)."""

    model: Any = "mlp"
    dataset: Any = None
    dtype: str | None = None
    model_seed: int | None = None
    dataset_options: Mapping[str, Any] | None = None
    model_options: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PipelineSpec:
    """The schedule (a registry name or a :class:`~workbench.schedules.core.Schedule`) over
    ``workers`` ranks, ``microbatches`` per minibatch, stages from ``plan`` (else even), and whether
    an epoch's minibatches run as one ``stream``."""

    schedule: Any = "pipedream"
    workers: int = 2
    microbatches: int = 4
    plan: Any = None
    schedule_options: Mapping[str, Any] | None = None
    stream: bool = False


@dataclass(frozen=True)
class OptimSpec:
    """SGD ``W <- W - lr * d``, ``d <- momentum * d + g`` over minibatches of ``batch_size`` samples,
    for ``steps`` minibatches (else ``epochs`` epochs); ``seed`` fixes the data order (and the model's
    initial weights unless ``model_seed``); ``evaluate``: test loss/accuracy at each epoch end."""

    batch_size: int = 64
    lr: float = DEFAULT_LR
    momentum: float = 0.0
    steps: int | None = None
    epochs: int = 1
    seed: int = 0
    evaluate: bool = True


@dataclass(frozen=True)
class RunSpec:
    """Where and how the ranks run (``None``: chosen by :func:`~workbench.runtime.launch.build_job`)."""

    out: Any = None
    device: str | None = None
    backend: str | None = None
    transport: str = "auto"
    threads: int | None = None
    lookahead: int | None = None
    timeout_s: float = 60.0
    allow_oversubscribe: bool = False
    progress: bool = True
    return_weights: bool = False
    resume: bool = False
    fail_rank: int | None = None
    fail_at_step: int | None = None


_GROUPS = {"model": ModelSpec, "pipeline": PipelineSpec, "optim": OptimSpec, "run": RunSpec}


@dataclass(frozen=True)
class JobSpec:
    """A training run as asked for: the four groups above (see the module docstring)."""

    model: ModelSpec = field(default_factory=ModelSpec)
    pipeline: PipelineSpec = field(default_factory=PipelineSpec)
    optim: OptimSpec = field(default_factory=OptimSpec)
    run: RunSpec = field(default_factory=RunSpec)

    @classmethod
    def from_keywords(
        cls, model: Any = "mlp", schedule: Any = "pipedream", workers: int = 2, microbatches: int = 4, **keywords
    ) -> JobSpec:
        """The spec of ``train(model, schedule, workers, microbatches, **keywords)``: each keyword goes
        to the group with a field of its name; the others are the zoo model's options."""
        keywords.update(model=model, schedule=schedule, workers=workers, microbatches=microbatches)
        groups: dict[str, dict[str, Any]] = {}
        for key, group in _GROUPS.items():
            names = {f.name for f in fields(group)} - {"model_options"}
            groups[key] = {n: keywords.pop(n) for n in names & set(keywords)}
        groups["model"]["model_options"] = keywords
        return cls(**{key: _GROUPS[key](**values) for key, values in groups.items()})

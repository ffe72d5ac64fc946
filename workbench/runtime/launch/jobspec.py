"""What the user asks of a training run, before it is checked: :class:`JobSpec`, four frozen groups of
the keywords of :func:`~workbench.runtime.launch.driver.train` / :func:`~workbench.runtime.launch.driver.prepare`.

* :class:`ModelSpec`: what is trained, on which data (a zoo name or a user's model, data set, dtype);
* :class:`PipelineSpec`: how it is parallelised (schedule, workers, microbatches, plan, stream);
* :class:`OptimSpec`: the optimizer and how long (SGD ``lr`` and heavy-ball ``momentum``, minibatch
  size, steps or epochs, the seed of the data order and of the model, test evaluation);
* :class:`RunSpec`: where and how the ranks run (output folder, device, backend, transport, threads,
  timeouts, resume, fault injection).

These fields are the one declaration of the run options: a keyword's name is its field's name, so
the keywords a caller may pass are these fields (any other is a ``TypeError`` naming the closest;
a zoo model's options go in ``model_options``), and ``workbench train``'s flags are built from the
fields' metadata (:func:`cli_fields`; a field without ``cli`` metadata is an API-only keyword). To add
a run option, add a field with :func:`option` to its group. :func:`workbench.runtime.launch.driver.build_job`
turns a spec into the picklable, checked :class:`~workbench.runtime.launch.job.Job` the ranks receive, which
holds the checked groups.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import Field, dataclass, field, fields
from typing import Any

from workbench.io.keywords import check_keywords

DEFAULT_LR = 0.05


TRANSPORTS = ("gloo", "shm")  # how activations and gradients travel between ranks (workbench.runtime.transport.shm)
TRAIN_TRANSPORTS = ("auto",) + TRANSPORTS  # train(): "auto" picks shm where it can run, else gloo (auto_transport)
STAGE_LR_RULES = (
    "same",
    "replicas",
)  # a replicated stage's learning rate (workbench.runtime.semantics.stages.stage_lrs)


def _train_transports() -> tuple[str, ...]:
    return TRAIN_TRANSPORTS


def option(default: Any = None, help: str | None = None, *, cli: bool = True, **argparse_keywords: Any) -> Any:
    """A run option: a dataclass field with ``default`` whose metadata declares its ``workbench train``
    flag (``cli=False``: API only). ``help`` is the flag's help; ``argparse_keywords`` refine it:
    ``flag`` (default ``--`` + the name with dashes), ``type`` (default: from the field's annotation),
    ``choices`` (a tuple, or a function returning one, called when the parser is built), ``negate``
    (a bool field defaulting to True, set False by the flag, e.g. ``--no-eval``), ``exclusive`` (a
    group name: flags of one group exclude each other), ``key_value`` (a mapping given as repeatable
    ``KEY=VALUE`` flags), ``metavar``."""
    meta = {"cli": dict(help=help, **argparse_keywords)} if cli else {}
    if isinstance(default, dict):
        return field(default_factory=lambda: dict(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ModelSpec:
    """The model and its data: ``model`` a zoo name, an ``nn.Module``, a factory,
    ``"package.module:function"`` or a LayerModel; ``dataset`` (a user model needs one; the zoo's
    default: its own); ``model_seed`` (default: the job's ``seed``); ``model_options`` (zoo only)."""

    model: Any = option(
        "mlp",
        "zoo model name (or toy-mlp), or package.module:function returning "
        "an nn.Module (traced into layers by workbench.profiling.layering.split)",
        type=str,
    )
    dataset: Any = option(
        None,
        "built-in data set name (`workbench models`) or package.module:function "
        "returning a TensorDataset or a (train, test) pair; default: the zoo model's own",
        type=str,
    )
    dtype: str | None = option(None, "e.g. float64")
    model_seed: int | None = option(None, cli=False)
    dataset_options: Mapping[str, Any] | None = option(None, cli=False)
    model_options: Mapping[str, Any] = option(
        {}, "model override, e.g. depth=4 (repeatable)", flag="--model-option", key_value=True, metavar="KEY=VALUE"
    )


@dataclass(frozen=True)
class PipelineSpec:
    """The schedule (a registry name or a :class:`~workbench.schedules.core.Schedule`) over
    ``workers`` ranks, ``microbatches`` per minibatch, stages from ``plan`` (else even), and whether
    an epoch's minibatches run as one ``stream``."""

    schedule: Any = option("pipedream", "schedule name (`workbench schedules` lists them)", type=str)
    workers: int = option(2)
    microbatches: int = option(4, "microbatches per minibatch (one pass of the schedule)")
    plan: Any = option(None, "plan JSON written by `workbench partition` (default: even split)", type=str)
    schedule_options: Mapping[str, Any] | None = option(
        None,
        "schedule option, e.g. chunks=2 (repeatable; `workbench schedules` lists them)",
        flag="--schedule-option",
        key_value=True,
        metavar="KEY=VALUE",
    )
    stream: bool = option(
        False,
        "schedules without a flush (pipedream, pipedream-2bw, model-parallel): the epoch's minibatches "
        "flow through the pipeline as one stream, drained at the epoch end only",
    )


@dataclass(frozen=True)
class OptimSpec:
    """SGD ``W <- W - lr * d``, ``d <- momentum * d + g`` over minibatches of ``batch_size`` samples
    (a replicated stage's ``lr`` by ``stage_lr``: :func:`~workbench.runtime.semantics.stages.stage_lrs`),
    for ``steps`` minibatches (else ``epochs`` epochs); ``seed`` fixes the data order (and the model's
    initial weights unless ``model_seed``); ``evaluate``: test loss/accuracy at each epoch end."""

    batch_size: int = option(64)
    lr: float = option(DEFAULT_LR)
    momentum: float = option(0.0, "SGD momentum (heavy ball, no dampening)")
    stage_lr: str = option(
        "same",
        "a replicated stage's learning rate: same (every stage at --lr; a replicated stage averages its "
        "replicas' microbatches) or replicas (stage s at lr x its replicas / the first stage's, as "
        "PipeDream's runtime sets it: the same step per sample on every stage)",
        choices=STAGE_LR_RULES,
    )
    steps: int | None = option(None, "minibatches to train (overrides --epochs)", exclusive="length")
    epochs: int = option(1, exclusive="length")
    seed: int = option(0)
    evaluate: bool = option(True, "skip the test-set evaluation at each epoch end", flag="--no-eval", negate=True)


@dataclass(frozen=True)
class RunSpec:
    """Where and how the ranks run (``None``: chosen by :func:`~workbench.runtime.launch.driver.build_job`)."""

    out: Any = option(None, "run folder (default: results/train/<model>-<schedule>-w<N>-<time>)", type=str)
    device: str | None = option(None, "cpu or cuda (default: cuda when every rank gets its own GPU)")
    backend: str | None = option(None, "gloo or nccl (default from the device)")
    transport: str = option(
        "auto",
        "activations and gradients through torch.distributed (gloo) or through shared memory "
        "(shm: CPU ranks on this machine, pipeline schedules); auto (default): shm where it can run "
        "with a core per rank, else gloo",
        choices=_train_transports,
    )
    threads: int | None = option(None, "torch threads per worker")
    lookahead: int | None = option(None, cli=False)
    one_tag: bool = option(
        False,
        "send every message with tag 0, so gloo matches messages by their order alone, as NCCL does "
        "(a check that the runtime's send and receive orders agree; the shm transport numbers its "
        "messages by order anyway)",
    )
    timeout_s: float = option(60.0, "seconds any wait may take before the job fails", flag="--timeout")
    port: int | None = option(None, "rendezvous port of the spawned ranks (default: a free one)")
    allow_oversubscribe: bool = option(False, "allow more workers than cores/GPUs")
    progress: bool = option(True, flag="--no-progress", negate=True)
    return_weights: bool = option(False, cli=False)
    resume: bool = option(False, "continue from the last complete checkpoint in --out")
    fail_rank: int | None = option(None, "fault injection: this rank raises ...")
    fail_at_step: int | None = option(None, "... at the start of this step")

    def __post_init__(self):
        t = self.threads
        if t is not None and (isinstance(t, bool) or not isinstance(t, int) or t < 1):
            raise ValueError(
                f"threads must be an integer >= 1 (torch threads per worker; omit it for the default), got {t!r}"
            )


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
        to the group with a field of its name; any other keyword is a ``TypeError`` naming the closest."""
        keywords.update(model=model, schedule=schedule, workers=workers, microbatches=microbatches)
        check_keywords(
            keywords,
            [f.name for f, _ in run_options()],
            "train",
            note=" (a zoo model's options go in model_options={...})",
        )
        groups: dict[str, dict[str, Any]] = {}
        for key, group in _GROUPS.items():
            names = {f.name for f in fields(group)}
            groups[key] = {n: keywords.pop(n) for n in names & set(keywords)}
        return cls(**{key: _GROUPS[key](**values) for key, values in groups.items()})


def run_options() -> Iterator[tuple[Field, str]]:
    """Every run option: (its field, the name of its group in :class:`JobSpec`)."""
    for key, group in _GROUPS.items():
        for f in fields(group):
            yield f, key


def cli_fields() -> Iterator[tuple[Field, dict[str, Any]]]:
    """The run options that ``workbench train`` takes: (field, its ``cli`` metadata)."""
    for f, _ in run_options():
        if "cli" in f.metadata:
            yield f, dict(f.metadata["cli"])

"""The schedule registry: one table that the builder, both CLIs, the runtime's launcher, the docs
and the tests read.

Adding a schedule is one decorator on its generator, in any module of ``workbench/schedules/``
(every module of the package is imported by ``workbench.schedules``, so a new file needs no other
edit)::

    @register("my-1f1b", description="one line", source="Author et al., Paper (Venue Year)",
              options={"steps": "iterations in the schedule"})
    def my_1f1b(plan, microbatches: int, steps: int = 1) -> Schedule:
        ...

The generator takes a Plan or a stage count, the number of microbatches and keyword options. An
option's type and default come from the generator's signature (its default value, or its
annotation when the default is None); ``options`` gives the one-line help of each, ``choices`` the
allowed values where there is a closed set.

``stages_per_worker`` says how the schedule maps stages to workers, which is what the launcher and
the CLIs need to turn a worker count into a stage count (and to refuse a silent reshape):

* an int k: worker w runs k stages (1 for a plain pipeline, 2 for V-shaped schedules);
* the name of an option (e.g. ``"chunks"``): that option's value is the count;
* ``"all"``: data parallel, every worker holds every stage; the schedule takes ``workers``;
* ``"placement"``: the master-schedule family; a placement function decides, the schedule takes
  ``workers``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from workbench.io.keywords import did_you_mean, shown

_TYPES = {"int": int, "float": float, "str": str, "bool": bool, "object": object}


@dataclass(frozen=True)
class Option:
    """One keyword option of a schedule: ``name``, Python ``type``, ``default``, one-line ``help``,
    allowed ``choices`` (None: any value of the type)."""

    name: str
    type: type
    default: object
    help: str = ""
    choices: tuple | None = None

    def check(self, schedule: str, value):
        """``value`` converted to the option's type, or ValueError naming the option and the fix."""
        if isinstance(value, str) and self.type not in (str, object):  # object: the generator parses it
            try:
                value = {"true": True, "false": False}[value.lower()] if self.type is bool else self.type(value)
            except (KeyError, ValueError):
                raise ValueError(
                    f"{schedule}: option {self.name} must be {self.type.__name__}, got {value!r}"
                ) from None
        if value is not None and not (
            isinstance(value, self.type) or (self.type is float and isinstance(value, int)) or callable(value)
        ):
            raise ValueError(f"{schedule}: option {self.name} must be {self.type.__name__}, got {value!r}")
        if self.choices is not None and value not in self.choices and not callable(value):
            raise ValueError(f"{schedule}: option {self.name} must be one of {list(self.choices)}, got {value!r}")
        return value


@dataclass(frozen=True)
class ScheduleSpec:
    """A registered schedule (see module docstring)."""

    name: str
    build: Callable
    description: str
    source: str
    options: tuple[Option, ...] = ()
    stages_per_worker: int | str = 1
    microbatches: str = "per step"  # or "in total": what the microbatch count of build() counts
    family: str = "pipeline"  # pipeline | data-parallel | master | custom
    data_parallel_plan: bool = False  # a one-stage replicated plan is a legitimate input (PipeDream's DP)
    bubble: Callable | None = None  # closed-form bubble (workbench.schedules.closed_forms), None: none stated
    executor: str = "pipeline"  # the runtime's executor: pipeline | ddp (DistributedDataParallel) | hogwild
    takes_plan: bool = False  # builds from a partitioner's Plan (stages with replicas): the tuner offers it
    flushes: bool = False  # microbatches count per flush; `steps` flushes per schedule
    document_row: Callable | None = None  # (S, B, G, R) -> the unifying document's table row (master family)
    costs_from: str | None = None  # the order depends on durations (option ``costs``): "job" (JobCosts) or "split"

    @property
    def takes_workers(self) -> bool:
        """The schedule takes the worker count as option ``workers`` (data parallel, master family)."""
        return any(o.name == "workers" for o in self.options)

    def option(self, name: str) -> Option:
        for o in self.options:
            if o.name == name:
                return o
        raise ValueError(f"{self.name} takes options {[o.name for o in self.options] or 'none'}, not {name!r}")

    def check_options(self, options: dict) -> dict:
        """Options converted to their types; ValueError on an unknown name or a bad value."""
        return {k: self.option(k).check(self.name, v) for k, v in options.items()}

    def stages_for(self, workers: int, options: dict | None = None) -> int:
        """Stage count that runs on ``workers`` workers with ``options`` (no plan given): k·W for
        k stages per worker, W for the master family, 1 for data parallel."""
        k = self.stages_per_worker
        if k == "all":
            return 1
        if k == "placement":
            return int(workers)
        if isinstance(k, str):
            per = (options or {}).get(k, self.option(k).default)
            if isinstance(per, bool) or not isinstance(per, int) or per < 1:
                raise ValueError(f"{self.name}: {k} must be a positive int (stages per worker), got {per!r}")
            return int(workers) * per
        return int(workers) * int(k)


REGISTRY: dict[str, ScheduleSpec] = {}


def _options_of(fn: Callable, helps: dict, choices: dict) -> tuple[Option, ...]:
    params = list(inspect.signature(fn).parameters.values())[2:]
    out = []
    for p in params:
        if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        default = None if p.default is p.empty else p.default
        if default is not None and not callable(default):
            typ = type(default)
        else:
            ann = p.annotation if isinstance(p.annotation, str) else getattr(p.annotation, "__name__", "str")
            typ = next((t for n, t in _TYPES.items() if ann.split("|")[0].strip() == n), str)
        out.append(
            Option(p.name, typ, default, helps.get(p.name, ""), tuple(choices[p.name]) if p.name in choices else None)
        )
    unknown = (set(helps) | set(choices)) - {o.name for o in out}
    if unknown:
        raise ValueError(f"{fn.__name__}: help or choices for options it does not take: {sorted(unknown)}")
    return tuple(out)


def register(
    name: str,
    *,
    description: str,
    source: str,
    options: dict | None = None,
    choices: dict | None = None,
    stages_per_worker: int | str = 1,
    microbatches: str = "per step",
    family: str = "pipeline",
    data_parallel_plan: bool = False,
    **knows,
):
    """Decorator: register generator ``fn(plan_or_stage_count, microbatches, **options) -> Schedule``
    as schedule ``name`` (see module docstring). ``knows``: what else the schedule knows, the
    :class:`ScheduleSpec` fields ``bubble`` (closed-form bubble), ``executor``, ``takes_plan``,
    ``flushes``, ``costs_from`` (for a schedule whose order depends on durations, option ``costs``:
    which costs object it plans with, ``"job"`` for :class:`~workbench.schedules.master.JobCosts`,
    ``"split"`` for :class:`~workbench.schedules.vshape_order.SplitCosts`; the simulator reads them from a
    simulation, :func:`workbench.simulation.costed_build.build_for_simulation`), ``document_row`` (the
    unifying document's table row of a master-family placement). Returns ``fn`` unchanged."""
    unknown = set(knows) - {"bubble", "executor", "takes_plan", "flushes", "costs_from", "document_row"}
    if unknown:
        raise ValueError(f"schedule {name!r}: register() takes no {sorted(unknown)}")
    if "\n" in description or not description or not source:
        raise ValueError(f"schedule {name!r}: description must be one non-empty line and source non-empty")

    def deco(fn: Callable) -> Callable:
        if name in REGISTRY and REGISTRY[name].build is not fn:
            raise ValueError(
                f"schedule {name!r} is registered twice ({REGISTRY[name].build.__module__} and {fn.__module__})"
            )
        REGISTRY[name] = ScheduleSpec(
            name,
            fn,
            description,
            source,
            _options_of(fn, options or {}, choices or {}),
            stages_per_worker,
            microbatches,
            family,
            data_parallel_plan,
            **knows,
        )
        return fn

    return deco


def spec(name: str) -> ScheduleSpec:
    """The registered schedule ``name``; ValueError listing the names otherwise."""
    if name not in REGISTRY:
        raise ValueError(
            f"unknown schedule {shown(name)}{did_you_mean(name, REGISTRY)}; expected one of {sorted(REGISTRY)}"
        )
    return REGISTRY[name]


def markdown_table() -> str:
    """The README's table of schedules: name, description, stages per worker, options, source."""
    rows = ["| schedule | what it does | stages per worker | options | source |", "|---|---|---|---|---|"]
    for s in REGISTRY.values():
        opts = ", ".join(f"`{o.name}`={o.default!r}" for o in s.options) or "—"
        per = {"all": "all (data parallel)", "placement": "placement w(s,b,d)"}.get(
            str(s.stages_per_worker),
            f"`{s.stages_per_worker}`" if isinstance(s.stages_per_worker, str) else str(s.stages_per_worker),
        )
        rows.append(f"| `{s.name}` | {s.description} | {per} | {opts} | {s.source} |")
    return "\n".join(rows)


def parse_option(text: str) -> tuple[str, str]:
    """``key=value`` from the command line (``--schedule-option``), value still a string (the
    registry converts it to the option's type)."""
    if "=" not in text:
        raise ValueError(f"schedule option must be KEY=VALUE, got {text!r}")
    k, v = text.split("=", 1)
    return k.strip().replace("-", "_"), v.strip()

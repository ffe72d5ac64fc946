"""The result of partitioning: which layers form each stage and which workers run it.

A :class:`Plan` is a small immutable object. Stages cover inclusive, contiguous ranges of layer
indices (0-based, execution order). Worker ids are 0..W-1 and are assigned to stages in order, so
stage 0 gets the first ``replicas`` workers, stage 1 the next ones, and so on.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Stage:
    """Layers ``first..last`` (inclusive) replicated on ``replicas`` workers (``workers``)."""

    first: int
    last: int
    replicas: int
    workers: tuple[int, ...]
    time_ms: float = float("nan")  # modeled time per minibatch per worker: T(first->last, replicas)

    @property
    def num_layers(self) -> int:
        return self.last - self.first + 1


@dataclass(frozen=True)
class Plan:
    """A pipeline partition. ``bottleneck_ms`` is the modeled time per minibatch of the slowest
    stage or cut (PipeDream's objective); ``noam`` = ceil(workers / replicas of the input stage)."""

    stages: tuple[Stage, ...]
    bottleneck_ms: float = float("nan")
    single_worker_ms: float = float("nan")  # modeled time of one minibatch on one worker
    data_parallel_ms: float = float("nan")  # modeled bottleneck of pure data parallelism
    method: str = "pipedream"
    meta: dict = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "stages", tuple(self.stages))
        if not self.stages:
            raise ValueError("a Plan needs at least one stage")
        expect = 0
        for s in self.stages:
            if s.first != expect or s.last < s.first:
                raise ValueError(f"stages must cover contiguous layer ranges from 0; got {s.first}..{s.last} after layer {expect - 1}")
            if s.replicas < 1 or len(s.workers) != s.replicas:
                raise ValueError(f"stage {s.first}..{s.last}: replicas={s.replicas} but workers={s.workers}")
            expect = s.last + 1

    @classmethod
    def from_boundaries(cls, last_layers, replicas=None, **kw) -> "Plan":
        """Build a plan from the last layer index of each stage, e.g. ``[3, 7]`` for two stages of
        an 8-layer model; ``replicas`` defaults to one worker per stage."""
        replicas = list(replicas) if replicas is not None else [1] * len(last_layers)
        if len(replicas) != len(last_layers):
            raise ValueError("give one replica count per stage")
        stages, first, w = [], 0, 0
        for last, r in zip(last_layers, replicas):
            stages.append(Stage(first, int(last), int(r), tuple(range(w, w + r))))
            first, w = int(last) + 1, w + r
        return cls(tuple(stages), **kw)

    @property
    def num_stages(self) -> int:
        return len(self.stages)

    @property
    def num_layers(self) -> int:
        return self.stages[-1].last + 1

    @property
    def num_workers(self) -> int:
        return sum(s.replicas for s in self.stages)

    @property
    def noam(self) -> int:
        """NOAM: minibatches admitted at the input stage in steady state."""
        return math.ceil(self.num_workers / self.stages[0].replicas)

    @property
    def is_straight(self) -> bool:
        return all(s.replicas == 1 for s in self.stages)

    @property
    def speedup_over_single(self) -> float:
        """Modeled throughput relative to one worker (per-minibatch time ratio)."""
        return self.single_worker_ms / self.bottleneck_ms

    @property
    def speedup_over_data_parallel(self) -> float:
        return self.data_parallel_ms / self.bottleneck_ms

    def stage_of_layer(self, layer: int) -> int:
        for i, s in enumerate(self.stages):
            if s.first <= layer <= s.last:
                return i
        raise IndexError(f"layer {layer} is not in this plan of {self.num_layers} layers")

    def describe(self) -> str:
        rows = [f"{'stage':>5} {'layers':>11} {'replicas':>8} {'workers':>14} {'time_ms':>10}"]
        for i, s in enumerate(self.stages):
            ws = ",".join(map(str, s.workers)) if s.replicas <= 4 else f"{s.workers[0]}..{s.workers[-1]}"
            rows.append(f"{i:>5} {f'{s.first}-{s.last}':>11} {s.replicas:>8} {ws:>14} {s.time_ms:>10.3f}")
        rows.append(f"bottleneck {self.bottleneck_ms:.3f} ms/minibatch (modeled), NOAM {self.noam}, "
                    f"speedup x{self.speedup_over_single:.2f} vs 1 worker, "
                    f"x{self.speedup_over_data_parallel:.2f} vs data parallel")
        return "\n".join(rows)

    # ---- persistence -------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d["stages"] = [asdict(s) | {"workers": list(s.workers)} for s in self.stages]
        d["noam"] = self.noam
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Plan":
        d = dict(d)
        d.pop("noam", None)
        stages = tuple(Stage(**(s | {"workers": tuple(s["workers"])})) for s in d.pop("stages"))
        return cls(stages, **d)

    def save(self, path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2, default=float))
        return path

    @classmethod
    def load(cls, path) -> "Plan":
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path} is not a plan JSON written by Plan.save ({e})") from None

"""The result of partitioning: which layers form each stage and which workers run it.

A :class:`Plan` is a small immutable object. Stages cover inclusive, contiguous ranges of layer
indices (0-based, execution order). Worker ids are 0..W-1 and are assigned to stages in order, so
stage 0 gets the first ``replicas`` workers, stage 1 the next ones, and so on.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.io.cards import card, one_line


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
    """A pipeline partition and what it costs, per minibatch (the profile's batch; see
    :mod:`workbench.cost.model`):

    * ``bottleneck_ms``: the dynamic program's objective (slowest stage or cut, the DP estimate);
    * ``predicted_ms``: the cost model's closed form for these flat stages under 1F1B
      (:meth:`CostModel.predicted_ms`; equals ``bottleneck_ms`` on a one-level topology);
    * ``in_flight[s]``: minibatches stage s admits (1F1B warm-up) to keep the bottleneck busy with
      communication counted (:meth:`CostModel.in_flight`); ``in_flight_count`` = the input stage's;
    * ``stage_memory_bytes[s]``: per worker, ``in_flight[s]`` x (weights + stashed activations);
    * ``simulated_ms``: steady-state time per minibatch of the simulated 1F1B schedule with that
      warm-up (``partition(refine=True)``), NaN when not simulated.

    ``noam`` = ceil(workers / replicas of the input stage), PipeDream's count without communication."""

    stages: tuple[Stage, ...]
    bottleneck_ms: float = float("nan")
    single_worker_ms: float = float("nan")  # modeled time of one minibatch on one worker
    data_parallel_ms: float = float("nan")  # modeled bottleneck of pure data parallelism
    method: str = "pipedream"
    meta: dict = field(default_factory=dict)
    predicted_ms: float = float("nan")
    in_flight: tuple[int, ...] = ()
    stage_memory_bytes: tuple[float, ...] = ()
    simulated_ms: float = float("nan")

    def __post_init__(self):
        object.__setattr__(self, "stages", tuple(self.stages))
        object.__setattr__(self, "in_flight", tuple(int(k) for k in self.in_flight))
        object.__setattr__(self, "stage_memory_bytes", tuple(float(x) for x in self.stage_memory_bytes))
        for name in ("in_flight", "stage_memory_bytes"):
            if getattr(self, name) and len(getattr(self, name)) != len(self.stages):
                raise ValueError(f"{name} needs one value per stage ({len(self.stages)}), got {getattr(self, name)}")
        if not self.stages:
            raise ValueError("a Plan needs at least one stage")
        expect = 0
        for s in self.stages:
            if s.first != expect or s.last < s.first:
                raise ValueError(
                    f"stages must cover contiguous layer ranges from 0; got {s.first}..{s.last} after layer {expect - 1}"
                )
            if s.replicas < 1 or len(s.workers) != s.replicas:
                raise ValueError(f"stage {s.first}..{s.last}: replicas={s.replicas} but workers={s.workers}")
            expect = s.last + 1

    @classmethod
    def from_boundaries(cls, last_layers, replicas=None, **kw) -> Plan:
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

    @classmethod
    def even(cls, num_layers: int, num_stages: int, **kw) -> Plan:
        """THE default split wherever no plan is given (simulator, runtime, baselines): contiguous
        stages of near-equal layer counts, the first ``num_layers mod num_stages`` one layer longer,
        stage k on worker k. (A profile-aware split is a plan: ``partition`` or
        ``partition_balanced_time``.)"""
        if isinstance(num_stages, bool) or int(num_stages) != num_stages or num_stages < 1:
            raise ValueError(f"stages must be a positive integer, got {num_stages!r}")
        if num_stages > num_layers:
            raise ValueError(
                f"cannot split {num_layers} layers into {num_stages} non-empty stages; "
                f"use at most {num_layers} stages or a deeper model"
            )
        base, extra = divmod(int(num_layers), int(num_stages))
        lasts = list(itertools.accumulate(base + (1 if k < extra else 0) for k in range(int(num_stages))))
        return cls.from_boundaries([x - 1 for x in lasts], **kw)

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
    def in_flight_count(self) -> int:
        """Minibatches the input stage admits: ``in_flight[0]`` (communication counted), else NOAM."""
        return self.in_flight[0] if self.in_flight else self.noam

    @property
    def simulated_throughput_minibatches_per_s(self) -> float:
        return 1e3 / self.simulated_ms if self.simulated_ms > 0 else float("nan")

    @property
    def samples_per_minibatch(self) -> int | None:
        return self.meta.get("batch_size")

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

    @property
    def cost(self) -> str:
        """Which cost model priced the plan: ``"workbench"`` (:mod:`workbench.cost.model`) or
        ``"pipedream"`` (PipeDream's optimizer, :mod:`workbench.partitioning.pipedream_optimizer`)."""
        return self.meta.get("cost", "workbench")

    def _rows(self) -> list:
        rows: list[tuple[str, Any, str]] = [
            ("stages", self.num_stages, ""),
            ("workers", self.num_workers, ""),
            ("DP estimate", self.bottleneck_ms, "ms/minibatch"),
            (f"predicted ({self.cost} cost model)", self.predicted_ms, "ms/minibatch"),
            ("simulated (1F1B steady state)", self.simulated_ms, "ms/minibatch"),
            ("in flight (input stage)", self.in_flight_count, "minibatches"),
            ("NOAM", self.noam, "minibatches"),
        ]
        if self.stage_memory_bytes:
            rows.append(("peak memory per worker", max(self.stage_memory_bytes) / 2**30, "GiB"))
        if self.memory_note():
            rows.append(("memory", self.memory_note(), ""))
        return rows

    def memory_note(self) -> str:
        """One line when the plan's peak memory per worker (``max(stage_memory_bytes)``, modeled)
        exceeds the device memory of the topology it was partitioned for
        (``meta["device_memory_bytes"]``), else ""."""
        device = (self.meta or {}).get("device_memory_bytes")
        if not device or not self.stage_memory_bytes or max(self.stage_memory_bytes) <= device:
            return ""
        need = max(self.stage_memory_bytes)
        worst = self.stage_memory_bytes.index(need)
        return (
            f"does NOT fit: stage {worst} needs {need / 2**30:.3g} GiB per worker (modeled), the topology's "
            f"devices have {device / 2**30:.3g} GiB; partition with memory_bytes (--memory-gb) to fit"
        )

    def __repr__(self) -> str:
        return one_line("Plan", self._rows()[:5])

    def _repr_html_(self) -> str:
        extra = ""
        if self.meta.get("compare_costs"):
            both = pd.DataFrame(self.meta["compare_costs"]).set_index("chosen by")
            extra = "<div><b>both cost models (modeled ms/minibatch)</b></div>" + both.to_html(
                float_format=lambda x: f"{x:.4g}", border=0
            )
        return card(
            f"Plan ({self.method}, {self.cost} cost model)",
            self._rows(),
            label=self.why(),
            table=self.stage_table(),
            max_rows=16,
            extra_html=extra,
        )

    def stage_table(self):

        df = pd.DataFrame(
            {
                "first": [s.first for s in self.stages],
                "last": [s.last for s in self.stages],
                "replicas": [s.replicas for s in self.stages],
                "time_ms": [s.time_ms for s in self.stages],
            }
        )
        if self.in_flight:
            df["in_flight"] = list(self.in_flight)
        if self.stage_memory_bytes:
            df["memory_GiB"] = [x / 2**30 for x in self.stage_memory_bytes]
        df.index.name = "stage"
        return df

    def why(self) -> str:
        """One sentence relating the DP estimate, the prediction and the simulated figure."""
        parts = [f"DP estimate {self.bottleneck_ms:.4g} ms/minibatch"]
        if math.isfinite(self.predicted_ms):
            same = abs(self.predicted_ms - self.bottleneck_ms) <= 1e-6 * max(1.0, self.bottleneck_ms)
            parts.append(
                f"cost model {self.predicted_ms:.4g} ms"
                + (
                    ""
                    if same
                    else " (flat stages priced exactly; the DP prices outer levels as max(inner, all-reduce))"
                )
            )
        if math.isfinite(self.simulated_ms):
            gap = self.simulated_ms / self.predicted_ms - 1 if self.predicted_ms > 0 else float("nan")
            how = (
                "agrees with the cost model"
                if abs(gap) < 0.005
                else f"{gap:+.1%} vs the cost model: waiting in the 1F1B order that the bottleneck bound ignores"
            )
            parts.append(
                f"simulated 1F1B steady state {self.simulated_ms:.4g} ms ({how}) with "
                f"{self.in_flight_count} minibatches in flight at the input stage (NOAM {self.noam})"
            )
        return "; ".join(parts)

    def describe(self) -> str:
        rows = [
            f"{'stage':>5} {'layers':>11} {'replicas':>8} {'workers':>14} {'time_ms':>10} {'in_flight':>9} {'mem_GiB':>8}"
        ]
        for i, s in enumerate(self.stages):
            ws = ",".join(map(str, s.workers)) if s.replicas <= 4 else f"{s.workers[0]}..{s.workers[-1]}"
            k = self.in_flight[i] if self.in_flight else ""
            mem = f"{self.stage_memory_bytes[i] / 2**30:.3g}" if self.stage_memory_bytes else ""
            rows.append(
                f"{i:>5} {f'{s.first}-{s.last}':>11} {s.replicas:>8} {ws:>14} {s.time_ms:>10.3f} {k:>9} {mem:>8}"
            )
        rows.append(
            f"DP estimate (bottleneck stage or cut) {self.bottleneck_ms:.3f} ms/minibatch (modeled), NOAM {self.noam}, "
            f"speedup x{self.speedup_over_single:.2f} vs 1 worker, "
            f"x{self.speedup_over_data_parallel:.2f} vs data parallel"
        )
        if math.isfinite(self.predicted_ms):
            rows.append(
                f"predicted {self.predicted_ms:.3f} ms/minibatch (cost model, closed form), "
                f"{self.in_flight_count} minibatches in flight at the input stage"
            )
        if math.isfinite(self.simulated_ms):
            rows.append(
                f"simulated {self.simulated_ms:.3f} ms/minibatch (1F1B steady state, "
                f"{self.simulated_throughput_minibatches_per_s:.4g} minibatches/s"
                + (
                    f", {self.samples_per_minibatch * self.simulated_throughput_minibatches_per_s:.4g} samples/s"
                    if self.samples_per_minibatch
                    else ""
                )
                + ")"
            )
        rows.append(f"priced by: {self.meta.get('cost_model', self.cost)}")
        if self.meta.get("compare_costs"):
            rows.append(
                f"{'both cost models':>16} {'stages':>6} {'replicas':>16} {'workbench ms':>12} {'pipedream ms':>12}"
            )
            for r in self.meta["compare_costs"]:
                rows.append(
                    f"{r['chosen by']:>16} {r['stages']:>6} {r['replicas']:>16} {r['workbench model ms']:>12.3f} "
                    f"{r['pipedream model ms']:>12.3f}"
                )
        rows.append("why: " + self.why())
        if self.memory_note():
            rows.append("memory: " + self.memory_note())
        return "\n".join(rows)

    # ---- persistence -------------------------------------------------------------------
    def to_dict(self) -> dict:
        d = asdict(self)
        d["stages"] = [asdict(s) | {"workers": list(s.workers)} for s in self.stages]
        d["noam"] = self.noam
        d["in_flight"] = list(self.in_flight)
        d["stage_memory_bytes"] = list(self.stage_memory_bytes)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Plan:
        d = dict(d)
        d.pop("noam", None)
        stages = tuple(Stage(**(s | {"workers": tuple(s["workers"])})) for s in d.pop("stages"))
        return cls(stages, **d)

    def save(self, path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(self.to_dict(), indent=2, default=float))
        return path

    @classmethod
    def load(cls, path) -> Plan:
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (KeyError, TypeError, json.JSONDecodeError) as e:
            raise ValueError(f"{path} is not a plan JSON written by Plan.save ({e})") from None

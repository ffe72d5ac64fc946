"""Both cost models side by side: the plan the workbench's model chooses and the plan PipeDream's
own optimizer chooses, each priced under both models.

* ``workbench`` model (:mod:`workbench.cost.model`): 1F1B round with the ring all-reduce overlapped
  with the backward, cuts per direction; a plan's figure is :meth:`CostModel.predicted_ms` of its
  flat stages.
* ``pipedream`` model (:mod:`workbench.partitioning.pipedream_optimizer`): data-parallel time added to compute,
  ``4 (m-1) |w| / m`` bytes per worker, cuts ``2 a / (B m')``; a plan's figure is the optimizer's
  own "time per stage in pipeline" for its choice and :func:`price_plan` for the other plan
  (one-level topologies; NaN on several levels, where PipeDream prices only its own nested choices).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import pandas as pd

from workbench.cost.model import CostModel
from workbench.cost.plan import Plan
from workbench.cost.topology import Topology
from workbench.io.cards import card
from workbench.partitioning.pipedream_optimizer import Settings, price_plan, profile_for
from workbench.partitioning.pricing import with_predictions
from workbench.partitioning.search import partition
from workbench.profiling.measure import Profile

MODELS = ("workbench", "pipedream")


@dataclass(frozen=True)
class CostComparison:
    """``plans[model]``: the plan chosen under ``model``; ``table``: one row per choice with its
    stages, replicas and the predicted ms per minibatch under each model (all modeled)."""

    plans: dict
    table: pd.DataFrame
    topology: Topology

    def describe(self) -> str:
        with pd.option_context("display.width", 160, "display.max_colwidth", 40):
            body = self.table.to_string(float_format=lambda x: f"{x:.3f}")
        return f"both cost models on {self.topology.describe()} (modeled ms per minibatch):\n{body}"

    def __repr__(self) -> str:
        return self.describe()

    def _repr_html_(self) -> str:
        return card(
            "cost models side by side", [], label="modeled, ms per minibatch; rows: whose choice", table=self.table
        )


def compare_costs(
    profile: Profile,
    topology: Topology,
    straight: bool = False,
    memory_bytes: float | None = None,
    use_fewer_workers: bool = False,
    *,
    pipedream: Settings | None = None,
    refine: bool = False,
) -> CostComparison:
    """Partition under both models (:func:`workbench.partition` with ``cost=`` each) and price each
    choice under both; each plan's ``meta["compare_costs"]`` holds the table rows (its card shows them)."""
    settings = pipedream or Settings()
    kw: dict[str, Any] = {"straight": straight, "memory_bytes": memory_bytes, "use_fewer_workers": use_fewer_workers}
    plans = {
        "workbench": partition(profile, topology, refine=refine, **kw),
        "pipedream": partition(profile, topology, cost="pipedream", pipedream=settings, **kw),
    }
    rows = [row(name, plan, profile, topology, settings) for name, plan in plans.items()]
    table = pd.DataFrame(rows).set_index("chosen by")
    shown = {k: Plan(**{**_fields(p), "meta": p.meta | {"compare_costs": rows}}) for k, p in plans.items()}
    return CostComparison(shown, table, topology)


def row(name: str, plan: Plan, profile: Profile, topology: Topology, settings: Settings) -> dict:
    """One choice: stages, replicas, last layers, workers and its ms per minibatch under each model."""
    prof = profile_for(profile, plan)
    wb = with_predictions(plan, CostModel.from_profile(prof, topology)).predicted_ms
    pd_ms = plan.bottleneck_ms if plan.meta.get("cost") == "pipedream" else price_plan(prof, topology, plan, settings)
    return {
        "chosen by": f"{name} model",
        "stages": plan.num_stages,
        "replicas": "-".join(str(s.replicas) for s in plan.stages),
        "last layers": ",".join(str(s.last) for s in plan.stages),
        "workers": plan.num_workers,
        "workbench model ms": wb,
        "pipedream model ms": pd_ms if math.isfinite(pd_ms) else math.nan,
    }


def _fields(p: Plan) -> dict:
    return {f: getattr(p, f) for f in Plan.__dataclass_fields__}

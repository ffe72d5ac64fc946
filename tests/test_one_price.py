"""One price of a replicated stage (CostModel.replicated_stage_ms): the plan's prediction, the
partitioner's ranking and data parallelism's bucketed round read the same function, so a plan that
is data parallelism is exactly data parallelism in every paper setting."""

import math

import numpy as np
import pytest

from repro import dp_overhead as dpo
from repro import paper_fit as pf
from workbench.cost import CostModel, Plan, Topology
from workbench.cost.plan import Stage
from workbench.partitioning import partition
from workbench.profiling.measure import Profile


def _toy(n=6, seed=0) -> Profile:
    import pandas as pd

    rng = np.random.default_rng(seed)
    layers = pd.DataFrame(
        dict(
            name=[f"l{i}" for i in range(n)],
            fwd_ms=rng.uniform(1, 4, n),
            bwd_ms=rng.uniform(2, 8, n),
            act_bytes=rng.uniform(1e5, 1e6, n),
            param_bytes=rng.uniform(1e6, 3e7, n),
        )
    )
    return Profile(layers, {"model": "toy", "batch_size": 8})


def test_one_bucket_at_the_backward_start_is_the_1f1b_round():
    prof = _toy()
    topo = Topology(((4, 1e9),))
    cm = CostModel.from_profile(prof, topo, op_overhead_ms=0.3)
    for first, last in [(0, 5), (2, 3), (4, 4)]:
        ar = cm.allreduce_ms(float(cm.range_sum("param_bytes", first, last)), range(4))
        old = cm.round_ms(cm.stage_fwd_ms(first, last), cm.stage_bwd_ms(first, last), ar) / 4
        assert cm.replicated_stage_ms(first, last, range(4)) == pytest.approx(old, rel=1e-12)


def test_buckets_at_the_backward_end_cost_more_than_perfect_overlap():
    prof = _toy()
    topo = Topology(((4, 1e9),))
    ideal = CostModel.from_profile(prof, topo).stage_ms(0, 5, range(4))
    ddp = CostModel.from_profile(prof, topo, allreduce_ready="backward-end", bucket_cap_bytes=25e6)
    assert ddp.stage_ms(0, 5, range(4)) > ideal  # the last bucket's all-reduce cannot hide
    assert len(ddp.layer_buckets(0, 5)) > 1


def test_layer_buckets_are_ddp_bucket_plan():
    prof = _toy(12, seed=3)
    cm = CostModel.from_profile(prof, None, bucket_cap_bytes=4e7)
    ranges = [(s.first, s.last) for s in dpo.bucket_plan(prof, 4e7).stages]
    assert cm.layer_buckets(0, 11) == ranges
    # a sub-range is cut by the same rule from its own last layer
    sub = cm.layer_buckets(3, 8)
    assert sub[0][0] == 3 and sub[-1][1] == 8 and all(a <= b for a, b in sub)


def test_bad_bucket_cap_is_one_line():
    with pytest.raises(ValueError, match="bucket_cap_bytes must be"):
        CostModel.from_profile(_toy(), None, bucket_cap_bytes=0)


def test_partition_with_buckets_ranks_by_the_one_price():
    prof = _toy()
    topo = Topology(((4, 2e8),))
    plan = partition(prof, topo, allreduce_ready="backward-end", bucket_cap_bytes=25e6)
    cm = CostModel.from_profile(prof, topo, allreduce_ready="backward-end", bucket_cap_bytes=25e6)
    assert plan.predicted_ms == pytest.approx(cm.predicted_ms(plan), rel=1e-12)
    assert plan.predicted_ms == min(c["predicted_ms"] for c in plan.meta["candidates"])
    with pytest.raises(ValueError, match="bucket_cap_bytes"):
        partition(prof, topo, cost="pipedream", bucket_cap_bytes=25e6)


def _settings_and_counts():
    seen = []
    for n in pf.load_paper_numbers():
        key = (n.setting, n.model, n.workers)
        if n.workers > 1 and n.model in pf.SHIPPED_V100 + ("s2vt", "awd-lstm") and key not in seen:
            seen.append(key)
    return seen


@pytest.mark.slow
@pytest.mark.parametrize("setting,model,workers", _settings_and_counts())
def test_a_data_parallel_plan_is_exactly_data_parallelism(setting, model, workers):
    s = pf.SETTINGS[setting]
    params = pf.fitted_params()[s.group]
    prof = pf.model_profile(model, s.gpu)
    topo = s.topology(workers)
    n = len(prof.layers)
    dp = Plan((Stage(0, n - 1, workers, tuple(range(workers))),), method="data-parallel")
    plan_ms = CostModel.from_profile(prof, topo, **s.pricing(topo, params)).predicted_ms(dp)
    bsp = pf.bsp(s, model, workers, params)
    assert (float(prof.total_ms) / plan_ms) / bsp["speedup"] == pytest.approx(1.0, abs=1e-12)
    plan = pf.pipedream_plan(s, model, workers, params)
    if plan.num_stages == 1:  # the partitioner's optimum is data parallelism: 1.00x, not a gain
        ratio = plan.single_worker_ms / plan.predicted_ms / bsp["speedup"]
        assert math.isclose(ratio, 1.0, abs_tol=1e-12)

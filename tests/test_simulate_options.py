"""SimOptions / CostOptions: the options object and the flat keywords of simulate() are one thing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from workbench import Profile
from workbench.cost.model import CostOptions
from workbench.cost.plan import Plan
from workbench.cost.topology import Topology
from workbench.schedules import build
from workbench.simulation import SimOptions, simulate


def profile(n: int = 8) -> Profile:
    rng = np.random.default_rng(3)
    return Profile.from_frame(
        pd.DataFrame(
            dict(
                name=[f"l{i}" for i in range(n)],
                fwd_ms=rng.uniform(1, 4, n),
                bwd_ms=rng.uniform(2, 8, n),
                act_bytes=rng.uniform(1e6, 4e7, n),
                param_bytes=rng.uniform(1e6, 4e7, n),
            )
        ),
        batch_size=16,
    )


def same(a, b) -> None:
    pd.testing.assert_frame_equal(a.timeline, b.timeline)
    assert a.metrics.keys() == b.metrics.keys()
    for k in a.metrics:
        assert repr(a.metrics[k]) == repr(b.metrics[k]), k
    assert a.label == b.label


def test_options_object_equals_flat_keywords_with_profile_costs():
    prof, plan = profile(), Plan.from_boundaries([1, 3, 5, 7], [2, 1, 1, 1])
    sched, topo = build("pipedream", plan, 12), Topology(((2, 10e9), (4, 1e9)))
    kw = dict(
        latency_ms=[0.05, 0.5],
        op_overhead_ms=0.02,
        overlap_comm=False,
        message_cpu_ms=0.01,
        allreduce_buckets=(1e6, 4e6),
        step_ms=0.1,
        step_copy_ms=0.3,
    )
    flat = simulate(sched, profile=prof, plan=plan, topology=topo, **kw)
    cost = CostOptions(
        latency_ms=[0.05, 0.5],
        op_overhead_ms=0.02,
        overlap_allreduce=False,
        message_cpu_ms=0.01,
        allreduce_buckets=(1e6, 4e6),
    )
    opts = SimOptions(cost=cost, step_ms=0.1, step_copy_ms=0.3)
    assert SimOptions.from_keywords(**kw) == opts
    same(flat, simulate(sched, profile=prof, plan=plan, topology=topo, options=opts))
    # the options change the result: overlap and latency are not ignored
    assert simulate(sched, profile=prof, plan=plan, topology=topo).makespan < flat.makespan


def test_keywords_override_the_options_object():
    sched = build("gpipe", 4, 8)
    base = SimOptions(transfer=0.5, cost=CostOptions(latency_ms=0.3))
    mixed = simulate(sched, options=base, transfer=0.2, overlap_comm=False)
    same(mixed, simulate(sched, transfer=0.2, latency_ms=0.3, overlap_comm=False))
    assert base.transfer == 0.5 and base.overlap_comm  # the object itself is not changed
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.transfer = 1.0  # type: ignore[misc]


def test_unknown_option_is_a_type_error_that_names_it():
    with pytest.raises(TypeError, match="'latency'"):
        simulate(build("gpipe", 4, 8), latency=0.1)
    with pytest.raises(TypeError, match="optionz"):
        SimOptions.from_keywords(SimOptions(), optionz=1)


def test_unit_costs_refuse_profile_only_options_given_as_object():
    opts = SimOptions(cost=CostOptions(message_cpu_ms=0.1))
    with pytest.raises(ValueError, match="need profile costs"):
        simulate(build("gpipe", 4, 8), options=opts)

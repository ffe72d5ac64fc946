import math

import pytest

from workbench.cost.topology import GBPS, Topology


def test_flat_and_counts():
    t = Topology.flat(4, 12e9)
    assert t.num_workers == 4 and t.num_levels == 1 and t.counts == (4,)
    assert t.bandwidth_between(0, 3) == 12e9
    assert t.bandwidth_between(2, 2) == math.inf


def test_hierarchy_bandwidth_between():
    t = Topology([(8, 25e9), (4, 3.125e9)])  # 4 servers of 8 GPUs
    assert t.num_workers == 32
    assert t.component_size(0) == 1 and t.component_size(1) == 8 and t.component_size(2) == 32
    assert t.bandwidth_between(0, 7) == 25e9  # same server
    assert t.bandwidth_between(7, 8) == 3.125e9  # neighbouring ids, different servers
    assert t.bandwidth_between(31, 0) == 3.125e9
    assert t.level_between(9, 15) == 1 and t.level_between(9, 16) == 2
    with pytest.raises(ValueError, match="outside"):
        t.bandwidth_between(0, 32)


def test_three_levels():
    t = Topology([(2, 100e9), (2, 10e9), (3, 1e9)])
    assert t.num_workers == 12
    assert [t.bandwidth_between(0, b) for b in (1, 2, 4)] == [100e9, 10e9, 1e9]


def test_presets_match_the_paper_numbers():
    a = Topology.preset("4xV100-pcie-10g", servers=4)
    assert a.counts == (4, 4) and a.num_workers == 16
    assert a.bandwidths[1] == pytest.approx(10 * 1e9 / 8)  # 10 Gbps Ethernet = 1.25 GB/s
    b = Topology.preset("8xV100-nvlink-25g", servers=2)
    assert b.counts == (8, 2) and b.bandwidths[1] == pytest.approx(25 * GBPS)
    c = Topology.preset("1xTitanX-40g", servers=5)
    assert c.num_workers == 5 and c.bandwidth_between(0, 1) == pytest.approx(5e9)
    assert set(Topology.presets()) >= {"4xV100-pcie-10g", "8xV100-nvlink-25g", "8x1080Ti-pcie-25g"}
    assert all("Gbps" in src for src in Topology.presets().values())
    with pytest.raises(ValueError, match="unknown topology preset"):
        Topology.preset("nope")


@pytest.mark.parametrize(
    "levels, msg",
    [
        ([(0, 1e9)], "count must be >= 1"),
        ([(4, 0)], "bandwidth must be > 0"),
        ([(4, -1e9)], "bandwidth must be > 0"),
        ([(4, float("nan"))], "bandwidth must be > 0"),
        ([(4, float("inf"))], "bandwidth must be > 0 bytes/s and finite"),
        ([(2.5, 1e9)], "positive integer"),
        ([(4, "fast")], "number"),
        ([], "at least one level"),
        ([(4,)], "pair"),
    ],
)
def test_bad_levels(levels, msg):
    with pytest.raises(ValueError, match=msg):
        Topology(levels)


def test_flat_zero_workers():
    with pytest.raises(ValueError, match="at least one worker"):
        Topology.flat(0, 1e9)


def test_presets_carry_their_gpu_memory():
    gib = 2**30
    mems = {name: Topology.preset(name).memory_bytes for name in Topology.presets()}
    assert mems == {
        "4xV100-pcie-10g": 16 * gib,
        "8xV100-nvlink-25g": 16 * gib,
        "1xTitanX-40g": 12 * gib,
        "8x1080Ti-pcie-25g": 11 * gib,
    }
    assert Topology.flat(4, 1e9).memory_bytes is None
    assert "16 GiB per worker" in Topology.preset("4xV100-pcie-10g", servers=2).describe()
    with pytest.raises(ValueError, match="memory_bytes must be a finite number > 0"):
        Topology(((2, 1e9),), memory_bytes=0)


@pytest.mark.slow
def test_a_plan_that_does_not_fit_the_preset_says_so():
    """PipeDream's VGG-16 profile on Cluster-A (the README's plan): stage 0 holds 3 minibatches of
    activations, more than a 16 GB V100 (modeled memory); with memory_bytes the plan fits and is quiet."""
    from workbench import partition
    from workbench.profiling.pipedream import shipped

    prof, topo = shipped("vgg16"), Topology.preset("4xV100-pcie-10g", servers=4)
    plan = partition(prof, topo, refine=False)
    need = max(plan.stage_memory_bytes)
    assert need > topo.memory_bytes
    note = plan.memory_note()
    assert note.startswith("does NOT fit") and f"{need / 2**30:.3g} GiB" in note and "16 GiB" in note
    assert "memory: does NOT fit" in plan.describe()
    fitted = partition(prof, topo, memory_bytes=topo.memory_bytes)  # refine keeps candidates that fit
    assert max(fitted.stage_memory_bytes) <= topo.memory_bytes and fitted.memory_note() == ""
    assert partition(prof, Topology.flat(16, 10e9), refine=False).memory_note() == ""  # memory unknown

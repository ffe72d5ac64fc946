"""Hierarchical cluster description (PipeDream §3.1): levels of components, innermost first.

A topology is a list of levels ``[(count_1, B_1), (count_2, B_2), ...]``. Level 1 groups
``count_1`` workers (GPUs) into one component (a server) whose members talk at ``B_1`` bytes/s;
level 2 groups ``count_2`` level-1 components (servers) that talk at ``B_2``; and so on. The
number of workers is ``W = prod(count_k)``. Worker ids are 0..W-1 and a level-k component holds
``S_k = count_1 * ... * count_k`` consecutive ids, so workers ``a`` and ``b`` share a level-k
component iff ``a // S_k == b // S_k``.

Bandwidths are bytes per second. Network figures quoted in bits per second are divided by 8.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

GBPS = 1e9 / 8  # one gigabit per second in bytes per second

# ---- sources of the preset numbers --------------------------------------------------------
# PipeDream (Narayanan et al., SOSP 2019), Table 1 / §5.1: Cluster-A = 4x V100 per server over
# PCIe, 10 Gbps Ethernet between servers (Azure NC24 v3); Cluster-B = 8x V100 per server with
# NVLink, 25 Gbps between servers (AWS p3.16xlarge); Cluster-C = 1x Titan X per server, 40 Gbps.
# PCIe 3.0 x16: 985 MB/s per lane and direction -> 15.75 GB/s theoretical, ~12 GB/s achieved in
# host-staged GPU-to-GPU copies; we use 12e9 B/s. NVLink 2.0: 25 GB/s per link and direction; in
# the p3.16xlarge / DGX-1 hybrid cube-mesh a GPU pair is joined by one or two links (some pairs
# need two hops), so we use one link, 25e9 B/s, as the all-pairs figure.
PCIE3_X16 = 12e9
NVLINK2_LINK = 25e9
# Device memory per GPU (vendors' data sheets): the V100s of Azure NC24s v3 and AWS p3.16xlarge
# have 16 GB (HBM2; a 32 GB V100 exists, used by neither); Titan X (Pascal) 12 GB GDDR5X; GTX
# 1080 Ti 11 GB GDDR5X. Memory sizes of GPUs are binary gigabytes (GiB).
GIB = 2**30

_PRESETS: dict[str, tuple[int, float, float, float, str]] = {
    # name: (GPUs per server, intra-server B/s, inter-server B/s, memory per GPU in bytes, source)
    "4xV100-pcie-10g": (
        4,
        PCIE3_X16,
        10 * GBPS,
        16 * GIB,
        "PipeDream Cluster-A: 4x V100 16 GB/server over PCIe 3.0 x16 (~12 GB/s), 10 Gbps Ethernet",
    ),
    "8xV100-nvlink-25g": (
        8,
        NVLINK2_LINK,
        25 * GBPS,
        16 * GIB,
        "PipeDream Cluster-B: 8x V100 16 GB/server with NVLink 2.0 (25 GB/s/link), 25 Gbps",
    ),
    "1xTitanX-40g": (
        1,
        PCIE3_X16,
        40 * GBPS,
        12 * GIB,
        "PipeDream Cluster-C: 1x Titan X 12 GB/server, 40 Gbps between servers",
    ),
    "8x1080Ti-pcie-25g": (
        8,
        PCIE3_X16,
        25 * GBPS,
        11 * GIB,
        "8x GTX 1080 Ti 11 GB/server over PCIe 3.0 x16 (~12 GB/s), 25 Gbps between servers",
    ),
}


def _check_level(k: int, count, bandwidth) -> tuple[int, float]:
    integral = isinstance(count, numbers.Integral) or (isinstance(count, float) and count.is_integer())
    if isinstance(count, bool) or not integral:
        raise ValueError(f"topology level {k}: count must be a positive integer, got {count!r}")
    count = int(count)
    if count < 1:
        raise ValueError(f"topology level {k}: count must be >= 1 (got {count}); a cluster needs at least one worker")
    try:
        bw = float(bandwidth)
    except (TypeError, ValueError):
        raise ValueError(f"topology level {k}: bandwidth must be a number in bytes/s, got {bandwidth!r}") from None
    if not math.isfinite(bw) or bw <= 0:
        raise ValueError(
            f"topology level {k}: bandwidth must be > 0 bytes/s and finite (got {bandwidth!r}); e.g. 10 Gbps = 1.25e9"
        )
    return count, bw


@dataclass(frozen=True)
class Topology:
    """Levels ``((count, bandwidth_bytes_per_s), ...)``, innermost first.

    ``B_k`` (the bandwidth of level k) is the bandwidth between two level-(k-1) components
    inside one level-k component; level 0 is a single worker. ``memory_bytes``: the memory of one
    worker's device (the presets carry their GPUs'), None when unknown.
    """

    levels: tuple[tuple[int, float], ...]
    name: str = ""
    memory_bytes: float | None = None

    def __post_init__(self):
        levels = tuple(self.levels) if self.levels is not None else ()
        if not levels:
            raise ValueError("a topology needs at least one level, e.g. Topology.flat(4, 12e9)")
        checked = []
        for k, lv in enumerate(levels, start=1):
            try:
                count, bw = lv
            except (TypeError, ValueError):
                raise ValueError(f"topology level {k} must be a pair (count, bandwidth), got {lv!r}") from None
            checked.append(_check_level(k, count, bw))
        object.__setattr__(self, "levels", tuple(checked))
        if self.memory_bytes is not None:
            mem = float(self.memory_bytes)
            if not math.isfinite(mem) or mem <= 0:
                raise ValueError(
                    f"topology memory_bytes must be a finite number > 0 of bytes per worker, got {self.memory_bytes!r}"
                )
            object.__setattr__(self, "memory_bytes", mem)

    # ---- constructors -------------------------------------------------------------------
    @classmethod
    def flat(cls, workers: int, bandwidth: float) -> Topology:
        """``workers`` workers, every pair connected at ``bandwidth`` bytes/s."""
        return cls(((workers, bandwidth),), name=f"flat{workers}")

    @classmethod
    def preset(cls, name: str, servers: int = 1) -> Topology:
        """One of :meth:`presets` with ``servers`` servers (sources in the module docstring)."""
        if name not in _PRESETS:
            raise ValueError(f"unknown topology preset {name!r}; choose one of {sorted(_PRESETS)}")
        gpus, intra, inter, memory, _ = _PRESETS[name]
        return cls(((gpus, intra), (servers, inter)), name=f"{name}x{servers}", memory_bytes=memory)

    @staticmethod
    def presets() -> dict[str, str]:
        """Preset names and where their numbers come from."""
        return {k: v[-1] for k, v in _PRESETS.items()}

    # ---- derived ------------------------------------------------------------------------
    @property
    def num_levels(self) -> int:
        return len(self.levels)

    @property
    def counts(self) -> tuple[int, ...]:
        return tuple(c for c, _ in self.levels)

    @property
    def bandwidths(self) -> tuple[float, ...]:
        return tuple(b for _, b in self.levels)

    @property
    def num_workers(self) -> int:
        return math.prod(self.counts)

    def component_size(self, k: int) -> int:
        """Workers in one level-k component, ``S_k = count_1 * ... * count_k`` (``S_0 = 1``)."""
        return math.prod(self.counts[:k])

    def level_between(self, worker_a: int, worker_b: int) -> int:
        """The innermost level k whose components contain both workers (0 if a == b)."""
        w = self.num_workers
        for x in (worker_a, worker_b):
            if not 0 <= int(x) < w:
                raise ValueError(f"worker id {x} is outside 0..{w - 1} of this {w}-worker topology")
        for k in range(self.num_levels + 1):
            s = self.component_size(k)
            if worker_a // s == worker_b // s:
                return k
        raise AssertionError("unreachable: the outermost level contains every worker")

    def bandwidth_between(self, worker_a: int, worker_b: int) -> float:
        """``B_k`` of the innermost level k containing both workers; ``inf`` for the same worker."""
        k = self.level_between(worker_a, worker_b)
        return math.inf if k == 0 else self.levels[k - 1][1]

    def to_list(self) -> list[list[float]]:
        return [[c, b] for c, b in self.levels]

    def describe(self) -> str:
        parts = [f"{c} x @ {b / 1e9:.3g} GB/s" for c, b in self.levels]
        mem = f", {self.memory_bytes / GIB:.3g} GiB per worker" if self.memory_bytes else ""
        return f"{self.num_workers} workers: " + " -> ".join(parts) + f" (innermost first){mem}"

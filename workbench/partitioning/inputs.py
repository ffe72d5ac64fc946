"""What the partitioner reads, checked once: a profile's per-layer costs with their prefix sums, the
topology and the memory limit. A bad value is one ``ValueError`` line that says how to fix it."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from workbench.cost.topology import Topology
from workbench.profiling.measure import Profile

MAX_WORKERS = 1024  # more are refused: the dynamic program's tables and the refinement's simulations grow with them


@dataclass(frozen=True)
class LayerCosts:
    """Per-layer costs of a profile (layer l = 0..N-1) and their prefix sums (length N + 1, with
    ``prefix[0] = 0``), so that a sum over the layers ``first..last`` is
    ``prefix[last + 1] - prefix[first]`` for scalars and numpy arrays of indices alike."""

    compute_ms: np.ndarray  # fwd_ms + bwd_ms of layer l
    act_bytes: np.ndarray  # bytes crossing the cut after layer l
    param_bytes: np.ndarray  # weights of layer l
    compute_prefix: np.ndarray
    param_prefix: np.ndarray
    act_prefix: np.ndarray
    fwd_prefix: np.ndarray
    bwd_prefix: np.ndarray

    @property
    def num_layers(self) -> int:
        return len(self.compute_ms)

    def fwd_ms(self, first, last):
        """Forward compute of layers ``first..last``."""
        return self.fwd_prefix[last + 1] - self.fwd_prefix[first]

    def bwd_ms(self, first, last):
        """Backward compute of layers ``first..last``."""
        return self.bwd_prefix[last + 1] - self.bwd_prefix[first]

    def weights(self, first, last):
        """Parameter bytes of layers ``first..last``."""
        return self.param_prefix[last + 1] - self.param_prefix[first]

    def acts(self, first, last):
        """Activation bytes of layers ``first..last`` (what a stage stashes per minibatch)."""
        return self.act_prefix[np.asarray(last) + 1] - self.act_prefix[first]


def layer_costs(profile) -> LayerCosts:
    """The :class:`LayerCosts` of a workbench :class:`Profile` (every cost finite and >= 0)."""
    if not isinstance(profile, Profile):
        raise ValueError(
            f"partition needs a workbench Profile, got {type(profile).__name__}; build one with Profile.from_frame(df)"
        )
    df = profile.layers
    if len(df) == 0:
        raise ValueError("profile has no layers; nothing to partition")
    cols = {}
    for c in ("fwd_ms", "bwd_ms", "act_bytes", "param_bytes"):
        x = df[c].to_numpy(dtype=float)
        if not np.all(np.isfinite(x)) or np.any(x < 0):
            raise ValueError(f"profile column {c!r} must be finite and >= 0 for every layer")
        cols[c] = x
    compute = cols["fwd_ms"] + cols["bwd_ms"]
    act, param = cols["act_bytes"], cols["param_bytes"]
    zero = np.zeros(1)
    return LayerCosts(
        compute_ms=compute,
        act_bytes=act,
        param_bytes=param,
        compute_prefix=np.concatenate([zero, np.cumsum(compute)]),
        param_prefix=np.concatenate([zero, np.cumsum(param)]),
        act_prefix=np.concatenate([zero, np.cumsum(act)]),
        fwd_prefix=np.concatenate([zero, np.cumsum(cols["fwd_ms"])]),
        bwd_prefix=np.concatenate([zero, np.cumsum(cols["bwd_ms"])]),
    )


def check_topology(topology) -> Topology:
    """``topology`` if it is a :class:`Topology` of at most :data:`MAX_WORKERS` workers with at
    least one component and a positive bandwidth per level."""
    if not isinstance(topology, Topology):
        raise ValueError(f"topology must be a workbench Topology, e.g. Topology.flat(4, 12e9); got {topology!r}")
    if topology.num_workers > MAX_WORKERS:
        raise ValueError(
            f"the topology has {topology.num_workers} workers; the partitioner takes at most {MAX_WORKERS} "
            "(its tables and simulations grow with the worker count)"
        )
    for k, (count, bw) in enumerate(topology.levels, start=1):
        if count < 1:
            raise ValueError(f"topology level {k} has {count} components; need at least 1 worker")
        if not bw > 0:
            raise ValueError(f"topology level {k} bandwidth must be > 0 bytes/s, got {bw}")
    return topology


def check_memory(memory_bytes) -> float | None:
    """The memory limit per worker as a float (None: no limit)."""
    if memory_bytes is None:
        return None
    mb = float(memory_bytes)
    if not (math.isfinite(mb) and mb > 0):
        raise ValueError(f"memory_bytes must be a positive number of bytes per worker, got {memory_bytes!r}")
    return mb

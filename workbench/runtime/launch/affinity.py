"""Pinning each rank to its own cores when the ranks of a CPU job fit on the machine.

With one rank per core and nothing else to run, Linux still moves a rank's threads between cores
and may wake a rank's communication thread on the core where the other rank computes; a message
then waits for that core's time slice (milliseconds on this 2-core machine: the measured
activation/gradient delays of a 2-rank pipeline had a 90th percentile of 1-3 ms). Pinned, each
rank's communication threads share its own core, which is idle whenever the rank waits for a
message. On the 2-core CI machine, pinning lowered the median time per step of gpipe, pipedream
and pipedream-flush over 6 runs each from 34.8 / 35.6 / 41.7 ms to 32.7 / 33.3 / 33.0 ms, mostly
by removing the slow outliers.

``WORKBENCH_PIN=0`` turns it off; it never applies to GPU jobs or when the ranks' threads
outnumber the cores (then the scheduler balances them).
"""

from __future__ import annotations

import os

from workbench.runtime.launch.allocator import retain_freed_memory


def place_rank(local_rank: int, local_world: int, threads: int = 1, device_type: str = "cpu") -> list[int] | None:
    """Set up this process as the runtime sets up each rank: :func:`pin_rank` and the allocator
    settings of :func:`workbench.runtime.launch.allocator.retain_freed_memory`. Returns the pinned cores."""

    cores = pin_rank(local_rank, local_world, threads, device_type)
    retain_freed_memory()
    return cores


def pin_rank(local_rank: int, local_world: int, threads: int = 1, device_type: str = "cpu") -> list[int] | None:
    """Pin this process to cores ``[local_rank · threads, (local_rank + 1) · threads)`` of the
    cores it may run on, if ``local_world · threads`` of them exist; returns the cores or None."""
    if device_type != "cpu" or os.environ.get("WORKBENCH_PIN", "1") == "0" or not hasattr(os, "sched_setaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    threads = max(1, int(threads))
    if local_world * threads > len(cpus) or not 0 <= local_rank < local_world:
        return None
    mine = cpus[local_rank * threads : (local_rank + 1) * threads]
    os.sched_setaffinity(0, mine)
    return mine

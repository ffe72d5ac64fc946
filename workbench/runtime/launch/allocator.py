"""Keeping freed memory inside a rank (glibc ``malloc``), so that an op does not page-fault.

PyTorch's CPU tensors come from ``malloc``. With glibc's defaults a freed block of the heap's top
is given back to the kernel once more than the trim threshold is free, and blocks above the
(adaptive) mmap threshold are unmapped on free; the next op that allocates the same sizes then
touches fresh pages, one page fault per 4 KiB. A training step frees and allocates the same
sizes over and over (a stage's gradients, its activations), so with the defaults the runtime pays
those faults in every op. Measured on the 2-core CI machine, 8 x 512 MLP, microbatch 32, one
thread, two pinned processes at once, a loop of forward, backward, in-place SGD step that frees
the gradients (medians of 30, two runs): forward 2.2-2.3 -> 1.8-1.9 ms, backward 5.2-6.1 -> 2.4-2.6
ms, step 1.5-1.8 -> 0.9-1.0 ms, with this module's settings. Neither setting alone is enough:
the trim threshold alone freezes the mmap threshold at its 128 KiB default, so every
megabyte-sized tensor is mapped and unmapped (backward 7.5 ms in one run); the mmap threshold
alone still trims the heap (backward 4.9 ms).

:func:`retain_freed_memory` sets the mmap threshold to glibc's ceiling (32 MiB on 64-bit:
smaller blocks come from the heap) and the trim threshold to 1 GiB (freed heap memory stays
mapped for the next op). The cost: a rank's resident memory stays at its peak instead of shrinking
between ops, as with PyTorch's CUDA caching allocator. ``WORKBENCH_MALLOC=0`` leaves glibc's
defaults; other C libraries (macOS, musl) are left alone.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters (malloc.h)
MMAP_THRESHOLD = 32 << 20  # glibc's largest mmap threshold on 64-bit (DEFAULT_MMAP_THRESHOLD_MAX)
TRIM_THRESHOLD = 1 << 30


def retain_freed_memory() -> bool:
    """Set this process's glibc ``malloc`` to keep freed memory (see the module docstring);
    returns whether the settings took effect (False: turned off, or not glibc)."""
    if os.environ.get("WORKBENCH_MALLOC", "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        _ = libc.gnu_get_libc_version  # glibc only (AttributeError elsewhere): musl has mallopt as a no-op
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))

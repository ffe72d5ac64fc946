"""The one timeline schema shared by modeled (:mod:`workbench.simulation`) and measured
(:mod:`workbench.runtime`) timelines: one row per op, times in ms.

Columns both write:

* ``worker``, ``stage``, ``microbatch`` (-1 for AR / STEP), ``kind`` (F, B, BI, BW, STEP,
  allreduce ...), ``start``, ``end`` (ms; the runtime from a barrier-synchronised t0), ``version``
  (the weight version an op read; after a STEP, the newest version);
* ``round``: which pass over the schedule's op lists the op belongs to. The runtime repeats the
  schedule once per minibatch round ``R = 0, 1, ...``; one call of ``simulate`` is one pass, round 0;
* ``step``: a copy of ``round``, written so that the committed run's timelines stay reproducible
  bit for bit; no reader uses it (read ``round``).

The simulator adds ``lane`` (compute / comm), ``src``, ``dst``, ``bytes`` and ``update`` (for STEP and
AR rows the index of that update of the stage within the pass, else -1); the runtime adds ``wait_ms``.
"""

from __future__ import annotations

COMMON_COLUMNS = ("worker", "stage", "microbatch", "kind", "start", "end", "version", "round", "step")

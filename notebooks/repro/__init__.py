"""The PipeDream reproduction beside the library: what the notebooks call, one module per paper
experiment, with the papers' settings, numbers and protocol as data (``data/``). It imports only
public names of ``workbench`` (``tests/test_repro_imports.py``); the library never imports it.

Each notebook in ``notebooks/`` is a thin papermill-parameterised driver over one module here:

* :mod:`.dp_overhead` — PipeDream (SOSP'19) Figure 1: data-parallel communication overhead; the
  papers' claims on their own hardware in :mod:`.paper_fit` (notebook 02);
* ``time_to_accuracy`` (notebook 03; its runs and statistics in :mod:`.convergence`) / ``timelines`` (04);
* :mod:`.unified` — "Unifying Parallelization Schemes to Train Deep Nets": the schedule table (05).

Every experiment writes its CSV tables, standalone HTML figures and a ``claims.csv`` (the paper's
numbers beside ours, :data:`common.CLAIM_COLUMNS`) into its ``out_dir``; ``workbench reproduce``
(:mod:`.reproduce`, a plugin of the ``workbench`` command) runs the notebooks and collects the claims
into ``summary.md``. ``import repro`` imports nothing else (no pandas): each name below is imported on
first use (PEP 562), so that the plugin keeps ``workbench --help`` fast.
"""

from __future__ import annotations

from workbench.io import lazy_exports

#: public name -> the module that defines it
_EXPORTS = {
    "CLAIM_COLUMNS": "repro.common",
    "claim": "repro.common",
    "out_folder": "repro.common",
    "save_figure": "repro.common",
    "save_table": "repro.common",
    "write_claims": "repro.common",
}

__all__ = list(_EXPORTS)

__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)

"""The functions the reproduction notebooks call, one module per paper experiment.

Each notebook in ``notebooks/`` is a thin papermill-parameterised driver over one module here:

* :mod:`.dp_overhead` — PipeDream (SOSP'19) Figure 1: data-parallel communication overhead;
* :mod:`.unified` — "Unifying Parallelization Schemes to Train Deep Nets": the schedule table;
* ``time_to_accuracy`` (notebook 03; its runs and statistics in :mod:`.convergence`) / ``timelines`` (04).

Every experiment writes its CSV tables, standalone HTML figures and a ``claims.csv`` (the paper's
numbers beside ours, :data:`common.CLAIM_COLUMNS`) into its ``out_dir``; ``workbench reproduce``
collects the claims into ``summary.md``.
"""

from workbench.experiments.common import CLAIM_COLUMNS, claim, out_folder, save_figure, save_table, write_claims

__all__ = ["CLAIM_COLUMNS", "claim", "out_folder", "save_figure", "save_table", "write_claims"]

"""Output handling shared by every experiment: output folders, tables, figures and ``claims.csv``.

``claims.csv`` has exactly the columns :data:`CLAIM_COLUMNS`, one row per number a paper states:
``paper`` (the published value), ``ours`` (our value in the same ``unit``), ``ratio = ours / paper``,
``label`` ("measured (this machine: ...)" or "modeled (profile X, topology Y)"), an
``explanation`` of any gap, and ``fit``: ``in-sample`` (a calibrated parameter was fitted to this
number), ``out-of-sample`` (modeled with nothing fitted to it: a prediction), ``none`` (not modeled:
measured here, or no value). ``workbench reproduce`` concatenates every notebook's claims into
``summary.md``.
"""

from __future__ import annotations

import csv
import math
from dataclasses import fields
from functools import cache
from pathlib import Path

import pandas as pd

from workbench.io.folders import fresh_path
from workbench.models import config as model_config
from workbench.viz.plot import save_html

#: The papers' data the experiments read (package data): ``settings.csv`` and ``paper_numbers.csv``
#: (:mod:`workbench.experiments.paper_fit`), ``paper_claims.csv`` (the other experiments' paper values).
DATA = Path(__file__).resolve().parent / "data"


def read_data(name: str) -> list[dict[str, str]]:
    """The rows of ``data/<name>`` (a CSV with a header), as strings in file order."""
    with (DATA / name).open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@cache
def paper_value(key: str) -> float:
    """A paper's number from ``data/paper_claims.csv`` by its ``key`` (each row names the paper's
    version and its source: table, figure or section)."""
    rows = {r["key"]: r for r in read_data("paper_claims.csv")}
    if key not in rows:
        raise ValueError(f"no paper number {key!r} in paper_claims.csv; keys: {sorted(rows)}")
    return float(rows[key]["paper"])


CLAIM_COLUMNS = ("experiment", "claim", "paper", "ours", "ratio", "unit", "label", "explanation", "fit")
FITS = ("in-sample", "out-of-sample", "none")


def out_folder(out_dir) -> Path:
    """The folder an experiment writes into: ``out_dir`` when it is new or empty, else a fresh
    sibling ``out_dir-2``, ``-3``, ... (a manual rerun never overwrites an earlier one). Created."""
    path = Path(out_dir)
    if path.exists() and (not path.is_dir() or any(path.iterdir())):
        path = fresh_path(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def claim(
    experiment: str,
    claim: str,
    paper: float,
    ours: float,
    unit: str,
    *,
    label: str,
    explanation: str = "",
    fit: str | None = None,
) -> dict:
    """One row of ``claims.csv``; ``ratio = ours / paper`` (NaN when the paper's value is 0 or missing).
    ``fit`` defaults to ``out-of-sample`` for a modeled value and ``none`` for a measured or missing one."""
    if not str(label).startswith(("measured", "modeled")):
        raise ValueError(f"claim {claim!r}: label must start with 'measured' or 'modeled', got {label!r}")
    paper_f, ours_f = float(paper), float(ours)
    if fit is None:
        fit = "out-of-sample" if str(label).startswith("modeled") and math.isfinite(ours_f) else "none"
    if fit not in FITS:
        raise ValueError(f"claim {claim!r}: fit must be one of {FITS}, got {fit!r}")
    ratio = ours_f / paper_f if paper_f and math.isfinite(paper_f) else math.nan
    return dict(
        experiment=experiment,
        claim=claim,
        paper=paper_f,
        ours=ours_f,
        ratio=ratio,
        unit=unit,
        label=label,
        explanation=explanation,
        fit=fit,
    )


def fit_summary(claims: pd.DataFrame, by=("fit",)) -> pd.DataFrame:
    """Per ``by`` group of the rows with a number on both sides: rows, how many within ±25% of the
    paper, the share within, the median ``|ours / paper − 1|``."""
    ratio = pd.to_numeric(claims["ratio"], errors="coerce")
    df = claims[ratio.notna() & ratio.map(math.isfinite)].assign(abs_error=(ratio - 1).abs())
    out = df.groupby(list(by)).agg(rows=("claim", "size"), within_25=("abs_error", lambda e: int((e <= 0.25).sum())),
                                   median_abs_error=("abs_error", "median"))  # fmt: skip
    out.insert(2, "share_within_25", out["within_25"] / out["rows"])
    return out.reset_index()


def write_claims(rows, out_dir) -> Path:
    """Write ``rows`` (dicts from :func:`claim`, or a DataFrame) to ``out_dir/claims.csv``."""
    df = pd.DataFrame(rows)
    missing = [c for c in CLAIM_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"claims lack columns {missing}; build rows with experiments.common.claim(...)")
    path = Path(out_dir) / "claims.csv"
    df[list(CLAIM_COLUMNS)].to_csv(path, index=False)
    return path


def save_table(df: pd.DataFrame, out_dir, name: str) -> Path:
    """``df`` as ``out_dir/name.csv`` (no index)."""
    path = Path(out_dir) / f"{name}.csv"
    df.to_csv(path, index=False)
    return path


def save_figure(fig, out_dir, name: str) -> Path:
    """A plotly figure as a standalone ``out_dir/name.html`` (:func:`workbench.viz.plot.save_html`)."""

    return save_html(fig, Path(out_dir) / f"{name}.html")


def check_config(config_cls, quick_config, quick: bool, params: dict) -> None:
    """Build the notebook's configuration from ``params`` (``quick_config`` in quick mode, else
    ``config_cls``; lists become tuples) and check its zoo model and options: a bad parameter raises
    one-line ``ValueError`` before anything runs (``workbench reproduce``)."""

    names = {f.name for f in fields(config_cls)}
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in params.items() if k in names}
    cfg = quick_config(**kw) if quick else config_cls(**kw)
    model_config(cfg.model, "mini", **dict(cfg.model_options))

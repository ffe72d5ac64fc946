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
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import fields
from functools import cache
from pathlib import Path
from typing import Any

import pandas as pd

from workbench.io import fresh_path
from workbench.models import config as model_config
from workbench.viz import save_html

#: The papers' data the experiments read (package data): ``settings.csv`` and ``paper_numbers.csv``
#: (:mod:`repro.paper_fit`), ``paper_claims.csv`` (the other experiments' paper values).
DATA = Path(__file__).resolve().parent / "data"


def read_data(name: str) -> list[dict[str, str]]:
    """The rows of ``data/<name>`` (a CSV with a header), as strings in file order."""
    with (DATA / name).open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


class LazyTable(Mapping):
    """A read-only mapping that ``load()`` builds on first use (a data file read when a value is
    needed, not when its module is imported)."""

    def __init__(self, load: Callable[[], Mapping]):
        self.load = cache(load)

    def __getitem__(self, key):
        return self.load()[key]

    def __iter__(self) -> Iterator:
        return iter(self.load())

    def __len__(self) -> int:
        return len(self.load())

    def __repr__(self) -> str:
        return f"LazyTable({dict(self.load())!r})"


class LazyRows(Sequence):
    """A read-only sequence that ``load()`` builds on first use (see :class:`LazyTable`)."""

    def __init__(self, load: Callable[[], Sequence]):
        self.load = cache(load)

    def __getitem__(self, index: Any) -> Any:
        return self.load()[index]

    def __len__(self) -> int:
        return len(self.load())

    def __repr__(self) -> str:
        return f"LazyRows({tuple(self.load())!r})"


@cache
def _paper_claim(key: str) -> dict[str, str]:
    rows = {r["key"]: r for r in read_data("paper_claims.csv")}
    if key not in rows:
        raise ValueError(f"no paper number {key!r} in paper_claims.csv; keys: {sorted(rows)}")
    return rows[key]


def paper_value(key: str) -> float:
    """A paper's number from ``data/paper_claims.csv`` by its ``key`` (each row names the paper's
    version and its source: table, figure or section)."""
    return float(_paper_claim(key)["paper"])


def paper_source(key: str) -> str:
    """The source of :func:`paper_value`'s number: paper, version and the words it is read from."""
    return _paper_claim(key)["source"]


CLAIM_COLUMNS = (
    "experiment",
    "claim",
    "paper",
    "ours",
    "ratio",
    "unit",
    "comparison",
    "met",
    "label",
    "explanation",
    "fit",
    "protocol",
)
FITS = ("in-sample", "out-of-sample", "none")
#: How a paper's words compare with ours (the protocol's ``[comparisons]``): ``point`` (a stated
#: number: met within ±25%), ``up to`` (the maximum of ours over the set the paper takes it over, as
#: a point), ``at least`` ("more than X": met when ours >= X), ``holds`` (a qualitative statement:
#: met when ours, the number of cases it holds in, reaches the paper's, the cases it is taken over).
COMPARISONS = ("point", "up to", "at least", "holds")
WITHIN = 0.25


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
    comparison: str = "point",
    protocol: str = "",
) -> dict:
    """One row of ``claims.csv``; ``ratio = ours / paper`` (NaN when the paper's value is 0 or missing).
    ``fit`` defaults to ``out-of-sample`` for a modeled value and ``none`` for a measured or missing one.
    ``comparison`` (:data:`COMPARISONS`) decides ``met``: ``yes``/``no``, empty without both numbers;
    ``protocol``: the protocol entries the row used (:func:`repro.protocol.used`)."""
    if comparison not in COMPARISONS:
        raise ValueError(f"claim {claim!r}: comparison must be one of {COMPARISONS}, got {comparison!r}")
    if not str(label).startswith(("measured", "modeled")):
        raise ValueError(f"claim {claim!r}: label must start with 'measured' or 'modeled', got {label!r}")
    paper_f, ours_f = float(paper), float(ours)
    if fit is None:
        fit = "out-of-sample" if str(label).startswith("modeled") and math.isfinite(ours_f) else "none"
    if fit not in FITS:
        raise ValueError(f"claim {claim!r}: fit must be one of {FITS}, got {fit!r}")
    ratio = ours_f / paper_f if paper_f and math.isfinite(paper_f) else math.nan
    if not (math.isfinite(paper_f) and math.isfinite(ours_f)):
        met = ""
    elif comparison in ("at least", "holds"):
        met = "yes" if ours_f >= paper_f else "no"
    elif paper_f == 0:  # a count of zero is met only by zero
        met = "yes" if ours_f == 0 else "no"
    else:
        met = "yes" if math.isfinite(ratio) and abs(ratio - 1) <= WITHIN else "no"
    return dict(
        experiment=experiment,
        claim=claim,
        paper=paper_f,
        ours=ours_f,
        ratio=ratio,
        unit=unit,
        comparison=comparison,
        met=met,
        label=label,
        explanation=explanation,
        fit=fit,
        protocol=protocol,
    )


def fit_summary(claims: pd.DataFrame, by=("fit",)) -> pd.DataFrame:
    """Per ``by`` group of the rows compared as numbers (``point`` and ``up to``) with a number on
    both sides: rows, how many within ±25% of the paper, the share within, the median
    ``|ours / paper − 1|``. Bounds and qualitative rows are counted by :func:`met_summary`."""
    ratio = pd.to_numeric(claims["ratio"], errors="coerce")
    numeric = claims["comparison"].isin(("point", "up to")) if "comparison" in claims.columns else True
    df = claims[numeric & ratio.notna() & ratio.map(math.isfinite)].assign(abs_error=(ratio - 1).abs())
    out = df.groupby(list(by)).agg(rows=("claim", "size"), within_25=("abs_error", lambda e: int((e <= 0.25).sum())),
                                   median_abs_error=("abs_error", "median"))  # fmt: skip
    out.insert(2, "share_within_25", out["within_25"] / out["rows"])
    return out.reset_index()


def met_summary(claims: pd.DataFrame, by=("comparison",)) -> pd.DataFrame:
    """Per ``by`` group of the rows with a verdict (``met`` yes or no): rows and how many are met."""
    df = claims[claims["met"].isin(("yes", "no"))] if "met" in claims.columns else claims.iloc[:0]
    out = df.groupby(list(by)).agg(rows=("claim", "size"), met=("met", lambda m: int((m == "yes").sum())))
    return out.reset_index()


def write_claims(rows, out_dir) -> Path:
    """Write ``rows`` (dicts from :func:`claim`, or a DataFrame) to ``out_dir/claims.csv``."""
    df = pd.DataFrame(rows)
    missing = [c for c in CLAIM_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"claims lack columns {missing}; build rows with repro.common.claim(...)")
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
    ``config_cls``; lists become tuples, ``None`` takes the default) and check its zoo model and options: a bad parameter raises
    one-line ``ValueError`` before anything runs (``workbench reproduce``)."""

    names = {f.name for f in fields(config_cls)}
    kw = {k: tuple(v) if isinstance(v, list) else v for k, v in params.items() if k in names and v is not None}
    cfg = quick_config(**kw) if quick else config_cls(**kw)
    model_config(cfg.model, "mini", **dict(cfg.model_options))

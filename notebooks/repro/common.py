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
    "low",
    "high",
    "width",
    "verdict",
    "kind",
    "paper_high",
)
FITS = ("in-sample", "out-of-sample", "none")
#: How a row's number of ours was made, the first word of its ``label``: ``measured`` (where, how),
#: ``modeled`` (from which profile and topology) or ``untestable`` (no number of ours; the
#: explanation says why nothing here can give one).
LABELS = ("measured", "modeled", "untestable")
#: What a row is evidence of, counted apart in ``summary.md`` (:func:`claim_kind`): ``measured``
#: (a number the papers measured, compared out of sample, each paper number once), ``repeat``
#: (another row of a paper number already counted: an abstract's "up to" over Table 1's rows, a
#: this-machine row of a number modeled elsewhere), ``in-sample`` (a fit), ``formula`` (a closed
#: form or a document's count, not a measurement) and ``qualitative`` (a statement in words).
KINDS = ("measured", "repeat", "in-sample", "formula", "qualitative")
#: ``verdict`` of a row over its interval (:func:`verdict`).
VERDICTS = ("consistent", "contradicted", "untestable")
#: How a paper's words compare with ours (the protocol's ``[comparisons]``): ``point`` (a stated
#: number: met within ±25%), ``up to`` (the maximum of ours over the set the paper takes it over, as
#: a point), ``at least`` ("more than X": met when ours >= X), ``holds`` (a qualitative statement:
#: met when ours, the number of cases it holds in, reaches the paper's, the cases it is taken over),
#: ``range`` ("from X to Y": met when ours lies inside [``paper``, ``paper_high``]).
COMPARISONS = ("point", "up to", "at least", "holds", "range")
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
    low: float | None = None,
    high: float | None = None,
    kind: str = "",
    paper_high: float | None = None,
) -> dict:
    """One row of ``claims.csv``; ``ratio = ours / paper`` (NaN when the paper's value is 0 or missing).
    ``fit`` defaults to ``out-of-sample`` for a modeled value and ``none`` for a measured or missing one.
    ``comparison`` (:data:`COMPARISONS`) decides ``met``: ``yes``/``no``, empty without both numbers;
    ``protocol``: the protocol entries the row used (:func:`repro.protocol.used`); ``low`` / ``high``:
    ours at the ends of the protocol's intervals (default ``ours``: nothing open), which decide
    ``verdict`` (:func:`verdict`); ``kind`` (:data:`KINDS`; empty: :func:`claim_kind` decides when the
    run is collected); ``paper_high``: the upper end of a ``range`` claim (``paper`` its lower end)."""
    if comparison not in COMPARISONS:
        raise ValueError(f"claim {claim!r}: comparison must be one of {COMPARISONS}, got {comparison!r}")
    if not str(label).startswith(LABELS):
        raise ValueError(f"claim {claim!r}: label must start with one of {LABELS}, got {label!r}")
    paper_f, ours_f = float(paper), float(ours)
    if fit is None:
        fit = "out-of-sample" if str(label).startswith("modeled") and math.isfinite(ours_f) else "none"
    if fit not in FITS:
        raise ValueError(f"claim {claim!r}: fit must be one of {FITS}, got {fit!r}")
    if kind and kind not in KINDS:
        raise ValueError(f"claim {claim!r}: kind must be one of {KINDS} or empty, got {kind!r}")
    top = math.nan if paper_high is None else float(paper_high)
    if comparison == "range" and not (math.isfinite(top) and top >= paper_f):
        raise ValueError(f"claim {claim!r}: a range claim needs paper_high >= paper, got {paper_high!r}")
    lo = ours_f if low is None else float(low)
    hi = ours_f if high is None else float(high)
    lo, hi = min(lo, hi, ours_f), max(lo, hi, ours_f)
    ratio = ours_f / paper_f if paper_f and math.isfinite(paper_f) else math.nan
    if not (math.isfinite(paper_f) and math.isfinite(ours_f)):
        met = ""
    elif comparison == "range":  # ours is a range too (low..high): it must lie inside the paper's
        met = "yes" if paper_f <= lo and hi <= top else "no"
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
        low=lo,
        high=hi,
        width=(hi - lo) / abs(ours_f) if ours_f and math.isfinite(ours_f) else math.nan,
        verdict=verdict(comparison, paper_f, lo, hi, top),
        kind=kind,
        paper_high=top,
    )


def verdict(comparison: str, paper: float, low: float, high: float, paper_high: float = math.nan) -> str:
    """``consistent`` when the paper's value lies inside our interval ``[low, high]`` as the claim's
    words compare (a number within 25%: ``paper`` in ``[low / 1.25, high / 0.75]``, so a zero-width
    interval is the point rule; ``at least`` / ``holds``: ``high >= paper``; ``range``: ours, a
    range itself, lies inside ``[paper, paper_high]``), ``contradicted`` when it lies outside, ``untestable`` without
    a number on both sides."""
    if not all(math.isfinite(x) for x in (paper, low, high)):
        return "untestable"
    if comparison == "range":
        inside = paper <= low and high <= paper_high
    elif comparison in ("at least", "holds"):
        inside = high >= paper
    elif paper == 0:
        inside = low <= 0 <= high
    else:
        a, b = sorted((low / (1 + WITHIN), high / (1 - WITHIN)))
        inside = a <= paper <= b
    return "consistent" if inside else "contradicted"


def with_interval(row: dict, values) -> dict:
    """``row`` (from :func:`claim`) with ``low`` / ``high`` the hull of its ``ours`` and ``values``
    (ours at the ends of the protocol's intervals; NaNs ignored), and its ``width`` and ``verdict``
    recomputed from them."""
    ours = float(row["ours"])
    vals = [ours] + [float(v) for v in values if v is not None and math.isfinite(float(v))]
    lo, hi = min(vals), max(vals)
    return dict(
        row,
        low=lo,
        high=hi,
        width=(hi - lo) / abs(ours) if ours and math.isfinite(ours) else math.nan,
        verdict=verdict(row["comparison"], float(row["paper"]), lo, hi, float(row.get("paper_high", math.nan))),
    )


#: Notebooks whose rows are formula checks (the unifying document's counts by its own formulas).
FORMULA_NOTEBOOKS = ("05_unified_schedules",)


def claim_kind(notebook: str, row: Mapping) -> str:
    """The :data:`KINDS` of a ``claims.csv`` row: its own ``kind`` where set, else from its words:
    a qualitative statement (``holds``), an in-sample fit, a formula check (the unifying document's
    counts, a closed-form bubble), a repeat (an abstract's "up to" over rows counted already, a
    row on this machine of a number modeled in another row), else a measured number."""
    own = str(row.get("kind") or "")
    if own in KINDS:
        return own
    text = str(row.get("claim", ""))
    if row.get("comparison") == "holds":
        return "qualitative"
    if row.get("fit") == "in-sample":
        return "in-sample"
    if notebook in FORMULA_NOTEBOOKS or "bubble fraction =" in text:
        return "formula"
    if " abstract: " in text or "(this machine)" in text:
        return "repeat"
    return "measured"


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
    for c, default in (("low", df.get("ours")), ("high", df.get("ours")), ("width", math.nan), ("verdict", ""),
                       ("kind", ""), ("paper_high", math.nan)):  # fmt: skip
        if c not in df.columns and default is not None:
            df[c] = default
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

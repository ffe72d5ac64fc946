"""summary.md's counts by kind equal a recount of claims.csv: each row's kind and verdict read back
with the csv module, every verdict recomputed from its paper value, interval and comparison."""

import csv
import math
from pathlib import Path

import pandas as pd
import pytest

from repro import common
from repro.reproduce import kind_counts, summary_markdown


def _recount(claims_csv: Path) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    with claims_csv.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            paper, low, high = (float(row[k]) if row[k] else math.nan for k in ("paper", "low", "high"))
            top = float(row["paper_high"]) if row.get("paper_high") else math.nan
            v = common.verdict(row["comparison"], paper, low, high, top)
            assert v == row["verdict"], f"{row['claim']!r}: stored verdict {row['verdict']}, recomputed {v}"
            c = out.setdefault(row["kind"], dict(rows=0, consistent=0, contradicted=0, untestable=0, met=0))
            c["rows"] += 1
            c[v] += 1
            c["met"] += row["met"] == "yes"
    return out


def _summary_counts(summary: str) -> dict[str, dict[str, int]]:
    lines = summary.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("## Counts by kind"))
    table = [ln for ln in lines[start + 1 :] if ln.startswith("| ")]
    table = table[: next((i for i, ln in enumerate(table[1:], 1) if not ln.startswith("| ")), len(table))]
    header = [c.strip() for c in table[0].strip("|").split("|")]
    out = {}
    for ln in table[1:]:
        cells = dict(zip(header, (c.strip() for c in ln.strip("|").split("|"))))
        if cells.get("kind") in common.KINDS:
            out[cells["kind"]] = dict(
                rows=int(cells["rows"]),
                consistent=int(cells["consistent"]),
                contradicted=int(cells["contradicted"]),
                untestable=int(cells["untestable"]),
                met=int(cells["met_at_point"]),
            )
    return out


def _toy_run(tmp_path: Path) -> Path:
    rows = [
        common.claim("e", "a measured point", 2.0, 2.2, "x", label="modeled (toy)"),
        common.claim("e", "a wide one", 5.0, 2.0, "x", label="modeled (toy)", low=1.5, high=4.5),
        common.claim("e", "a fit", 1.0, 1.0, "x", label="modeled (toy)", fit="in-sample"),
        common.claim("e", "words", 3, 2, "cases", label="modeled (toy)", comparison="holds"),
        common.claim("e", "SOSP abstract: up to", 5.3, 4.0, "x", label="modeled (toy)", comparison="up to"),
        common.claim(
            "e", "a range", 2.6, 3.7, "x", label="modeled (toy)", comparison="range", paper_high=15, low=3.7, high=5.5
        ),  # fmt: skip
        common.claim("e", "no number here", math.nan, 1.0, "x", label="measured (toy)"),
    ]
    nb = tmp_path / "02_dp_communication_overhead"
    nb.mkdir(parents=True)
    common.write_claims(rows, nb)
    return tmp_path


def _check(run: Path, summary: str):
    recount = _recount(run / "claims.csv")
    assert _summary_counts(summary) == recount
    return recount


def test_the_counts_by_kind_are_a_recount_of_claims_csv(tmp_path):
    from repro.reproduce import Outcome, collect_claims

    run = _toy_run(tmp_path)
    claims = collect_claims(run)
    claims.to_csv(run / "claims.csv", index=False)
    summary = summary_markdown(run, [Outcome("02_dp_communication_overhead", "ok")], True, claims)
    recount = _check(run, summary)
    assert recount["measured"] == dict(rows=4, consistent=3, contradicted=0, untestable=1, met=2)
    assert recount["repeat"]["rows"] == 1 and recount["qualitative"] == dict(
        rows=1, consistent=0, contradicted=1, untestable=0, met=0
    )
    assert summary.index("## What this reproduction can and cannot say") < summary.index("## Counts by kind")


def test_a_wrong_count_is_caught(tmp_path):
    from repro.reproduce import Outcome, collect_claims

    run = _toy_run(tmp_path)
    claims = collect_claims(run)
    claims.to_csv(run / "claims.csv", index=False)
    summary = summary_markdown(run, [Outcome("02_dp_communication_overhead", "ok")], True, claims)
    broken = summary.replace("| measured |", "| in-sample |", 1)
    assert _summary_counts(broken) != _recount(run / "claims.csv")


def test_verdicts_follow_the_words():
    v = common.verdict
    assert v("point", 2.0, 2.2, 2.2) == "consistent" and v("point", 5.0, 2.0, 2.0) == "contradicted"
    assert v("point", 5.0, 2.0, 4.5) == "consistent"  # inside [2 / 1.25, 4.5 / 0.75]
    assert v("at least", 90, 73, 80) == "contradicted" and v("at least", 90, 73, 95) == "consistent"
    assert v("range", 2.6, 3.76, 5.5, 15) == "consistent" and v("range", 2.6, 1.0, 5.5, 15) == "contradicted"
    assert v("point", math.nan, 1, 1) == "untestable"


def test_committed_run_counts_are_a_recount(committed_run):
    summary = (committed_run / "summary.md").read_text()
    if "## Counts by kind" not in summary:
        pytest.fail("the committed run predates the counts by kind: regenerate it with the present code")
    _check(committed_run, summary)
    claims = pd.read_csv(committed_run / "claims.csv")
    assert kind_counts(claims)["rows"].sum() == len(claims)

"""The papers' data files (notebooks/repro/data/*.csv): every row says where it comes from,
the experiments read them, and they ship with the package."""

from __future__ import annotations

import csv
from fnmatch import fnmatch
from pathlib import Path

import pytest

from repro import common, paper_fit

ROOT = Path(__file__).resolve().parents[1]
FILES = ("settings.csv", "paper_numbers.csv", "paper_claims.csv")


def _rows(name: str) -> list[dict[str, str]]:
    with (common.DATA / name).open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize("name", FILES)
def test_every_row_names_its_source(name):
    rows = _rows(name)
    assert rows, f"{name} is empty"
    for r in rows:
        assert r["source"].strip(), f"{name}: a row without a source: {r}"
        if "paper_version" in r:
            assert r["paper_version"] in ("arXiv:1806.03377v1", "SOSP 2019"), r


def test_experiments_read_the_files():
    numbers = _rows("paper_numbers.csv")
    assert len(paper_fit.PAPER) == len(numbers)
    for num, r in zip(paper_fit.PAPER, numbers):
        assert (num.setting, num.quantity, num.paper, num.where) == (
            r["setting"],
            r["quantity"],
            float(r["paper"]),
            r["source"],
        )
    assert list(paper_fit.SETTINGS) == [r["key"] for r in _rows("settings.csv")]
    for r in _rows("paper_claims.csv"):
        assert common.paper_value(r["key"]) == float(r["paper"])


def test_settings_parse_to_link_rates():
    a, b = paper_fit.SETTINGS["arxiv-A"], paper_fit.SETTINGS["sosp-B"]
    assert a.inter_bytes_s == 25e9 / 8 and a.intra_bytes_s is None and a.gpus_per_machine == 1
    assert b.inter_bytes_s == 25e9 / 8 and b.intra_bytes_s == 25e9 and b.gpus_per_machine == 8


def test_unknown_paper_value_is_one_clear_error():
    with pytest.raises(ValueError, match="no paper number 'nope'"):
        common.paper_value("nope")


def test_data_files_are_package_data():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["repro"]
    for name in FILES:
        rel = f"data/{name}"
        assert any(fnmatch(rel, g) for g in globs), f"{rel} is not in pyproject's package-data"

"""The README's tour, run as written (its paths moved under a temporary folder): the profile,
partition and simulate commands end in a simulated steady state equal to the plan's prediction,
and write nothing outside their --out paths."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from workbench.cli.commands import main

README = Path(__file__).resolve().parents[1] / "README.md"


def tour_commands() -> list[list[str]]:
    text = README.read_text()
    block = text[text.index("## A short tour") :]
    block = block[block.index("```bash") + 7 : block.index("```", block.index("```bash") + 7)]
    cmds = [shlex.split(line.split("#")[0]) for line in block.splitlines() if line.strip()]
    return [c[1:] for c in cmds if c and c[0] == "workbench"]


def test_the_tour_writes_under_results_tour_and_simulates_a_steady_state(tmp_path, capsys, monkeypatch):
    cmds = [c for c in tour_commands() if c[0] in ("partition", "simulate") or "--pipedream" in c]
    assert [c[0] for c in cmds] == ["profile", "partition", "simulate"]
    assert all(a.startswith("results/tour/") for c in tour_commands() for a in c if "/" in a)
    monkeypatch.chdir(tmp_path)
    for c in cmds:
        assert main(c) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("plan: predicted"))
    m = re.match(r"plan: predicted ([\d.]+) ms/minibatch \(cost model\) vs simulated ([\d.]+) ms/minibatch", line)
    assert m, line
    assert abs(float(m[1]) / float(m[2]) - 1) < 0.05
    assert [p.name for p in tmp_path.iterdir()] == ["results"]


def test_the_seq1f1b_examples_of_docs_schedules_show_a_steady_state(tmp_path, capsys):
    text = (README.parent / "docs" / "seq1f1b.md").read_text().replace("\\\n", " ")
    cmds = [shlex.split(ln)[1:] for ln in text.splitlines() if ln.startswith("workbench simulate --schedule seq1f1b")]
    assert len(cmds) == 2
    for k, c in enumerate(cmds):
        assert main([*c, "--out", str(tmp_path / f"s{k}")]) == 0
        first = capsys.readouterr().out.splitlines()[1]
        assert first.startswith("time per minibatch ") and "no steady state" not in first, first

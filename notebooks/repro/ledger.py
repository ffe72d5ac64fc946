"""The protocol's ledger, derived from git history: for every entry of ``data/protocol.toml``, the
commit that set its present value, the value it held before, and whether a committed run
(``results/reproduce/<run>/claims.csv``) had already shown the rows it moves when it was set.

An entry *moves* a row when the row's ``protocol`` cell names it; a run *showed* that row when it
holds a row of the same claim or a row whose ``protocol`` cell names the entry. Nothing here is
typed by hand: every field is read from ``git log`` and ``git show``. Without a git history (an
exported tree, a shallow clone) :func:`ledger` raises :class:`NoHistory` saying so.
"""

from __future__ import annotations

import csv
import io
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import tomllib

from repro import protocol

RUN_CLAIMS = re.compile(r"^results/reproduce/[^/]+/claims\.csv$")


class NoHistory(RuntimeError):
    """The checkout has no git history to derive the ledger from."""


@dataclass(frozen=True)
class Entry:
    """One protocol entry's line of the ledger."""

    key: str
    value: object
    set_commit: str
    set_time: int
    previous: object  # the value held before (None: the entry was new)
    rows_moved: int  # rows of the latest committed run whose protocol cell names the entry
    shown_by: str  # the first committed run, added before set_commit, that showed those rows ("" if none)

    @property
    def seen_before_set(self) -> bool:
        """A committed run had shown the rows this entry moves before its value was set."""
        return bool(self.shown_by)

    @property
    def changed_after_seen(self) -> bool:
        """The entry's value *changed* after a committed run had shown its rows (a new entry that
        wrote down a choice the code already made is only :attr:`seen_before_set`). Such an entry
        decides no headline: its rows are judged over its whole interval (:func:`protocol.interval`)."""
        return self.previous is not None and self.seen_before_set


def _git(root: Path, *args: str) -> str:
    try:
        out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise NoHistory(f"git is not available here ({e}); the ledger needs a clone with its history") from None
    if out.returncode != 0:
        raise NoHistory(f"git {' '.join(args[:2])} failed: {out.stderr.strip()[:200]}")
    return out.stdout


def repo_root() -> Path:
    return Path(_git(protocol.PATH.parent, "rev-parse", "--show-toplevel").strip())


def _flat(text: str) -> dict[str, object]:
    out: dict[str, object] = {}

    def walk(prefix: str, node: dict) -> None:
        for k, v in node.items():
            key = f"{prefix}.{k}" if prefix else k
            if isinstance(v, dict) and "value" in v:
                out[key] = v["value"]
            elif isinstance(v, dict):
                walk(key, v)

    try:
        walk("", tomllib.loads(text))
    except tomllib.TOMLDecodeError:
        return {}
    return out


def protocol_history(root: Path) -> list[tuple[str, int, dict[str, object]]]:
    """``(commit, time, {key: value})`` of every commit that touched the protocol file (under any
    of its paths, ``git log --follow``), oldest first."""
    rel = protocol.PATH.resolve().relative_to(root)
    log = _git(root, "log", "--follow", "--format=@%H %ct", "--name-only", "--", str(rel))
    commits, current = [], None
    for line in log.splitlines():
        if line.startswith("@"):
            sha, t = line[1:].split()
            current = [sha, int(t), None]
            commits.append(current)
        elif line.strip() and current is not None and current[2] is None:
            current[2] = line.strip()
    if len(commits) < 1:
        raise NoHistory("the protocol file has no commits in this checkout's history")
    out = []
    for sha, t, path in reversed(commits):
        try:
            text = _git(root, "show", f"{sha}:{path}")
        except NoHistory:
            continue  # the commit deleted the file at that path
        out.append((sha, t, _flat(text)))
    return out


def committed_runs(root: Path) -> list[tuple[str, int, str, list[dict]]]:
    """``(commit, time, run path, claim rows)`` of every commit that added a run's ``claims.csv``
    (added or renamed into place), oldest first."""
    log = _git(root, "log", "-M", "--format=@%H %ct", "--name-status", "--", "results/reproduce")
    runs, sha, t = [], "", 0
    for line in log.splitlines():
        if line.startswith("@"):
            sha, t = line[1:].split()[0], int(line[1:].split()[1])
            continue
        parts = line.split("\t")
        if len(parts) >= 2 and parts[0][:1] in "AR" and RUN_CLAIMS.match(parts[-1]):
            text = _git(root, "show", f"{sha}:{parts[-1]}")
            runs.append((sha, t, parts[-1], list(csv.DictReader(io.StringIO(text)))))
    return sorted(runs, key=lambda r: r[1])


def _names(row: dict, key: str) -> bool:
    return key in protocol.parse_used(row.get("protocol", ""))


def ledger(root: Path | None = None) -> list[Entry]:
    """Every present protocol entry with the commit that set its value and whether a committed run
    had shown the rows it moves before that commit (module docstring)."""
    root = root or repo_root()
    history = protocol_history(root)
    runs = committed_runs(root)
    latest = runs[-1][3] if runs else []
    out = []
    for key, e in protocol.entries().items():
        value = e["value"]
        set_sha, set_t, previous, current = "", 0, None, None
        for sha, t, values in history:
            if key in values and (not set_sha or values[key] != current):
                set_sha, set_t, previous = sha, t, (current if set_sha else None)
            current = values.get(key)
        moved = [r for r in latest if _names(r, key)]
        claims = {r["claim"] for r in moved}
        shown = next(
            (
                path.split("/")[2]
                for sha, t, path, rows in runs
                if t < set_t and any(r.get("claim") in claims or _names(r, key) for r in rows)
            ),
            "",
        )
        out.append(Entry(key, value, set_sha, set_t, previous, len(moved), shown))
    return out


def table(entries: list[Entry]):
    """The ledger as a DataFrame (``ledger.csv``)."""
    import pandas as pd

    return pd.DataFrame(
        [
            dict(
                key=e.key,
                value=protocol.text_of(e.key),
                set_commit=e.set_commit[:12],
                previous=e.previous if e.previous is not None else "",
                rows_moved=e.rows_moved,
                seen_before_set="yes" if e.seen_before_set else "no",
                changed_after_seen="yes" if e.changed_after_seen else "no",
                shown_by=e.shown_by,
                interval="yes" if e.key in protocol.intervals() else "no",
            )
            for e in entries
        ]
    )

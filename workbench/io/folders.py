"""Safe output folders: nothing already written under ``results/`` is ever lost.

Every command writes into a fresh temporary folder beside its destination and renames it into
place only when it finished; an existing destination is never overwritten (a new run folder with a
numeric suffix is used instead).
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
from datetime import datetime, timezone
from pathlib import Path


def fresh_path(dest) -> Path:
    """``dest`` if it does not exist yet, else the first free of ``dest-2``, ``dest-3``, ... for a
    folder (``run-2``) and ``stem-2.suffix`` ... for a file (``plan.json`` -> ``plan-2.json``: the
    suffix is kept, so tools still recognise the file type)."""
    dest = Path(dest)
    if not dest.exists():
        return dest
    stem, suffix = (dest.name, "") if dest.is_dir() else (dest.stem, dest.suffix)
    for k in range(2, 10_000):
        cand = dest.with_name(f"{stem}-{k}{suffix}")
        if not cand.exists():
            return cand
    raise ValueError(f"too many runs named {dest}; choose another --out")


def run_id(prefix: str) -> str:
    return f"{prefix}-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}"


@contextlib.contextmanager
def run_folder(dest):
    """Yield a temporary folder; on success move it to ``fresh_path(dest)``. The final path is
    available as ``tmp.final`` after the block (``tmp`` is a :class:`RunFolder`)."""
    dest = Path(dest)
    check_writable(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent))
    box = RunFolder(tmp)
    try:
        yield box
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    final = fresh_path(dest)
    os.rename(tmp, final)
    box.final = final


def check_writable(dest) -> None:
    """One ValueError line when the output ``dest`` cannot be written: a folder above it exists as a
    file, or the nearest existing folder above it is read-only. Commands call it before their work,
    so a bad ``--out`` fails before anything is computed or printed."""
    for up in Path(dest).parents:
        if up.exists():
            if not up.is_dir():
                raise ValueError(
                    f"{up} is a file, not a folder; give an output folder (--out) that is not inside a file"
                )
            if not os.access(up, os.W_OK | os.X_OK):
                raise ValueError(
                    f"cannot write {dest}: the folder {up} is read-only; give --out a folder you can write"
                )
            return


class RunFolder(type(Path())):  # type: ignore[misc]  # a Path that remembers where it ended up (PosixPath/WindowsPath)
    final: Path | None = None


def json_ready(x):
    """``x`` with plain JSON types only: dicts (string keys) and lists recursively, numpy numbers as
    Python numbers, non-finite floats as None, anything else as its ``str``."""
    if isinstance(x, dict):
        return {str(k): json_ready(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [json_ready(v) for v in x]
    if isinstance(x, (bool, str)) or x is None:
        return x
    if hasattr(x, "dtype") and getattr(x, "ndim", 1) == 0:  # a numpy scalar
        x = x.item()
    if isinstance(x, int):
        return x
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    return str(x)

"""The house stays readable, package-wide: no function longer than 80 lines, and no underscore name
imported from another module (what two modules share is public, or lives with its owner), in the
library, the reproduction beside the notebooks and the notebooks themselves, and the tests, benchmarks and
scripts that use them.
Both checks read the source with ``ast``; a test shows each finds what it looks for."""

from __future__ import annotations

import ast
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: where functions stay within 80 lines: the library and the reproduction
CODE = ("workbench", "notebooks/repro")
#: where no underscore name of ours is imported: those, and every script and test that imports them
IMPORTERS = (*CODE, "tests", "benchmarks", "scripts")
OURS = ("workbench", "repro")
MOST_LINES = 80


def python_files(folders: tuple[str, ...]) -> list[Path]:
    return sorted(p for folder in folders for p in (REPO / folder).rglob("*.py") if "__pycache__" not in p.parts)


def long_functions(source: str, where: str, most: int = MOST_LINES) -> list[str]:
    """``where:line name (n lines)`` of every function (or method) longer than ``most`` lines."""
    return [
        f"{where}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > most
    ]


def private_imports(source: str, where: str) -> list[str]:
    """``from M import _name`` where ``M`` is one of our modules (absolute, or relative inside a
    package); dunder names such as ``__version__`` are not private."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ImportFrom):
            continue
        module = node.module or ""
        if node.level == 0 and module.split(".")[0] not in OURS:
            continue
        found += [
            f"{where}: from {'.' * node.level}{module} import {a.name}"
            for a in node.names
            if a.name.startswith("_") and not a.name.startswith("__")
        ]
    return found


def test_the_checks_find_what_they_look_for():
    body = "\n".join(f"    x = {i}" for i in range(MOST_LINES))
    assert long_functions(f"def f():\n{body}\n", "m") == ["m:1 f (81 lines)"]
    assert long_functions(f"def f():\n{body}\n", "m", most=81) == []
    src = (
        "from workbench.a import _x, y, __version__\nfrom numpy import _p\nfrom .b import _z\nfrom repro.c import _w\n"
    )
    assert private_imports(src, "s") == [
        "s: from workbench.a import _x",
        "s: from .b import _z",
        "s: from repro.c import _w",
    ]


def test_the_walk_sees_the_code():
    files = {str(p.relative_to(REPO)) for p in python_files(IMPORTERS)}
    assert "workbench/runtime/executors/pipeline.py" in files and "notebooks/repro/reproduce.py" in files
    assert len(files) > 200


def test_no_function_is_longer_than_80_lines():
    found = [f for p in python_files(CODE) for f in long_functions(p.read_text(), str(p.relative_to(REPO)))]
    assert found == []


def notebook_code(path: Path) -> str:
    """A notebook's code cells as one source (IPython's ``%`` and ``!`` lines left out)."""
    cells = json.loads(path.read_text())["cells"]
    lines = [ln for c in cells if c["cell_type"] == "code" for ln in "".join(c["source"]).splitlines()]
    return "\n".join(ln for ln in lines if not ln.lstrip().startswith(("%", "!")))


def test_no_underscore_name_is_imported_from_another_module():
    found = [f for p in python_files(IMPORTERS) for f in private_imports(p.read_text(), str(p.relative_to(REPO)))]
    found += [
        f
        for p in sorted((REPO / "notebooks").glob("*.ipynb"))
        for f in private_imports(notebook_code(p), str(p.relative_to(REPO)))
    ]
    assert found == []

"""The runtime's executors, semantics, calibration and the rank side of launch stay readable: no
function longer than 80 lines, and no underscore name crosses a module boundary into or out of them
(what two modules share is public, or lives with its owner)."""

from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[1] / "workbench" / "runtime"
PACKAGE = RUNTIME.parent

#: the modules these checks cover (the runtime's other modules are checked where they are refactored)
ROOMS = sorted(
    [p for room in ("executors", "semantics", "calibration") for p in (RUNTIME / room).glob("*.py")]
    + [RUNTIME / "launch" / f"{name}.py" for name in ("rank", "outputs", "job", "jobspec")]
    + [RUNTIME / "transport" / "messages.py"]
)


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def long_functions(source: str, where: str, most: int = 80) -> list[str]:
    return [
        f"{where}:{node.lineno} {node.name} ({node.end_lineno - node.lineno + 1} lines)"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno + 1 > most
    ]


def private_imports(source: str, where: str, only_from: tuple[str, ...] | None = None) -> list[str]:
    """``from M import _name`` in ``source`` (dunder names are not private); ``only_from``: only
    where ``M`` is one of these modules."""
    return [
        f"{where}: from {node.module} import {alias.name}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.ImportFrom) and (only_from is None or node.module in only_from)
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    ]


def test_the_rooms_are_found():
    names = {module_name(p) for p in ROOMS}
    assert {"workbench.runtime.executors.pipeline", "workbench.runtime.calibration.machine"} <= names
    assert len(ROOMS) > 15


def test_the_checks_find_what_they_look_for():
    body = "\n".join(f"    x = {i}" for i in range(80))
    assert long_functions(f"def f():\n{body}\n", "m") == ["m:1 f (81 lines)"]
    assert long_functions(f"def f():\n{body}\n", "m", most=81) == []
    assert private_imports("from a.b import _x, y, __version__\n", "s") == ["s: from a.b import _x"]
    assert private_imports("from a.b import _x\n", "s", only_from=("c",)) == []


def test_no_function_in_the_rooms_is_longer_than_80_lines():
    found = [f for p in ROOMS for f in long_functions(p.read_text(), str(p.relative_to(PACKAGE)))]
    assert found == []


def test_the_rooms_import_no_underscore_name():
    found = [f for p in ROOMS for f in private_imports(p.read_text(), str(p.relative_to(PACKAGE)))]
    assert found == []


def test_nothing_imports_an_underscore_name_of_the_rooms():
    """Neither the package nor its tests, benchmarks, scripts and notebooks' modules."""
    rooms, repo = tuple(module_name(p) for p in ROOMS), PACKAGE.parent
    found = [
        f
        for folder in ("workbench", "tests", "benchmarks", "scripts", "notebooks")
        for p in sorted((repo / folder).rglob("*.py"))
        for f in private_imports(p.read_text(), str(p.relative_to(repo)), only_from=rooms)
    ]
    assert found == []

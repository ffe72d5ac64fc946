"""The package's import graph has no circle: every ``import`` and ``from ... import`` of workbench
modules, at module level and inside functions (a function-local import can hide a circle), read from
the source with ``ast``; a package's ``__init__`` importing its own submodules is no circle unless a
submodule imports the package back."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "workbench"


def modules() -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for name, (path, is_pkg) in mods.items():
        here = name.split(".") if is_pkg else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[: len(here) - (node.level - 1)] + ([node.module] if node.module else [])
                    target = ".".join(base)
                else:
                    target = node.module or ""
                for alias in node.names:  # a submodule by name, else the module the names come from
                    sub = f"{target}.{alias.name}"
                    if sub in mods:
                        graph[name].add(sub)
                    elif target in mods:
                        graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module, or a module importing itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in graph[v]:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_the_import_graph_has_no_circle():
    graph = import_graph()
    assert len(graph) > 50 and sum(map(len, graph.values())) > 100  # the walk sees the package
    assert cycles(graph) == []


def test_the_walk_finds_a_circle_when_there_is_one():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


#: the package's floors, lowest first: a module imports only its own floor or lower ones
LAYERS = (
    "io",
    "models",
    "profiling",
    "cost",
    "schedules",
    "simulation",
    "partitioning",
    "runtime",
    "viz",
    "experiments",
    "cli",
)


def floor(module: str) -> int:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 else len(LAYERS)  # the package's __init__ is the top


def test_the_package_root_holds_only_the_floors():
    entries = {p.name for p in ROOT.iterdir() if p.name != "__pycache__"}
    assert entries == {"__init__.py", *LAYERS}


def test_imports_run_down_the_floors_never_up():
    up = sorted(
        (m, t) for m, targets in import_graph().items() for t in targets if m != "workbench" and floor(t) > floor(m)
    )
    assert up == []


def reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen, todo = set(), [start]
    while todo:
        for t in graph[todo.pop()] - seen:
            seen.add(t)
            todo.append(t)
    return seen


def test_the_dynamic_program_is_pure_and_refinement_sits_above_it():
    graph = import_graph()
    for pure in ("dynamic_program", "pipedream_optimizer", "antichain"):
        below = reachable(graph, f"workbench.partitioning.{pure}")
        assert not {m for m in below if m.split(".")[1] in ("schedules", "simulation")}, pure
    search = reachable(graph, "workbench.partitioning.search")
    assert "workbench.simulation" in search and "workbench.partitioning.dynamic_program" in search


def test_no_function_shares_its_name_with_its_module():
    """A function named like its module (or a package exporting a name of one of its submodules)
    makes ``import a.b`` and ``a.b(...)`` the same attribute; no module does that."""
    clash = []
    for path in ROOT.rglob("*.py"):
        own = path.parent.name if path.stem == "__init__" else path.stem
        subs = {p.stem for p in path.parent.glob("*.py")} | {p.name for p in path.parent.iterdir() if p.is_dir()}
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == own:
                clash.append(f"{path.relative_to(ROOT)}:{node.name}")
            if path.stem == "__init__" and isinstance(node, ast.ImportFrom):
                clash += [
                    f"{path.relative_to(ROOT)}:{a.asname or a.name}"
                    for a in node.names
                    if (a.asname or a.name) in subs and node.module and not node.module.endswith(a.name)
                ]
    assert clash == []

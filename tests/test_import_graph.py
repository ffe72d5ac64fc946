"""The package's import graph has no circle: every ``import`` and ``from ... import`` of workbench
modules, at module level and inside functions (a function-local import can hide a circle), read from
the source with ``ast``; a package's ``__init__`` importing its own submodules is no circle unless a
submodule imports the package back."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
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
    pure_modules = ("dynamic_program", "pipedream_optimizer", "antichain", "inputs", "level", "crossing")
    pure_modules += ("reconstruction", "infeasible", "pricing", "options", "candidates", "baselines")
    for pure in pure_modules:
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


# Function-local imports: only heavy optional dependencies (kept out of ``workbench --help`` and out
# of modules that must import without them), or, inside workbench/cli/, the workbench modules a
# command needs (so that the CLI's parser stays light).
HEAVY_OPTIONAL = {
    "torch",
    "plotly",
    "ipywidgets",
    "IPython",
    "papermill",
    "transformers",
    "scipy",
    "sklearn",
    "mnist1d",
    "yaml",
    "tqdm",
    "playwright",
}
# The CLI loads its commands' module (workbench.cli.actions) with one lazy import; what is left is
# heavy optional packages (papermill, plotly, transformers, ...) kept out of `workbench --help`.
MOST_LOCAL_IMPORTS = 40


def local_imports(root: Path = ROOT) -> list[tuple[str, int, str]]:
    """(file, line, imported module) of every import inside a function of the package."""
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = str(path.relative_to(root.parent))
        for fn in ast.walk(ast.parse(path.read_text())):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    out += [(rel, node.lineno, a.name) for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    out.append((rel, node.lineno, "." * node.level + (node.module or "")))
    return sorted(set(out))


def test_function_local_imports_are_few_and_each_for_a_heavy_optional_dependency():
    found = local_imports()
    wrong = [
        f"{f}:{line} imports {mod}"
        for f, line, mod in found
        if mod.split(".")[0] not in HEAVY_OPTIONAL
        and not (f.startswith("workbench/cli/") and mod.split(".")[0] in ("workbench", "pandas"))
    ]
    assert not wrong, "function-local imports of light modules (hoist them):\n" + "\n".join(wrong)
    assert len(found) <= MOST_LOCAL_IMPORTS, f"{len(found)} function-local imports (at most {MOST_LOCAL_IMPORTS})"


def test_the_local_import_count_sees_a_nested_import(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "m.py").write_text("import os\n\ndef f():\n    def g():\n        import torch\n    return g\n")
    assert local_imports(pkg) == [("pkg/m.py", 5, "torch")]  # the nested one, not the module-level one


def test_the_cli_commands_import_neither_torch_nor_pandas():
    code = "import sys, workbench.cli.commands; print(sorted({'torch', 'pandas', 'plotly'} & set(sys.modules)))"
    env = {**os.environ, "PYTHONPATH": str(ROOT.parent)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, check=True)
    assert out.stdout.strip() == "[]", out.stdout


MOST_POSITIONAL = 5


def positional_heavy(tree: ast.AST) -> list[tuple[int, str, int]]:
    """(line, name, count) of every function, method or nested function taking more than
    MOST_POSITIONAL positional parameters (``self``/``cls`` not counted)."""
    out = []
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            names = [a.arg for a in fn.args.posonlyargs + fn.args.args]
            if names and names[0] in ("self", "cls"):
                names = names[1:]
            if len(names) > MOST_POSITIONAL:
                out.append((fn.lineno, getattr(fn, "name", "<lambda>"), len(names)))
    return out


def test_no_function_takes_more_than_five_positional_parameters():
    found = [
        f"{path.relative_to(ROOT.parent)}:{line} {name} ({n} positional)"
        for path in sorted(ROOT.rglob("*.py"))
        for line, name, n in positional_heavy(ast.parse(path.read_text()))
    ]
    assert not found, "make the options keyword-only (*) or group them:\n" + "\n".join(found)


def test_the_positional_check_sees_methods_and_nested_functions():
    src = (
        "class C:\n    def m(self, a, b, c, d, e, f): pass\n"
        "def outer():\n    def inner(a, b, c, d, e, f): pass\n"
        "def fine(a, b, c, d, e, *, f): pass\n"
    )
    assert [name for _, name, _ in positional_heavy(ast.parse(src))] == ["m", "inner"]

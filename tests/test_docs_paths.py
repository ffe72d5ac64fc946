"""Every file path and module name that README.md and docs/*.md name exists in the checkout.

Paths (``workbench/...``, ``tests/...``, ``scripts/...``, ``benchmarks/...``, ``notebooks/...``,
``docs/...``) and relative markdown link targets (``results/...`` included) must exist as files or
folders (``results/...`` named outside a link is what a command writes, so it is not checked), and
so must a path inside the package (``runtime/comm.py``); a dotted name ``workbench.a.b[.attr]`` (or ``a.b[.attr]`` where ``a`` is a folder of the package)
must resolve to a module (``workbench/a/b.py`` or a package) and, where a name follows the module,
to a top-level definition or import of that module (read with ``ast``; nothing is imported); so must
``repro.a[.attr]``, a module of the reproduction beside the notebooks (``notebooks/repro/a.py``)."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

PATH = re.compile(r"(?<![\w./-])((?:workbench|tests|scripts|benchmarks|notebooks|docs)/[\w./*-]*[\w*/])")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")  # a markdown link's target, without its anchor
MODULE = re.compile(r"(?<![\w./-])(workbench(?:\.\w+)+)")
#: the package's floors (workbench/__init__.py), and former names of floors that a stale doc may still use
FLOORS = (
    "io|models|profiling|cost|schedules|simulation|partitioning|runtime|viz|cli"
    "|experiments|simulate|partition|calibrate|calibration|costmodel|profiler"
)
#: ``repro.paper_fit`` (a module of the reproduction beside the notebooks, notebooks/repro/)
REPRO_MODULE = re.compile(r"(?<![\w./-])(repro(?:\.\w+)+)")
#: ``runtime/comm.py`` (a path inside the package) and ``simulation.sweep.x`` (a module without ``workbench.``)
SHORT_PATH = re.compile(rf"(?<![\w./-])((?:{FLOORS})/[\w/]+\.py)\b")
FILE = re.compile(r"\.(?:csv|html|json|md|py|txt|ipynb)$")  # ``partition.csv`` is a file, not a module
SHORT_MODULE = re.compile(rf"(?<![\w./-])((?:{FLOORS})(?:\.\w+)+)")


def _names(path: Path) -> list[tuple[str, str]]:
    text = path.read_text(encoding="utf-8")
    out = [("path", m.group(1)) for m in PATH.finditer(text)]
    out += [("module", m.group(1)) for m in MODULE.finditer(text)]
    out += [("path", "workbench/" + m.group(1)) for m in SHORT_PATH.finditer(text)]
    out += [("module", "workbench." + m.group(1)) for m in SHORT_MODULE.finditer(text) if not FILE.search(m.group(1))]
    out += [("module", m.group(1)) for m in REPRO_MODULE.finditer(text) if not FILE.search(m.group(1))]
    out += [("link", m.group(1)) for m in LINK.finditer(text) if "://" not in m.group(1)]
    return out


@cache
def _top_level(module_file: Path) -> frozenset[str]:
    """Names a module defines or imports at top level (functions, classes, assignments, imports)."""
    tree = ast.parse(module_file.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                names.update(n.id for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    if module_file.name == "__init__.py":  # a package's modules are its attributes too
        names.update(p.stem for p in module_file.parent.glob("*.py"))
        names.update(p.name for p in module_file.parent.iterdir() if (p / "__init__.py").exists())
        tree_text = module_file.read_text(encoding="utf-8")
        names.update(re.findall(r'"(\w+)": (?:"(?:workbench)?\.|None)', tree_text))  # lazy exports (PEP 562)
    return frozenset(names)


def _resolve_module(dotted: str) -> str | None:
    """``None`` if ``dotted`` names an existing module (and attribute), else why not."""
    parts = dotted.split(".")
    for k in range(len(parts), 0, -1):
        base = (ROOT / "notebooks" if parts[0] == "repro" else ROOT).joinpath(*parts[:k])
        module_file = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if not module_file.exists():
            continue
        rest = parts[k:]
        if k == 1 and len(rest) > 1:  # workbench.<export>.<more>: the export is a function or class
            return f"workbench has no module {rest[0]!r}"
        if not rest or rest[0] in _top_level(module_file):
            return None
        return f"{'.'.join(parts[:k])} has no top-level name {rest[0]!r}"
    return "no such module"


def _cases():
    for doc in DOCS:
        for kind, name in sorted(set(_names(doc))):
            yield pytest.param(doc, kind, name, id=f"{doc.name}:{name}")


def test_docs_name_something():
    """The patterns find references at all (a test that matches nothing checks nothing)."""
    found = [n for d in DOCS for n in _names(d)]
    assert any(k == "path" for k, _ in found) and any(k == "module" for k, _ in found)


@pytest.mark.parametrize("doc,kind,name", list(_cases()))
def test_named_path_or_module_exists(doc, kind, name):
    if kind == "link":
        target = (doc.parent / name).resolve()
        assert target.exists(), f"{doc.name} links to {name}, which does not exist"
    elif kind == "path":
        hits = list(ROOT.glob(name.rstrip("/"))) if "*" in name else [ROOT / name.rstrip("/")]
        assert hits and all(h.exists() for h in hits), f"{doc.name} names {name}, which does not exist"
    else:
        why = _resolve_module(name)
        assert why is None, f"{doc.name} names {name}: {why}"


def test_checker_rejects_what_does_not_exist():
    assert _resolve_module("workbench.simulation") is None
    assert _resolve_module("workbench.cost.model.CostModel") is None
    assert _resolve_module("workbench.simulate.planning") is not None
    assert _resolve_module("workbench.cost.model.NoSuchThing") is not None
    assert _resolve_module("repro.paper_fit.model_profile") is None
    assert _resolve_module("repro.paper_fit.no_such_thing") is not None
    assert _resolve_module("workbench.experiments.paper_fit") is not None  # the reproduction left the package

"""Every public name that README.md and docs/*.md use works after a plain ``import workbench``, each in
an interpreter of its own, so that no other workbench import runs first (the order that hid a reader's
registration, ``Profile.from_pipedream``, and ``workbench.runtime`` as an attribute).

One helper process imports ``workbench`` (nothing else of ours) and the third-party libraries the
package needs (:data:`PRELOAD`: their import is the slow part and holds no workbench state), then
forks one child per name: each child starts with ``workbench`` as the only workbench module, resolves
the name as the docs write it and, for the names in :data:`CALLS`, makes one trivial call.

How a name resolves: ``wb.a.b`` (after ``import workbench as wb``) by attribute access alone;
``workbench.a.b.c`` by attribute access, where a hop below the first that is no attribute may be a
submodule (as ``import workbench.a.b`` reaches it); ``from M import n`` (in a code block) as written."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

DOTTED = re.compile(r"(?<![\w./-])(wb|workbench)((?:\.\w+)+)")
FROM_IMPORT = re.compile(r"^\s*from (workbench(?:\.\w+)*) import \(?([\w, ]+)", re.M)
SHIPPED_VGG = "workbench/profiling/data/pipedream/vgg16/graph.txt"

#: names checked whatever the docs say (what a newcomer hit), and their trivial calls: ``obj`` is the name
CALLS = {
    "workbench.Profile.from_pipedream": f"len(obj({str(ROOT / SHIPPED_VGG)!r})) > 0",
    "workbench.profiling.pipedream.shipped": 'len(obj("vgg16")) > 0',
    "workbench.Topology.preset": 'obj("4xV100-pcie-10g").num_workers > 0',
    "workbench.schedules.build": 'obj("gpipe", 2, 4).num_workers == 2',
    "workbench.runtime.train": "callable(obj)",
    "workbench.runtime.reference_train": "callable(obj)",
}

#: third-party modules the helper imports before it forks (their import is what takes the time)
PRELOAD = ("numpy", "pandas", "torch", "torch.distributed.pipelining", "plotly.graph_objects", "ipywidgets", "nbformat")

CHILD = (
    f"PRELOAD = {PRELOAD!r}\n"
    + r"""
import importlib, json, os, sys

for lib in PRELOAD:  # third-party only: no workbench state
    try:
        importlib.import_module(lib)
    except ImportError:
        pass
import workbench
import workbench as wb

assert sorted(m for m in sys.modules if m.split(".")[0] == "workbench") == ["workbench"], "not fresh"


def resolve(name):
    if name.startswith("from "):
        module, attr = name[5:].split(" import ")
        return getattr(importlib.import_module(module), attr)
    parts = name.split(".")
    obj = wb
    for k, part in enumerate(parts[1:], start=1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            if parts[0] == "wb" or k == 1 or not hasattr(obj, "__path__"):
                raise
            obj = importlib.import_module(f"{obj.__name__}.{part}")
    return obj


def check(name, call):
    obj = resolve(name)
    if call and not eval(call, {"obj": obj}):
        raise AssertionError(f"{call} is false")


results = {}
for name, call in json.loads(sys.argv[1]):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            check(name, call)
            msg = "ok"
        except BaseException as e:
            msg = f"{type(e).__name__}: {e}"
        os.write(write, msg.encode()[:2000])
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as f:
        results[name] = f.read()
    os.waitpid(pid, 0)
print(json.dumps(results))
"""
)


def doc_names() -> list[str]:
    """The public names README.md and docs/*.md use, as the docs write them."""
    names: set[str] = set(CALLS)
    for doc in DOCS:
        text = doc.read_text(encoding="utf-8")
        for m in DOTTED.finditer(text):
            if m.group(2).endswith((".py", ".md", ".csv", ".json", ".txt", ".toml")):
                continue
            names.add(m.group(1) + m.group(2))
        for m in FROM_IMPORT.finditer(text):
            names.update(f"from {m.group(1)} import {n.strip()}" for n in m.group(2).split(",") if n.strip())
    return sorted(names)


NAMES = doc_names()


@pytest.fixture(scope="module")
def resolved() -> dict[str, str]:
    todo = json.dumps([(n, CALLS.get(n, "")) for n in NAMES])
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, todo], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_the_docs_name_public_names():
    """The patterns find what the docs use (a table that matches nothing checks nothing)."""
    assert "workbench.runtime.train" in NAMES and "wb.partition" in NAMES
    assert any(n.startswith("from workbench.profiling.pipedream import") for n in NAMES)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_a_public_name_works_after_import_workbench_alone(resolved, name):
    assert resolved[name] == "ok", f"{name}, after a plain `import workbench`: {resolved[name]}"


@pytest.mark.slow
def test_the_check_fails_where_a_name_is_missing_or_its_call_fails():
    todo = [("wb.runtime.no_such_name", ""), ("workbench.Topology.preset", 'obj("no-such-preset")'), ("wb.io", "")]
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(todo)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    out = json.loads(proc.stdout.splitlines()[-1])
    assert out["wb.runtime.no_such_name"].startswith("AttributeError")
    assert out["workbench.Topology.preset"] != "ok"
    assert out["wb.io"] == "ok"

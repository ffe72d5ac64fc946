"""The reproduction beside the library (``notebooks/repro/``, import name ``repro``) and the library
keep apart: ``repro`` imports only public names of ``workbench`` (from a package, never from a module
inside one, and no underscore name), the library never imports ``repro``, and importing any module
of either reads no data file (the papers' numbers, the protocol, PipeDream's profiles are read on
first use)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REPRO = ROOT / "notebooks" / "repro"
LIBRARY = ROOT / "workbench"


def workbench_imports(tree: ast.AST) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import of a ``workbench`` module in ``tree`` (``import
    workbench.x`` gives no names), at module level and inside functions."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, []) for a in node.names if a.name.split(".")[0] == "workbench"]
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "workbench":
            out.append((node.lineno, node.module, [a.name for a in node.names]))
    return out


def is_package(module: str) -> bool:
    return (ROOT.joinpath(*module.split(".")) / "__init__.py").exists()


def exports(package: str, init: Path | None = None) -> set[str]:
    """The names in ``package``'s ``__all__``, read from its ``__init__.py`` (or ``init``): a list of
    strings, or ``list(_EXPORTS)`` of a dict of lazy exports; nothing is imported."""
    tree = ast.parse((init or ROOT.joinpath(*package.split(".")) / "__init__.py").read_text())
    assigned = {
        t.id: node.value
        for node in tree.body
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    value = assigned.get("__all__")
    if isinstance(value, ast.Call) and value.args and isinstance(value.args[0], ast.Name):
        value = assigned.get(value.args[0].id)  # list(_EXPORTS)
    if isinstance(value, ast.Dict):
        return {k.value for k in value.keys if isinstance(k, ast.Constant)}
    if isinstance(value, (ast.List, ast.Tuple)):
        return {e.value for e in value.elts if isinstance(e, ast.Constant)}
    return set()


def is_public_submodule(package: str, name: str) -> bool:
    """``name`` is a module or package inside ``package`` (``from workbench.models import sequence``)."""
    base = ROOT.joinpath(*package.split("."), name)
    return not name.startswith("_") and (base.with_suffix(".py").exists() or (base / "__init__.py").exists())


def private_uses(tree: ast.AST) -> list[str]:
    """Where an import of ``workbench`` in ``tree`` reaches past a package's public names."""
    bad = []
    for line, module, names in workbench_imports(tree):
        if not is_package(module):
            bad.append(f"{line}: {module} is a module inside a package; import its names from the package")
            continue
        exported = exports(module)
        for name in names:
            if name.startswith("_"):
                bad.append(f"{line}: {name} from {module} is private")
            elif name not in exported and not is_public_submodule(module, name):
                bad.append(f"{line}: {module} does not export {name} (add it to its __all__)")
    return bad


def test_repro_imports_only_public_names_of_packages():
    files = sorted(REPRO.rglob("*.py"))
    assert len(files) >= 10  # the walk sees the package
    bad = [f"{p.relative_to(ROOT)}:{why}" for p in files for why in private_uses(ast.parse(p.read_text()))]
    assert not bad, "repro reaches inside workbench:\n" + "\n".join(bad)


def test_exports_are_read_like_python_reads_them(tmp_path):
    import workbench.cost
    import workbench.runtime

    assert exports("workbench.runtime") == set(workbench.runtime.__all__) and "train" in exports("workbench.runtime")
    assert exports("workbench.cost") == set(workbench.cost.__all__) and "Plan" in exports("workbench.cost")
    (tmp_path / "__init__.py").write_text('from a import b\n__all__ = ["b", "c"]\n')
    assert exports("pkg", tmp_path / "__init__.py") == {"b", "c"}


def test_the_check_sees_a_deep_module_and_a_private_name():
    src = (
        "from workbench.runtime.calibration.machine import STAGE_TIMINGS\n"
        "from workbench.runtime import _EXPORTS, train\n"
        "from workbench.cost import no_such_export\n"
        "from workbench.models import sequence\n"
        "def f():\n    import workbench.cost.plan\n"
    )
    bad = private_uses(ast.parse(src))
    assert [b.split(":")[0] for b in bad] == ["1", "2", "3", "6"], bad  # train and the submodule are fine


def test_the_library_never_imports_the_reproduction():
    found = []
    for path in sorted(LIBRARY.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            found += [f"{path.relative_to(ROOT)}:{node.lineno}" for n in names if n.split(".")[0] == "repro"]
    assert found == []


# A fresh interpreter records every file opened (audit hook "open") while it imports the modules;
# the data files are what the packages ship beside their code.
OPENS = """
import importlib, json, os, pkgutil, sys
opened = []
sys.addaudithook(lambda event, args: opened.append(os.fsdecode(args[0]))
                 if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)) else None)
import repro, workbench
names = {names}
for name in names:
    importlib.import_module(name)
{then}
print(json.dumps({{"modules": names, "opened": sorted(set(opened))}}))
"""
EVERY_MODULE = (
    '[m.name for pkg, prefix in ((workbench, "workbench."), (repro, "repro."))'
    ' for m in pkgutil.walk_packages(pkg.__path__, prefix) if not m.name.endswith("__main__")]'
)


def data_files_opened(names: str = EVERY_MODULE, then: str = "") -> tuple[list[str], list[str]]:
    """(modules imported, data files of workbench/ or notebooks/repro/ opened) by a fresh interpreter
    that imports ``names`` (a Python expression) and then runs ``then``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "notebooks")])}
    code = OPENS.format(names=names, then=then)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    mine = [str(LIBRARY.resolve()), str(REPRO.resolve())]
    data = [
        p
        for p in seen["opened"]
        if any(os.path.realpath(p).startswith(m + os.sep) for m in mine)
        and not p.endswith((".py", ".pyc"))
        and "__pycache__" not in p
    ]
    return seen["modules"], data


@pytest.mark.slow  # a fresh interpreter imports every module
def test_importing_any_module_reads_no_data_file():
    modules, data = data_files_opened()
    assert len(modules) > 60 and "repro.paper_fit" in modules and "workbench.profiling.pipedream" in modules
    assert data == [], f"read at import: {data}"


@pytest.mark.slow
def test_the_open_check_sees_a_data_file_read():
    modules, data = data_files_opened('["repro.paper_fit"]', then='repro.paper_fit.SETTINGS["arxiv-A"]')
    assert modules == ["repro.paper_fit"] and [Path(p).name for p in data] == ["settings.csv"]


def test_reproduce_is_a_plugin_of_the_command():
    import importlib.metadata

    from repro.reproduce import cmd_reproduce
    from workbench.cli.commands import PLUGIN_GROUP, build_parser

    names = [ep.name for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP)]
    assert names == ["reproduce"]  # pyproject.toml's entry point, installed by `pip install -e .`
    args = build_parser(train_arguments=False).parse_args(["reproduce", "--quick", "--only", "02"])
    assert args.fn is cmd_reproduce and args.quick and args.only == ["02"]


def test_a_plugin_that_cannot_be_loaded_is_left_out_with_one_line(monkeypatch, capsys):
    import importlib.metadata

    from workbench.cli import commands

    broken = importlib.metadata.EntryPoint("broken", "no_such_module_here:register", commands.PLUGIN_GROUP)
    monkeypatch.setattr(importlib.metadata, "entry_points", lambda group: [broken] if group == broken.group else [])
    parser = commands.build_parser(train_arguments=False)
    assert parser.parse_args(["models"]).command == "models"
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "command 'broken'" in err and "no_such_module_here" in err


def test_the_parser_with_its_plugins_imports_neither_torch_nor_pandas():
    code = (
        "import sys, workbench.cli.commands as c; c.build_parser(train_arguments=False); "
        "print(sorted({'torch', 'pandas', 'plotly', 'repro.common'} & set(sys.modules)), 'repro.reproduce' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["[]", "True"], out.stdout

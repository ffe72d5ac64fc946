"""Every ``python`` and ``bash`` code block of README.md and docs/*.md runs as written, shows what its
text says, and writes only under ``results/`` (or nowhere): :data:`TABLE` holds one entry per block,
keyed by its document and first line, either how to check it or why it is not run (a block with no
entry fails, so a new block is never skipped silently).

Each block runs in a fresh copy of the checkout's tracked files but ``results/`` (``notebooks/...``
and ``workbench/...`` read as in the checkout; the package itself is imported from the checkout):
afterwards no file of the copy has changed and none is new outside ``results/``, which is what
``git status`` of the checkout would show for a block run there (``results/`` is ignored). Python blocks run as a script; a block without an
``if __name__ == "__main__":`` guard prints the value of each top-level expression, as Jupyter shows a
cell's, so that what the text says it shows can be checked (``expect``: regular expressions that must
match the output, ``absent``: ones that must not)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
BLOCK = re.compile(r"^```(python|bash)\n(.*?)^```", re.S | re.M)

#: runs a block's file, printing each top-level expression's value (the blocks without a __main__ guard)
ECHO = r"""
import ast, sys
path = sys.argv[1]
tree = ast.parse(open(path).read(), path)
ns = {"__name__": "__main__", "__file__": path}
for node in tree.body:
    if isinstance(node, ast.Expr):
        value = eval(compile(ast.Expression(node.value), path, "eval"), ns)
        if value is not None:
            print(repr(value))
    else:
        exec(compile(ast.Module([node], []), path, "exec"), ns)
"""


@dataclass(frozen=True)
class Check:
    """How one block is run and what its output must show; ``skip``: why it is not run."""

    expect: tuple[str, ...] = ()
    absent: tuple[str, ...] = ("Traceback",)
    before: str = ""  # a bash command run first in the same folder (a run the block reads)
    subst: tuple[tuple[str, str], ...] = ()  # placeholders of the block replaced before it runs
    prelude: str = ""  # python put before a fragment that continues an earlier block
    requires: tuple[str, ...] = ()  # optional packages the block imports
    skip: str = ""
    timeout_s: int = 600


NO_NAN = ("Traceback", r"\bNaN\b", r"\bnan\b")
TOUR_RUN = "workbench train --model mlp --workers 2 --microbatches 4 --steps 6 --no-progress --out results/train/r"

#: (document, first line of the block) -> its check
TABLE: dict[tuple[str, str], Check] = {
    ("README.md", "# 1. set up and run the main job: the paper reproduction, quick parameters"): Check(
        skip="the two commands are .ci/run itself (setup, the whole suite, the quick reproduction): CI runs them"
    ),
    ("README.md", ".venv/bin/workbench quickstart"): Check(
        expect=(r"plan predicted [\d.]+ ms/minibatch; simulated steady state", r"wrote results/quickstart/quickstart-"),
        absent=NO_NAN,
    ),
    ("README.md", ".venv/bin/jupyter lab notebooks/"): Check(
        skip="starts a server that waits for a browser; tests/test_browser.py drives JupyterLab headless"
    ),
    ("README.md", "workbench models"): Check(
        expect=(r"plan: predicted [\d.]+ ms/minibatch \(cost model\) vs simulated", r"pipedream: 20 steps in", "gpt"),
        absent=NO_NAN,
    ),
    ("README.md", "import workbench as wb"): Check(expect=(r"^\(\d+\.\d+, ",), absent=NO_NAN),
    ("cost-model.md", "from workbench.profiling.pipedream import shipped"): Check(
        expect=(r"(?m)^\d+\.\d+$", r"(?m)^\(\d", r"why: "), absent=NO_NAN
    ),
    ("cost-model.md", "python benchmarks/bench_partition.py      # DP alone and DP + refinement side by side"): Check(
        skip="benchmarks take minutes each (bench_fidelity calibrates and trains every schedule); they write only "
        "with --out, and benchmarks/ has its own tests"
    ),
    ("pipedream-optimizer.md", "import workbench"): Check(expect=("pipedream",), absent=NO_NAN),
    ("reproduce.md", "workbench reproduce                       # full parameters"): Check(
        skip="the full reproduction takes hours and the quick one minutes; tests/conftest.py's quick_run runs "
        "`workbench reproduce --quick` once per test session"
    ),
    ("reproduce.md", "mkdir -p results/reproduce/manual && papermill notebooks/03_time_to_accuracy.ipynb"): Check(
        skip="minutes (notebook 03 in quick mode, which the quick run executes); its paths are checked below"
    ),
    ("reproduce.md", "mkdir -p results/reproduce/manual && papermill notebooks/04_pipeline_timelines.ipynb"): Check(
        skip="minutes (notebook 04 in quick mode, which the quick run executes); its paths are checked below"
    ),
    ("runtime.md", "import pandas as pd"): Check(
        before=TOUR_RUN, subst=(("results/train/<run>/", "results/train/r/"),), expect=(r"compute",), absent=NO_NAN
    ),
    ("runtime.md", "python benchmarks/bench_runtime.py [--models mlp,gpt] [--repeat 5]"): Check(
        skip="tens of minutes (its text says so): every schedule, repeated"
    ),
    ("runtime.md", "import torch"): Check(
        expect=(r"largest weight difference from one process: \d\.\de-(1\d|[2-9]\d)",)
    ),
    ("runtime.md", "torchrun --nnodes 2 --nproc_per_node 1 --rdzv_backend c10d --rdzv_endpoint HOST_A:29400"): Check(
        skip="needs two machines (HOST_A); tests/test_torchrun.py runs torchrun on this one"
    ),
    ("schedules.md", "from workbench.schedules.registry import register"): Check(),
    ("seq1f1b.md", "from workbench.schedules.sequence_split import segment_splits"): Check(
        expect=(r"1\.934074e\+11", r"2\.224277e\+11"),
        absent=NO_NAN,  # the doc's table: equal and balanced FLOPs
    ),
    ("seq1f1b.md", "workbench simulate --schedule seq1f1b --schedule-option segments=4 --schedule-option steps=3"): (
        Check(expect=(r"time per minibatch 26\.2\d unit", r"bubble fraction \(mean\) 0\.08"), absent=NO_NAN)
    ),
    ("seq1f1b.md", "workbench train --model gpt --schedule seq1f1b --schedule-option segments=4 --steps 20"): Check(
        expect=(r"seq1f1b: 20 steps in",), absent=NO_NAN
    ),
    ("widgets.md", "from workbench import Topology"): Check(
        expect=(r"PartitionTuner\(stages=([2-9]|\d\d)",), absent=NO_NAN
    ),
    ("your-own-model.md", "import torch"): Check(
        requires=("transformers",), expect=(r"predicted [\d.]+ ms/minibatch", r"[\d.]+ [\d.]+\s*$"), absent=NO_NAN
    ),
    (
        "your-own-model.md",
        "workbench profile --model workbench.models.examples:resnet18_digits --dataset digits",
    ): Check(expect=(r"gpipe: 20 steps in",), absent=NO_NAN),
    ("your-own-model.md", "from workbench.models.examples import llama_tiny"): Check(
        requires=("transformers",),
        prelude="import torch\nfrom torch.utils.data import TensorDataset\nfrom workbench.runtime import train\n"
        "t = torch.randint(0, 64, (64, 17), generator=torch.Generator().manual_seed(0))\n"
        "ds = TensorDataset(t[:, :-1], t[:, 1:])\n",
        expect=("RunResult",),
    ),
    ("your-own-model.md", ".venv/bin/pip install -c constraints-cpu.txt torchvision"): Check(
        skip="installs packages from the network, which CI does not have"
    ),
}


def blocks() -> list[tuple[str, str, str, str]]:
    """(document, first line, language, code) of every python and bash block."""
    out = []
    for doc in DOCS:
        for m in BLOCK.finditer(doc.read_text(encoding="utf-8")):
            code = m.group(2)
            first = next(ln for ln in code.splitlines() if ln.strip())
            out.append((doc.name, first, m.group(1), code))
    return out


def entry(doc: str, first: str) -> Check | None:
    for (d, start), check in TABLE.items():
        if d == doc and first.startswith(start):
            return check
    return None


BLOCKS = blocks()


def test_every_block_has_an_entry_and_every_entry_a_block():
    missing = [f"{d}: {first}" for d, first, _, _ in BLOCKS if entry(d, first) is None]
    assert missing == [], f"blocks without an entry in TABLE (say how to check each, or why not): {missing}"
    unused = [k for k in TABLE if not any(d == k[0] and first.startswith(k[1]) for d, first, _, _ in BLOCKS)]
    assert unused == [], f"TABLE entries that match no block: {unused}"


def test_the_skipped_papermill_commands_write_under_results():
    for d, _, _, code in BLOCKS:
        for line in code.splitlines():
            if "papermill " in line:
                words = shlex.split(line[line.index("papermill ") :])
                assert words[2].startswith("results/"), f"{d}: papermill writes its notebook to {words[2]}"


def fresh_folder(tmp_path: Path) -> Path:
    """A copy of the checkout's tracked files but results/, with a link to its .venv."""
    cwd = tmp_path / "cwd"
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for rel in tracked.splitlines():
        if rel.startswith("results/") or not (ROOT / rel).is_file():
            continue
        (cwd / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, cwd / rel)
    (cwd / ".venv").symlink_to(ROOT / ".venv")
    return cwd


def snapshot(cwd: Path) -> dict[str, tuple[int, int]]:
    """{path: (size, mtime)} of every file of the folder but results/ and .venv."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(cwd):
        rel = Path(dirpath).relative_to(cwd)
        if rel == Path("."):
            dirnames[:] = [d for d in dirnames if d not in ("results", ".venv")]
        for f in filenames:
            st = (Path(dirpath) / f).stat()
            out[str(rel / f)] = (st.st_size, st.st_mtime_ns)
    return out


def command(lang: str, code: str, check: Check, where: Path) -> list[str]:
    for old, new in check.subst:
        code = code.replace(old, new)
    if lang == "bash":
        return ["bash", "-e", "-c", code]
    script = where / "snippet.py"
    script.write_text(check.prelude + code)
    guarded = "__name__" in code
    return [sys.executable, str(script)] if guarded else [sys.executable, "-c", ECHO, str(script)]


def run_block(tmp_path: Path, lang: str, code: str, check: Check) -> str:
    cwd, code_dir = fresh_folder(tmp_path), tmp_path / "code"
    code_dir.mkdir()
    env = dict(os.environ, PATH=f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}", MPLBACKEND="Agg")
    before = snapshot(cwd)
    if check.before:
        subprocess.run(["bash", "-e", "-c", check.before], cwd=cwd, env=env, check=True, capture_output=True)
    proc = subprocess.run(
        command(lang, code, check, code_dir),
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=check.timeout_s,
        check=False,
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"exit {proc.returncode}:\n{output[-4000:]}"
    after = snapshot(cwd)
    wrote = sorted(p for p in after.keys() | before.keys() if after.get(p) != before.get(p))
    assert wrote == [], f"the block wrote {wrote} outside results/"
    return output


@pytest.mark.slow
@pytest.mark.parametrize("doc, first, lang, code", BLOCKS, ids=[f"{d}:{f[:40]}" for d, f, _, _ in BLOCKS])
def test_a_block_runs_as_written(tmp_path, doc, first, lang, code):
    check = entry(doc, first)
    assert check is not None
    if check.skip:
        pytest.skip(check.skip)
    for package in check.requires:
        pytest.importorskip(package)
    output = run_block(tmp_path, lang, code, check)
    for pattern in check.expect:
        assert re.search(pattern, output, re.M), f"expected {pattern!r} in the output:\n{output[-3000:]}"
    for pattern in check.absent:
        assert not re.search(pattern, output), f"{pattern!r} in the output:\n{output[-3000:]}"


@pytest.mark.slow
def test_the_runner_fails_a_block_that_writes_outside_results(tmp_path):
    with pytest.raises(AssertionError, match=r"wrote \['out.txt'\] outside results/"):
        run_block(tmp_path, "bash", "echo x > out.txt\n", Check())
    with pytest.raises(AssertionError, match="exit 1"):
        (tmp_path / "b").mkdir()
        run_block(tmp_path / "b", "python", "raise SystemExit(1)\n", Check())

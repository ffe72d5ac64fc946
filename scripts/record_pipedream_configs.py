"""Record, as data, the run settings that PipeDream's own runtime ships: the per-GPU minibatch of
every driver config and the replicas per stage of every stage-to-rank file.

The reference is github.com/msr-fiddle/pipedream. Fetch a copy (a bare mirror is enough) and run::

    python scripts/record_pipedream_configs.py /path/to/pipedream.git \
        workbench/profiling/data/pipedream/runtime_configs.json

``/path/to/pipedream.git`` is the repository's git directory (``git --git-dir`` is given it; the files
are read with ``git show <commit>:<path>``, so no work tree is needed). What is recorded, and nothing
else (no code of the authors):

* ``drivers``: for every ``runtime/*/driver_configs/<name>.yml``, its ``batch_size`` (per GPU), the
  model (``module`` ``models.<model>.gpus=<n>``), the GPU count (entries of ``machines``) and which
  ``config_file`` it runs (``<gpus dir>/<kind>``, e.g. ``gpus=16/hybrid``).
* ``configs``: for every ``runtime/*/models/<model>/<gpus dir>/<kind>_conf.json``, the replicas of
  each stage in stage order (``len(stage_to_rank_map[s])``). One of the authors' files has a bare
  integer key (``{"0": [0], 1: [1]}``), which JSON does not allow: such keys are quoted before
  parsing and the file is listed under ``repaired``.
* ``profiled_batch``: the minibatch at which each published ``graph.txt`` was profiled: image models
  from the input node's bytes (``batch x 3 x H x W x 4``, H = W = 299 for Inception-v3, else 224),
  translation models from the ``--batch-size`` of the profiler's README command.

This script imports nothing of the workbench.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
from pathlib import Path

_KEY = re.compile(r"([{,]\s*)(\d+)(\s*:)")  # a bare integer key: {"0": [0], 1: [1]}
_INPUT = re.compile(r"^node\d+ -- Input\d* -- .*activation_size=([0-9.]+),", re.M)


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", "--git-dir", git_dir, *args], check=True, capture_output=True, text=True).stdout


def yaml_value(text: str, key: str) -> str | None:
    """The value of a top-level ``'key': value`` line of the authors' flat driver YAML."""
    m = re.search(rf"^'?{key}'?\s*:\s*(.+)$", text, re.M)
    return m.group(1).strip().strip("'\"") if m else None


def driver(text: str) -> dict:
    module = yaml_value(text, "module") or ""
    config = yaml_value(text, "config_file") or ""
    machines = yaml_value(text, "machines") or "[]"
    m = re.match(r"models\.([\w]+)\.gpus=(\d+)", module)
    c = re.match(r"models/[\w]+/([^/]+)/(\w+)_conf\.json", config)
    return dict(
        model=m.group(1) if m else None,
        gpus=len(re.findall(r"'[^']+'", machines)),
        batch_size=int(yaml_value(text, "batch_size") or 0),
        config=f"{c.group(1)}/{c.group(2)}" if c else config,
    )


def replicas(text: str) -> tuple[list[int], bool]:
    """Replicas per stage of a ``*_conf.json`` and whether its JSON had to be repaired."""
    try:
        conf, repaired = json.loads(text), False
    except json.JSONDecodeError:
        conf, repaired = json.loads(_KEY.sub(r'\1"\2"\3', text)), True
    ranks = conf["stage_to_rank_map"]
    return [len(ranks[k]) for k in sorted(ranks, key=int)], repaired


def profiled_batch(git_dir: str, commit: str, files: list[str]) -> dict:
    out = {}
    for path in files:
        m = re.match(r"profiler/(image_classification|translation)/profiles/(\w+)/graph\.txt$", path)
        if not m:
            continue
        kind, model = m.groups()
        if kind == "image_classification":
            side = 299 if model.startswith("inception") else 224
            inputs = _INPUT.findall(git(git_dir, "show", f"{commit}:{path}"))
            if len(inputs) == 1:
                out[model] = dict(
                    batch=round(float(inputs[0]) / (3 * side * side * 4)), how=f"input bytes / (3x{side}x{side}x4)"
                )
        else:
            readme = git(git_dir, "show", f"{commit}:profiler/translation/README.md")
            b = re.search(r"--batch-size\s+(\d+)", readme)
            if b:
                out[model] = dict(batch=int(b.group(1)), how="--batch-size of profiler/translation/README.md")
    return out


def record(git_dir: str, commit: str = "HEAD") -> dict:
    sha = git(git_dir, "rev-parse", commit).strip()
    files = git(git_dir, "ls-tree", "-r", "--name-only", sha).splitlines()
    drivers, configs, repaired = {}, {}, []
    for path in files:
        if re.match(r"runtime/\w+/driver_configs/[\w.-]+\.yml$", path):
            drivers[Path(path).stem] = driver(git(git_dir, "show", f"{sha}:{path}"))
        elif m := re.match(r"runtime/\w+/models/(\w+)/([^/]+)/(\w+)_conf\.json$", path):
            model, gpus_dir, kind = m.groups()
            reps, bad = replicas(git(git_dir, "show", f"{sha}:{path}"))
            configs.setdefault(model, {}).setdefault(gpus_dir, {})[kind] = reps
            if bad:
                repaired.append(path)
    return dict(
        source="github.com/msr-fiddle/pipedream",
        commit=sha,
        regenerate="python scripts/record_pipedream_configs.py <pipedream git dir> workbench/profiling/data/pipedream/runtime_configs.json",
        drivers=dict(sorted(drivers.items())),
        configs={k: dict(sorted(v.items())) for k, v in sorted(configs.items())},
        repaired=repaired,
        profiled_batch=profiled_batch(git_dir, sha, files),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("git_dir", help="git directory of a copy of msr-fiddle/pipedream")
    ap.add_argument("out", type=Path, help="JSON file to write")
    ap.add_argument("--commit", default="HEAD")
    args = ap.parse_args()
    data = record(args.git_dir, args.commit)
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(f"{args.out}: {len(data['drivers'])} driver configs, {sum(map(len, data['configs'].values()))} GPU folders")


if __name__ == "__main__":
    main()

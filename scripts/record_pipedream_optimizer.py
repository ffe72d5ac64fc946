"""Record the decisions of PipeDream's own optimizer as test data.

Runs ``optimizer/optimizer_graph_hierarchical.py`` of msr-fiddle/pipedream (a fetched copy: a
work tree, or a bare git directory such as the ``fetch`` tool's ``/work/.mirror/.../repo``) on its
published profiles, as its README runs it, and writes what it printed and the stage of every node
to ``tests/data/pipedream_optimizer/<profile>__<config>.json`` (``.json.gz`` when large):

* ``states``: its number of antichain states;
* ``levels``: per topology level (outermost first, as it prints them) the stages
  ``[start_state, end_state, compute_s, replicas]`` of every sub-pipeline;
* ``stages``: the final stages in order, each with its nodes (from the ``gpus=N.txt`` graph it
  writes, ``stage_id`` per node) and its replication (the product over the levels that contain it);
* ``pipeline_s`` ("Time per stage in pipeline"), ``single_s`` ("Time taken by single-stage
  pipeline"), ``dp_speedup`` (its "Throughput increase of (..)-machine DP compared to single
  machine"), ``speedup_over_dp`` and ``unused_machines`` (per level, per sub-pipeline);
* ``candidate_order``: for every state, the order in which its dynamic program tries the split
  states (``all_predecessor_ids``: a list made from a Python set of objects, so memory-address
  order). Where several configurations tie at the optimum this order decides which one it prints;
  the tests replay it to compare configurations bit for bit;
* ``state_compute_s``, ``state_activation``, ``state_parameters``, ``state_output_activation``:
  its per-state cumulative sums, as it summed them (over a set of objects, so the last bits
  depend on that set's order; where two splits tie exactly, those bits decide). Tests compare
  ours with them (relative 1e-12) and replay them with the candidate order;
* ``wall_s``, ``cpu_s``, ``load1``: how long the run took here (measured, this machine: wall clock,
  CPU seconds of the process, which other load disturbs less, and the 1-minute load average at
  its start), and the equivalent command line.

The optimizer runs in-process through a small driver (written to a temporary folder) that sets its
module flags as its ``__main__`` block does, wraps ``compute_partitioning`` to read the candidate
order, and calls its ``main``.

Its ``graph`` package imports ``graphviz`` only to draw; a stub module on PYTHONPATH (written to a
temporary folder, never into either repository) stands in for it. Each run gets a time limit
(``--timeout``, default 300 s) and 4 GiB of address space and runs under ``nice``; a run that does not finish is recorded with
``"finished": false`` and its limit. Usage::

    python scripts/record_pipedream_optimizer.py /work/.mirror/msr-fiddle+pipedream/repo \\
        [--profiles vgg16 resnet50] [--configs flat8 h4x2] [--timeout 300]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "pipedream_optimizer"

#: name -> (machines per level innermost first, bandwidths in bytes/s, extra flags)
CONFIGS = {
    "flat8": ([8], [1.25e9], []),
    "flat8_straight": ([8], [1.25e9], ["--straight_pipeline"]),
    "flat8_fewer": ([8], [1.25e9], ["--use_fewer_machines"]),
    "flat8_mem": ([8], [1.25e9], ["--use_memory_constraint", "--memory_size", "2e9"]),
    "flat4": ([4], [12e9], []),
    "h4x2": ([4, 2], [12e9, 1.25e9], []),
    "h4x2_straight": ([4, 2], [12e9, 1.25e9], ["--straight_pipeline"]),
    "h2x2x2": ([2, 2, 2], [25e9, 12e9, 1.25e9], []),
}
#: configurations run without ``--activation_compression_ratio`` (its default: no cut term)
NO_COMPRESSION = {"flat8_nocomm": ([8], [1.25e9], [])}

PROFILES = {
    **{
        n: f"profiler/image_classification/profiles/{n}/graph.txt"
        for n in (
            "alexnet",
            "vgg16",
            "resnet18",
            "resnet50",
            "resnet101",
            "resnext50",
            "resnext101",
            "squeezenet1_0",
            "densenet121",
            "inception_v3",
            "nasnetamobile",
            "nasnetalarge",
        )
    },
    **{n: f"profiler/translation/profiles/{n}/graph.txt" for n in ("gnmt", "gnmt_large")},
}

#: Runs PipeDream's ``main`` as its ``__main__`` block does (module flags, then ``main``), and
#: prints what its dynamic program received: the order in which it visits the split candidates of
#: every state (``all_predecessor_ids``, a list built from a Python set of objects: memory-address
#: order) and the per-state cumulative sums (row 0 of its tables).
_DRIVER = """
import json, sys
sys.path.insert(0, ".")
import optimizer_graph_hierarchical as opt
a = json.loads(sys.argv[1])
seen = []
real = opt.compute_partitioning
def capture(*args, **kw):
    if not seen:  # the first level's inputs, copied before later levels overwrite them
        seen.append({"candidate_order": args[4], "state_compute_s": list(args[0][0]),
                     "state_activation": list(args[1][0]), "state_parameters": list(args[2][0]),
                     "state_output_activation": list(args[3])})
    return real(*args, **kw)
opt.compute_partitioning = capture
for flag in ("straight_pipeline", "use_memory_constraint", "use_fewer_machines", "activation_compression_ratio",
             "memory_size"):
    setattr(opt, flag, a[flag])
opt.main(a["n"], a["f"], a["b"], a["memory_size"], a["straight_pipeline"], a["use_memory_constraint"],
         a["use_fewer_machines"], a["activation_compression_ratio"], a["o"], verbose=True)
print("CAPTURED " + json.dumps(seen[0]))
"""
_STUB = "class Digraph:\n    def __getattr__(self, name):\n        return lambda *a, **k: None\n"
_STAGE = re.compile(r"^\((\d+), (\d+)\) (\S+) (\d+)$")
_NODE_STAGE = re.compile(r"^(node\d+) -- .* -- stage_id=(\d+)$")


def checkout(source: Path, into: Path) -> Path:
    """A work tree of the fetched copy (a bare git directory is exported with ``git archive``)."""
    if (source / "optimizer" / "optimizer_graph_hierarchical.py").exists():
        return source
    tar = subprocess.run(
        ["git", "--git-dir", str(source), "archive", "HEAD", "optimizer", "graph", "profiler"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "x", "--exclude=*.pdf", "-C", str(into)], input=tar, check=True)
    return into


def parse(stdout: str) -> dict:
    """The numbers and stage lists the optimizer prints (see the module docstring)."""
    levels, unused, rec = [], [], {}
    for line in stdout.splitlines():
        line = line.strip()
        if m := re.match(r"^Level (\d+)$", line):
            levels.append({"level": int(m.group(1)), "stages": []})
        elif m := _STAGE.match(line):
            levels[-1]["stages"].append([int(m.group(1)), int(m.group(2)), float(m.group(3)), int(m.group(4))])
        elif m := re.match(r"^Number of machines in budget not used: (\d+)", line):
            unused.append(int(m.group(1)))
        elif m := re.match(r"^Total number of states: (\d+)", line):
            rec["states"] = int(m.group(1))
        elif line.startswith("Time taken by single-stage pipeline:"):
            rec["single_s"] = float(line.split(":")[1])
        elif line.startswith("Time per stage in pipeline:"):
            rec["pipeline_s"] = float(line.split(":")[1])
        elif m := re.match(r"^Throughput increase of \(.*\)-machine DP compared to single machine: (\S+)", line):
            rec["dp_speedup"] = float(m.group(1))
        elif m := re.match(r"^Throughput increase \(compared to \(.*\)-machine DP\): (\S+)", line):
            rec["speedup_over_dp"] = float(m.group(1))
    rec["levels"] = levels
    rec["unused_machines"] = unused
    return rec


def final_stages(levels: list[dict], node_stage: dict[str, int]) -> list[dict]:
    """The innermost level's stages, each with its nodes and its replication across all levels."""
    inner = levels[-1]["stages"]
    out = []
    for sid, (start, end, _, r) in enumerate(inner):
        total = r
        for lev in levels[:-1]:
            total *= next(rr for s, e, _, rr in lev["stages"] if s <= start and end <= e)
        nodes = sorted((n for n, s in node_stage.items() if s == sid), key=lambda n: int(n[4:]))
        out.append({"states": [start, end], "replicas": total, "nodes": nodes})
    return out


def _children_cpu() -> float:
    """User + system CPU seconds of the finished child processes (the optimizer's run)."""
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _limit_memory():
    """At most ``MEMORY_LIMIT`` bytes of address space for a run (its antichain search can explode)."""
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


MEMORY_LIMIT = 4 << 30


def _flags(machines, bws, flags, compression, profile_path: str, outdir: str) -> dict:
    """The optimizer's arguments as its argparse would set them."""
    mem = float(flags[flags.index("--memory_size") + 1]) if "--memory_size" in flags else 16e9
    return {
        "n": machines,
        "b": bws,
        "f": profile_path,
        "o": outdir,
        "memory_size": mem,
        "straight_pipeline": "--straight_pipeline" in flags,
        "use_memory_constraint": "--use_memory_constraint" in flags,
        "use_fewer_machines": "--use_fewer_machines" in flags,
        "activation_compression_ratio": compression,
    }


def run_one(repo: Path, profile: str, config: str, timeout: float, helpers: Path) -> dict:
    machines, bws, flags = {**CONFIGS, **NO_COMPRESSION}[config]
    compression = None if config in NO_COMPRESSION else 1.0
    cli = [
        "python",
        "optimizer_graph_hierarchical.py",
        "-f",
        PROFILES[profile],
        "-n",
        *map(str, machines),
        "-b",
        *map(repr, bws),
        *flags,
    ] + ([] if compression is None else ["--activation_compression_ratio", "1"])
    rec = {
        "profile": profile,
        "config": config,
        "machines": machines,
        "bandwidths": bws,
        "flags": flags,
        "activation_compression_ratio": compression,
        "command": " ".join(cli),
    }
    with tempfile.TemporaryDirectory() as outdir:
        args = _flags(machines, bws, flags, compression, str(repo / PROFILES[profile]), outdir)
        cmd = ["nice", sys.executable, str(helpers / "driver.py"), json.dumps(args)]
        env = dict(os.environ, PYTHONPATH=str(helpers), PYTHONHASHSEED="0")
        t0, c0 = time.perf_counter(), _children_cpu()
        rec["load1"] = os.getloadavg()[0]
        try:
            proc = subprocess.run(
                cmd,
                cwd=repo / "optimizer",
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
                preexec_fn=_limit_memory,
            )
        except subprocess.TimeoutExpired:
            return rec | {"finished": False, "timeout_s": timeout}
        rec["wall_s"] = round(time.perf_counter() - t0, 3)
        rec["cpu_s"] = round(_children_cpu() - c0, 3)
        if proc.returncode != 0:
            return rec | {"finished": False, "error": proc.stderr.strip().splitlines()[-1:]}
        rec |= parse(proc.stdout)
        txt = next(Path(outdir).glob("gpus=*.txt"))
        node_stage = {
            m.group(1): int(m.group(2)) for line in txt.read_text().splitlines() if (m := _NODE_STAGE.match(line))
        }
        rec["stages"] = final_stages(rec["levels"], node_stage)
        captured = next(line for line in proc.stdout.splitlines() if line.startswith("CAPTURED "))
        rec |= json.loads(captured.split(" ", 1)[1])
        return rec | {"finished": True}


def write(path: Path, rec: dict) -> Path:
    """One key per line (long lists on one line); gzipped (``.json.gz``) above ``GZIP_ABOVE`` bytes."""
    text = "{\n" + ",\n".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in rec.items()) + "\n}\n"
    gz = path.with_name(path.name + ".gz")
    for old in (path, gz):
        old.unlink(missing_ok=True)
    if len(text) > GZIP_ABOVE:
        gz.write_bytes(gzip.compress(text.encode(), mtime=0))
        return gz
    path.write_text(text)
    return path


GZIP_ABOVE = 400_000


def read(path: Path) -> dict:
    """A recording written by :func:`write`."""
    raw = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    return json.loads(raw)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("pipedream", type=Path, help="fetched msr-fiddle/pipedream (work tree or bare git directory)")
    ap.add_argument("--profiles", nargs="+", default=["alexnet", "vgg16", "resnet50"], choices=sorted(PROFILES))
    ap.add_argument("--configs", nargs="+", default=sorted({**CONFIGS, **NO_COMPRESSION}))
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        helpers = Path(tmp) / "helpers"
        helpers.mkdir()
        (helpers / "graphviz.py").write_text(_STUB)
        (helpers / "driver.py").write_text(_DRIVER)
        (Path(tmp) / "repo").mkdir()
        repo = checkout(args.pipedream.resolve(), Path(tmp) / "repo")
        for profile in args.profiles:
            for config in args.configs:
                rec = run_one(repo, profile, config, args.timeout, helpers)
                write(args.out / f"{profile}__{config}.json", rec)
                print(
                    profile,
                    config,
                    "finished" if rec["finished"] else "NOT finished",
                    rec.get("pipeline_s"),
                    rec.get("wall_s"),
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

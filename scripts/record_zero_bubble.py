"""Record the zero-bubble authors' V-shape schedules as test data (``tests/data/zero_bubble/``).

Usage::

    python scripts/record_zero_bubble.py PATH [--out tests/data/zero_bubble]

``PATH`` is a copy of github.com/sail-sg/zero-bubble-pipeline-parallelism: a checkout, or the bare
git directory the workbench's ``fetch`` gives (read with ``git show HEAD:...``). The script runs the
repository's pure-Python schedulers in ``megatron/core/pipeline_parallel/zerobubble/scheduler/``
(``zbv.py``: ZB-V / V-ZB; ``zbv_greedy.py``: V-Min and V-Half of "Pipeline Parallelism with
Controllable Memory") without Megatron or torch (the package modules are stubbed so that their one
import, ``scheduler.graph``, resolves), and writes one JSON file per scheduler with, for every
grid point (P workers, M microbatches, per-op costs F, B, W and communication C):

* ``orders``: per worker, the ops in the order the scheduler emits them, as ``[kind, stage,
  microbatch]`` in the workbench's names (``F``, ``BI``, ``BW``; rank r holds stages r and
  2P - 1 - r);
* ``makespan``: the last op's end time in the scheduler's own timing (all ops start at 0 or later);
* ``reference_metric``: the figure the scheduler itself minimises or reports (``zbv``: the largest
  per-stage bubble; ``zbv_greedy``: the longest per-stage span, first F start to last W end);
* ``peak_chunks``: per worker, most (stage, microbatch) activations held at once (F to W).

Memory accounting given to ``zbv.py``: one unit per F, released by the W (f_mem = 1, b_mem = 0,
w_mem = -1) and ``max_mem = 2P``, its default (1F1B's memory, P microbatches of a worker).

``zb.json``: the automatic scheduler of the zero-bubble paper (``zb.py``, its heuristic; the ILP of
older versions of the file is disabled there) on a straight pipeline of P stages, on a grid of P, M,
costs and memory limits (``limit`` microbatches per stage, the same accounting: f_mem = 1, b_mem = 0,
w_mem = -1, ``max_mem = limit``). Its eight heuristic settings are run as its ``initial_solution``
runs them, the least longest per-stage span kept (the first on a tie); a setting that raises
"Cannot fit memory" is skipped (``initial_solution`` would raise; ``failed_settings`` counts them) and
a point where all do is recorded with ``orders: null``. Per point: ``orders`` (per stage, by
completion time), ``makespan``, ``reference_metric`` (its ``best_time``: the longest per-stage span,
first F start to last W end) and ``peak_chunks`` (live microbatches per stage, F to W).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import types
from pathlib import Path

SCHED = "megatron/core/pipeline_parallel/zerobubble/scheduler"
PKG = "megatron.core.pipeline_parallel.zerobubble.scheduler"
GRID_P, GRID_M = (4, 8), (8, 16, 24)
GRID_COSTS = ((1, 1, 1, 0), (1, 2, 1, 0), (2, 2, 1, 0), (1, 1, 1, 1), (2, 3, 1, 1))
# zb.py: the V grid's costs and two of the zero-bubble paper's Table 9 rows (1.5B and 6.2B at m = 24, ms)
ZB_COSTS = GRID_COSTS + ((18.522, 18.086, 9.337, 0.601), (29.718, 29.444, 19.927, 0.527))
ZB_LIMITS = (lambda P: P // 2, lambda P: P, lambda P: P + P // 2, lambda P: 2 * P)


def read_source(root: Path, name: str) -> str:
    """Text of ``scheduler/<name>.py`` from a checkout or a bare git directory."""
    f = root / SCHED / f"{name}.py"
    if f.exists():
        return f.read_text()
    return subprocess.run(
        ["git", "--git-dir", str(root), "show", f"HEAD:{SCHED}/{name}.py"], check=True, capture_output=True, text=True
    ).stdout


def load(root: Path, name: str) -> types.ModuleType:
    """Import ``scheduler/<name>`` with stub parent packages (no Megatron, no torch: ``zb.py``'s
    ``import torch`` and ``import pulp`` get empty stand-ins; its heuristic uses neither)."""
    parts = PKG.split(".")
    for i in range(1, len(parts) + 1):
        sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
    if name == "zb":
        torch_stub = sys.modules.setdefault("torch", types.ModuleType("torch"))
        if not hasattr(torch_stub, "Tensor"):
            torch_stub.Tensor = object  # a dataclass annotation of zb.Graph
        sys.modules.setdefault("pulp", types.ModuleType("pulp"))
    for dep in ("graph", name):
        full = f"{PKG}.{dep}"
        if full not in sys.modules:
            mod = sys.modules[full] = types.ModuleType(full)
            exec(compile(read_source(root, dep), f"{SCHED}/{dep}.py", "exec"), mod.__dict__)  # noqa: S102 (the reference, run as recorded)
    return sys.modules[f"{PKG}.{name}"]


def stage_of(P: int, rank: int, leg: int) -> int:
    """Workbench stage of ``rank``'s V leg (0: stage r, 1: stage 2P - 1 - r)."""
    return rank if leg == 0 else 2 * P - 1 - rank


def peak_chunks(order) -> int:
    live = peak = 0
    for kind, _, _ in order:
        live += {"F": 1, "BW": -1}.get(kind, 0)
        peak = max(peak, live)
    return peak


def run_zbv(mod, P, M, f, b, w, c):
    """zbv.py as its ``create_schedule`` runs it: the four (fill_b, fill_f) settings, the least max
    per-stage bubble kept. Its ops are (category F/B/W, index, microbatch); for B and W index 1 is
    the first leg (stage r), index 0 the second."""
    graph = mod.PipelineGraph(P, M, f, b, w, c, f_mem=1, b_mem=0, w_mem=-1, max_mem=2 * P)
    best = None
    for fill_b in (True, False):
        for fill_f in (True, False):
            sched, end, bubble = graph.try_v_schedule(fill_b=fill_b, fill_f=fill_f)
            if best is None or bubble < best[2]:
                best = (sched, end, bubble)
    sched, end, bubble = best
    orders = [
        [[["F", "BI", "BW"][cat], stage_of(P, r, idx if cat == 0 else 1 - idx), mb] for cat, idx, mb in ops]
        for r, ops in enumerate(sched)
    ]
    return orders, float(max(end)), float(bubble)


def run_zbv_greedy(mod, P, M, f, b, w, c, mem: str):
    """zbv_greedy.py's ``create_schedule`` without its config object: the V-Min or V-Half building
    block repeated M times, squeezed, W's placed, timed at the given costs. Op types 0..5 are
    F of leg 0, F of leg 1, B of leg 1, B of leg 0, W of leg 1, W of leg 0."""
    graph = mod.PipelineGraph(P, M, mem, f, b, w, c)
    pattern = {"min": graph.stable_pattern_v_min, "half": graph.stable_pattern_v_half}[mem](P)
    span, starts, stage_order = graph.schedule_from_pattern(pattern, M, [f, f, b, b, w, w], do_reorder=True)
    kinds = ["F", "F", "BI", "BI", "BW", "BW"]
    legs = [0, 1, 1, 0, 1, 0]
    cost = [f, f, b, b, w, w]
    orders = [[[kinds[t], stage_of(P, r, legs[t]), mb] for t, mb in ops] for r, ops in enumerate(stage_order)]
    end = max(starts[r][t][mb] + cost[t] for r in range(P) for t in range(6) for mb in range(len(starts[r][t])))
    return orders, float(end), float(span)


def run_zb(mod, P, M, f, b, w, c, limit):
    """zb.py's heuristic as ``initial_solution`` runs it (module docstring). Returns (orders,
    makespan, best_time, failed settings); orders None when no setting fits the memory."""
    config = mod.GraphConfig(
        cost_f=[float(f)] * P,
        cost_b=[float(b)] * P,
        cost_w=[float(w)] * P,
        cost_comm=float(c),
        mem_f=[1] * P,
        mem_b=[0] * P,
        mem_w=[-1] * P,
        max_mem=[limit] * P,
        n_stages=P,
        n_micro=M,
    )
    graph = mod.Graph.build_graph(P, M, config)
    best, failed = None, 0
    for late in (True, False):
        for prio in (True, False):
            for greedy in (True, False):
                try:
                    _, times, span = graph.manual_order(
                        allow_bubble_before_first_b=late, prioritize_b=prio, no_bubble_greedy=greedy
                    )
                except ValueError:  # "Cannot fit memory"
                    failed += 1
                    continue
                if best is None or span < best[1]:
                    best = (times, span)
    if best is None:
        return None, None, None, failed
    times, span = best
    kinds = ["F", "BI", "BW"]
    orders = []
    for s in range(P):
        ops = [(times[graph.get_id(k, s, mb)], k, mb) for k in range(3) for mb in range(M)]
        orders.append([[kinds[k], s, mb] for _, k, mb in sorted(ops)])
    return orders, float(max(times)), float(span), failed


def record_zb(root: Path, out: Path, commit: str) -> None:
    """``zb.json`` (module docstring)."""
    zb = load(root, "zb")
    cases = []
    for P in GRID_P:
        for M in GRID_M:
            for f, b, w, c in ZB_COSTS:
                for lim in ZB_LIMITS:
                    orders, makespan, metric, failed = run_zb(zb, P, M, f, b, w, c, lim(P))
                    cases.append(
                        {
                            "P": P,
                            "M": M,
                            "F": f,
                            "B": b,
                            "W": w,
                            "C": c,
                            "limit": lim(P),
                            "makespan": makespan,
                            "reference_metric": metric,
                            "failed_settings": failed,
                            "peak_chunks": None if orders is None else [peak_chunks(o) for o in orders],
                            "orders": orders,
                        }
                    )
                    print(
                        f"zb P={P} M={M} F,B,W,C={f},{b},{w},{c} limit={lim(P)}: makespan {makespan}", file=sys.stderr
                    )
    doc = {
        "source": "github.com/sail-sg/zero-bubble-pipeline-parallelism",
        "commit": commit,
        "scheduler": f"{SCHED}/zb.py",
    }
    (out / "zb.json").write_text(json.dumps(dict(doc, cases=cases), separators=(",", ":")) + "\n")


def record(root: Path, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    zbv, greedy = load(root, "zbv"), load(root, "zbv_greedy")
    runs = {
        "zbv": lambda *a: run_zbv(zbv, *a),
        "v_min": lambda *a: run_zbv_greedy(greedy, *a, "min"),
        "v_half": lambda *a: run_zbv_greedy(greedy, *a, "half"),
    }
    commit = subprocess.run(
        ["git", "--git-dir", str(root if (root / "HEAD").exists() else root / ".git"), "rev-parse", "HEAD"],
        check=False,
        capture_output=True,
        text=True,
    ).stdout.strip()
    for name, fn in runs.items():
        cases = []
        for P in GRID_P:
            for M in GRID_M:
                for f, b, w, c in GRID_COSTS:
                    orders, makespan, metric = fn(P, M, f, b, w, c)
                    cases.append(
                        {
                            "P": P,
                            "M": M,
                            "F": f,
                            "B": b,
                            "W": w,
                            "C": c,
                            "makespan": makespan,
                            "reference_metric": metric,
                            "peak_chunks": [peak_chunks(o) for o in orders],
                            "orders": orders,
                        }
                    )
                    print(f"{name} P={P} M={M} F,B,W,C={f},{b},{w},{c}: makespan {makespan:g}", file=sys.stderr)
        doc = {
            "source": "github.com/sail-sg/zero-bubble-pipeline-parallelism",
            "commit": commit,
            "scheduler": f"{SCHED}/{'zbv_greedy' if name.startswith('v_') else 'zbv'}.py",
            "cases": cases,
        }
        (out / f"{name}.json").write_text(json.dumps(doc, separators=(",", ":")) + "\n")
    record_zb(root, out, commit)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("path", type=Path, help="checkout or bare git dir of sail-sg/zero-bubble-pipeline-parallelism")
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parents[1] / "tests/data/zero_bubble")
    args = ap.parse_args(argv)
    if not (args.path / SCHED).exists() and not (args.path / "HEAD").exists():
        print(
            f"error: {args.path} is neither a checkout nor a git directory of the zero-bubble repository",
            file=sys.stderr,
        )
        return 2
    record(args.path, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

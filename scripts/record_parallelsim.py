"""Record the outputs of the unifying document's public simulator as test data.

The reference is ``parallelsim.py`` of github.com/a-rahimi/parallel-training (the simulator of
"Unifying Parallelization Schemes to Train Deep Nets"; forward 1, backward 2 time units). It needs
pandas < 3, numpy, matplotlib and IPython, so it runs in a throwaway virtual environment, not the
project's::

    python3 -m venv /tmp/ps-venv && /tmp/ps-venv/bin/pip install 'pandas<3' numpy matplotlib ipython
    /tmp/ps-venv/bin/python scripts/record_parallelsim.py /path/to/parallel-training \
        tests/data/parallelsim/grid.json

For every case of the grid (scheme, S stages, B batches, W workers, R workers per group, priority)
the file holds the reference's latency, its peak activation storage (max over workers and per
worker), its other per-worker counters (``worker_stats()``: "Activation transmissions", "Weight
transmissions", "Weight storage", as ``*_per_worker`` lists) and, for the smaller cases, every
worker's job order (``F<s>.<b>`` / ``B<s>.<b>``). The grid includes every configuration of notebook
05's table (:data:`TABLE_SIZES`). ``tests/test_master.py`` compares ``from_placement(...,
rule="parallelsim")`` and the workbench's counters with it. This script imports nothing of the
workbench (it runs under another interpreter); the placements are the document's formulas.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def doc_placement(scheme: str, W: int, R: int):
    """(compute worker, weights worker) of job (s, b) for the document's five schemes."""

    def h(x, y):  # the document's looped hash h(x, y) = (R y mod W) + (x mod R)
        return (R * y) % W + x % R

    return {
        "ddp": lambda s, b: (b % W, b % W),
        "fsdp": lambda s, b: (b % W, s % W),
        "pp": lambda s, b: (s % W, s % W),
        "lpp": lambda s, b: (h(s, b), h(s, b)),
        "fslpp": lambda s, b: (h(s, b), h(s, s)),
    }[scheme]


TABLE_SIZES = [(4, 8), (8, 16), (6, 12)]  # (S, B) of notebook 05's table (repro.unified)


def table_cases() -> list[dict]:
    """Notebook 05's table: DDP/FSDP (W = B), PP (W = S), LPP/FSLPP with G = 2 groups of R = S, and
    the document's example LPP with G = B/2 groups of R = S."""
    cases = []
    for S, B in TABLE_SIZES:
        cases += [dict(scheme=n, S=S, B=B, W=B, R=1) for n in ("ddp", "fsdp")]
        cases.append(dict(scheme="pp", S=S, B=B, W=S, R=1))
        cases += [dict(scheme=n, S=S, B=B, W=2 * S, R=S) for n in ("lpp", "fslpp")]
        cases.append(dict(scheme="lpp", S=S, B=B, W=B // 2 * S, R=S))
    return cases


def grid() -> list[dict]:
    """Cases: DDP/FSDP with W = B, PP with W = S, LPP/FSLPP with W = G R for several G and R, and
    notebook 05's table (:func:`table_cases`), each under the reference's two priority orders."""
    cases = []
    for S, B in [(2, 4), (3, 5), (4, 8), (8, 4), (8, 16), (16, 32)]:
        cases += [dict(scheme=n, S=S, B=B, W=B, R=1) for n in ("ddp", "fsdp")]
        cases.append(dict(scheme="pp", S=S, B=B, W=S, R=1))
    for S, B in [(4, 8), (6, 12), (8, 8), (8, 16), (16, 32)]:
        for R in (1, 2, 4):
            for W in sorted({S, 2 * R, 4 * R}):
                if W % R == 0 and W <= 2 * S:
                    cases += [dict(scheme=n, S=S, B=B, W=W, R=R) for n in ("lpp", "fslpp")]
    cases += [c for c in table_cases() if c not in cases]
    return [dict(c, priority=p) for c in cases for p in ("oldest-batch", "oldest-stage")]


ORDERS_UP_TO = 128  # per-worker orders are recorded where S B <= this (keeps the file small)
#: the reference's per-worker counters (its ``worker_stats()`` columns) -> the keys recorded
COUNTERS = {
    "Activation transmissions": "act_transmissions",
    "Weight transmissions": "weight_transmissions",
    "Weight storage": "weight_storage",
}


def run_case(ps, case: dict) -> dict:
    S, B, W, R = case["S"], case["B"], case["W"], case["R"]
    place = doc_placement(case["scheme"], W, R)

    def schedule(work):
        return ps.ComputeAndWeightWorkers(*place(work.stage, work.batch))

    schedule.__name__ = case["scheme"]
    order = (ps.OldestBatchFirst if case["priority"] == "oldest-batch" else ps.OldestStageFirst)(S, B)
    stats = ps.simulate(W, S, B, schedule, order)
    ws = stats.worker_stats()
    per_worker = [int(v) for v in ws["Max activation storage"]]
    orders: list[list[str]] = [[] for _ in range(W)]
    for wh in stats.all_work:
        kind = "F" if wh.work.direction == ps.Direction.FORWARD else "B"
        orders[wh.performed_by].append(f"{kind}{wh.work.stage}.{wh.work.batch}")
    out = dict(
        case, latency=int(stats.end_time()), peak_activations=max(per_worker), peak_activations_per_worker=per_worker
    )
    for column, key in COUNTERS.items():
        out[f"{key}_per_worker"] = [int(v) for v in ws[column]]
    if S * B <= ORDERS_UP_TO:
        out["orders"] = orders
    return out


def git_head(path: Path) -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reference", type=Path, help="a checkout of a-rahimi/parallel-training (holds parallelsim.py)")
    ap.add_argument("out", type=Path, help="JSON file to write (tests/data/parallelsim/grid.json)")
    ap.add_argument("--commit", help="the reference's commit, where the checkout is not a git work tree")
    args = ap.parse_args()
    if not (args.reference / "parallelsim.py").is_file():
        sys.exit(f"error: {args.reference}/parallelsim.py not found; pass a checkout of a-rahimi/parallel-training")
    sys.path.insert(0, str(args.reference))
    import parallelsim as ps  # the reference, from the checkout given on the command line

    commit = args.commit or git_head(args.reference)
    data = dict(
        reference="github.com/a-rahimi/parallel-training parallelsim.py",
        commit=commit,
        durations=dict(forward=1, backward=2),
        cases=[run_case(ps, c) for c in grid()],
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(data, separators=(",", ":")) + "\n")
    print(f"wrote {len(data['cases'])} cases to {args.out}")


if __name__ == "__main__":
    main()

"""Simulated bubble and peak activation memory of the Seq1F1B family and re-materialization beside
1F1B, ZB-H1 and interleaved 1F1B (modeled: unit costs F = 1, B = 2 per whole-sequence microbatch of
a 4-stage model on 4 workers, 8 microbatches; communication free).

Memory is ``max_w peak_activation_share``: sequences' activations of one of the 4 model quarters,
so an interleaved worker's half-size stages count 1/2 each (recompute rows: n/a, their saving is
in bytes: ``recompute_bytes`` models it from PipeDream's vgg16 GPU profile, 4-stage straight plan,
10 GB/s). ``measured_memory`` runs the segment runtime on 2 gloo ranks and measures it.

    PYTHONPATH=. python benchmarks/seq1f1b_table.py
"""

from __future__ import annotations

import pandas as pd

from workbench.cost.topology import Topology
from workbench.partitioning.search import partition
from workbench.profiling.pipedream import shipped
from workbench.schedules import build
from workbench.simulation import simulate

ROWS = [
    ("pipedream-flush", {}),
    ("zb-h1", {}),
    ("interleaved-1f1b", {"chunks": 2}),
    ("seq1f1b", {"segments": 2}),
    ("seq1f1b", {"segments": 4}),
    ("seq1f1b-interleaved", {"segments": 2, "chunks": 2}),
    ("seq1f1b-interleaved", {"segments": 4, "chunks": 2}),
    ("seq1f1b-zb", {"segments": 2}),
    ("seq1f1b-zb", {"segments": 4}),
    ("pipedream-flush", {"recompute": True}),
    ("gpipe", {}),
    ("gpipe", {"recompute": True}),
]


def table(workers: int = 4, microbatches: int = 8, fwd: float = 1.0, bwd: float = 2.0) -> pd.DataFrame:
    rows = []
    for name, opts in ROWS:
        chunks = opts.get("chunks", 1)
        sched = build(name, workers * chunks, microbatches, **opts)
        res = simulate(sched, fwd=fwd / chunks, bwd=bwd / chunks)
        m = res.metrics
        rows.append(
            {
                "schedule": name,
                "options": ", ".join(f"{k}={v}" for k, v in opts.items()),
                "makespan": res.makespan,
                "bubble": max(m["bubble_fraction"]),
                "peak_activations": float("nan") if sched.recompute else max(m["peak_activation_share"]) / chunks,
            }
        )
    return pd.DataFrame(rows)


def recompute_bytes(microbatches: int = 8) -> pd.DataFrame:
    prof, topo = shipped("vgg16"), Topology.flat(4, 10e9)
    plan = partition(prof, topo, straight=True)
    out = {}
    for re in (False, True):
        res = simulate(
            build("pipedream-flush", plan, microbatches, recompute=re), profile=prof, plan=plan, topology=topo
        )
        out[f"recompute={re}"] = [x / 2**30 for x in res.metrics["peak_activation_bytes"]] + [res.makespan]
    return pd.DataFrame(out, index=[f"worker {w} GiB" for w in range(4)] + ["makespan ms"])


def measured_memory(seq_len: int = 64, microbatches: int = 4, batch: int = 2) -> pd.DataFrame:
    """Measured (2 gloo ranks on this CPU, float64, pydocs text, a 2-block d=32 segment transformer):
    peak bytes autograd keeps for the backward plus stage inputs, per rank (runtime.executors.segments)."""
    from workbench.models.segmented import flop_model, segment_gpt
    from workbench.runtime.executors import segments as R

    x, y, vocab = R.pydocs_batch(microbatches * batch, seq_len, seed=0)
    model = dict(vocab=vocab, context=seq_len, dim=32, num_layers=2, heads=2, seed=0)
    P = flop_model(segment_gpt(**model))
    cases = [
        ("pipedream-flush", {}),
        ("seq1f1b", {"segments": 2}),
        ("seq1f1b", {"segments": 4}),
        ("pipedream-flush", {"recompute": True}),
        ("seq1f1b", {"segments": 4, "recompute": True}),
    ]
    scheds = [
        build(n, 2, microbatches, **(o | ({"seq_len": seq_len, "model": P} if "segments" in o else {})))
        for n, o in cases
    ]
    outs = R.run([R.SegmentJob(s, x, y, model=model, timeout_s=300) for s in scheds])
    return pd.DataFrame(
        [
            {
                "schedule": n,
                "options": ", ".join(f"{k}={v}" for k, v in o.items()),
                **{f"rank {r} KiB": b / 1024 for r, b in enumerate(out["peak_saved_bytes"])},
            }
            for (n, o), out in zip(cases, outs)
        ]
    )


if __name__ == "__main__":
    fmt = lambda x: f"{x:.3f}"  # noqa: E731
    print(table().to_string(index=False, float_format=fmt))
    print()
    print(recompute_bytes().to_string(float_format=fmt))
    print()
    print(measured_memory().to_string(index=False, float_format=lambda x: f"{x:.1f}"))

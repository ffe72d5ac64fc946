"""Validate the modeled (roofline) GPU profile against real PipeDream GPU profiles.

For AlexNet, VGG-16 and ResNet-50 at the batch size of the published ``graph.txt`` (inferred from
its input tensor), build the paper-size model on the meta device, count FLOPs/bytes per layer
(``workbench.profiling.measure.analyze``), project it to a V100 (``workbench.profiling.measure.project``) and compare
total forward, backward and fwd+bwd time with the measured profile. The efficiency factors are the
library defaults, fixed a priori: this script does not fit them.

Prints a table; writes a CSV only with ``--out`` (the committed results/bench/projection.csv is
refreshed on purpose with ``--out results/bench/projection.csv``). Needs ../shared/pipedream-profiles.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd

from workbench import models
from workbench.profiling.measure import Profile, project

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "pipedream-profiles"


def compare(name: str, gpu: str = "V100", winograd: bool = True) -> dict:
    real = Profile.from_pipedream(SHARED / name / "graph.txt")
    batch = int(real.meta["batch_size_if_imagenet"])
    modeled = project(models.build(name, size="paper", device="meta"), gpu, batch_size=batch, winograd=winograd)
    r, m = real.layers, modeled.layers
    row = dict(
        model=name,
        batch_size=batch,
        gpu=gpu,
        winograd=winograd,
        measured_fwd_ms=r.fwd_ms.sum(),
        modeled_fwd_ms=m.fwd_ms.sum(),
        measured_bwd_ms=r.bwd_ms.sum(),
        modeled_bwd_ms=m.bwd_ms.sum(),
    )
    row["measured_total_ms"] = row["measured_fwd_ms"] + row["measured_bwd_ms"]
    row["modeled_total_ms"] = row["modeled_fwd_ms"] + row["modeled_bwd_ms"]
    row["error_total_pct"] = 100 * (row["modeled_total_ms"] / row["measured_total_ms"] - 1)
    row["measured_param_bytes"], row["modeled_param_bytes"] = r.param_bytes.sum(), m.param_bytes.sum()
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None, help="CSV to write (none by default)")
    a = ap.parse_args(argv)
    if not SHARED.exists():
        print(f"needs {SHARED}", file=sys.stderr)
        return 2
    df = pd.DataFrame([compare(n, winograd=w) for w in (False, True) for n in ("alexnet", "vgg16", "resnet50")])
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        df.to_csv(a.out, index=False)
    cols = [
        "model",
        "winograd",
        "batch_size",
        "measured_total_ms",
        "modeled_total_ms",
        "error_total_pct",
        "measured_fwd_ms",
        "modeled_fwd_ms",
        "measured_bwd_ms",
        "modeled_bwd_ms",
    ]
    print("modeled V100 (roofline, a-priori efficiencies) vs measured PipeDream GPU profiles")
    print(df[cols].round(1).to_string(index=False))
    for w, g in df.groupby("winograd"):
        print(f"winograd={w}: mean |error| {g['error_total_pct'].abs().mean():.1f}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())

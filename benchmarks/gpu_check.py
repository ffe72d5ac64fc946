"""One command for a lent GPU: profile, train a pipeline, benchmark, and write CSVs named after the device.

    python benchmarks/gpu_check.py [--out results/bench] [--budget-s 460]

Without a CUDA device it prints one line and exits 0. With one, in about 8 minutes at most:

1. **Profile vs projection.** Profiles two zoo models (paper-size ``resnet50`` at batch 32 and ``gpt``
   at batch 8) layer by layer on ``cuda:0`` with CUDA events
   (:func:`workbench.profiling.measure.profile`) and compares every layer and the totals with the
   roofline projection (:func:`workbench.profiling.measure.project`) for the listed GPU nearest to the
   device (``--spec`` overrides). Writes ``gpu-check-<device>-profile.csv``.
2. **A pipeline on the GPUs.** Trains the float64 toy MLP for 3 steps with several schedules
   (``gpipe``, ``interleaved-1f1b``, ``zb-v``, ``dualpipev``, ``fsdp``: the orders whose NCCL
   matching :mod:`workbench.runtime.transport.comm_plan` proves on CPU) on 2 ranks, once on the CPUs (gloo)
   and once on the GPUs: NCCL with one GPU per rank where 2 are present. With one GPU it tries
   NCCL with both ranks on the one GPU (NCCL may refuse two ranks of one communicator on one
   device) and otherwise one rank (no pipeline: the executor's CUDA path only), and says which ran;
   gloo is not tried, as it cannot send CUDA tensors (torch.distributed's table of backends).
   Compares the losses of every step and the final weights with the CPU run's. Writes
   ``gpu-check-<device>-train.csv``.
3. **The runtime benchmark** (``benchmarks/bench_runtime.py --device cuda``, one repetition) where
   there are 2 GPUs (its rows put rank r on ``cuda:r``), into ``gpu-check-<device>-runtime.csv``,
   with what is left of the budget as its timeout.

Every part reports its failure as one line and the script goes on; the exit status is 1 if a part
failed or a GPU result disagrees with the CPU's, else 0.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILE_MODELS = (("resnet50", 32), ("gpt", 8))
PROFILE_SIZE = "paper"
DEVICE = "cuda"  # the device of the GPU runs (a dry run of the script's logic on a CPU sets "cpu")
SCHEDULES = ("gpipe", "interleaved-1f1b", "zb-v", "dualpipev", "fsdp")
ONE_RANK = ("gpipe", "interleaved-1f1b", "zb-v")  # one rank: its stages in one process
STEPS = 3
TRAIN = dict(  # the float64 toy MLP of the runtime's tests: the CPU and GPU runs agree to rounding
    dtype="float64",
    model_options={"widths": (8, 16, 16, 16, 4)},
    batch_size=16,
    lr=0.1,
    steps=STEPS,
    progress=False,
    return_weights=True,
    timeout_s=120,
    evaluate=False,
)
TOLERANCE = 1e-9  # float64: different kernels, same arithmetic up to rounding


def slug(name: str) -> str:
    """A file-name form of a device name: ``"NVIDIA H200"`` -> ``"nvidia-h200"``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def nearest_spec(name: str, specs) -> str:
    """The listed GPU spec whose name the device name contains (``H200`` -> ``H100``'s family:
    same compute, the nearest listed), else the newest listed."""
    upper = name.upper()
    for key in specs:
        if key.upper().split("-")[0] in upper:
            return key
    if "H200" in upper or "GH200" in upper:
        return "H100"
    return list(specs)[-1]


def _line(e: BaseException) -> str:
    """An exception as one line."""
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def _nccl_version() -> str:
    try:
        import torch.cuda.nccl as nccl

        return ".".join(map(str, nccl.version()))
    except Exception:  # noqa: BLE001 - only printed
        return "?"


def max_diff(a, b) -> float:
    """Largest absolute difference between two per-stage weight lists."""
    return max(float((a[s][n].cpu() - b[s][n].cpu()).abs().max()) for s in range(len(a)) for n in a[s])


# ---- 1. profile vs projection ------------------------------------------------------------------
def profile_rows(spec: str) -> list[dict]:
    import torch

    from workbench import models
    from workbench.profiling.measure import profile, project

    rows = []
    for name, batch in PROFILE_MODELS:
        try:
            measured = profile(models.build(name, size=PROFILE_SIZE), batch_size=batch, device=DEVICE, progress=False)
            modeled = project(models.build(name, size=PROFILE_SIZE, device="meta"), spec, batch_size=batch)
        except Exception as e:  # noqa: BLE001 - one line, the other model still runs
            raise RuntimeError(f"{name}: {_line(e)}") from None
        m, p = measured.layers, modeled.layers
        n = min(len(m), len(p))
        for i in range(n):
            rows.append(
                dict(
                    model=name,
                    batch_size=batch,
                    layer=m["name"].iloc[i],
                    measured_fwd_ms=float(m["fwd_ms"].iloc[i]),
                    modeled_fwd_ms=float(p["fwd_ms"].iloc[i]),
                    measured_bwd_ms=float(m["bwd_ms"].iloc[i]),
                    modeled_bwd_ms=float(p["bwd_ms"].iloc[i]),
                )
            )
        total = dict(
            model=name,
            batch_size=batch,
            layer="TOTAL",
            measured_fwd_ms=float(m["fwd_ms"].sum()),
            modeled_fwd_ms=float(p["fwd_ms"].sum()),
            measured_bwd_ms=float(m["bwd_ms"].sum()),
            modeled_bwd_ms=float(p["bwd_ms"].sum()),
        )
        rows.append(total)
        meas, mod = (
            total["measured_fwd_ms"] + total["measured_bwd_ms"],
            total["modeled_fwd_ms"] + total["modeled_bwd_ms"],
        )
        print(
            f"profile {name} (batch {batch}, {n} layers): measured {meas:.2f} ms fwd+bwd, projected for {spec} "
            f"{mod:.2f} ms ({100 * (mod / meas - 1):+.0f}%); peak memory "
            f"{measured.meta.get('peak_memory_bytes', 0) / 2**30:.2f} GiB"
        )
        del measured
        torch.cuda.empty_cache()
    for r in rows:
        r["spec"] = spec
    return rows


# ---- 2. a pipeline on the GPUs -----------------------------------------------------------------
def _losses(out: Path) -> list[float]:
    import pandas as pd

    return [float(x) for x in pd.read_csv(out / "metrics.csv")["loss"]]


def _jobs(root: Path, tag: str, workers: int, **run):
    from workbench.runtime import prepare

    names = SCHEDULES if workers > 1 else ONE_RANK
    return [
        prepare(
            "toy-mlp",
            name,
            workers=workers,
            microbatches=4,
            out=root / f"{tag}-{name}",
            allow_oversubscribe=True,
            **TRAIN,
            **run,
        )
        for name in names
    ]


def train_rows(gpus: int, root: Path) -> list[dict]:
    from workbench.runtime import run_jobs

    cpu = _jobs(root, "cpu", 2, device="cpu", backend="gloo", transport="gloo")
    cpu_res = run_jobs(cpu)
    attempts = (
        [("nccl", 2, "NCCL, one GPU per rank")]
        if gpus >= 2
        else [
            ("nccl", 2, "NCCL, both ranks on the one GPU"),
            ("nccl", 1, "one rank on the GPU (no pipeline: the executor's CUDA path only)"),
        ]
    )
    rows = []
    for backend, workers, what in attempts:
        t = time.perf_counter()
        try:
            gpu = _jobs(root, f"gpu-{backend}-{workers}", workers, device=DEVICE, backend=backend, transport="gloo")
            res = run_jobs(gpu)
        except Exception as e:  # noqa: BLE001 - reported, the next attempt follows
            first = _line(e)
            print(f"train {what}: failed: {first}")
            rows.append(dict(attempt=what, backend=backend, workers=workers, status="failed", note=first))
            continue
        by_name = {c.schedule.name: (c, r) for c, r in zip(cpu, cpu_res)}
        for job, r in zip(gpu, res):
            cjob, cr = by_name[job.schedule.name]
            gl, cl = _losses(Path(job.run.out)), _losses(Path(cjob.run.out))
            dl = max(abs(a - b) for a, b in zip(gl, cl)) if len(gl) == len(cl) else float("inf")
            dw = max_diff(r["weights"], cr["weights"]) if workers == 2 else float("nan")
            ok = dl <= TOLERANCE and (workers != 2 or dw <= TOLERANCE)
            rows.append(
                dict(
                    attempt=what,
                    backend=backend,
                    workers=workers,
                    schedule=job.schedule.name,
                    status="equal" if ok else "DIFFERENT",
                    steps=len(gl),
                    max_loss_diff=dl,
                    max_weight_diff=dw,
                    seconds=time.perf_counter() - t,
                )
            )
            print(
                f"train {what}: {job.schedule.name}: {len(gl)} steps, losses vs CPU max |diff| {dl:.2e}"
                + (f", weights {dw:.2e}" if workers == 2 else " (1 rank: losses only)")
                + ("" if ok else "  <-- DIFFERENT")
            )
        break  # the first attempt that runs is what the device allows
    return rows


# ---- 3. the runtime benchmark ------------------------------------------------------------------
def bench_runtime(gpus: int, out: Path, timeout_s: float) -> str:
    if gpus < 2:
        return "skipped: benchmarks/bench_runtime.py puts rank r on cuda:r and needs 2 GPUs"
    if timeout_s < 60:
        return f"skipped: {timeout_s:.0f} s of the budget left"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "bench_runtime.py"), "--device", "cuda", "--repeat", "1"]
    cmd += ["--out", str(out)]
    try:
        p = subprocess.run(cmd, cwd=ROOT, timeout=timeout_s, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return f"failed: did not finish within {timeout_s:.0f} s"
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
        return f"failed (exit {p.returncode}): {tail[0][:300]}"
    return f"wrote {out}"


def _write(rows: list[dict], path: Path, device: str) -> None:
    import pandas as pd

    df = pd.DataFrame(rows)
    df.insert(0, "device", device)
    path.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(path, index=False, float_format="%.6g")
    print(f"wrote {path}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "results" / "bench"), help="folder of the CSVs")
    ap.add_argument(
        "--budget-s", type=float, default=460.0, help="seconds for the whole check (the benchmark gets the rest)"
    )
    ap.add_argument(
        "--spec", default=None, help="GPU spec of the projection (default: the listed one nearest the device)"
    )
    a = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: no CUDA device visible (torch.cuda.is_available() is False): nothing to check")
        return 0
    from workbench.profiling.measure import GPUS

    t0 = time.perf_counter()
    gpus, device = torch.cuda.device_count(), torch.cuda.get_device_name(0)
    name, out = slug(device), Path(a.out)
    spec = a.spec or nearest_spec(device, GPUS)
    if spec not in GPUS:
        ap.error(f"unknown --spec {spec!r}; choose one of {sorted(GPUS)}")
    print(
        f"gpu_check: {gpus} x {device} (torch {torch.__version__}, CUDA {torch.version.cuda}, NCCL {_nccl_version()})"
    )
    failed = False
    try:
        _write(profile_rows(spec), out / f"gpu-check-{name}-profile.csv", device)
    except Exception as e:  # noqa: BLE001 - one line, the other parts still run
        print(f"profile: failed: {_line(e)}")
        failed = True
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        try:
            rows = train_rows(gpus, Path(tmp))
            _write(rows, out / f"gpu-check-{name}-train.csv", device)
            failed |= not any(r["status"] == "equal" for r in rows) or any(r["status"] == "DIFFERENT" for r in rows)
        except Exception as e:  # noqa: BLE001
            print(f"train: failed: {_line(e)}")
            failed = True
    left = a.budget_s - (time.perf_counter() - t0)
    msg = bench_runtime(gpus, out / f"gpu-check-{name}-runtime.csv", left)
    print(f"runtime benchmark: {msg}")
    failed |= msg.startswith("failed")
    print(f"gpu_check: {'FAILED' if failed else 'ok'} in {time.perf_counter() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

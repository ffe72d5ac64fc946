"""One command for a lent GPU: what the device can show of the runtime, each part saying what it did not exercise.

    python benchmarks/gpu_check.py [--out results/bench] [--budget-s 460]

Without a CUDA device it prints one line and exits 0. With one, in about 8 minutes at most:

1. **Profile vs projection.** Profiles two zoo models (paper-size ``resnet50`` at batch 32 and ``gpt``
   at batch 8) layer by layer on the GPU with CUDA events
   (:func:`workbench.profiling.measure.profile`) and compares every layer and the totals with the
   roofline projection (:func:`workbench.profiling.measure.project`) for the listed GPU nearest to the
   device (``--spec`` overrides). Writes ``gpu-check-<device>-profile.csv``.
2. **NCCL on the ranks the device allows**, in this script's own processes (each picks its GPU by
   ``LOCAL_RANK``): with 2 GPUs, 2 ranks, one GPU each; with one GPU, 1 rank (an all-reduce and a
   send to itself), then 2 ranks sharing the GPU with distinct NCCL host identities
   (``NCCL_HOSTID``; NCCL refuses two ranks of one communicator on one GPU of one host): an
   all-reduce and a message each way. Writes ``gpu-check-<device>-nccl.csv``.
3. **Each schedule in its own run.** Trains the float64 toy MLP for 3 steps with each of
   ``gpipe``, ``interleaved-1f1b``, ``zb-v``, ``dualpipev``, ``fsdp`` on the ranks step 2 found
   working (NCCL, one GPU each; or 2 ranks on the one GPU with distinct host ids; else 1 rank with
   ``gpipe``, ``interleaved-1f1b``, ``zb-v``), one run per schedule so one failure loses only its
   own result, and compares the final weights with the single-process CPU reference in float64
   (:func:`workbench.runtime.reference_train`); reports the timeline's clock (``cuda-events`` where
   the executor timed its ops with CUDA events). Writes ``gpu-check-<device>-train.csv``.
4. **The runtime benchmark** (``benchmarks/bench_runtime.py --device cuda``, one repetition) where
   there are 2 GPUs (its rows put rank r on ``cuda:r``), into ``gpu-check-<device>-runtime.csv``,
   with what is left of the budget as its timeout.

Each part prints a ``not exercised:`` line. Every part reports its failure as one line and the
script goes on; the exit status is 1 if a part failed or a GPU result disagrees with the CPU's, else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROFILE_MODELS = (("resnet50", 32), ("gpt", 8))
PROFILE_SIZE = "paper"
DEVICE = "cuda"  # the device of the GPU runs (a dry run of the script's logic on a CPU sets "cpu")
SCHEDULES = ("gpipe", "interleaved-1f1b", "zb-v", "dualpipev", "fsdp")  # each in its own run
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


# ---- processes of this script (devices by LOCAL_RANK) --------------------------------------------
def _spawn(fn, args: tuple, nprocs: int, timeout_s: float) -> str:
    """Run ``fn(i, *args)`` in ``nprocs`` spawned processes; '' when all ended well, else one line."""
    import torch.multiprocessing as mp

    ctx = mp.start_processes(fn, args=args, nprocs=nprocs, join=False, start_method="spawn")
    deadline = time.perf_counter() + timeout_s
    try:
        while not ctx.join(timeout=1.0):
            if time.perf_counter() > deadline:
                for p in ctx.processes:
                    p.kill()
                return f"did not finish within {timeout_s:.0f} s"
    except Exception as e:  # noqa: BLE001 - a rank's error, as one line: the traceback's last
        lines = [x for x in str(e).splitlines() if x.strip()]
        return lines[-1][:300] if lines else type(e).__name__
    return ""


def _as_rank(index: int, world: int, port: int, hostids: bool) -> None:
    """This process is rank ``index`` of ``world`` on this machine: the environment torchrun would
    give it (``LOCAL_RANK`` picks its device), and with ``hostids`` an NCCL host identity of its own
    (``NCCL_HOSTID``: NCCL then treats the ranks as on different hosts and lets them share a GPU)."""
    env = dict(RANK=index, LOCAL_RANK=index, WORLD_SIZE=world, LOCAL_WORLD_SIZE=world, MASTER_PORT=port)
    os.environ.update({k: str(v) for k, v in env.items()}, MASTER_ADDR="127.0.0.1")
    if hostids:
        os.environ["NCCL_HOSTID"] = f"gpu-check-rank{index}"


def local_device():
    import torch

    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())


# ---- 2. NCCL on the ranks the device allows ------------------------------------------------------
def _nccl_probe(index: int, world: int, port: int, spec: dict) -> None:
    """Rank ``index``: the process group initialised on its device (``spec``: ``backend``, default
    NCCL; ``hostids``; ``out``), an all-reduce, point-to-point messages (to the other rank each way,
    or to itself when alone). Writes what ran to ``out/rank<i>.json``: True, False (wrong data) or
    the one-line refusal."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    _as_rank(index, world, port, spec["hostids"])
    backend = spec.get("backend", "nccl")
    dev = local_device() if backend == "nccl" else torch.device("cpu")
    kw = dict(device_id=dev) if backend == "nccl" else {}
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group(backend, rank=index, world_size=world, timeout=timedelta(seconds=60), **kw)
    x = torch.full((4,), float(index + 1), device=dev, dtype=torch.float64)
    dist.all_reduce(x)
    done: dict = dict(all_reduce=float(x[0]) == world * (world + 1) / 2)
    for way in ("first", "second")[: 1 if world == 1 else 2]:  # rank 0 sends first, then rank 1
        done[f"p2p_{way}"] = _message(index, world, dev, sending=world == 1 or (index == 0) == (way == "first"))
    Path(spec["out"], f"rank{index}.json").write_text(json.dumps(done))
    dist.destroy_process_group()


def _message(index: int, world: int, dev, *, sending: bool):
    """One message to the other rank (or, alone, to itself: a send and a receive in one batch)."""
    import torch
    import torch.distributed as dist

    peer = index if world == 1 else 1 - index
    buf = torch.zeros(4, device=dev, dtype=torch.float64)
    src = torch.full((4,), 10.0 + index, device=dev, dtype=torch.float64)
    try:
        if world == 1:
            ops = [dist.P2POp(dist.isend, src, peer), dist.P2POp(dist.irecv, buf, peer)]
        else:
            ops = [dist.P2POp(dist.isend, src, peer) if sending else dist.P2POp(dist.irecv, buf, peer)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
    except Exception as e:  # noqa: BLE001 - reported
        return f"refused: {_line(e)}"
    return (sending and world > 1) or float(buf[0]) == 10.0 + peer


def probe_status(err: str, got: list[dict], world: int) -> str:
    """``ok`` (everything ran and carried the right data), ``partial`` (something was refused, nothing
    was wrong) or ``failed`` (a rank failed, or a value was wrong)."""
    values = [v for g in got for v in g.values()]
    if err or len(got) != world or any(v is False for v in values):
        return "failed"
    return "ok" if all(v is True for v in values) else "partial"


def nccl_rows(gpus: int, root: Path, *, timeout_s: float = 120.0, backend: str = "nccl") -> list[dict]:
    """NCCL with 2 ranks, one GPU each (2+ GPUs), or on one GPU: 1 rank (a send to itself), then
    2 ranks sharing it with distinct host identities. One row per attempt."""
    from workbench.runtime.launch.ports import free_port

    attempts = [("2 ranks, one GPU each", 2, False)] if gpus >= 2 else []
    attempts += [] if gpus >= 2 else [("1 rank", 1, False), ("2 ranks on one GPU, distinct NCCL host ids", 2, True)]
    rows = []
    for what, world, hostids in attempts:
        out = root / f"nccl-{world}-{int(hostids)}"
        out.mkdir(parents=True, exist_ok=True)
        spec = dict(hostids=hostids, out=str(out), backend=backend)
        err = _spawn(_nccl_probe, (world, free_port(), spec), world, timeout_s)
        got = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]
        status = probe_status(err, got, world)
        rows.append(dict(part="nccl", attempt=what, workers=world, status=status, note=err or str(got)))
        print(f"nccl {what}: {status}: {err or got}")
    print(f"nccl: not exercised: {unexercised_nccl(gpus, rows)}")
    return rows


def unexercised_nccl(gpus: int, rows: list[dict]) -> str:
    """What the NCCL step's rows leave unshown."""
    shared = any(r["workers"] == 2 and r["status"] == "ok" for r in rows)
    alone = [r for r in rows if r["workers"] == 1 and r["status"] == "partial"]
    refused = " and a send to itself (refused)" if alone else ""
    if gpus >= 2:
        return "more than 2 GPUs, several machines (only 2 ranks on this one)"
    if shared:
        return f"NCCL between two GPUs (the ranks shared one: NCCL's network transport, not P2P/NVLink){refused}"
    return f"any NCCL message between two ranks (two ranks on the one GPU did not run){refused}"


# ---- 3. each schedule on its own ------------------------------------------------------------------
def _train_as_rank(index: int, world: int, jobs, port: int, hostids: bool) -> None:
    from workbench.runtime.launch.rank import worker_main

    _as_rank(index, world, port, hostids)
    worker_main(index, world, jobs, "127.0.0.1", port)


def _run_one(job, hostids: bool, timeout_s: float) -> dict:
    """The summary of one job: through the runtime's launcher, or (``hostids``) on this script's
    processes, each rank with an NCCL host identity of its own."""
    from workbench.runtime import run_jobs
    from workbench.runtime.launch.ports import free_port

    if not hostids:
        return run_jobs([job])[0]
    out = Path(job.run.out)
    out.mkdir(parents=True, exist_ok=True)
    world = job.schedule.num_workers
    err = _spawn(_train_as_rank, (world, [job], free_port(), True), world, timeout_s)
    if err:
        raise RuntimeError(err)
    summary = json.loads((out / "summary.json").read_text())
    summary["weights"] = torch_load(out / "weights.pt")
    return summary


def torch_load(path: Path):
    import torch

    return torch.load(path, weights_only=False)


def train_one(name: str, root: Path, mode: dict) -> dict:
    """One schedule in its own run (``mode``: workers, device, backend, hostids) against the
    single-process CPU float64 reference; one row."""
    import torch

    from workbench.runtime import prepare, reference_train

    t = time.perf_counter()
    row = dict(part="train", attempt=mode["what"], workers=mode["workers"], schedule=name)
    try:
        job = prepare(
            "toy-mlp",
            name,
            workers=mode["workers"],
            microbatches=4,
            out=root / f"{mode['tag']}-{name}",
            allow_oversubscribe=True,
            device=mode["device"],
            backend=mode["backend"],
            transport="gloo",
            **TRAIN,
        )
        summary = _run_one(job, mode.get("hostids", False), timeout_s=180.0)
        ref = reference_train(
            job.schedule,
            job.model_fn(),
            job.bounds,
            job.dataset_fn(),
            batch_size=job.optim.batch_size,
            lr=job.optim.lr,
            rounds=STEPS,
            dtype=torch.float64,
        )
    except Exception as e:  # noqa: BLE001 - this schedule's failure, the next one runs
        row.update(status="failed", note=_line(e), seconds=time.perf_counter() - t)
        print(f"train {mode['what']}: {name}: failed: {_line(e)}")
        return row
    dw = max_diff(summary["weights"], ref)
    clocks = sorted({r.get("timeline_clock", "?") for r in summary.get("ranks", [])})
    row.update(status="equal" if dw <= TOLERANCE else "DIFFERENT", max_weight_diff=dw, clock=",".join(clocks))
    row.update(steps=summary.get("steps"), seconds=time.perf_counter() - t)
    print(
        f"train {mode['what']}: {name}: {summary.get('steps')} steps, weights vs CPU float64 reference "
        f"max |diff| {dw:.2e}, timeline clock {row['clock']}" + ("" if dw <= TOLERANCE else "  <-- DIFFERENT")
    )
    return row


def train_modes(gpus: int, nccl: list[dict]) -> list[dict]:
    """The ranks the training runs on: 2 NCCL ranks where step 2 ran them (one GPU each, or sharing
    the one GPU with distinct host ids), else 1 rank."""
    base = dict(device=DEVICE, backend="nccl")
    if gpus >= 2:
        return [dict(base, what="NCCL, one GPU per rank", workers=2, tag="gpu2")]
    if any(r["workers"] == 2 and r["status"] == "ok" for r in nccl):
        return [dict(base, what="NCCL, 2 ranks on one GPU (distinct host ids)", workers=2, tag="gpu1x2", hostids=True)]
    return [dict(base, what="1 rank on the GPU", workers=1, tag="gpu1")]


def train_rows(modes: list[dict], root: Path, names=None) -> list[dict]:
    """Every schedule of ``names`` (default :data:`SCHEDULES`; one rank: :data:`ONE_RANK`) in its own
    run under each mode, then what the runs left unexercised."""
    rows = []
    for mode in modes:
        for name in names or (SCHEDULES if mode["workers"] > 1 else ONE_RANK):
            rows.append(train_one(name, root, mode))
        print(f"train {mode['what']}: not exercised: {unexercised_train(mode)}")
    return rows


def unexercised_train(mode: dict) -> str:
    if mode["workers"] == 1:
        return "messages between ranks (one rank holds every stage: the executor's CUDA path only)"
    if mode.get("hostids"):
        return "NCCL between two GPUs (both ranks on one GPU), more than 2 ranks"
    return "more than 2 ranks, several machines"


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
        print("profile: not exercised: NCCL and any other GPU (one process, the first GPU)")
    except Exception as e:  # noqa: BLE001 - one line, the other parts still run
        print(f"profile: failed: {_line(e)}")
        failed = True
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        try:
            nccl = nccl_rows(gpus, Path(tmp))
            _write(nccl, out / f"gpu-check-{name}-nccl.csv", device)
            failed |= not any(r["status"] in ("ok", "partial") for r in nccl)
        except Exception as e:  # noqa: BLE001
            print(f"nccl: failed: {_line(e)}")
            nccl, failed = [], True
        try:
            rows = train_rows(train_modes(gpus, nccl), Path(tmp))
            _write(rows, out / f"gpu-check-{name}-train.csv", device)
            failed |= any(r["status"] != "equal" for r in rows)
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

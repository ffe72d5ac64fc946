"""Per-layer profiles: PipeDream's T_l (forward + backward ms), a_l (activation bytes) and w_l
(parameter bytes) for every layer of a layer-sequential model.

A :class:`Profile` wraps a DataFrame with one row per layer in execution order and at least the
columns ``name, fwd_ms, bwd_ms, act_bytes, param_bytes``. ``act_bytes`` is the size of everything
that crosses the cut *after* this layer (the layer's output, plus any skip tensors carried past it)
for one minibatch. ``meta["kind"]`` says whether the numbers were ``measured`` (and where) or
``modeled`` (and from what). A parameter held by several layers (a tied weight) counts in
``param_bytes`` of its first layer only; :func:`profile` lists it in ``meta["tied"]`` as
``[layer indices, bytes]`` (the simulator charges its all-reduce between the owning stages).
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch.utils.flop_counter import FlopCounterMode
from tqdm.auto import tqdm

from workbench.profiling.layering import new_param_bytes, split
from workbench.profiling.table import Profile


def _tensors(x):
    """Flatten a layer input/output (tensor or nested tuple/list of tensors) into a list."""

    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (tuple, list)):
        return [t for item in x for t in _tensors(item)]
    raise TypeError(f"layer inputs/outputs must be tensors or tuples of tensors, got {type(x).__name__}")


def detach_input(x, requires_grad: bool = True):
    """Detach a layer input from earlier layers; floating tensors require grad (the layer's backward
    then includes its input gradient) unless ``requires_grad=False`` (the model's first layer: no
    gradient is computed for the data)."""

    if isinstance(x, torch.Tensor):
        t = x.detach()
        return t.requires_grad_(True) if requires_grad and t.is_floating_point() else t
    return type(x)(detach_input(i, requires_grad) for i in x)


def nbytes(x) -> int:
    """Bytes of a tensor or a tuple of tensors."""
    return sum(t.numel() * t.element_size() for t in _tensors(x))


def layers_and_input(model, example_input, batch_size):
    """``(name, layers, layer names, example input)`` of what :func:`profile` accepts: a zoo
    model (its input built for ``batch_size`` when ``example_input`` is None), a list or Sequential of
    layers, or any module (traced into layers on ``example_input``)."""
    if hasattr(model, "layers") and hasattr(model, "example_input"):  # a zoo LayerModel
        layers = list(model.layers)
        if example_input is None:
            example_input = model.example_input(batch_size)
        name = getattr(model, "name", type(model).__name__)
        names = model.layer_names() if hasattr(model, "layer_names") else None
    elif isinstance(model, torch.nn.Sequential) or isinstance(model, (list, tuple, torch.nn.ModuleList)):
        layers = list(model)
        name, names = type(model).__name__, None
    elif isinstance(model, torch.nn.Module):  # any other module: trace it into layers (workbench.profiling.layering)
        if example_input is None:
            raise ValueError(f"profile() needs example_input to trace {type(model).__name__} into layers")

        return layers_and_input(split(model, example_input), example_input, batch_size)
    else:
        raise ValueError(
            f"profile() needs an nn.Module, a workbench.models LayerModel or a list of modules, "
            f"got {type(model).__name__}"
        )
    if example_input is None:
        raise ValueError("profile() needs example_input for a plain list of layers")
    if not layers:
        raise ValueError("the model has no layers to profile")
    names = names or [f"{i}:{type(l).__name__}" for i, l in enumerate(layers)]
    return name, layers, names, example_input


def _backward_inputs(out):

    outs = [t for t in _tensors(out) if t.requires_grad]
    grads = [torch.ones_like(t) for t in outs]
    return outs, grads


def _flops(layer, x, first: bool = False) -> tuple[float, float]:
    """Forward and backward FLOPs of one layer via torch.utils.flop_counter."""

    x = detach_input(x, not first)
    with FlopCounterMode(display=False) as fc:
        out = layer(x)
    fwd = fc.get_total_flops()
    outs, grads = _backward_inputs(out)
    bwd = 0.0
    if outs:
        with FlopCounterMode(display=False) as fc:
            torch.autograd.backward(outs, grads)
        bwd = fc.get_total_flops()
    layer.zero_grad(set_to_none=True)
    return float(fwd), float(bwd)


def profile(
    model,
    example_input=None,
    *,
    batch_size: int = 32,
    iterations: int = 10,
    warmup: int = 3,
    device=None,
    flops: bool = True,
    progress: bool = True,
    threads: int | None = None,
) -> Profile:
    """Measure every layer of a layer-sequential model on ``device`` (default: CUDA if available).

    For each layer l, with the output of layer l-1 as its (detached) input:
    ``fwd_ms`` / ``bwd_ms`` are medians over ``iterations`` timed runs after ``warmup`` runs
    (CUDA events on a GPU; ``time.perf_counter`` around synchronised calls on a CPU), and
    ``fwd_spread`` / ``bwd_spread`` the spread of those runs, ``(p90 - p10) / median``. The backward
    is timed from a gradient of ones on every floating output and includes the input gradient and
    the weight gradients. ``act_bytes`` counts every tensor the layer passes on (what crosses a cut
    after it), ``param_bytes`` its parameters, ``flops_fwd``/``flops_bwd`` come from
    ``torch.utils.flop_counter.FlopCounterMode``. ``meta["peak_memory_bytes"]``: the CUDA
    allocator's peak on a GPU, the process's max resident set size on a CPU.

    ``threads``: torch threads while measuring (restored afterwards); default
    :func:`threads_per_rank` ``(1)``, all cores this process may use, which is what the one rank
    of a one-worker CPU job gets; pass ``threads_per_rank(W)`` to measure as each rank of a
    W-worker job on this machine will run. ``meta`` records ``threads``, ``cores``, the 1-minute
    load average before and after (``load_before``, ``load_after``) and ``spread``, the spread of
    the whole profile (:func:`relative_spread`); :meth:`Profile.trust_note` turns them into a warning.
    """

    if iterations < 1 or warmup < 0:
        raise ValueError(f"iterations must be >= 1 and warmup >= 0 (got {iterations}, {warmup})")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1 (got {batch_size})")
    threads = threads_per_rank(1) if threads is None else _check_threads(threads)
    name, layers, names, x = layers_and_input(model, example_input, batch_size)
    batch_size = _batch_of(x, batch_size)
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    timing = _Timing(warmup, iterations, dev, flops)
    layers = [l.to(dev) for l in layers]
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    before, load_before = torch.get_num_threads(), _load()
    torch.set_num_threads(threads)
    try:
        rows = _measure_layers(layers, names, _to(x, dev), timing, f"profiling {name}", progress=progress)
    finally:
        torch.set_num_threads(before)
    meta = _measurement_meta(name, batch_size, timing, threads, load_before)
    df = pd.DataFrame(rows)
    ranges = df.pop("_fwd_range") + df.pop("_bwd_range")
    meta["spread"] = float(ranges.sum() / max(float((df["fwd_ms"] + df["bwd_ms"]).sum()), 1e-12))
    if tied := _tied_layers(layers):
        meta["tied"] = tied
    if rows and all("own_act_bytes" in r for r in rows):
        meta["graph"] = layer_dag(rows, [layer.reads_from for layer in layers])
    return Profile(df, meta)


@dataclass(frozen=True)
class _Timing:
    """How :func:`profile` times each layer: ``warmup`` untimed then ``iterations`` timed runs on
    ``dev``; ``flops``: also count FLOPs."""

    warmup: int
    iterations: int
    dev: Any
    flops: bool


def _measure_layers(layers, names, x, timing: _Timing, desc: str, *, progress: bool) -> list[dict]:
    """One row per layer (the columns :func:`profile` documents, plus the private ``_fwd_range`` /
    ``_bwd_range``), each layer fed the detached output of the one before."""

    rows, seen = [], set[int]()
    for i, layer in enumerate(tqdm(layers, desc=desc, disable=not progress, leave=False)):
        try:
            fwd_times, bwd_times, out = _time_layer(
                layer, x, i, names[i], timing.warmup, iterations=timing.iterations, dev=timing.dev
            )
        except (RuntimeError, TypeError, IndexError) as e:
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            shape = tuple(x.shape) if torch.is_tensor(x) else [tuple(t.shape) for t in x if torch.is_tensor(t)]
            raise ValueError(f"layer {i} ({names[i]}) cannot take its input of shape {shape}: {first}") from None
        row = dict(
            name=names[i],
            fwd_ms=_median(fwd_times),
            bwd_ms=_median(bwd_times),
            act_bytes=float(nbytes(out)),
            param_bytes=float(new_param_bytes(layer, seen)),
            input_bytes=float(nbytes(x)),
            fwd_spread=relative_spread(fwd_times),
            bwd_spread=relative_spread(bwd_times),
            _fwd_range=_range(fwd_times),
            _bwd_range=_range(bwd_times),
        )
        if timing.flops:
            row["flops_fwd"], row["flops_bwd"] = _flops(layer, x, first=i == 0)
        if getattr(layer, "reads_from", None) is not None:
            row["own_act_bytes"] = float(_own_bytes(out, layer.own_out))
        rows.append(row)
        x = detach_input(out).detach() if isinstance(out, torch.Tensor) else tuple(t.detach() for t in _tensors(out))
        if not isinstance(out, torch.Tensor):
            x = _regroup(out, x)
    return rows


def _measurement_meta(model: str, batch_size: int, timing: _Timing, threads: int, load_before: float | None) -> dict:
    """Where and how a profile was measured (read right after the measurement: peak memory, load)."""

    dev = timing.dev
    cuda = dev.type == "cuda"
    peak = torch.cuda.max_memory_allocated(dev) if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return dict(
        kind="measured",
        model=model,
        batch_size=batch_size,
        device=torch.cuda.get_device_name(dev) if cuda else f"CPU ({threads} threads)",
        iterations=timing.iterations,
        warmup=timing.warmup,
        peak_memory_bytes=int(peak),
        timer="cuda events" if cuda else "time.perf_counter",
        torch=torch.__version__,
        threads=threads,
        cores=_cores(),
        load_before=load_before,
        load_after=_load(),
    )


def _time_layer(layer, x, i: int, name: str, warmup: int, *, iterations: int, dev):
    """``iterations`` forward and backward times (ms) of one layer after ``warmup`` untimed runs,
    and its output (no autograd graph) for the next layer."""

    layer.train()
    fwd_times, bwd_times = [], []
    for it in range(warmup + iterations):
        inp = detach_input(x, i > 0)
        out, tf = _timed(lambda: _call(layer, inp, i, name), dev)
        outs, grads = _backward_inputs(out)
        tb = 0.0
        if outs:
            _, tb = _timed(lambda: torch.autograd.backward(outs, grads), dev)
        if it >= warmup:
            fwd_times.append(tf)
            bwd_times.append(tb)
        layer.zero_grad(set_to_none=True)
    with torch.no_grad():
        out = layer(detach_input(x))
    return fwd_times, bwd_times, out


def _timed(fn, dev):
    """``(fn(), ms)``: CUDA events on a GPU, ``time.perf_counter`` around synchronised calls else."""

    if dev.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        r = fn()
        end.record()
        torch.cuda.synchronize(dev)
        return r, start.elapsed_time(end)
    t0 = time.perf_counter()
    r = fn()
    return r, (time.perf_counter() - t0) * 1e3


def _median(times) -> float:
    return float(np.median(times))


def _range(times) -> float:
    """``p90 - p10`` of repeated times (0 for one run)."""
    return float(np.percentile(times, 90) - np.percentile(times, 10)) if len(times) > 1 else 0.0


def relative_spread(times) -> float:
    """Relative spread ``(p90 - p10) / median`` of repeated times (0 for one run or a zero median)."""
    med = _median(times)
    return _range(times) / med if med > 0 else 0.0


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        return os.cpu_count() or 1


def threads_per_rank(workers: int = 1) -> int:
    """Torch threads each of ``workers`` CPU ranks on this machine gets by default from
    :func:`workbench.runtime.train`: ``max(1, cores // workers)`` (cores this process may use)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be a positive int, got {workers!r}")
    return max(1, _cores() // workers)


def _check_threads(threads) -> int:
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int (torch threads while profiling), got {threads!r}")
    return threads


def _load() -> float | None:
    """The 1-minute load average (runnable processes, all users), None where the OS has none."""
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):  # pragma: no cover
        return None


def _own_bytes(out, own: tuple[int, ...]) -> int:
    """Bytes of the outputs a layer computes itself (positions ``own``; the rest pass through)."""
    outs = list(out) if isinstance(out, (tuple, list)) else [out]
    return sum(nbytes(outs[k]) for k in own)


def layer_dag(rows: list[dict], reads_from: list) -> dict:
    """The layer DAG of a traced model's profile (``meta["graph"]``, :class:`~workbench.partitioning.antichain.LayerGraph`
    form): node ``node0`` is the input (its first layer's ``input_bytes``), ``node{i+1}`` layer i with
    its own outputs' bytes; an edge from every layer (or the input) whose values layer i reads."""
    nodes = [["node0", "Input0", 0.0, 0.0, rows[0]["input_bytes"], 0.0]]
    nodes += [
        [f"node{i + 1}", r["name"], r["fwd_ms"], r["bwd_ms"], r["own_act_bytes"], r["param_bytes"]]
        for i, r in enumerate(rows)
    ]
    edges = [[f"node{j + 1}", f"node{i + 1}"] for i, src in enumerate(reads_from) for j in src]
    return {"nodes": nodes, "edges": edges}


def _batch_of(x, default: int) -> int:
    """The batch size a profile really measured: the first dimension of its first input tensor."""
    ts = _tensors(x) if x is not None else []
    return int(ts[0].shape[0]) if ts and ts[0].dim() else default


def _call(layer, inp, i: int, name: str):
    """``layer(inp)``, with an in-place operation on the layer's input named instead of autograd's
    bare "a leaf Variable that requires grad is being used in an in-place operation"."""
    try:
        return layer(inp)
    except TypeError as e:
        raise ValueError(
            f"layer {i} ({name}: {type(layer).__name__}) cannot take the previous layer's output "
            f"({_describe(inp)}) as its one argument ({e}); in a layer-sequential model every layer "
            "takes its predecessor's output: wrap a layer of several arguments with the layer that "
            "produces them, or trace the model with workbench.profiling.layering.split"
        ) from None
    except RuntimeError as e:
        if "in-place" not in str(e) and "inplace" not in str(e):
            raise
        raise ValueError(
            f"layer {i} ({name}: {type(layer).__name__}) modifies its input in place (e.g. "
            "ReLU(inplace=True) at the start of a layer); trace the model with workbench.profiling.layering.split "
            "(it keeps in-place operations with the layer that produced their input) or use "
            "inplace=False"
        ) from None


def _tied_layers(layers) -> list:
    """``[(layer indices, bytes)]`` of every parameter held by several layers (a tied weight)."""
    where: dict[int, list] = {}
    size = {}
    for i, layer in enumerate(layers):
        for p in layer.parameters():
            where.setdefault(id(p), []).append(i)
            size[id(p)] = p.numel() * p.element_size()
    return [[sorted(set(idx)), int(size[k])] for k, idx in where.items() if len(set(idx)) > 1]


def _describe(x) -> str:
    """``tensor (8, 4)`` or ``tuple of 2 tensors``: what a layer was given."""
    ts = _tensors(x)
    return f"tensor {tuple(ts[0].shape)}" if len(ts) == 1 and ts[0] is x else f"{type(x).__name__} of {len(ts)} tensors"


def _to(x, dev):

    if isinstance(x, torch.Tensor):
        return x.to(dev)
    return type(x)(_to(i, dev) for i in x)


def _regroup(template, flat):
    """Rebuild the (nested) tuple structure of ``template`` from a flat list of tensors."""

    it = iter(flat)

    def build(t):
        if isinstance(t, torch.Tensor):
            return next(it)
        return type(t)(build(i) for i in t)

    return build(template)


# ---------------------------------------------------------------------------------------------
# Modeled profiles for a target GPU
# ---------------------------------------------------------------------------------------------
#: Peak dense FP32 throughput (FLOP/s, non-tensor-core) and memory bandwidth (bytes/s) from the
#: vendors' data sheets: V100 SXM2 15.7 TFLOP/s, 900 GB/s; GTX 1080 Ti 11.3 TFLOP/s, 484 GB/s;
#: A100 SXM 19.5 TFLOP/s FP32 (156 TF32 tensor), 1555 GB/s (40 GB); H100 SXM 67 TFLOP/s FP32
#: (495 dense TF32 tensor), 3350 GB/s. FP32 without tensor cores matches PipeDream's (2019) setting.
#: ``memory``: device memory in bytes (V100 16 GB, or 32 GB as "V100-32GB"; 1080 Ti 11 GB; A100 40 GB;
#: H100 SXM 80 GB), recorded in a modeled profile's ``meta["device_memory_bytes"]``.
GPUS = {
    "V100": dict(flops=15.7e12, mem_bw=900e9, memory=16 * 2**30),
    "V100-32GB": dict(flops=15.7e12, mem_bw=900e9, memory=32 * 2**30),
    "1080Ti": dict(flops=11.3e12, mem_bw=484e9, memory=11 * 2**30),
    "A100": dict(flops=19.5e12, mem_bw=1555e9, memory=40 * 2**30),
    "H100": dict(flops=67e12, mem_bw=3350e9, memory=80 * 2**30),
}
#: Efficiency factors of the projection, chosen a priori (not fitted to the validation profiles):
#: dense layers reach about half of peak FLOP/s in FP32 cuDNN/cuBLAS kernels and memory-bound
#: layers about 70% of peak bandwidth; every kernel costs at least ~10 us of launch overhead.
COMPUTE_EFFICIENCY = 0.5
MEMORY_EFFICIENCY = 0.7
LAUNCH_MS = 0.01


def _winograd_flops(layer, x) -> float:
    """Forward FLOPs of the layer's 3x3, stride-1, ungrouped convolutions (direct-convolution
    count 2·N·C_out·H_out·W_out·C_in·9), captured with forward hooks."""

    total = [0.0]

    def hook(mod, inp, out):
        n, c_out = out.shape[0], out.shape[1]
        total[0] += 2.0 * n * c_out * out.shape[2] * out.shape[3] * mod.in_channels * 9

    handles = [
        m.register_forward_hook(hook)
        for m in layer.modules()
        if isinstance(m, torch.nn.Conv2d)
        and m.kernel_size == (3, 3)
        and m.stride == (1, 1)
        and m.groups == 1
        and m.dilation == (1, 1)
    ]
    if handles:
        with torch.no_grad():
            layer(x)
        for h in handles:
            h.remove()
    return total[0]


def analyze(model, example_input=None, *, batch_size: int = 32) -> pd.DataFrame:
    """FLOPs and bytes of every layer without timing (works on the meta device, so paper-size
    models cost no memory): columns name, flops_fwd, flops_bwd, flops_conv3x3 (the forward FLOPs
    of 3x3 stride-1 convolutions, which GPU libraries run with Winograd), input_grad (False for the
    first layer: no gradient is computed for the data), act_bytes, input_bytes, param_bytes."""

    name, layers, names, x = layers_and_input(model, example_input, batch_size)
    rows, seen = [], set[int]()
    for i, layer in enumerate(layers):
        fwd, bwd = _flops(layer, x, first=i == 0)
        out = layer(detach_input(x, i > 0))
        rows.append(
            dict(
                name=names[i],
                flops_fwd=fwd,
                flops_bwd=bwd,
                flops_conv3x3=_winograd_flops(layer, x),
                input_grad=i > 0,
                act_bytes=float(nbytes(out)),
                input_bytes=float(nbytes(x)),
                param_bytes=float(new_param_bytes(layer, seen)),
            )
        )
        x = _regroup(out, [t.detach() for t in _tensors(out)])
    return pd.DataFrame(rows)


#: Multiplications saved by Winograd F(2x2, 3x3) on 3x3 stride-1 convolutions (Lavin & Gray,
#: CVPR 2016: 16 instead of 36 multiplies per 2x2 output tile), which cuDNN selects for them.
WINOGRAD_SPEEDUP = 36 / 16


def project(
    model_or_frame,
    gpu: str = "V100",
    *,
    batch_size: int = 32,
    example_input=None,
    compute_efficiency: float = COMPUTE_EFFICIENCY,
    memory_efficiency: float = MEMORY_EFFICIENCY,
    winograd: bool = True,
) -> Profile:
    """A *modeled* profile for ``gpu`` (one of :data:`GPUS`), from FLOPs and bytes (roofline):

    ``fwd_ms = max(F_fwd / (peak · ce), (input + output + params) bytes / (bw · me)) + launch``
    ``bwd_ms = max(F_bwd / (peak · ce), 2 · (input + output) + 2 · params bytes / (bw · me)) + launch``

    with ce = ``compute_efficiency`` and me = ``memory_efficiency``. With ``winograd`` the FLOPs
    of 3x3 stride-1 convolutions count ``1 / WINOGRAD_SPEEDUP`` of their direct-convolution value
    in the forward and in both backward products (F_bwd discounts twice their forward FLOPs, or
    once for the model's first layer, which computes no input gradient). The profile's
    ``meta["kind"]`` is ``"modeled"``.
    """
    if gpu not in GPUS:
        raise ValueError(f"unknown GPU {gpu!r}; choose one of {sorted(GPUS)}")
    if not (0 < compute_efficiency <= 1 and 0 < memory_efficiency <= 1):
        raise ValueError("efficiency factors must be in (0, 1]")
    df = (
        model_or_frame
        if isinstance(model_or_frame, pd.DataFrame)
        else analyze(model_or_frame, example_input, batch_size=batch_size)
    )
    spec = GPUS[gpu]
    peak, bw = spec["flops"] * compute_efficiency, spec["mem_bw"] * memory_efficiency
    io = df["input_bytes"] + df["act_bytes"]
    f_fwd, f_bwd = df["flops_fwd"].astype(float), df["flops_bwd"].astype(float)
    if winograd and "flops_conv3x3" in df:
        saved = df["flops_conv3x3"] * (1 - 1 / WINOGRAD_SPEEDUP)
        bwd_products = np.where(df.get("input_grad", True), 2, 1)  # first layer: weight gradient only
        f_fwd, f_bwd = f_fwd - saved, f_bwd - bwd_products * saved
    out = df.copy()
    out["fwd_ms"] = np.maximum(f_fwd / peak, (io + df["param_bytes"]) / bw) * 1e3 + LAUNCH_MS
    out["bwd_ms"] = np.maximum(f_bwd / peak, (2 * io + 2 * df["param_bytes"]) / bw) * 1e3 + LAUNCH_MS
    name = getattr(model_or_frame, "name", "frame")
    meta = dict(
        kind="modeled",
        device=f"{gpu} (modeled)",
        model=name,
        batch_size=_batch_of(example_input, batch_size),
        method="roofline from torch.utils.flop_counter FLOPs and tensor bytes" + (", Winograd 3x3" if winograd else ""),
        compute_efficiency=compute_efficiency,
        memory_efficiency=memory_efficiency,
        peak_flops=spec["flops"],
        mem_bw=spec["mem_bw"],
        device_memory_bytes=spec["memory"],
    )
    return Profile(out, meta)

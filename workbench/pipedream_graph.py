"""Import PipeDream's ``graph.txt`` layer profiles (msr-fiddle/pipedream's profiler output).

Format: one line per node ``nodeN -- <module repr> -- forward_compute_time=<ms>,
backward_compute_time=<ms>, activation_size=<bytes>, parameter_size=<bytes>``, then one
tab-indented line per edge ``nodeA -- nodeB``. Node lines are not in execution order.

Linearisation: nodes are put in a topological order (Kahn's algorithm, ties broken by node number,
which follows PipeDream's creation order). The ``Input`` node is dropped (its time is data
loading, not layer compute; its size is recorded as ``meta["input_bytes"]``). For a cut after
position i of the order, every node at a position <= i that has a consumer at a position > i must
be sent across the cut: ``act_bytes[i]`` is the sum of their activation sizes. For a chain this is
just the layer's own output; across a ResNet block it also counts the skip tensor.
"""
from __future__ import annotations

import heapq
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from .profiler import Profile

_NODE = re.compile(r"^(node\d+) -- (.*) -- forward_compute_time=([^,]+), backward_compute_time=([^,]+), "
                   r"activation_size=([^,]+), parameter_size=(.+)$")
_EDGE = re.compile(r"^\s+(node\d+) -- (node\d+)\s*$")


def read_graph(path) -> "Profile":
    from .profiler import Profile

    path = Path(path)
    if path.is_dir():
        path = path / "graph.txt"
    if not path.exists():
        raise ValueError(f"PipeDream profile {path} does not exist")
    nodes: dict[str, dict] = {}
    edges: list[tuple[str, str]] = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        if m := _EDGE.match(line):
            edges.append((m.group(1), m.group(2)))
        elif m := _NODE.match(line):
            nid, desc, f, b, a, p = m.groups()
            nodes[nid] = dict(node=nid, desc=desc.strip(), fwd_ms=float(f), bwd_ms=float(b),
                              act_bytes_own=float(a), param_bytes=float(p))
        else:
            raise ValueError(f"{path}:{lineno}: not a PipeDream graph.txt line: {line[:80]!r}")
    if not nodes:
        raise ValueError(f"{path} has no nodes; is it a PipeDream graph.txt?")
    for a, b in edges:
        if a not in nodes or b not in nodes:
            raise ValueError(f"{path}: edge {a} -- {b} names an unknown node")
    order = _topological(nodes, edges, path)
    inputs = [n for n in order if nodes[n]["desc"] == "Input"]
    input_bytes = sum(nodes[n]["act_bytes_own"] for n in inputs)
    order = [n for n in order if nodes[n]["desc"] != "Input"]
    pos = {n: i for i, n in enumerate(order)}
    last_use = {n: pos[n] for n in order}  # latest position of a consumer
    for a, b in edges:
        if a in pos and b in pos:
            last_use[a] = max(last_use[a], pos[b])
    rows = []
    for i, n in enumerate(order):
        crossing = [m for m in order[: i + 1] if last_use[m] > i]
        if i == len(order) - 1:
            crossing = [n]  # the model's output (goes to the loss)
        d = nodes[n]
        rows.append(dict(name=f"{n}:{d['desc'].split('(')[0]}", fwd_ms=d["fwd_ms"], bwd_ms=d["bwd_ms"],
                         act_bytes=sum(nodes[m]["act_bytes_own"] for m in crossing),
                         param_bytes=d["param_bytes"], node=n, module=d["desc"],
                         crossing=len(crossing)))
    meta = dict(kind="measured", source=f"PipeDream graph.txt ({path})", device="GPU (PipeDream profiler)",
                input_bytes=input_bytes)
    if input_bytes:
        meta["batch_size_if_imagenet"] = round(input_bytes / (3 * 224 * 224 * 4))
    return Profile(pd.DataFrame(rows), meta)


def _topological(nodes, edges, path) -> list[str]:
    succ = {n: [] for n in nodes}
    indeg = {n: 0 for n in nodes}
    for a, b in edges:
        succ[a].append(b)
        indeg[b] += 1
    key = lambda n: int(n[4:])  # noqa: E731
    heap = [(key(n), n) for n, d in indeg.items() if d == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, n = heapq.heappop(heap)
        out.append(n)
        for m in succ[n]:
            indeg[m] -= 1
            if indeg[m] == 0:
                heapq.heappush(heap, (key(m), m))
    if len(out) != len(nodes):
        raise ValueError(f"{path}: the graph has a cycle; PipeDream graphs are DAGs")
    return out


#: PipeDream's published GPU profiles that ship inside the package (see data/pipedream/README.md).
SHIPPED = ("alexnet", "resnet50", "vgg16")


def shipped_path(name: str) -> Path:
    """Path of a shipped PipeDream ``graph.txt`` (``name`` in :data:`SHIPPED`)."""
    if name not in SHIPPED:
        raise ValueError(f"no shipped PipeDream profile {name!r}; choose one of {', '.join(SHIPPED)}")
    return Path(__file__).resolve().parent / "data" / "pipedream" / name / "graph.txt"


def shipped(name: str) -> "Profile":
    """PipeDream's published GPU profile of ``name`` (alexnet, resnet50, vgg16) as a Profile."""
    return read_graph(shipped_path(name))

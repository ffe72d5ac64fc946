"""Import PipeDream's ``graph.txt`` layer profiles (msr-fiddle/pipedream's profiler output).

Format: one line per node ``nodeN -- <module repr> -- forward_compute_time=<ms>,
backward_compute_time=<ms>, activation_size=<bytes>, parameter_size=<bytes>``, then one
tab-indented line per edge ``nodeA -- nodeB``. Node lines are not in execution order.

Recurrent models (GNMT) produce several tensors per node: their ``activation_size`` is a list
``[a; b; c]`` (bytes of each output, ``;``-separated). The parts are kept (column ``act_parts``,
text ``"a;b;c"`` in bytes, so it survives CSV and JSON) and their sum is the node's activation size. A number that does not parse names the file
and line.

Linearisation: nodes are put in a topological order (Kahn's algorithm, ties broken by node number,
which follows PipeDream's creation order). Input nodes (``Input``, ``Input0``, ``Input1``, ...)
are inputs, not layers: they are dropped from the rows (their time is data loading, not compute;
their total size is ``meta["input_bytes"]``, the parts ``meta["input_parts_bytes"]``). For a cut after
position i of the order, every tensor produced at a position <= i (or an input) that has a consumer
at a position > i must be sent across the cut (PipeDream's runtime forwards it stage to stage):
``act_bytes[i]`` is the sum of their activation sizes. For a chain this is just the layer's own
output; across a ResNet block it also counts the skip tensor; in GNMT, the source lengths
(``Input1``) that the decoder reads.
"""

from __future__ import annotations

import heapq
import json
import re
from functools import cache
from pathlib import Path

import pandas as pd

from workbench.profiling.graph import LayerGraph, node_on_cycle
from workbench.profiling.table import Profile, register_reader

_NODE = re.compile(
    r"^(node\d+) -- (.*) -- forward_compute_time=([^,]+), backward_compute_time=([^,]+), "
    r"activation_size=([^,]+), parameter_size=(.+)$"
)
_EDGE = re.compile(r"^\s+(node\d+) -- (node\d+)\s*$")
_INPUT = re.compile(r"^Input\d*$")


def _bytes(text: str, where: str) -> tuple[float, ...]:
    """``123.0`` -> (123.0,); ``[1.0; 2.0]`` -> (1.0, 2.0); ValueError naming ``where`` otherwise."""
    t = text.strip()
    parts = t[1:-1].split(";") if t.startswith("[") and t.endswith("]") else [t]
    try:
        vals = tuple(float(p) for p in parts if p.strip())
    except ValueError:
        vals = ()
    if not vals or any(v < 0 or v != v for v in vals):
        raise ValueError(f"{where}: {text!r} is not a size in bytes (a number, or a list [a; b; ...])")
    return vals


def _parse(path: Path) -> tuple[dict[str, dict], list[tuple[str, str]]]:
    """Nodes (file order) and edges (file order) of a ``graph.txt``; errors name file, line and node."""
    nodes: dict[str, dict] = {}
    edges: list[tuple[str, str]] = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        if m := _EDGE.match(line):
            edges.append((m.group(1), m.group(2)))
        elif m := _NODE.match(line):
            nid, desc, f, b, a, p = m.groups()
            parts = _bytes(a, f"{where}: activation_size")
            nodes[nid] = dict(
                node=nid,
                desc=desc.strip(),
                fwd_ms=_number(f, where),
                bwd_ms=_number(b, where),
                act_parts=parts,
                act_bytes_own=sum(parts),
                param_bytes=sum(_bytes(p, f"{where}: parameter_size")),
            )
        else:
            nid = re.match(r"^(node\d+) -- ", line)
            hint = (
                (
                    f" (node {nid.group(1)} needs forward_compute_time=, backward_compute_time=, activation_size=, "
                    "parameter_size=)"
                )
                if nid
                else ""
            )
            raise ValueError(f"{where}: not a PipeDream graph.txt line{hint}: {line[:80]!r}")
    if not nodes:
        raise ValueError(f"{path} has no nodes; is it a PipeDream graph.txt?")
    for a, b in edges:
        if a not in nodes or b not in nodes:
            raise ValueError(f"{path}: edge {a} -- {b} names an unknown node {a if a not in nodes else b}")
    return nodes, edges


def _read(path) -> tuple[Path, dict, list, list[str]]:
    """The ``graph.txt`` at ``path`` (or in the folder ``path``): its path, nodes, edges and a
    topological order (one-line errors for a missing file, a bad line or a cycle)."""
    path = Path(path)
    if path.is_dir():
        path = path / "graph.txt"
    if not path.exists():
        raise ValueError(f"PipeDream profile {path} does not exist")
    nodes, edges = _parse(path)
    return path, nodes, edges, _topological(nodes, edges, path)


def layer_graph(path) -> LayerGraph:
    """The node DAG of a ``graph.txt`` (every node, inputs included, file order) for PipeDream's
    antichain states (:mod:`workbench.partitioning.antichain`)."""
    _, nodes, edges, _ = _read(path)
    return _as_layer_graph(nodes, edges)


def _as_layer_graph(nodes: dict, edges: list) -> LayerGraph:
    vals = list(nodes.values())
    return LayerGraph(
        tuple(nodes),
        tuple(d["desc"] for d in vals),
        tuple(d["fwd_ms"] for d in vals),
        tuple(d["bwd_ms"] for d in vals),
        tuple(d["act_bytes_own"] for d in vals),
        tuple(d["param_bytes"] for d in vals),
        tuple(edges),
    )


def read_graph(path, label: str | None = None) -> Profile:
    """A Profile from PipeDream's ``graph.txt`` (module docstring); ``meta["source"]`` names it
    ``label`` (default: the path as given). ``meta["graph"]`` keeps the node DAG
    (:meth:`LayerGraph.to_dict`) for PipeDream's antichain states."""
    path, nodes, edges, order = _read(path)
    inputs = [n for n in order if _INPUT.match(nodes[n]["desc"])]
    layers = [n for n in order if n not in set(inputs)]
    if not layers:
        raise ValueError(f"{path}: only input nodes; a profile needs at least one layer")
    own = {n: d["act_bytes_own"] for n, d in nodes.items()}
    rows = []
    for n, (act, count) in zip(layers, _crossing(inputs, layers, edges, own)):
        d = nodes[n]
        rows.append(
            dict(
                name=f"{n}:{d['desc'].split('(')[0]}",
                fwd_ms=d["fwd_ms"],
                bwd_ms=d["bwd_ms"],
                act_bytes=act,
                param_bytes=d["param_bytes"],
                node=n,
                module=d["desc"],
                crossing=count,
                act_parts=";".join(f"{v:g}" for v in d["act_parts"]),
            )
        )
    input_bytes = sum(nodes[n]["act_bytes_own"] for n in inputs)
    meta = dict(
        kind="measured",
        source=f"PipeDream graph.txt ({label or path})",
        device="GPU (PipeDream profiler)",
        input_bytes=input_bytes,
        input_parts_bytes=[nodes[n]["act_bytes_own"] for n in inputs],
        graph=_as_layer_graph(nodes, edges).to_dict(),
    )
    if input_bytes and len(inputs) == 1:
        meta["batch_size_if_imagenet"] = round(input_bytes / (3 * 224 * 224 * 4))
    return Profile(pd.DataFrame(rows), meta)


def _crossing(inputs: list, layers: list, edges, own: dict) -> list[tuple[float, int]]:
    """Per layer position i: (bytes, count) of the tensors crossing the cut after i (module docstring)."""
    pos = {n: i for i, n in enumerate(layers)}
    for n in inputs:
        pos[n] = -1  # produced before the first layer
    last_use = dict(pos)  # latest position of a consumer
    for a, b in edges:
        if b in pos and pos[b] >= 0 and a in last_use:
            last_use[a] = max(last_use[a], pos[b])
    producers = inputs + layers
    out = []
    for i, n in enumerate(layers):
        crossing = [m for m in producers if pos[m] <= i and last_use[m] > i]
        if i == len(layers) - 1:
            crossing = [n]  # the model's output (goes to the loss)
        out.append((sum(own[m] for m in crossing), len(crossing)))
    return out


def in_order(profile: Profile, layer_nodes: list[str]) -> Profile:
    """``profile`` (read from a graph.txt) with its layers in another topological order
    ``layer_nodes`` (node ids), ``act_bytes`` and ``crossing`` recomputed for that order."""
    if "graph" not in profile.meta or "node" not in profile.layers:
        raise ValueError("in_order needs a profile read from a PipeDream graph.txt (meta['graph'] and a 'node' column)")
    g = LayerGraph.from_dict(profile.meta["graph"])
    df = profile.layers.set_index("node", drop=False)
    if sorted(layer_nodes) != sorted(df.index):
        raise ValueError("in_order needs every layer node of the profile exactly once")
    seen: set = set()
    pred = {v: [a for a, b in g.edges if b == v] for v in layer_nodes}
    for v in layer_nodes:
        late = [a for a in pred[v] if a in df.index and a not in seen]
        if late:
            raise ValueError(f"in_order: node {v} comes before its input {late[0]}; give a topological order")
        seen.add(v)
    inputs = [v for v in g.ids if v not in df.index]
    own = dict(zip(g.ids, g.act_bytes))
    rows = df.loc[list(layer_nodes)].reset_index(drop=True)
    cross = _crossing(inputs, list(layer_nodes), g.edges, own)
    rows["act_bytes"] = [a for a, _ in cross]
    rows["crossing"] = [c for _, c in cross]
    return Profile(rows, dict(profile.meta))


def _number(text: str, where: str) -> float:
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not v >= 0:  # negative or nan
        raise ValueError(f"{where}: compute time {text!r} is not a number of ms >= 0")
    return v


def _topological(nodes, edges, path) -> list[str]:
    succ: dict[str, list[str]] = {n: [] for n in nodes}
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
        bad = node_on_cycle({n for n in nodes if indeg[n] > 0}, edges)
        raise ValueError(
            f"{path}: the graph has a cycle through node {bad}; PipeDream graphs are DAGs: "
            "remove the edge that closes it"
        )
    return out


#: PipeDream's published GPU profiles that ship inside the package (see data/pipedream/README.md).
SHIPPED = ("alexnet", "resnet50", "vgg16", "inception_v3", "gnmt", "gnmt_large")


def shipped_path(name: str) -> Path:
    """Path of a shipped PipeDream ``graph.txt`` (``name`` in :data:`SHIPPED`)."""
    if name not in SHIPPED:
        raise ValueError(f"no shipped PipeDream profile {name!r}; choose one of {', '.join(SHIPPED)}")
    return Path(__file__).resolve().parent / "data" / "pipedream" / name / "graph.txt"


def shipped(name: str) -> Profile:
    """PipeDream's published GPU profile of ``name`` (one of :data:`SHIPPED`) as a Profile."""
    return read_graph(shipped_path(name), label=f"shipped {name}")


register_reader("pipedream", read_graph)


# ---- the authors' runtime settings (recorded by scripts/record_pipedream_configs.py) -----------
@cache
def runtime_configs() -> dict:
    """``data/pipedream/runtime_configs.json``: the per-GPU minibatch of every driver config of
    PipeDream's runtime, the replicas per stage of every shipped ``*_conf.json`` and the minibatch
    each published ``graph.txt`` was profiled at (recorded from a fetched copy of the authors'
    repository; the file names its commit and how to regenerate it)."""
    return json.loads((Path(__file__).resolve().parent / "data" / "pipedream" / "runtime_configs.json").read_text())


def authors_batch(model: str) -> int | None:
    """The per-GPU minibatch PipeDream's runtime trains ``model`` at (its driver configs), ``None``
    where no driver config names the model; a ValueError if its configs disagree."""
    sizes = {d["batch_size"] for d in runtime_configs()["drivers"].values() if d["model"] == model}
    if len(sizes) > 1:
        raise ValueError(f"PipeDream's driver configs run {model} at several minibatch sizes {sorted(sizes)}")
    return sizes.pop() if sizes else None


def profiled_batch(model: str) -> int | None:
    """The minibatch the published ``graph.txt`` of ``model`` was profiled at (``None``: unknown)."""
    entry = runtime_configs()["profiled_batch"].get(model)
    return int(entry["batch"]) if entry else None


def authors_config(model: str, gpus: int) -> str | None:
    """Replicas per stage (``"15-1"``) of the configuration PipeDream's runtime runs ``model`` with on
    ``gpus`` GPUs: the ``config_file`` of its PipeDream driver config where one exists, else the
    ``hybrid_conf.json`` of ``gpus=<gpus>``; ``None`` where the authors ship neither."""
    rec = runtime_configs()
    folder, kind = f"gpus={gpus}", "hybrid"
    for d in rec["drivers"].values():
        if d["model"] == model and d["gpus"] == gpus and "/" in d["config"] and not d["config"].endswith("/dp"):
            folder, kind = d["config"].split("/")
    reps = rec["configs"].get(model, {}).get(folder, {}).get(kind)
    return "-".join(map(str, reps)) if reps else None

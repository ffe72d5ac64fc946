"""The layer graph: a profile's layers as a DAG (PipeDream's ``graph.txt`` nodes and edges).

A :class:`LayerGraph` holds nodes (id, description, fwd/bwd ms, own output bytes, parameter bytes)
in a fixed order and directed edges in a fixed order; :func:`node_on_cycle` names a node of a cycle
when a graph is not a DAG. PipeDream's antichain states over it: :mod:`workbench.partitioning.antichain`.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property

import numpy as np


@dataclass(frozen=True)
class LayerGraph:
    """Layer DAG: parallel per-node tuples in node order and ``edges`` (source id, target id)."""

    ids: tuple[str, ...]
    desc: tuple[str, ...]
    fwd_ms: tuple[float, ...]
    bwd_ms: tuple[float, ...]
    act_bytes: tuple[float, ...]
    param_bytes: tuple[float, ...]
    edges: tuple[tuple[str, str], ...]

    def __post_init__(self):
        n = len(self.ids)
        if not n:
            raise ValueError("a layer graph needs at least one node")
        if len(set(self.ids)) != n:
            dup = next(i for i in self.ids if self.ids.count(i) > 1)
            raise ValueError(f"layer graph: node {dup} appears twice; give every node one id")
        for name in ("desc", "fwd_ms", "bwd_ms", "act_bytes", "param_bytes"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"layer graph: {name} has {len(getattr(self, name))} entries for {n} nodes")
        for name in ("fwd_ms", "bwd_ms", "act_bytes", "param_bytes"):
            for i, x in zip(self.ids, getattr(self, name)):
                if not (isinstance(x, (int, float)) and x >= 0 and np.isfinite(x)):
                    raise ValueError(f"layer graph: node {i} has no valid {name} ({x!r}); give a number >= 0")
        known = set(self.ids)
        for a, b in self.edges:
            if a not in known or b not in known:
                raise ValueError(f"layer graph: edge {a} -> {b} names unknown node {a if a not in known else b}")
        self._check_acyclic()

    def _check_acyclic(self):
        indeg = {i: 0 for i in self.ids}
        for _, b in self.edges:
            indeg[b] += 1
        ready = [i for i in self.ids if indeg[i] == 0]
        seen = 0
        while ready:
            v = ready.pop()
            seen += 1
            for w in self.succ[v]:
                indeg[w] -= 1
                if indeg[w] == 0:
                    ready.append(w)
        if seen < len(self.ids):
            bad = node_on_cycle({i for i in self.ids if indeg[i] > 0}, self.edges)
            raise ValueError(f"layer graph has a cycle through node {bad}; PipeDream partitions DAGs only")

    @cached_property
    def succ(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {i: [] for i in self.ids}
        for a, b in self.edges:
            out[a].append(b)
        return out

    # ---- conversions ------------------------------------------------------------------
    @classmethod
    def chain(cls, names, fwd_ms, bwd_ms, act_bytes, param_bytes) -> LayerGraph:
        """Layers in execution order as a chain ``0 -> 1 -> ... -> n-1`` (states = prefixes)."""
        ids = tuple(f"layer{i}" for i in range(len(names)))
        fwd, bwd, act, par = (tuple(map(float, c)) for c in (fwd_ms, bwd_ms, act_bytes, param_bytes))
        return cls(ids, tuple(map(str, names)), fwd, bwd, act, par, tuple(itertools.pairwise(ids)))

    def to_dict(self) -> dict:
        """JSON-able form (``Profile.meta["graph"]``)."""
        return {
            "nodes": [
                list(t) for t in zip(self.ids, self.desc, self.fwd_ms, self.bwd_ms, self.act_bytes, self.param_bytes)
            ],
            "edges": [list(e) for e in self.edges],
        }

    @classmethod
    def from_dict(cls, d: dict) -> LayerGraph:
        try:
            cols = list(zip(*d["nodes"])) if d["nodes"] else [()] * 6
            ids, desc, f, b, a, p = (tuple(c) for c in cols)
            return cls(
                tuple(map(str, ids)), tuple(map(str, desc)), f, b, a, p, tuple((str(x), str(y)) for x, y in d["edges"])
            )
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, ValueError) and str(e).startswith("layer graph"):
                raise
            raise ValueError(
                f"not a layer graph ({{'nodes': [[id, desc, fwd_ms, bwd_ms, act_bytes, param_bytes]...], "
                f"'edges': [[a, b]...]}}): {e}"
            ) from None

    def without_io(self) -> LayerGraph:
        """PipeDream's pruning: drop the ``Input*`` sources, then the ``__getitem__*`` sinks."""
        targets = {b for _, b in self.edges}
        keep = [i for i, d in zip(self.ids, self.desc) if not (d.startswith("Input") and i not in targets)]
        g = self._subgraph(keep)
        keep = [i for i, d in zip(g.ids, g.desc) if not (d.startswith("__getitem__") and not g.succ[i])]
        return g._subgraph(keep)

    def _subgraph(self, keep: list[str]) -> LayerGraph:
        k = set(keep)
        idx = [n for n, i in enumerate(self.ids) if i in k]

        def pick(t):
            return tuple(t[n] for n in idx)

        return LayerGraph(
            pick(self.ids),
            pick(self.desc),
            pick(self.fwd_ms),
            pick(self.bwd_ms),
            pick(self.act_bytes),
            pick(self.param_bytes),
            tuple(e for e in self.edges if e[0] in k and e[1] in k),
        )


def node_on_cycle(remaining: set, edges) -> str:
    """A node on a cycle, given the nodes Kahn's algorithm never reached (each has a remaining
    predecessor, so walking back through remaining predecessors must repeat a node)."""
    pred: dict = {}
    for a, b in edges:
        if a in remaining and b in remaining:
            pred.setdefault(b, a)
    v, seen = min(remaining, key=lambda x: (len(x), x)), set()
    while v not in seen:
        seen.add(v)
        v = pred[v]
    return v

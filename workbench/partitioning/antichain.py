"""PipeDream's states: the antichain DAG of a layer graph (Narayanan et al., SOSP 2019, §3.1 and its
public optimizer), with the cumulative sizes its optimizer prices.

A :class:`LayerGraph` is the layer DAG: nodes (id, description, fwd/bwd ms, own output bytes,
parameter bytes) in a fixed order and directed edges in a fixed order. Let ``P(v)`` be the strict
ancestors of node ``v`` and ``S(v)`` its strict descendants. Before the search PipeDream removes its
input nodes (sources described ``Input...``) and then the sinks described ``__getitem__...``.

*Augmented antichain.* For an antichain ``A`` (pairwise incomparable nodes), its augmentation adds
every ancestor ``p in P(a)`` (for some ``a in A``) that has an edge to a node outside
``P(a) ∪ {a}``: a tensor still needed after the cut ``A``. ``aug(A) = extras(A) + A``.

*Next antichains.* From ``A``, for each ``x in aug(A)`` and each edge ``x -> y`` with ``y`` not in
``A`` and no descendant of ``y`` in ``aug(A)``: replace ``x`` by ``y`` in ``aug(A)`` and drop every
node that has a descendant in the list (``deaug``). A breadth-first search from the first source
(in node order) gives the states; each state keeps ``aug`` of its antichain. The states are put in
the depth-first reverse post-order of this DAG (children in the order they were found).

*Per state* ``s`` with down-set ``D(s) = ∪_{x in aug(s)} P(x) ∪ {x}``::

    compute_s(s) = Σ_{v in D(s)} (fwd_v + bwd_v) / 1000        (seconds, as PipeDream)
    activation(s) = Σ_{v in D(s)} act_v,   parameters(s) = Σ_{v in D(s)} param_v
    output_activation(s) = Σ_{x in aug(s)} act_x                 (what crosses a cut at s)

and ``ancestors[s]``: every state from which ``s`` is reachable. A stage between states ``k`` and
``j`` (``k`` an ancestor of ``j``) holds ``D(j) \\ D(k)`` and its sums are differences of the
cumulative ones. Lists keep the order of their first derivation (memoised by node set), so the
state order is a function of the node and edge order only.

For a chain (a profile's execution-order layers) the states are the prefixes: state ``i`` ends at
layer ``i`` and its ``output_activation`` is the profile's ``act_bytes[i]``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

import numpy as np

from workbench.profiling.graph import LayerGraph


@dataclass(frozen=True)
class States:
    """The antichain DAG in topological order (see the module docstring). Arrays are per state."""

    antichains: tuple[tuple[str, ...], ...]  # aug(s), in derivation order
    ancestors: tuple[np.ndarray, ...]  # state indices (sorted) from which s is reachable
    compute_s: np.ndarray
    activation: np.ndarray
    parameters: np.ndarray
    output_activation: np.ndarray
    down_sets: tuple[frozenset, ...]  # D(s)
    graph: LayerGraph  # the pruned graph the states are built on
    inputs: tuple[str, ...] = ()  # pruned input nodes (they go with the first stage)

    def __len__(self) -> int:
        return len(self.antichains)

    def stage_nodes(self, ends: list[int]) -> list[list[str]]:
        """Nodes of each stage for stage ends (exclusive state indices, last = len): a node goes to
        the first stage whose end state's down-set holds it; the pruned inputs go to stage 0."""
        done: set = set()
        out = []
        for e in ends:
            new = [v for v in self.graph.ids if v in self.down_sets[e - 1] and v not in done]
            done.update(new)
            out.append(new)
        out[0] = list(self.inputs) + out[0]
        return out


class _Search:
    """Memoised P, S, aug, deaug and next-antichain of one pruned graph."""

    def __init__(self, g: LayerGraph):
        self.g = g
        self.order = {v: n for n, v in enumerate(g.ids)}
        self.pred: dict[str, list[str]] = {v: [] for v in g.ids}
        for a, b in g.edges:
            self.pred[b].append(a)
        self.P = self._closure(self.pred, list(g.ids))
        self.S = self._closure(g.succ, list(reversed(g.ids)))
        self.succ_set = {v: frozenset(w) for v, w in g.succ.items()}
        self._aug: dict = {}
        self._deaug: dict = {}

    def _closure(self, nbr: dict, nodes: list[str]) -> dict[str, frozenset]:
        """Transitive neighbours (ancestors for ``pred``), by a post-order walk (no recursion)."""
        out: dict[str, frozenset] = {}
        for root in nodes:
            stack = [(root, False)]
            while stack:
                v, expanded = stack.pop()
                if v in out:
                    continue
                if expanded:
                    acc = set(nbr[v])
                    for w in nbr[v]:
                        acc |= out[w]
                    out[v] = frozenset(acc)
                else:
                    stack.append((v, True))
                    stack.extend((w, False) for w in nbr[v] if w not in out)
        return out

    def aug(self, A: list[str]) -> list[str]:
        key = frozenset(A)
        if key not in self._aug:
            extra: set[str] = set()
            for a in A:
                inside = self.P[a] | {a}
                extra.update(p for p in self.P[a] if not self.succ_set[p] <= inside)
            self._aug[key] = sorted(extra, key=self.order.__getitem__) + list(A)
        return self._aug[key]

    def deaug(self, L: list[str]) -> list[str]:
        key = frozenset(L)
        if key not in self._deaug:
            drop = {x for x in L if not self.S[x].isdisjoint(L)}
            self._deaug[key] = list(dict.fromkeys(x for x in L if x not in drop))
        return self._deaug[key]

    def next(self, A: list[str]) -> list[list[str]]:
        aug, inA = self.aug(A), set(A)
        out = []
        for x in aug:
            for y in self.g.succ[x]:
                if y in inA or not self.S[y].isdisjoint(aug):
                    continue
                out.append(self.deaug([y if z == x else z for z in aug]))
        return out


MAX_STATES = 20_000  # beyond this the O(N^2) tables of the DP do not fit a laptop either


def antichain_states(graph: LayerGraph, prune: bool = True, max_states: int = MAX_STATES) -> States:
    """PipeDream's states of ``graph`` (module docstring); ``prune``: drop inputs and ``__getitem__``
    sinks. More than ``max_states`` states (wide branching, e.g. Inception, NASNet) is refused."""
    g = graph.without_io() if prune else graph
    if not g.ids:
        raise ValueError("layer graph has only input nodes; a profile needs at least one layer")
    srch = _Search(g)
    sources = [v for v in g.ids if not srch.pred[v]]
    first = [sources[0]]
    keys = {frozenset(first): 0}
    lists = [first]
    children: list[list[int]] = [[]]
    queue, expanded = deque([first]), set()
    while queue:  # breadth first, as PipeDream numbers its states
        A = queue.popleft()
        kA = frozenset(A)
        if kA in expanded:
            continue
        expanded.add(kA)
        for B in srch.next(A):
            kB = frozenset(B)
            if kB not in keys:
                if len(lists) >= max_states:
                    raise ValueError(
                        f"more than {max_states} antichain states: the graph branches too widely for "
                        "PipeDream's states (its optimizer's README says to compress branches first); "
                        "partition over the layer order instead (Settings(over='layers'))"
                    )
                keys[kB] = len(lists)
                lists.append(B)
                children.append([])
            children[keys[kA]].append(keys[kB])
            queue.append(B)
    topo = _reverse_postorder(children)
    st = _measure(srch, [lists[s] for s in topo], _ancestors(children, topo))
    inputs = tuple(v for v, d in zip(graph.ids, graph.desc) if d.startswith("Input") and v not in srch.order)
    return replace(st, inputs=inputs)


def _reverse_postorder(children: list[list[int]]) -> list[int]:
    """Depth-first from state 0, children in their order; reverse post-order (a topological order)."""
    post, done = [], set()
    stack = [(0, iter(children[0]))]
    done.add(0)
    while stack:
        v, it = stack[-1]
        for w in it:
            if w not in done:
                done.add(w)
                stack.append((w, iter(children[w])))
                break
        else:
            stack.pop()
            post.append(v)
    return post[::-1]


def _ancestors(children: list[list[int]], topo: list[int]) -> list[np.ndarray]:
    """For each state (in topological positions), the sorted positions of its ancestors (bit sets
    as Python integers: bit p = position p)."""
    n = len(topo)
    pos = {s: k for k, s in enumerate(topo)}
    anc = [0] * n
    for s in topo:
        mine = anc[pos[s]] | (1 << pos[s])
        for c in children[s]:
            anc[pos[c]] |= mine
    size = (n + 7) // 8
    return [
        np.flatnonzero(np.unpackbits(np.frombuffer(a.to_bytes(size, "little"), np.uint8), bitorder="little")[:n])
        for a in anc
    ]


def _measure(srch: _Search, antichains: list[list[str]], ancestors) -> States:
    g = srch.g
    comp = (np.asarray(g.fwd_ms, dtype=float) + np.asarray(g.bwd_ms, dtype=float)) / 1000.0
    act, par = np.asarray(g.act_bytes, dtype=float), np.asarray(g.param_bytes, dtype=float)
    augs = [tuple(srch.aug(A)) for A in antichains]
    downs, rows = [], []
    for aug in augs:
        D = frozenset(aug).union(*(srch.P[x] for x in aug))
        downs.append(D)
        rows.append(np.sort(np.fromiter((srch.order[v] for v in D), dtype=np.int64, count=len(D))))
    out_act = [float(sum(act[srch.order[x]] for x in aug)) for aug in augs]
    return States(
        tuple(augs),
        tuple(ancestors),
        np.array([comp[r].sum() for r in rows]),
        np.array([act[r].sum() for r in rows]),
        np.array([par[r].sum() for r in rows]),
        np.array(out_act, dtype=float),
        tuple(downs),
        g,
    )

"""Any ``nn.Module`` as a layer-sequential model: trace it, linearize its graph, cut it into layers.

:func:`split` traces the model with ``torch.export`` (non-strict, batch dimension dynamic) into one
graph of ATen operations in execution order. Each operation carries the module that issued it
(``nn_module_stack``); operations are grouped into *layers* by module: a layer starts at the first
operation of each chosen module (``layers=``, or the automatic choice of :func:`auto_units`), and code
between modules stays with the layer before it.

The live set. Let ``V`` be the values of the graph and ``prod(v)`` / ``last(v)`` the layers that
produce and last read ``v``. The cut ``c`` (between layer ``c-1`` and ``c``) carries

    live(c) = { v in V : prod(v) < c <= last(v) }

so layer ``i`` is a function ``live(i) -> live(i+1)``: it computes its operations and passes on every
value a later layer still needs (skip connections, a decoder's tokens, attention masks). Its
``act_bytes`` in a profile is then the size of ``live(i+1)``, the quantity PipeDream's branching
graphs charge for a cut. Parameters and buffers never cross a cut: each layer reads them from the
shared module objects (``get_attr``), so a tied weight is one tensor held by several layers.

Cuts that cannot be made are removed (the layers around them merge):
* an in-place operation (``relu_``, ``add_``, ``+=`` on a tensor) whose target (or the tensor it is a
  view of) was produced by an earlier layer: the runtime's stage input is a leaf that autograd may not
  modify in place, and a copy on another rank would not see the write;
* a non-tensor value other than an integer (SymInt sizes cross a cut as 0-d int64 tensors).

The result is a :class:`GraphModel`, a :class:`~workbench.models.base.LayerModel`, so
``workbench.profile``, the partitioner and the runtime use it unchanged. Its layers hold no user
classes (only ``torch.fx`` graphs of ATen operations and the parameter tensors), so it pickles into
spawned ranks even when the model's class was defined in a notebook.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch
from torch import fx, nn
from torch.export import Dim, export

from workbench.io.cards import card, one_line
from workbench.models.base import LayerModel, TensorSpec

CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


# ---------------------------------------------------------------------------------------------
# The layers
# ---------------------------------------------------------------------------------------------
class GraphLayer(nn.Module):
    """One layer: ``live(i) -> live(i+1)`` as a ``torch.fx.GraphModule`` of ATen operations.

    Input and output are one tensor when the live set has one value, else a tuple; integers (sizes)
    travel as 0-d int64 tensors (``in_ints`` / ``out_ints`` mark their positions). ``own_out``: the
    output positions this layer computes (the rest pass through); ``reads_from``: the layers whose
    values it reads (-1: the model's input). Together they give the layer DAG of
    :mod:`workbench.partitioning.antichain`."""

    def __init__(
        self,
        gm: fx.GraphModule,
        in_ints: tuple[int, ...],
        out_ints: tuple[int, ...],
        n_out: int,
        modules: tuple[str, ...],
        *,
        own_out: tuple[int, ...] | None = None,
        reads_from: tuple[int, ...] | None = None,
    ):
        super().__init__()
        self.gm = gm
        self.in_ints, self.out_ints, self.n_out, self.modules_covered = in_ints, out_ints, n_out, modules
        self.own_out = tuple(range(n_out)) if own_out is None else own_out
        self.reads_from = reads_from

    def forward(self, x):
        args = list(x) if isinstance(x, (tuple, list)) else [x]
        for i in self.in_ints:
            args[i] = int(args[i])
        out = self.gm(*args)
        out = list(out)
        for i in self.out_ints:
            out[i] = torch.tensor(int(out[i]), dtype=torch.int64)
        return out[0] if self.n_out == 1 else tuple(out)

    def extra_repr(self) -> str:
        return "modules=" + ", ".join(self.modules_covered)

    def __getstate__(self) -> dict:
        """Pickled as its graph's nodes, not as the GraphModule's generated code: unpickling a
        GraphModule re-traces that code with ``torch.fx``'s symbolic tracer, which cannot call an
        ATen operation whose only traced argument sits in a list (an LSTM's initial state
        ``aten.zeros([1, sym_size, hidden])`` holds the batch size, a symbolic size, in its size
        list: the spawned ranks failed to unpickle it)."""
        state = self.__dict__.copy()
        modules = dict(state["_modules"])
        state["_modules"] = modules
        state["_graph"] = _graph_state(modules.pop("gm"))
        return state

    def __setstate__(self, state: dict) -> None:
        graph = state.pop("_graph")
        self.__dict__.update(state)
        self._modules["gm"] = _graph_from_state(graph)


@dataclass(frozen=True)
class _Ref:
    """A node named ``name`` in a pickled graph's arguments."""

    name: str


@dataclass(frozen=True)
class _Op:
    """An ATen operation overload ``torch.ops.<namespace>.<name>.<overload>`` (not picklable itself)."""

    namespace: str
    name: str
    overload: str

    def resolve(self):
        return getattr(getattr(getattr(torch.ops, self.namespace), self.name), self.overload)


def _ref(node: fx.Node) -> Any:
    return _Ref(node.name)


def _graph_state(gm: fx.GraphModule) -> tuple:
    """``(root, nodes, training)``: a plain module holding ``gm``'s submodules, parameters, buffers
    and attributes that the graph reads, and each node as ``(op, name, target, args, kwargs)`` with
    nodes named (:class:`_Ref`) and ATen targets by their qualified name (:class:`_Op`)."""
    root = nn.Module()
    root._modules, root._parameters, root._buffers = dict(gm._modules), dict(gm._parameters), dict(gm._buffers)
    nodes = []
    for n in gm.graph.nodes:
        if n.op == "get_attr" and "." not in n.target and not hasattr(root, n.target):
            setattr(root, n.target, getattr(gm, n.target))
        t = n.target
        if isinstance(t, torch._ops.OpOverload):
            t = _Op(t.namespace, t._opname, t._overloadname)
        args, kwargs = fx.node.map_arg((n.args, n.kwargs), _ref)
        nodes.append((n.op, n.name, t, args, kwargs))
    return root, nodes, gm.training


def _graph_from_state(state: tuple) -> fx.GraphModule:
    """The GraphModule of :func:`_graph_state`'s form."""
    root, nodes, training = state
    graph, env = fx.Graph(), dict[str, fx.Node]()

    def back(a):
        if isinstance(a, _Ref):
            return env[a.name]
        if isinstance(a, (list, tuple)):
            out = [back(v) for v in a]
            return out if isinstance(a, list) else type(a)(out) if type(a) is tuple else type(a)(*out)
        if isinstance(a, dict):
            return {k: back(v) for k, v in a.items()}
        if isinstance(a, slice):
            return slice(back(a.start), back(a.stop), back(a.step))
        return a

    for op, name, target, args, kwargs in nodes:
        target = target.resolve() if isinstance(target, _Op) else target
        env[name] = graph.create_node(op, target, back(args), back(kwargs), name=name)
    gm = fx.GraphModule(root, graph)
    gm.train(training)
    return gm


@dataclass(repr=False)
class GraphModel(LayerModel):
    """A traced user model (see the module docstring). ``tied`` lists the parameters held by more
    than one layer: ``(names in the original model, layer indices)``; where they fall into several
    stages the runtime combines their gradients at every update (:mod:`workbench.runtime.executors.tied`). ``loss_fn(output, target)``,
    when given, replaces the task's cross-entropy."""

    tied: list = field(default_factory=list)
    loss_fn: object = None

    def loss(self, output, target):
        if self.loss_fn is not None:
            return self.loss_fn(output, target)
        return super().loss(output, target)

    # ---- Jupyter manners -----------------------------------------------------------------
    def _rows(self) -> list:
        mib = sum(p.numel() * p.element_size() for p in self.parameters()) / 2**20
        return [
            ("layers", len(self.layers), ""),
            ("parameters", mib, "MiB (tied counted once)"),
            ("task", self.task, ""),
            ("tied weights", len(self.tied), ""),
        ]

    def __repr__(self) -> str:

        return one_line("GraphModel", [("name", self.name, "")] + self._rows())

    def _repr_html_(self) -> str:

        seen: set = set()  # a tied weight counts at its first layer, as in a Profile
        table = pd.DataFrame(
            [dict(layer=n, param_bytes=new_param_bytes(layer, seen)) for n, layer in zip(self.names, self.layers)]
        )
        return card(
            f"{self.name}: layers for the pipeline", self._rows(), label=self.description, table=table, max_rows=30
        )

    def to(self, device) -> GraphModel:
        """Move the weights and rewrite the device constants the trace recorded (``arange(...,
        device=cpu)``) so the layers create their tensors on ``device`` too."""
        super().to(device)
        dev = torch.device(device)
        for layer in self.layers:
            if not isinstance(layer, GraphLayer):  # from_modules: nothing traced
                continue
            changed = False
            for n in layer.gm.graph.nodes:
                if isinstance(n.kwargs.get("device"), torch.device) and n.kwargs["device"] != dev:
                    n.update_kwarg("device", dev)
                    changed = True
            if changed:
                layer.gm.recompile()
        return self


# ---------------------------------------------------------------------------------------------
# Tracing and grouping
# ---------------------------------------------------------------------------------------------
_CACHE_HINT = (
    "the model builds a key/value cache for generation (transformers' DynamicCache), which "
    "training does not use: build it with use_cache=False (e.g. LlamaConfig(use_cache=False), or "
    "model.config.use_cache = False)"
)


def _first_line(e: BaseException) -> str:
    why = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
    return f"{type(e).__name__}: {why}" if why else type(e).__name__


def _check_runs(model: nn.Module, args: tuple) -> None:
    """Run ``model(*args)`` once in eval mode without gradients (no running statistics change), so
    that an input the model itself rejects (a shape that does not fit, a wrong argument count) is
    named as such rather than as a tracing failure."""
    was = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(*args)
    except Exception as e:  # noqa: BLE001 - the model's own error becomes one line for the user
        shapes = ", ".join(str(tuple(a.shape)) if torch.is_tensor(a) else type(a).__name__ for a in args)
        raise ValueError(
            f"{type(model).__name__} fails on the example input ({shapes}) before any tracing: "
            f"{_first_line(e)}; give an input (or a data set) whose samples the model accepts"
        ) from None
    finally:
        model.train(was)


def _export(model: nn.Module, args: tuple) -> fx.GraphModule:
    """``torch.export`` in training mode with a dynamic batch dimension -> an unlifted GraphModule."""

    dyn = tuple({0: Dim.AUTO} if torch.is_tensor(a) and a.dim() > 0 else None for a in args)
    _check_runs(model, args)
    was = model.training
    model.train()
    try:
        ep = export(model, args, dynamic_shapes=dyn, strict=False)
    except Exception as e:  # noqa: BLE001 - any tracing failure becomes one line for the user
        raise ValueError(
            f"cannot trace {type(model).__name__} with torch.export ({_first_line(e)}); "
            + (
                _CACHE_HINT
                if "Cache" in f"{type(e).__name__} {e}"
                else "give the layers by hand: workbench.profiling.layering.from_modules([module, ...], example_input), each "
                "module taking the previous one's output, or split(..., layers=[names]) on a traceable "
                "part"
            )
        ) from None
    finally:
        model.train(was)
    gm = ep.module()
    for n in list(gm.graph.nodes):  # dtype/device assertions of the trace: the layers may move to float64
        if n.op == "call_function" and n.target is torch.ops.aten._assert_tensor_metadata.default and not n.users:
            gm.graph.erase_node(n)
    gm.recompile()
    return gm


def _path(node: fx.Node) -> str | None:
    """Qualified name of the innermost module that issued ``node`` ("" for the root's own code)."""
    stack = node.meta.get("nn_module_stack")
    if not stack:
        return None
    path = list(stack.values())[-1][0]
    return None if path.startswith("_empty_nn_module_stack") else path


def _under(path: str, unit: str) -> bool:
    return unit == "" or path == unit or path.startswith(unit + ".")


def auto_units(model: nn.Module, used: set[str], min_layers: int = 12) -> list[str]:
    """Modules that start layers: expand the module tree level by level from the root, always
    through containers (Sequential, ModuleList, ModuleDict), until at least ``min_layers`` modules
    (that issue operations) are chosen or nothing is left to expand."""
    mods = dict(model.named_modules())

    def children(u: str) -> list[str]:
        pre = u + "." if u else ""
        return [pre + n for n, _ in mods[u].named_children() if any(_under(p, pre + n) for p in used)]

    def open_containers(units: list[str]) -> list[str]:
        out = []
        for u in units:
            kids = children(u)
            out += open_containers(kids) if isinstance(mods[u], CONTAINERS) and kids else [u]
        return out

    units = open_containers(children(""))
    while len(units) < min_layers:
        nxt = open_containers([k for u in units for k in (children(u) or [u])])
        if nxt == units:
            break
        units = nxt
    return units


def _group_nodes(gm: fx.GraphModule, units: list[str]) -> dict[fx.Node, int]:
    """Compute node -> layer index: a layer starts where the issuing unit changes."""
    longest = sorted(units, key=len, reverse=True)
    group, g, cur = {}, 0, None  # code before the first unit joins the first unit's layer
    for n in gm.graph.nodes:
        if n.op != "call_function":
            continue
        p = _path(n)
        unit = next((u for u in longest if p is not None and _under(p, u) and u != ""), None)
        if unit is not None and unit != cur:
            g += cur is not None
            cur = unit
        group[n] = g
    return group


def _mutated_args(n: fx.Node) -> list[fx.Node]:
    schema = getattr(n.target, "_schema", None)
    if schema is None or not schema.is_mutable:
        return []
    out = []
    for i, a in enumerate(schema.arguments):
        if a.alias_info is not None and a.alias_info.is_write:
            v = n.args[i] if i < len(n.args) else n.kwargs.get(a.name)
            if isinstance(v, fx.Node):
                out.append(v)
    return out


def _view_base(v: fx.Node) -> fx.Node:
    """Follow views (ops whose result aliases their first argument) back to the base value."""
    while v.op == "call_function":
        schema = getattr(v.target, "_schema", None)
        if not (
            schema
            and schema.returns
            and schema.returns[0].alias_info is not None
            and v.args
            and isinstance(v.args[0], fx.Node)
        ):
            break
        v = v.args[0]
    return v


def _value(n: fx.Node):
    return n.meta.get("val", n.meta.get("example_value"))


def _forbidden_cuts(gm: fx.GraphModule, group: dict) -> set[int]:
    """Cuts ``c`` (before layer c) that must not be made (see the module docstring)."""
    bad: set[int] = set()
    for n in gm.graph.nodes:
        if n not in group:
            continue
        for v in _mutated_args(n):
            v = _view_base(v)
            if v in group:  # in-place on an activation produced by an earlier layer
                bad.update(range(group[v] + 1, group[n] + 1))
            elif v.op == "placeholder":  # in-place on the model input
                bad.update(range(1, group[n] + 1))
        if not (isinstance(_value(n), torch.Tensor) or _is_int(n)):  # tuples, None, floats: keep with readers
            last = max((group.get(u, len(group)) for u in n.users), default=group[n])
            bad.update(range(group[n] + 1, min(last, max(group.values())) + 1))
    return bad


def _merge(group: dict, bad: set[int]) -> dict:
    n_groups = max(group.values()) + 1
    new, k = [], -1
    for g in range(n_groups):
        if g == 0 or g not in bad:
            k += 1
        new.append(k)
    return {n: new[g] for n, g in group.items()}


def _is_int(n: fx.Node) -> bool:
    return isinstance(_value(n), (int, torch.SymInt)) and not isinstance(_value(n), bool)


def _covering(n: fx.Node, units: list[str]) -> str | None:
    """The unit (or, outside every unit, the top-level module) that issued ``n``: a layer's name."""
    p = _path(n)
    if not p:
        return None
    return max((u for u in units if u and _under(p, u)), key=len, default=p.split(".")[0])


def _build_layers(gm: fx.GraphModule, group: dict, units: list[str]) -> tuple[list[GraphLayer], list[str]]:
    nodes = list(gm.graph.nodes)
    G = max(group.values()) + 1
    out_node = next(n for n in nodes if n.op == "output")
    outputs = list(torch.utils._pytree.tree_leaves(out_node.args[0]))
    inputs = [n for n in nodes if n.op == "placeholder" and n.users]
    prod = {n: -1 for n in inputs} | {n: g for n, g in group.items()}
    last = {}
    for n in prod:
        users = [group[u] for u in n.users if u in group]
        last[n] = max(users, default=prod[n])
    for o in outputs:
        if isinstance(o, fx.Node):
            last[o] = G
    order = {n: i for i, n in enumerate(nodes)}

    def live(c: int) -> list[fx.Node]:
        return sorted((v for v in prod if prod[v] < c <= last[v]), key=order.__getitem__)

    layers, names = [], []
    for g in range(G):
        live_in = inputs if g == 0 else live(g)
        live_out = [o for o in outputs if isinstance(o, fx.Node)] if g == G - 1 else live(g + 1)
        graph = fx.Graph()
        env = {v: graph.placeholder(v.name) for v in live_in}

        def look(a):
            if a not in env:
                if a.op != "get_attr":
                    raise RuntimeError(f"value {a.name} used in layer {g} is not live there")
                env[a] = graph.node_copy(a)
            return env[a]

        body = [n for n in nodes if group.get(n) == g]
        for n in body:
            env[n] = graph.node_copy(n, look)
        graph.output(tuple(env[v] for v in live_out))
        graph.lint()
        sub = fx.GraphModule(gm, graph)
        covered = tuple(dict.fromkeys(c for n in body if (c := _covering(n, units))))
        covered = tuple(c for c in covered if not any(d != c and _under(d, c) for d in covered)) or covered
        # the layer DAG (PipeDream's antichain states): outputs made here, layers whose values it reads
        used = {a for n in body for a in n.all_input_nodes if a in prod}
        layers.append(
            GraphLayer(
                sub,
                tuple(i for i, v in enumerate(live_in) if _is_int(v)),
                tuple(i for i, v in enumerate(live_out) if _is_int(v)),
                len(live_out),
                covered,
                own_out=tuple(i for i, v in enumerate(live_out) if prod.get(v) == g),
                reads_from=tuple(sorted({prod[v] for v in used if prod[v] != g})),
            )
        )
        label = covered[0] if len(covered) == 1 else (f"{covered[0]}..{covered[-1]}" if covered else "(ops)")
        names.append(f"{g}:{label}")
    return layers, names


# ---------------------------------------------------------------------------------------------
# The entry point
# ---------------------------------------------------------------------------------------------
def _spec(t: torch.Tensor, vocab: int | None = None) -> TensorSpec:
    high = None
    if not t.dtype.is_floating_point:
        high = vocab if vocab is not None else int(t.max()) + 1
    return TensorSpec(tuple(t.shape[1:]), t.dtype, high)


def _tied(model: nn.Module, layers: Sequence[nn.Module]) -> list:
    """Parameters with several names in ``model`` or held by several layers: (names, layer indices)."""
    names: dict[int, list[str]] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(n)
    by_id: dict[int, list[int]] = {}
    out = []
    for i, layer in enumerate(layers):
        for p in layer.parameters():
            by_id.setdefault(id(p), []).append(i)
    for pid, idx in by_id.items():
        if len(idx) > 1 or len(names.get(pid, [])) > 1:
            out.append((names.get(pid, ["?"]), sorted(set(idx))))
    return out


def _task_and_specs(args: tuple, out_shape, task: str | None):
    task = task or ("lm" if out_shape is not None and len(out_shape) == 3 else "classification")
    classes = int(out_shape[-1]) if out_shape is not None and not isinstance(out_shape[-1], torch.SymInt) else None
    inputs = tuple(_spec(a, classes if task == "lm" else None) for a in args)
    target = (
        TensorSpec(tuple(args[0].shape[1:]), torch.int64, classes)
        if task == "lm"
        else TensorSpec((), torch.int64, classes)
    )
    return task, inputs, target


def from_modules(modules, example_input, *, name: str = "modules", task: str | None = None, loss=None) -> GraphModel:
    """Layers given by hand, without tracing: ``modules[i+1]`` takes ``modules[i]``'s output (a tensor
    or a tuple of tensors), the zoo's convention. For models ``torch.export`` cannot trace."""
    layers = list(modules)
    if not layers or not all(isinstance(m, nn.Module) for m in layers):
        raise ValueError("from_modules() needs a non-empty list of nn.Module layers")
    args = tuple(example_input) if isinstance(example_input, (tuple, list)) else (example_input,)
    with torch.no_grad():
        y = args[0] if len(args) == 1 else args
        for m in layers:
            y = m(y)
    out = y if torch.is_tensor(y) else next(t for t in torch.utils._pytree.tree_leaves(y) if torch.is_tensor(t))
    task, inputs, target = _task_and_specs(args, tuple(out.shape), task)
    names = [f"{i}:{type(m).__name__}" for i, m in enumerate(layers)]
    tied = _tied(nn.Sequential(*layers), layers)
    return GraphModel(
        name=name,
        size="user",
        layers=layers,
        names=names,
        dataset="user",
        task=task,
        inputs=inputs,
        target=target,
        config=dict(traced=None),
        description=f"{len(layers)} layers given by hand",
        tied=tied,
        loss_fn=loss,
    )


def split(
    model: nn.Module,
    example_input,
    *,
    layers: list[str] | None = None,
    min_layers: int = 12,
    name: str | None = None,
    task: str | None = None,
    dataset: str = "user",
    loss=None,
    description: str = "",
) -> GraphModel:
    """Trace ``model`` on ``example_input`` (a tensor, or a tuple of positional inputs; batch first)
    and cut it into layers (see the module docstring).

    ``layers``: names of the modules at which a layer starts (``model.named_modules()`` names, e.g.
    ``["layer1.0", "layer1.1", "fc"]``): code before the first joins the first layer, code outside
    the named modules stays with the layer before it; default :func:`auto_units` with
    ``min_layers``. ``task``:
    ``"classification"`` (output ``(N, C)``) or ``"lm"`` (output ``(N, T, V)``), inferred from the output
    shape when None; ``loss(output, target)`` replaces the task's cross-entropy.
    """
    if isinstance(model, (list, tuple, nn.ModuleList)):
        model = nn.Sequential(*model)
    if not isinstance(model, nn.Module):
        raise ValueError(f"split() needs an nn.Module, got {type(model).__name__}")
    args = tuple(example_input) if isinstance(example_input, (tuple, list)) else (example_input,)
    if not args or not all(torch.is_tensor(a) for a in args):
        raise ValueError("example_input must be a tensor or a tuple of tensors (batch dimension first)")
    gm = _export(model, args)
    used = {p for n in gm.graph.nodes if n.op == "call_function" and (p := _path(n)) is not None}
    known = dict(model.named_modules())
    if layers is not None:
        unknown = [u for u in layers if u not in known]
        if unknown:
            top = [n for n, _ in model.named_children()]
            raise ValueError(
                f"layers= names unknown module(s) {unknown} of {type(model).__name__}; its top-level modules are {top}"
            )
        units = list(layers)
    else:
        units = auto_units(model, used, min_layers)
    group = _group_nodes(gm, units)
    if not group:
        raise ValueError(f"{type(model).__name__} computes nothing from its input; nothing to split")
    group = _merge(group, _forbidden_cuts(gm, group))
    glayers, names = _build_layers(gm, group, units)
    first_out = torch.utils._pytree.tree_leaves(next(n for n in gm.graph.nodes if n.op == "output").args[0])[0]
    out_val = _value(first_out) if isinstance(first_out, fx.Node) else None
    out_shape = tuple(out_val.shape) if isinstance(out_val, torch.Tensor) else None
    task, inputs, target = _task_and_specs(args, out_shape, task)
    return GraphModel(
        name=name or type(model).__name__,
        size="user",
        layers=list(glayers),
        names=names,
        dataset=dataset,
        task=task,
        inputs=inputs,
        target=target,
        config=dict(traced="torch.export", min_layers=min_layers, layers=layers),
        description=description or f"{type(model).__name__} traced by torch.export into {len(glayers)} layers",
        tied=_tied(model, glayers),
        loss_fn=loss,
    )


def new_param_bytes(layer, seen: set) -> int:
    """Bytes of the layer's parameters not counted by an earlier layer (a tied weight counts once)."""
    total = 0
    for p in layer.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total

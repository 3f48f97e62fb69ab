"""Layers of a module whose forward is not a chain of its children, from its torch.fx graph.

`fx_layers(module, inputs)` traces the module (torch.fx.symbolic_trace) and cuts its node list
(1) wherever exactly one value is live (the value just computed: nothing computed earlier is
used later), so skips inside a block (a ResNet block's identity, a ViT block's residual) stay
inside a layer; and (2) between two of the user's modules ("units": a submodule, descending
through nn.Sequential/ModuleList/ModuleDict containers that hold modules of their own) whatever
is live there, as long as every live value is an activation tensor: a U-Net's long skips then
cross the cut. A segment without parameters is merged into the next one.

Each layer is a GraphModule holding the user's own submodules and parameters under their
original names. Layer k takes the values live at the cut before it (one tensor, or several as
positional arguments) and returns those live at the cut after it: one tensor, or a tuple of them
in graph order. A skip spanning several layers is returned unchanged by each layer in between,
so a pipeline stage boundary sends every tensor crossing it (executor/pipeline.py).
`graph_edges` names the values crossing the cuts with the layers producing and consuming them:
the profile's graph edges (profiler/api.py).
Returns None when the graph cannot be traced, gives fewer than two layers, or the chained layers
do not reproduce `module(inputs)`.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Sequence

import torch
from torch import fx, nn


def fx_layers(module: nn.Module, inputs: torch.Tensor) -> list[fx.GraphModule] | None:
    if any(p.is_meta for p in module.parameters()):  # a factory's `device` = meta: run on meta shapes
        inputs = inputs.to("meta")
    gm = _trace(module)
    if gm is None:
        return None
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    output = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    if len([n for n in gm.graph.nodes if n.op == "placeholder"]) != 1 or not nodes or not isinstance(output, fx.Node):
        return None
    tensors = _tensor_values(gm, inputs)
    if tensors is None:
        return None
    partition = _partition(gm, nodes, tensors)
    if len(set(partition.values())) < 2:
        return None
    try:
        layers = _own_modules(_segments(gm, nodes, partition, output))
    except Exception:
        return None
    return layers if _reproduces(module, layers, inputs) else None


def _tensor_values(gm: fx.GraphModule, inputs: torch.Tensor) -> set[str] | None:
    """Names of the nodes whose value is an activation tensor (run once on the example inputs)."""
    found: set[str] = set()

    class _Record(fx.Interpreter):
        def run_node(self, n):
            value = super().run_node(n)
            if isinstance(value, torch.Tensor) and not isinstance(value, nn.Parameter):
                found.add(n.name)
            return value

    try:
        with torch.no_grad():
            torch.manual_seed(0)
            _Record(gm).run(inputs)
    except Exception:
        return None
    return found


def _segments(gm: fx.GraphModule, nodes: list[fx.Node], partition: dict[str, int], output: fx.Node) -> list:
    """One GraphModule per layer; layer k reads the values live at the cut before it."""
    index = {n: i for i, n in enumerate(nodes)}
    last_use = {n: max((index.get(u, len(nodes)) for u in n.users), default=index[n]) for n in nodes}
    groups = [[n for n in nodes if partition[n.name] == k] for k in sorted(set(partition.values()))]
    layers, live_in = [], [next(n for n in gm.graph.nodes if n.op == "placeholder")]
    for k, group in enumerate(groups):
        end = index[group[-1]]
        live_out = [n for n in nodes[: end + 1] if last_use[n] > end] if k < len(groups) - 1 else [output]
        layers.append(_segment(gm, group, live_in, live_out))
        live_in = live_out
    return layers


def _own_modules(layers: list[fx.GraphModule]) -> list[fx.GraphModule]:
    """A module reused in several layers (ALBERT's one block applied at every depth) gets a
    module object per layer holding the *same* Parameters and buffers: the weight is tied
    across those layers (models/identity.py tied_groups), so pipeline stages, FSDP2 and TP each
    own a copy and executor/tied.py sums the copies' gradients, as for a tied LM head."""
    seen: set[int] = set()
    for layer in layers:
        done: list[str] = []
        for path, module in list(layer.named_modules()):
            if not path or any(path.startswith(d + ".") for d in done) or id(module) not in seen:
                continue
            shared = {id(t): t for t in [*module.parameters(), *module.buffers()]}
            layer.set_submodule(path, copy.deepcopy(module, memo=shared))  # new modules, same tensors
            done.append(path)
        seen.update(id(m) for m in layer.modules())
    return layers


def _segment(gm: fx.GraphModule, nodes: list[fx.Node], live_in: list[fx.Node], live_out: list[fx.Node]):
    """One layer: placeholders for the values live before it, its nodes, and the values live
    after it as outputs (one tensor, or a tuple; skips pass through unchanged).
    GraphModule(root, graph) keeps the user's submodules under their names. `fx_inputs`,
    `fx_outputs` and `fx_uses` name the values it reads, returns and itself consumes."""
    graph, env = fx.Graph(), {}
    inside = set(nodes)
    for value in live_in:
        env[value] = graph.placeholder(value.name)
        if any(u in inside and _in_place(gm, u, value) for u in value.users):  # e.g. ReLU(inplace=True) first
            env[value] = graph.call_method("clone", (env[value],))
    for node in nodes:
        env[node] = graph.node_copy(node, lambda a: env[a])
    graph.output(env[live_out[0]] if len(live_out) == 1 else tuple(env[v] for v in live_out))
    layer = fx.GraphModule(gm, graph, class_name="FxLayer")
    # plain attributes: nn.Module.__setattr__'s stub types every value as Tensor | Module
    vars(layer).update(
        fx_inputs=tuple(v.name for v in live_in),
        fx_outputs=tuple(v.name for v in live_out),
        fx_uses=tuple(v.name for v in live_in if any(u in inside for u in v.users)),
    )
    return layer


def _in_place(gm: fx.GraphModule, node: fx.Node, value: fx.Node) -> bool:
    """Whether `node` may write into its input `value`: a module with `inplace=True` (torchvision's
    ReLU/Hardswish/SiLU), an `inplace=True` keyword, an in-place method or operator (`x.add_(y)`,
    `x += y`). A layer's input is a leaf that requires grad when it is captured or received by a
    pipeline stage, and autograd refuses to write into such a leaf: the layer clones it first
    (one copy of the input; the user's modules stay as they are)."""
    if node.op == "call_module":
        assert isinstance(node.target, str)  # a call_module node's target is the submodule's path
        return bool(getattr(gm.get_submodule(node.target), "inplace", False)) and node.args[:1] == (value,)
    if node.kwargs.get("inplace") is True:
        return True
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    in_place_op = (name.endswith("_") and not name.endswith("__")) or name.strip("_") in _IN_PLACE_OPERATORS
    return node.op in ("call_method", "call_function") and in_place_op and node.args[:1] == (value,)


_IN_PLACE_OPERATORS = {"iadd", "isub", "imul", "itruediv", "ifloordiv", "ipow", "iand", "ior", "ixor"}


def graph_edges(layers: Sequence[nn.Module]) -> list[tuple[int, int, str, int]]:
    """(producer layer, consumer layer, value name, position in the producer's outputs) of every
    value crossing a cut: a skip from layer i to layer j is the edge (i, j), whatever passes it on."""
    producer: dict[str, tuple[int, int]] = {}
    edges = []
    for k, layer in enumerate(layers):
        for name in getattr(layer, "fx_uses", ()):
            if name in producer:
                edges.append((producer[name][0], k, name, producer[name][1]))
        for pos, name in enumerate(getattr(layer, "fx_outputs", ())):
            producer.setdefault(name, (k, pos))
    return edges


class _Tracer(fx.Tracer):
    """symbolic_trace, keeping as leaves the submodules whose own forward does not trace
    (e.g. nn.TransformerEncoder's fast-path checks)."""

    def __init__(self, leaves: set[nn.Module]):
        super().__init__()
        self.leaves = leaves

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return m in self.leaves or super().is_leaf_module(m, qualname)


def _trace(module: nn.Module) -> fx.GraphModule | None:
    leaves: set[nn.Module] = set()
    for _ in range(8):  # each failure makes the innermost untraceable module on its path a leaf
        try:
            tracer = _Tracer(leaves)
            return fx.GraphModule(tracer.root if hasattr(tracer, "root") else module, tracer.trace(module))
        except Exception:
            found = _untraceable(module, leaves)
            if found is None or found is module:
                return None
            leaves.add(found)
    return None


def _untraceable(module: nn.Module, leaves: set[nn.Module]) -> nn.Module | None:
    """The first child (depth first) that does not trace on its own, or the module itself."""
    for child in module.children():
        if child in leaves or _Tracer(leaves).is_leaf_module(child, ""):
            continue
        try:
            _Tracer(leaves).trace(child)
        except Exception:
            return _untraceable(child, leaves) or child
    return None


def _partition(gm: fx.GraphModule, nodes: list[fx.Node], tensors: set[str]) -> dict[str, int]:
    """Node name -> layer index: cut after node i when it is the only value live past it, or
    when node i + 1 starts another unit and every value live past i is an activation tensor."""
    index = {n: i for i, n in enumerate(nodes)}
    last_use = {n: max((index.get(u, len(nodes)) for u in n.users), default=index[n]) for n in nodes}
    placeholder = next(n for n in gm.graph.nodes if n.op == "placeholder")
    first_input_use = max((index.get(u, len(nodes)) for u in placeholder.users), default=-1)
    units = [_unit(gm, n) for n in nodes]
    current, has_params, out = 0, False, {}
    for i, node in enumerate(nodes):
        out[node.name] = current
        has_params |= node.op in ("call_module", "get_attr") and _has_params(gm, node)
        if not has_params or i == len(nodes) - 1 or first_input_use > i:
            continue
        live = [n for n in nodes[: i + 1] if last_use[n] > i]
        activations = all(n.name in tensors and n.op != "get_attr" for n in live)
        if activations and (live == [node] or units[i] != units[i + 1]):
            current, has_params = current + 1, False
    last = out[nodes[-1].name]
    if not has_params and last > 0:  # a trailing parameter-free segment joins the previous one
        out = {k: (v if v < last else last - 1) for k, v in out.items()}
    return out


_CONTAINERS = (nn.Sequential, nn.ModuleList, nn.ModuleDict)


def _unit(gm: fx.GraphModule, node: fx.Node) -> str:
    """The user's module a node runs in: the outermost submodule on its module stack that is not
    a container of modules with children of their own ("" for ops of the top-level forward)."""
    for key in (node.meta.get("nn_module_stack") or {}).keys():
        path = re.sub(r"@\d+$", "", key)  # fx names the k-th call of a reused module "path@k"
        try:
            module = gm.get_submodule(path) if path else gm
        except AttributeError:  # traced through and holding no parameters (torchvision's Permute)
            return key
        inner = isinstance(module, _CONTAINERS) and any(any(True for _ in c.children()) for c in module.children())
        if not inner:
            return key
    return ""


def _has_params(gm: fx.GraphModule, node: fx.Node) -> bool:
    """Whether a call_module or get_attr node (whose target is a path) holds parameters."""
    assert isinstance(node.target, str)
    target = gm.get_submodule(node.target) if node.op == "call_module" else None
    if target is not None:
        return any(True for _ in target.parameters())
    return isinstance(getattr_path(gm, node.target), nn.Parameter)


def getattr_path(root: nn.Module, path: str):
    obj = root
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


@torch.no_grad()
def _reproduces(module: nn.Module, layers: Sequence[nn.Module], inputs: torch.Tensor) -> bool:
    try:
        torch.manual_seed(0)
        expected = module(inputs)
        torch.manual_seed(0)  # dropout draws the same masks in the same op order
        x = inputs
        for layer in layers:
            x = layer(*x) if isinstance(x, tuple) else layer(x)
        if not isinstance(x, torch.Tensor) or x.shape != expected.shape:
            return False
        return x.is_meta or torch.allclose(x, expected)  # on meta (a 7B model planned): the shapes only
    except Exception:
        return False

"""Layers of a module whose forward is not a chain of its children, from its torch.fx graph.

`fx_layers(module, inputs)` traces the module (torch.fx.symbolic_trace), then cuts the node list
wherever exactly one value is live (the value just computed: nothing else computed earlier is
used later), so a stage boundary there sends one tensor, and skip connections (a ResNet block's
identity, a ViT block's residual) stay inside a layer. A segment without parameters is merged
into the next one. Each layer is a GraphModule holding the user's own submodules and
parameters under their original names. Returns None when the graph cannot be traced, gives fewer than two
layers, or the chained layers do not reproduce `module(inputs)`.
Not yet: cuts where several tensors are live (a U-Net's long skips), which need stage
boundaries that send tuples; such models stay one layer.
"""

from __future__ import annotations

import torch
from torch import fx, nn


def fx_layers(module: nn.Module, inputs: torch.Tensor) -> list[nn.Module] | None:
    gm = _trace(module)
    if gm is None:
        return None
    nodes = [n for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    if len([n for n in gm.graph.nodes if n.op == "placeholder"]) != 1 or not nodes:
        return None
    partition = _partition(gm, nodes)
    if len(set(partition.values())) < 2:
        return None
    try:
        layers = [_segment(gm, [n for n in nodes if partition[n.name] == k]) for k in sorted(set(partition.values()))]
    except Exception:
        return None
    return layers if _reproduces(module, layers, inputs) else None


def _segment(gm: fx.GraphModule, nodes: list[fx.Node]) -> fx.GraphModule:
    """One layer: its nodes, reading the one value live before it (the first node's tensor input,
    or the model input). GraphModule(root, graph) keeps the user's submodules under their names."""
    graph, env = fx.Graph(), {}
    inside = set(nodes)
    outer = [a for n in nodes for a in n.all_input_nodes if a not in inside]
    x = graph.placeholder("x")
    for value in outer:  # only the one live tensor comes from outside (see _partition)
        env[value] = x
    for node in nodes:
        env[node] = graph.node_copy(node, lambda a: env[a])
    graph.output(env[nodes[-1]])
    return fx.GraphModule(gm, graph, class_name="FxLayer")


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


def _partition(gm: fx.GraphModule, nodes: list[fx.Node]) -> dict[str, int]:
    """Node name -> layer index: cut after node i when it is the only value live past it."""
    index = {n: i for i, n in enumerate(nodes)}
    last_use = {n: max((index.get(u, len(nodes)) for u in n.users), default=index[n]) for n in nodes}
    placeholder = next(n for n in gm.graph.nodes if n.op == "placeholder")
    first_input_use = max((index.get(u, len(nodes)) for u in placeholder.users), default=-1)
    current, has_params, out = 0, False, {}
    for i, node in enumerate(nodes):
        out[node.name] = current
        has_params |= node.op in ("call_module", "get_attr") and _has_params(gm, node)
        live = [n for n in nodes[: i + 1] if last_use[n] > i]
        if has_params and i < len(nodes) - 1 and first_input_use <= i and live == [node]:
            current, has_params = current + 1, False
    last = out[nodes[-1].name]
    if not has_params and last > 0:  # a trailing parameter-free segment joins the previous one
        out = {k: (v if v < last else last - 1) for k, v in out.items()}
    return out


def _has_params(gm: fx.GraphModule, node: fx.Node) -> bool:
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
def _reproduces(module: nn.Module, layers: list[nn.Module], inputs: torch.Tensor) -> bool:
    try:
        torch.manual_seed(0)
        expected = module(inputs)
        torch.manual_seed(0)  # dropout draws the same masks in the same op order
        x = inputs
        for layer in layers:
            x = layer(x)
        return isinstance(x, torch.Tensor) and x.shape == expected.shape and torch.allclose(x, expected)
    except Exception:
        return False

"""FLOPs of routed experts, which a fake-tensor run cannot see.

transformers' MoE blocks (Mixtral, Qwen2-MoE, ...) keep the experts as stacked 3-D weights
(`gate_up_proj` (E, 2f, h), `down_proj` (E, h, f)) and loop over the experts the router hit;
which ones is data-dependent, so on fake tensors the loop runs no expert and FlopCounterMode
counts only attention and the router. With balanced routing every token reaches top_k experts,
each a GEMM chain over that expert's weights: forward = 2 x tokens x top_k x (weights of one
expert) (Fedus et al. 2021 §2.1; the same count as a dense MLP of top_k experts), backward 2x.
A module counts as routed experts when it has `num_experts` and 3-D weights (E, out, in); one
that multiplies them densely (batched GEMMs the fake run sees) would be counted twice.
"""

from __future__ import annotations

from torch import nn


def expert_flops(layer: nn.Module, tokens: int) -> tuple[float, list[list[int]]]:
    """(forward FLOPs per sample, [m, n, k] GEMM shapes) of the routed experts in `layer`."""
    total, shapes = 0.0, []
    for module in layer.modules():
        experts = getattr(module, "num_experts", None)
        stacked = [p for p in module.parameters(recurse=False) if p.dim() == 3 and p.shape[0] == experts]
        if not experts or not stacked or type(module).__module__.startswith("meshplan."):
            continue  # the zoo's MoE runs every expert densely (capacity bmm): counted by the fake run
        top_k = _top_k(layer, module)
        for p in stacked:  # (E, out, in): one (tokens x top_k) x in @ in x out GEMM per routed token
            total += 2.0 * tokens * top_k * p.shape[1] * p.shape[2]
            shapes.append([tokens * top_k, int(p.shape[1]), int(p.shape[2])])
    return total, shapes


def _top_k(layer: nn.Module, experts: nn.Module) -> int:
    for module in layer.modules():
        for name in ("top_k", "num_experts_per_tok"):
            value = getattr(module, name, None)
            if isinstance(value, int) and value > 0:
                return value
    config = getattr(experts, "config", None)
    return int(getattr(config, "num_experts_per_tok", 1) or 1)

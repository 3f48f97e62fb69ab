"""Global gradient-norm clipping across every parallel dimension (torchtitan's recipe).

Gradients are grouped by (device mesh, placements); each group's norm is computed with DTensor
arithmetic (`get_total_norm` gives a partial norm, `full_tensor()` reduces it over the group's
mesh), plain tensors (DDP / ZeRO-1 replicas) are complete locally, and the squared norms of the
pipeline stages are summed with one all-reduce over the pp group. Clipping then matches
`torch.nn.utils.clip_grad_norm_` on the single-process model: coef = max_norm / (norm + 1e-6).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.experimental import implicit_replication
from torch.nn.utils import get_total_norm


def _groups(grads: list[torch.Tensor]) -> dict:
    groups: dict = {}
    for g in grads:
        if isinstance(g, DTensor):
            if any(p.is_partial() for p in g.placements):
                g = g.redistribute(placements=[Replicate() if p.is_partial() else p for p in g.placements])
            key = (g.device_mesh, tuple(g.placements))
        else:
            key = None
        groups.setdefault(key, []).append(g)
    return groups


@torch.no_grad()
def global_grad_norm(grads: list[torch.Tensor], pp_group, device: torch.device) -> torch.Tensor:
    """The global L2 norm as a 0-dim float64 tensor on `device` (no host synchronisation)."""
    total_sq = torch.zeros((), dtype=torch.float64, device=device)
    for gs in _groups(grads).values():
        norm = get_total_norm(gs, 2.0)
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()
        total_sq += norm.to(device=device, dtype=torch.float64) ** 2
    if pp_group is not None and dist.get_world_size(pp_group) > 1:
        dist.all_reduce(total_sq, group=pp_group)
    return total_sq.sqrt()


@torch.no_grad()
def clip_grad_norm(params: list[torch.Tensor], max_norm: float, pp_group, device: torch.device) -> torch.Tensor:
    """Scale gradients in place so their global L2 norm is <= max_norm (<= 0: only measure);
    returns the norm before clipping, as a tensor (read it with .item() when needed)."""
    grads = [p.grad for p in params if p.grad is not None]
    norm = global_grad_norm(grads, pp_group, device)
    if max_norm > 0 and grads:
        # torch.nn.utils.clip_grad_norm_'s formula, kept on the device (multiplying by 1.0 when
        # under the limit, as torch does, instead of a host-side branch)
        coef = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        by_mesh: dict = {}  # foreach ops need one mesh per list (and plain tensors apart)
        for g in grads:
            by_mesh.setdefault(g.device_mesh if isinstance(g, DTensor) else None, []).append(g)
        with implicit_replication():
            for group in by_mesh.values():
                torch._foreach_mul_(group, coef.to(group[0].dtype))
    return norm

"""Global gradient-norm clipping across every parallel dimension, with one all-reduce.

The global norm is over the distinct gradient elements of the whole model. Each rank sums the
squares of its local gradient pieces, divided by how many ranks hold an identical copy of that
piece (its replication factor), and one all-reduce over the world adds them up:
  replication = (world / pp) / prod(mesh size of the axes the DTensor is sharded on)
(a pipeline stage's ranks are world / pp; plain tensors and replicated DTensor axes are copies).
Clipping then matches `torch.nn.utils.clip_grad_norm_` on the single-process model.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate

from meshplan.plan import Plan


def _local_sq_and_copies(grad: torch.Tensor, ranks_per_stage: int) -> tuple[torch.Tensor, int]:
    if not isinstance(grad, DTensor):
        return grad.detach().float().pow(2).sum(), ranks_per_stage
    if any(p.is_partial() for p in grad.placements):
        grad = grad.redistribute(placements=[Replicate() if p.is_partial() else p for p in grad.placements])
    shards = 1
    for axis, placement in enumerate(grad.placements):
        if placement.is_shard():
            shards *= grad.device_mesh.size(axis)
    return grad.to_local().detach().float().pow(2).sum(), ranks_per_stage // shards


@torch.no_grad()
def clip_grad_norm(params: list[torch.Tensor], max_norm: float, plan: Plan, device: torch.device) -> float:
    """Scale gradients in place so their global L2 norm is <= max_norm (<= 0: only measure)."""
    ranks_per_stage = plan.world_size // plan.pipeline_parallel_degree
    total = torch.zeros(1, dtype=torch.float64, device=device)
    grads = [p.grad for p in params if p.grad is not None]
    for g in grads:
        sq, copies = _local_sq_and_copies(g, ranks_per_stage)
        total += sq.to(torch.float64) / copies
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(total)
    norm = total.sqrt().item()
    if max_norm > 0:
        coef = max_norm / (norm + 1e-6)  # torch.nn.utils.clip_grad_norm_'s formula
        if coef < 1.0:
            for g in grads:
                g.mul_(coef)
    return norm

"""Tied weights across stages and wrappers: one weight, several copies kept equal (Megatron-LM's
embedding group, Shoeybi et al. 2019; Narayanan et al. 2021 §2.2 for the first/last stage).

`apply` works on a meta copy of the model, and `to("meta")`, pipeline splitting, TP's
`distribute_module` and FSDP2 each give a tied parameter one copy per owning module. All copies
start from the same full value (materialise fills each FQN from the one weight), so keeping them
equal needs only equal gradients: after the data-parallel reduction, `TiedGrads.reduce` sums the
copies' gradients on each rank and all-reduces the sum over the pipeline group (only when the
copies live on different pipeline ranks), then every copy takes the total — the gradient of the
single shared weight. Copies have equal shapes, so under TP/FSDP their local shards line up.
The global-norm clip counts each weight once (`duplicates`: every copy but the group's first).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from meshplan.executor.materialize import clean_fqn
from meshplan.executor.shards import local_shard
from meshplan.plan import Plan


def _layer_of(fqn: str, layers: list[str]) -> str:
    return next(layer for layer in layers if fqn == layer or fqn.startswith(layer + "."))


class TiedGrads:
    """Gradient sum over the copies of each tied group this rank holds (see module docstring)."""

    def __init__(self, plan: Plan, groups: list[list[str]], parts: list[nn.Module], mesh):
        ranks = plan.stage_ranks()
        stage_of = {layer: s for s, stage in enumerate(plan.stages) for layer in stage}
        self.groups: list[list[nn.Parameter]] = []
        self.collective: list[bool] = []
        self.duplicates: set[int] = set()
        by_fqn = {clean_fqn(n): p for part in parts for n, p in part.named_parameters(remove_duplicate=False)}
        self.pp_groups: list = []
        for names in groups:
            stages = [stage_of[_layer_of(n, plan.layers)] for n in names]
            copies = list({id(by_fqn[n]): by_fqn[n] for n in names if n in by_fqn}.values())
            owner = by_fqn.get(names[stages.index(min(stages))])
            self.duplicates.update(id(p) for p in copies if p is not owner)
            self.groups.append(copies)
            holders = sorted({ranks[s] for s in stages})
            self.collective.append(len(holders) > 1)
            self.pp_groups.append(_holder_group(mesh, holders) if len(holders) > 1 else None)

    def __bool__(self) -> bool:
        return any(len(c) > 1 for c in self.groups) or any(self.collective)

    @torch.no_grad()
    def reduce(self) -> None:
        """Every copy's gradient := the sum over all copies (on all pipeline ranks)."""
        for copies, collective, group in zip(self.groups, self.collective, self.pp_groups):
            if len(copies) < 2 and not collective:
                continue
            for p in copies:  # a DTensor's gradient may come in another layout (embedding: Replicate)
                if isinstance(p, DTensor) and isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
                    p.grad = p.grad.redistribute(p.device_mesh, p.placements)
            total = self._local_sum(copies)
            if total is None:  # no copy on this rank
                continue
            if collective:
                dist.all_reduce(total, group=group)
            for p in copies:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                local_shard(p.grad).copy_(total)

    @torch.no_grad()
    def scale_duplicates(self, coef: torch.Tensor) -> None:
        """Clip the copies the norm left out by the same coefficient as their owner."""
        for copies in self.groups:
            for p in copies:
                if id(p) in self.duplicates and p.grad is not None:
                    local_shard(p.grad).mul_(coef.to(p.grad.dtype))

    @staticmethod
    def _local_sum(copies: list[nn.Parameter]) -> torch.Tensor | None:
        if not copies:
            return None
        total = torch.zeros_like(local_shard(copies[0]))
        for p in copies:
            if p.grad is not None:
                assert local_shard(p.grad).shape == total.shape, "tied copies must be sharded alike"
                total += local_shard(p.grad)
        return total


def _holder_group(mesh, holders: list[int]):
    """The process group of this rank's pipeline ranks `holders` (every rank creates every slice's
    group, in the same order, as new_group requires); None on ranks outside it."""
    pp = mesh.mesh.shape[0]
    slices = mesh.mesh.reshape(pp, -1)
    me, mine = dist.get_rank(), None
    for col in range(slices.shape[1]):
        ranks = [int(slices[r, col]) for r in holders]
        group = dist.new_group(ranks) if len(ranks) < pp else mesh["pp"].get_group()
        if me in ranks:
            mine = group
    return mine

"""Data parallelism: DDP (+ communication hook), ZeRO-1, ZeRO-2/3 (FSDP2), and the optimizers.

- zero_stage 0: DDP over all data-parallel ranks, gradients all-reduced in buckets during
  backward; `gradient_comm` picks the hook: allreduce (default), fp16 (compress to fp16 before the
  all-reduce), powersgd (Vogels et al. 2019, rank 2, error feedback; exact for the first 2 steps).
- zero_stage 1: the same gradient all-reduce, and a ZeroRedundancyOptimizer, so each rank keeps
  1/dp of the optimizer states and broadcasts the parameters it updated (Rajbhandari et al. 2020).
- zero_stage 2/3: FSDP2 `fully_shard` per layer and on the stage root (HSDP over dp_replicate x
  dp_shard when both > 1); reshard_after_forward = False for ZeRO-2 (parameters stay gathered
  between forward and backward), True for ZeRO-3.
DDP and ZeroRedundancyOptimizer refuse DTensor parameters, so with tensor parallelism zero 0/1
use `ReplicaGradReducer` (one bucketed all-reduce of the local shards after backward) and a
ZeroRedundancyOptimizer over the local shards (`_local_tensor`, sharing storage).
"""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from meshplan.executor.parallel_dims import ParallelDims
from meshplan.plan import Plan

BUCKET_BYTES = 25 * 2**20


def apply_fsdp(part: nn.Module, dims: ParallelDims, plan: Plan, device: torch.device) -> nn.Module:
    """ZeRO-2/3: shard each held layer, then the stage root (which takes embed/head leftovers)."""
    mesh = dims.fsdp_mesh()
    kwargs = {"mesh": mesh, "reshard_after_forward": plan.zero_stage == 3}
    if plan.offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=device.type == "cuda")
    for name in ("embed", "head"):
        if getattr(part, name, None) is not None and any(True for _ in getattr(part, name).parameters()):
            fully_shard(getattr(part, name), **kwargs)
    for layer in part.layers.values():
        fully_shard(layer, **kwargs)
    fully_shard(part, **kwargs)
    return part


def has_dtensor_params(part: nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in part.parameters())


def apply_ddp(part: nn.Module, dims: ParallelDims, plan: Plan, device: torch.device) -> nn.Module:
    """DDP over the flattened data-parallel group, with the plan's gradient communication hook."""
    group = dims.dp_mesh().get_group()
    ddp = DDP(part, process_group=group, device_ids=[device.index] if device.type == "cuda" else None,
              bucket_cap_mb=BUCKET_BYTES // 2**20,
              # under a pipeline schedule every microbatch's backward marks the params ready again
              # and DDP's one-time bucket rebuild double-counts them (INTERNAL ASSERT); the rebuild
              # is skipped when find_unused_parameters is set
              find_unused_parameters=plan.pipeline_parallel_degree > 1)
    if plan.gradient_comm == "fp16":
        ddp.register_comm_hook(group, default_hooks.fp16_compress_hook)
    elif plan.gradient_comm == "powersgd":
        # start_powerSGD_iter >= 2 is required with error feedback / warm start (torch-gloo.md 1e)
        state = powerSGD_hook.PowerSGDState(process_group=group, matrix_approximation_rank=2,
                                            start_powerSGD_iter=2, min_compression_rate=2)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    return ddp


class ReplicaGradReducer:
    """DDP's arithmetic for DTensor (tensor-parallel) parameters: after backward, average each
    local gradient shard over the data-parallel group in flat buckets (fp16 if asked)."""

    def __init__(self, params: list[nn.Parameter], group, fp16: bool = False):
        self.params = [p for p in params if p.requires_grad]
        self.group = group
        self.fp16 = fp16
        self.world = dist.get_world_size(group)

    @torch.no_grad()
    def reduce(self) -> None:
        for p in self.params:
            if isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
                # e.g. the vocab-parallel embedding's grad comes out Replicate/Partial: shard it as the param
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)
        grads = [_local(p.grad) for p in self.params if p.grad is not None]
        for bucket in _buckets(grads):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            wire = flat.half() if self.fp16 else flat
            dist.all_reduce(wire, group=self.group)
            flat.copy_(wire).div_(self.world)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()


def _local(t: torch.Tensor) -> torch.Tensor:
    return t._local_tensor if isinstance(t, DTensor) else t


def _buckets(tensors: list[torch.Tensor]):
    bucket, size = [], 0
    for t in tensors:
        if bucket and (size + t.numel() * t.element_size() > BUCKET_BYTES or t.dtype != bucket[0].dtype):
            yield bucket
            bucket, size = [], 0
        bucket.append(t)
        size += t.numel() * t.element_size()
    if bucket:
        yield bucket


def make_optimizer(params: list[nn.Parameter], name: str, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    cls, kwargs = optimizer_spec(name, lr, weight_decay)
    return cls(params, **kwargs)


def optimizer_spec(name: str, lr: float, weight_decay: float) -> tuple[type, dict]:
    if name == "sgd":  # with momentum, so checkpoints and ZeRO-1 carry optimizer state
        return torch.optim.SGD, {"lr": lr, "momentum": 0.9}
    assert name == "adamw", name
    return torch.optim.AdamW, {"lr": lr, "weight_decay": weight_decay, "betas": (0.9, 0.95)}


def build_optimizer(part: nn.Module, dims: ParallelDims, plan: Plan, name: str, lr: float,
                    weight_decay: float) -> torch.optim.Optimizer:
    """One optimizer per model part; ZeRO-1 shards its states over the data-parallel group."""
    params = [p for p in part.parameters() if p.requires_grad]
    if plan.zero_stage != 1 or dims.dp_degree == 1:
        return make_optimizer(params, name, lr, weight_decay)
    cls, kwargs = optimizer_spec(name, lr, weight_decay)
    group = dims.dp_mesh().get_group()
    if not any(isinstance(p, DTensor) for p in params):
        return ZeroRedundancyOptimizer(params, optimizer_class=cls, process_group=group,
                                       parameters_as_bucket_view=True, **kwargs)
    return ZeroOverLocalShards(params, optimizer_class=cls, process_group=group, **kwargs)


class ZeroOverLocalShards(ZeroRedundancyOptimizer):
    """ZeRO-1 for tensor-parallel (DTensor) parameters, which ZeroRedundancyOptimizer cannot
    broadcast: it optimises plain Parameters viewing each DTensor's local shard (same storage),
    copies the DTensor gradients' local shards onto them before each step, and clears both."""

    def __init__(self, params: list[nn.Parameter], **kwargs):
        self.real_and_local = [(p, _local_param(p)) for p in params]
        super().__init__([local for _, local in self.real_and_local], **kwargs)

    def step(self, closure=None, **kwargs):
        for param, local in self.real_and_local:
            if local is not param:
                local.grad = None if param.grad is None else _local(param.grad)
        return super().step(closure, **kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for param, _ in self.real_and_local:
            param.grad = None


def _local_param(p: nn.Parameter) -> nn.Parameter:
    return nn.Parameter(p._local_tensor, requires_grad=True) if isinstance(p, DTensor) else p

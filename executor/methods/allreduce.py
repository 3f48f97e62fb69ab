"""sync=allreduce, compression=none: synchronous data parallelism, gradients averaged every step.

- DDP (plain parameters): torch's `allreduce_hook` (divide by the group size, all-reduce the
  bucket) registered as a comm hook so the bucket it sends is counted.
- Tensor-parallel (DTensor) replicas, which DDP cannot hold, and zero-bubble schedules, whose
  split weight-gradient pass DDP's autograd hooks miss: `ReplicaGradReducer`, one bucketed
  all-reduce of the local gradient shards after backward (DDP's arithmetic; fp16 on the wire
  for compression=fp16).
The members every other compression or sync module without a need of its own shares: no optimizer
check, no codec to time; sync=allreduce is DDP itself (no hook of its own, no SyncMethod).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.tensor import DTensor

from meshplan.comm_bytes import ByteCounter
from meshplan.executor.methods.counting import tensor_bytes
from meshplan.executor.shards import local_shard


def comm_hook(group, params: dict, counter: ByteCounter, axis: str):
    """(state, hook) for DDP.register_comm_hook: the plain all-reduce, counted."""

    def allreduce_counted(state, bucket):  # no annotations: DDP checks them against the class
        counter.add(axis, "all_reduce", state.size(), tensor_bytes(bucket.buffer()))
        return default_hooks.allreduce_hook(state, bucket)

    return group, allreduce_counted


class ReplicaGradReducer:
    """After backward, average each local gradient shard over the data-parallel group in flat
    buckets of `bucket_bytes` (cast to `wire_dtype` for the all-reduce), counting each bucket."""

    def __init__(
        self,
        params: list[nn.Parameter],
        group,
        *,
        counter: ByteCounter,
        axis: str,
        bucket_bytes: int,
        wire_dtype: torch.dtype | None = None,
    ):
        self.params = [p for p in params if p.requires_grad]
        self.group, self.counter, self.axis = group, counter, axis
        self.bucket_bytes, self.wire_dtype = bucket_bytes, wire_dtype
        self.world = dist.get_world_size(group)

    @torch.no_grad()
    def reduce(self) -> None:
        for p in self.params:
            if isinstance(p, DTensor) and isinstance(p.grad, DTensor) and p.grad.placements != p.placements:
                # e.g. the vocab-parallel embedding's grad comes out Replicate/Partial: shard it as the param
                p.grad = p.grad.redistribute(p.device_mesh, p.placements)
        grads = [local_shard(p.grad) for p in self.params if p.grad is not None]
        for bucket in buckets(grads, self.bucket_bytes):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            wire = flat.to(self.wire_dtype) if self.wire_dtype is not None else flat
            self.counter.add(self.axis, "all_reduce", self.world, tensor_bytes(wire))
            dist.all_reduce(wire, group=self.group)
            flat.copy_(wire).div_(self.world)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()


def dense_replica_reducer(wire_dtype: torch.dtype | None = None):
    """A `replica_reducer` (axes.Compression) that all-reduces the buckets as DDP does, cast to
    `wire_dtype` on the wire (None: as they are)."""

    def build(params, group, *, counter: ByteCounter, axis: str, bucket_bytes: int, method_params: dict):
        return ReplicaGradReducer(
            params, group, counter=counter, axis=axis, bucket_bytes=bucket_bytes, wire_dtype=wire_dtype
        )

    return build


replica_reducer = dense_replica_reducer()

TIMED_CODEC = None
"""The plain all-reduce has no codec to time."""


def check_optimizer(params: dict, optimizer: str) -> None:
    """Any optimizer: the gradients are exchanged whatever steps on them."""


def optimizer_kwargs(params: dict, optimizer: str, kwargs: dict) -> dict:
    return kwargs


USES_DDP = True
"""sync=allreduce: DDP (or the replica reducer) is the synchronisation."""


def ddp_comm_hook(group, params: dict, counter: ByteCounter, axis: str) -> None:
    """No hook of its own: DDP runs the compression method's."""
    return None


def build(par, params: dict, counter: ByteCounter) -> None:
    """No SyncMethod: train.py's own step."""
    return None


def buckets(tensors: list[torch.Tensor], bucket_bytes: int):
    """Consecutive runs of one dtype of at most `bucket_bytes` (a larger tensor alone)."""
    bucket: list[torch.Tensor] = []
    size = 0
    for t in tensors:
        if bucket and (size + tensor_bytes(t) > bucket_bytes or t.dtype != bucket[0].dtype):
            yield bucket
            bucket, size = [], 0
        bucket.append(t)
        size += tensor_bytes(t)
    if bucket:
        yield bucket

"""compression=fp16: gradients cast to fp16 for the all-reduce (half the bytes; rounding error).

DDP: torch's `fp16_compress_hook` (cast, divide by the group size, all-reduce, cast back),
counted as the fp16 buffer it sends. TP replicas: the ReplicaGradReducer with fp16 on the wire.
`meshplan profile` times `Fp16Cast`, the hook's tensor work (executor/methods/codecs.py).
"""

from __future__ import annotations

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from meshplan.comm_bytes import ByteCounter
from meshplan.executor.methods import allreduce, compressed

WIRE_DTYPE = torch.float16


def comm_hook(group, params: dict, counter: ByteCounter, axis: str):
    """(state, hook) for DDP.register_comm_hook: fp16 all-reduce of each bucket, counted."""

    def fp16_counted(state, bucket):  # no annotations: DDP checks them against the class
        buffer = bucket.buffer()
        counter.add(axis, "all_reduce", state.size(), buffer.numel() * torch.finfo(WIRE_DTYPE).bits // 8)
        return default_hooks.fp16_compress_hook(state, bucket)

    return group, fp16_counted


replica_reducer = allreduce.dense_replica_reducer(WIRE_DTYPE)
check_optimizer = allreduce.check_optimizer
optimizer_kwargs = allreduce.optimizer_kwargs


class Fp16Cast(compressed.Codec):
    """fp16_compress_hook's tensor work per bucket: fp32 -> fp16, / world, all-reduce, -> fp32."""

    def exchange(self, comm, items) -> None:
        flat = torch.cat([g for _, g, _ in items])
        wire = flat.to(torch.float16).div_(comm.world)
        comm.all_reduce(wire)
        offset = 0
        for _, g, _ in items:
            g.copy_(wire[offset : offset + g.numel()])
            offset += g.numel()


TIMED_CODEC = Fp16Cast

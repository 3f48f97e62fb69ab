"""compression=powersgd: rank-r low-rank gradients with error feedback (Vogels et al. 2019).

torch's `powerSGD_hook` with a PowerSGDState from the registry parameters (rank ->
matrix_approximation_rank, start_iter -> start_powerSGD_iter, min_compression_rate,
error_feedback -> use_error_feedback, warm_start). Not `batched_powerSGD_hook`: it fails an
assertion in `_orthogonalize` in torch 2.13. DDP only (no DTensor).

Bytes: before start_iter the hook all-reduces the whole bucket (counted here); from then on per
bucket one all-reduce of the uncompressed tensors (vectors, and matrices whose compression rate
n m / ((n + m) r) is below min_compression_rate) and one each of the P (n x r) and Q (m x r)
factors, Q from a future callback: all three are counted by the CountingDist that replaces the
hook module's `dist`.
"""

from __future__ import annotations

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

from meshplan.comm_bytes import ByteCounter
from meshplan.executor.methods import allreduce
from meshplan.executor.methods.counting import counting_dist, tensor_bytes
from meshplan.executor.methods.lowrank import LowRank


def comm_hook(group, params: dict, counter: ByteCounter, axis: str):
    """(PowerSGDState, hook) for DDP.register_comm_hook, every all-reduce counted."""
    # torch requires start_powerSGD_iter >= 2 with error feedback / warm start (PowerSGDState
    # raises ValueError otherwise); the registry's start_iter range already says so
    state = powerSGD_hook.PowerSGDState(
        process_group=group,
        matrix_approximation_rank=params["rank"],
        start_powerSGD_iter=params["start_iter"],
        min_compression_rate=params["min_compression_rate"],
        use_error_feedback=params["error_feedback"],
        warm_start=params["warm_start"],
    )
    counting_dist(powerSGD_hook).register(group, counter, axis)
    counter.warmup_steps = max(counter.warmup_steps, params["start_iter"])  # dense until then

    def powersgd_counted(state, bucket):  # no annotations: DDP checks them against the class
        if state.iter < state.start_powerSGD_iter:  # the hook then all-reduces the bucket as it is
            counter.add(axis, "all_reduce", dist.get_world_size(group), tensor_bytes(bucket.buffer()))
        return powerSGD_hook.powerSGD_hook(state, bucket)

    return state, powersgd_counted


replica_reducer = allreduce.dense_replica_reducer()
"""Where DDP does not run (a split-backward schedule; tensor parallelism is refused for powersgd):
the replica reducer's plain all-reduce."""
check_optimizer = allreduce.check_optimizer
optimizer_kwargs = allreduce.optimizer_kwargs
TIMED_CODEC = LowRank
"""torch's hook needs a process group: `meshplan profile` times LowRank, the same algorithm per
tensor (executor/methods/codecs.py)."""

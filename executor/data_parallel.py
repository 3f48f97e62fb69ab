"""Data parallelism: DDP (+ communication hook), ZeRO-1, ZeRO-2/3 (FSDP2), and the optimizers.

- zero_stage 0: DDP over all data-parallel ranks, gradients all-reduced in buckets during
  backward (comm_schedule=buckets: bucket_cap_mb); the plan's compression method supplies the
  comm hook (executor/methods/: allreduce, fp16, powersgd), which counts the bytes it sends.
- zero_stage 1: the same gradient all-reduce, and a ZeroRedundancyOptimizer, so each rank keeps
  1/dp of the optimizer states and broadcasts the parameters it updated (Rajbhandari et al. 2020);
  the broadcasts are counted (`CountedBroadcasts`).
- zero_stage 2/3: FSDP2 `fully_shard` per layer and on the stage root (HSDP over dp_replicate x
  dp_shard when both > 1); reshard_after_forward = False for ZeRO-2 (parameters stay gathered
  between forward and backward), True for ZeRO-3; offload=cpu adds CPUOffloadPolicy. Gathers,
  reduce-scatters and HSDP's all-reduce are counted through FSDP2's custom-comm API.
DDP and ZeroRedundancyOptimizer refuse DTensor parameters, so with tensor parallelism zero 0/1
use `ReplicaGradReducer` (one bucketed all-reduce of the local shards after backward) and a
ZeroRedundancyOptimizer over the local shards (`_local_tensor`, sharing storage).
Every count goes into the rank's ByteCounter (meshplan/comm_bytes.py) on the mesh axis of its
group: "dp_replicate" for DDP, ZeRO-1 and HSDP's replicate all-reduce, "dp_shard" for FSDP2.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel as DDP

from meshplan import dp_methods
from meshplan.comm_bytes import ByteCounter
from meshplan.executor import methods
from meshplan.executor.methods import axes
from meshplan.executor.methods.allreduce import ReplicaGradReducer
from meshplan.executor.methods.counting import count_fsdp, tensor_bytes
from meshplan.executor.optimizers import optimizer_spec
from meshplan.executor.parallel_dims import ParallelDims
from meshplan.executor.shards import local_shard
from meshplan.models.zoo.base import LayeredModel
from meshplan.plan import Plan


def bucket_cap_mb(schedule: axes.CommSchedule, params: dict) -> int:
    """DDP's bucket_cap_mb under the comm_schedule method `schedule` with its `params`."""
    return schedule.bucket_bytes(params) // 2**20


DEFAULT_BUCKET_CAP_MB = bucket_cap_mb(
    methods.MODULES.comm_schedule[dp_methods.DEFAULTS["comm_schedule"]], dp_methods.default_params("comm_schedule")
)
"""DDP's bucket_cap_mb under the default comm_schedule (buckets, bucket_mb 25): the profiler's DDP case."""


def apply_fsdp(
    part: LayeredModel, dims: ParallelDims, plan: Plan, device: torch.device, counter: ByteCounter
) -> nn.Module:
    """ZeRO-2/3: shard each held layer, then the stage root (which takes embed/head leftovers);
    the offload method adds its policy, and every sharded module counts its collectives."""
    offload, params = methods.offload_of(plan)
    kwargs = {
        "mesh": dims.fsdp_mesh(),
        "reshard_after_forward": plan.zero_stage == 3,
        **offload.fsdp_kwargs(params, device, plan.zero_stage),
    }
    sharded = [m for m in (part.embed, part.head) if m is not None and any(True for _ in m.parameters())]
    sharded += list(part.layers.values()) + [part]
    replicate = dims.mesh["dp_replicate"].get_group() if dims.size("dp_replicate") > 1 else None
    for module in sharded:
        count_fsdp(fully_shard(module, **kwargs), counter, replicate)  # the module, now an FSDPModule
    return part


def has_dtensor_params(part: nn.Module) -> bool:
    return any(isinstance(p, DTensor) for p in part.parameters())


def apply_ddp(part: nn.Module, dims: ParallelDims, plan: Plan, device: torch.device, counter: ByteCounter) -> nn.Module:
    """DDP over the data-parallel (dp_replicate) group: the comm_schedule method's buckets, then
    the compression method's comm hook (which counts what it sends)."""
    group = dims.dp_mesh().get_group()
    schedule, schedule_params = methods.comm_schedule_of(plan)
    replaced = schedule.wrap(part, group, schedule_params, counter)  # comm_schedule=bytescheduler's reducer
    if replaced is not None:
        return replaced
    ddp = DDP(
        part,
        process_group=group,
        device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=bucket_cap_mb(schedule, schedule_params),
        # under a pipeline schedule every microbatch's backward marks the params ready again
        # and DDP's one-time bucket rebuild double-counts them (INTERNAL ASSERT); the rebuild
        # is skipped when find_unused_parameters is set
        find_unused_parameters=plan.pipeline_parallel_degree > 1,
    )
    compression, params = methods.compression_of(plan)
    sync, sync_params = methods.sync_of(plan)
    hook = sync.ddp_comm_hook(group, sync_params, counter, "dp_replicate")  # sync=local-sgd: post-local SGD
    ddp.register_comm_hook(*(hook or compression.comm_hook(group, params, counter, "dp_replicate")))
    return ddp


def replica_reducer(part: nn.Module, dims: ParallelDims, plan: Plan, counter: ByteCounter) -> ReplicaGradReducer:
    """DDP's arithmetic for DTensor (tensor-parallel) replicas and zero-bubble schedules: the
    comm_schedule method's bucket size, the compression method's exchange (a codec, or the dense
    all-reduce with fp16 or the gradients' own dtype on the wire)."""
    schedule, schedule_params = methods.comm_schedule_of(plan)
    compression, compression_params = methods.compression_of(plan)
    return compression.replica_reducer(
        list(part.parameters()),
        dims.dp_mesh().get_group(),
        counter=counter,
        axis="dp_replicate",
        bucket_bytes=schedule.bucket_bytes(schedule_params),
        method_params=compression_params,
    )


def build_optimizer(
    part: nn.Module,
    dims: ParallelDims,
    plan: Plan,
    name: str,
    lr: float,
    weight_decay: float,
    counter: ByteCounter | None = None,
    offload_dir: str = "offload",
) -> torch.optim.Optimizer:
    """One optimizer per model part; ZeRO-1 shards its states over the data-parallel group and
    counts its parameter broadcasts into `counter`; the offload method may put the step on the
    host (offload=cpu/nvme: executor/methods/host_optimizer.py, NVMe files under offload_dir)."""
    params = [p for p in part.parameters() if p.requires_grad]
    if not params:  # a fully frozen pipeline stage: nothing to update (torch refuses an empty list)
        return FrozenOptimizer()
    counter = counter if counter is not None else ByteCounter()
    cls, kwargs = optimizer_spec(name, lr, weight_decay)
    compression, compression_params = methods.compression_of(plan)
    kwargs = compression.optimizer_kwargs(compression_params, name, kwargs)  # top-k's DGC: no momentum
    offload, offload_params = methods.offload_of(plan)
    offload.prepare_part(part, offload_params, zero=plan.zero_stage, counter=counter, folder=offload_dir)  # nvme
    cls = offload.optimizer_class(
        cls, offload_params, zero=plan.zero_stage, counter=counter, folder=offload_dir, optimizer=name
    )
    if plan.zero_stage != 1 or dims.dp_degree == 1:
        return cls(params, **kwargs)
    group = dims.dp_mesh().get_group()
    if not any(isinstance(p, DTensor) for p in params):
        return CountedZero(
            params, optimizer_class=cls, process_group=group, parameters_as_bucket_view=True, counter=counter, **kwargs
        )
    return ZeroOverLocalShards(params, optimizer_class=cls, process_group=group, counter=counter, **kwargs)


class CountedBroadcasts(ZeroRedundancyOptimizer):
    """A ZeroRedundancyOptimizer whose each step every rank broadcasts the parameters it
    updated (`_broadcast_params_from_rank`, once per source rank); each broadcast is counted on
    "dp_replicate" as the bucket (parameters_as_bucket_view) or the parameters it sends."""

    counter: ByteCounter

    # torch's zero_redundancy_optimizer.pyi leaves out the private methods its .py defines and
    # these override or call (_broadcast_params_from_rank, _partition_parameters)
    def _broadcast_params_from_rank(self, rank: int):
        if self.parameters_as_bucket_view:
            payload = sum(tensor_bytes(dev_buckets[rank]) for dev_buckets in self._buckets)
        else:
            groups = self._partition_parameters()[rank]  # type: ignore[attr-defined]  # not in the stub
            payload = sum(tensor_bytes(p) for g in groups for p in g["params"])
        self.counter.add("dp_replicate", "broadcast", self.world_size, payload)
        return super()._broadcast_params_from_rank(rank)  # type: ignore[misc]  # not in the stub


class CountedZero(CountedBroadcasts):
    """torch's ZeroRedundancyOptimizer with its parameter broadcasts counted."""

    def __init__(self, params, *, counter: ByteCounter, **kwargs):
        self.counter = counter
        super().__init__(params, **kwargs)


class ZeroOverLocalShards(CountedBroadcasts):
    """ZeRO-1 for tensor-parallel (DTensor) parameters, which ZeroRedundancyOptimizer cannot
    broadcast: it optimises plain Parameters viewing each DTensor's local shard (same storage),
    copies the DTensor gradients' local shards onto them before each step, and clears both."""

    def __init__(self, params: list[nn.Parameter], *, counter: ByteCounter, **kwargs):
        self.counter = counter
        self.real_and_local = [(p, _local_param(p)) for p in params]
        super().__init__([local for _, local in self.real_and_local], **kwargs)

    def step(self, closure=None, **kwargs):
        for param, local in self.real_and_local:
            if local is not param:
                local.grad = None if param.grad is None else local_shard(param.grad)
        return super().step(closure, **kwargs)

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for param, _ in self.real_and_local:
            param.grad = None


def _local_param(p: nn.Parameter) -> nn.Parameter:
    return nn.Parameter(p._local_tensor, requires_grad=True) if isinstance(p, DTensor) else p


class FrozenOptimizer(torch.optim.Optimizer):
    """The optimizer of a stage without trainable parameters: step and zero_grad do nothing."""

    def __init__(self):
        self.param_groups, self.state, self.defaults = [], {}, {}
        self._optimizer_step_pre_hooks, self._optimizer_step_post_hooks = {}, {}

    def step(self, closure=None):
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None

    def state_dict(self) -> dict:
        return {"state": {}, "param_groups": []}

    def load_state_dict(self, state_dict: dict) -> None:
        return None

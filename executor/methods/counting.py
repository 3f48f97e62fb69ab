"""Counting the bytes every data-parallel collective really sends, into the rank's ByteCounter.

Each counter records (mesh axis, collective, group size, payload bytes as the collective gets
them, padding included); meshplan/comm_bytes.py turns that into ring bytes on the wire, the
convention the planner predicts. Where a collective is issued:
- DDP comm hooks (allreduce.py, fp16.py, powersgd.py) count their bucket's wire buffer;
- torch's powerSGD_hook issues its P and Q all-reduces itself (Q from a future callback), so its
  module's `dist` is replaced by `CountingDist`, which counts `all_reduce` on registered groups
  and forwards everything else untouched;
- FSDP2 through its custom-comm API (`FSDPModule.set_custom_all_gather` /
  `set_custom_reduce_scatter`), and HSDP's replicate all-reduce through `set_all_reduce_hook`
  (called with the all-reduced gradient shard right after that all-reduce);
- ZeRO-1's parameter broadcasts in `CountedBroadcasts` (data_parallel.py's optimizers).
Not counted: the gradient-clipping norm scalars and the loss all-reduce (a few bytes each, no
method's traffic), DDP's one-time parameter broadcast at construction, and any TP/PP traffic.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather, DefaultReduceScatter

from meshplan.comm_bytes import ByteCounter


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class CountingDist:
    """Stands in for `torch.distributed` inside one torch module: `all_reduce` on a registered
    process group is counted into that group's (counter, axis), everything else passes through."""

    def __init__(self, real):
        self._real = real
        self.groups: dict[int, tuple[object, ByteCounter, str]] = {}

    def __getattr__(self, name):
        return getattr(self._real, name)

    def register(self, group, counter: ByteCounter, axis: str) -> None:
        self.groups[id(group)] = (group, counter, axis)  # the group is kept alive with its id

    def all_reduce(self, tensor, *args, group=None, **kwargs):
        hit = self.groups.get(id(group))
        if hit is not None:
            hit[1].add(hit[2], "all_reduce", group.size(), tensor_bytes(tensor))
        return self._real.all_reduce(tensor, *args, group=group, **kwargs)


def counting_dist(module) -> CountingDist:
    """Install (once) and return the CountingDist that `module` (a torch module doing
    `import torch.distributed as dist`) now calls."""
    if not isinstance(module.dist, CountingDist):
        module.dist = CountingDist(module.dist)
    return module.dist


class CountingAllGather(DefaultAllGather):
    """FSDP2's all-gather, counted: this rank's shard (the padded all-gather input) per call."""

    def __init__(self, counter: ByteCounter, axis: str):
        self.counter, self.axis = counter, axis

    def __call__(self, output_tensor, input_tensor, group, async_op: bool = False):
        self.counter.add(self.axis, "all_gather", group.size(), tensor_bytes(input_tensor))
        return super().__call__(output_tensor, input_tensor, group, async_op)


class CountingReduceScatter(DefaultReduceScatter):
    """FSDP2's reduce-scatter, counted: the whole padded unsharded gradient buffer per call."""

    def __init__(self, counter: ByteCounter, axis: str):
        self.counter, self.axis = counter, axis

    def __call__(self, output_tensor, input_tensor, group, op, async_op: bool = False):
        self.counter.add(self.axis, "reduce_scatter", group.size(), tensor_bytes(input_tensor))
        return super().__call__(output_tensor, input_tensor, group, op, async_op)


def count_fsdp(module: FSDPModule, counter: ByteCounter, replicate_group=None) -> None:
    """Count one fully_shard'ed module's gathers and reduce-scatters on "dp_shard" and, for HSDP
    (`replicate_group` given), its gradient all-reduce over the replicas on "dp_replicate"."""
    module.set_custom_all_gather(CountingAllGather(counter, "dp_shard"))
    module.set_custom_reduce_scatter(CountingReduceScatter(counter, "dp_shard"))
    if replicate_group is not None:
        size = dist.get_world_size(replicate_group)
        module.set_all_reduce_hook(
            lambda reduced: counter.add("dp_replicate", "all_reduce", size, tensor_bytes(reduced))
        )

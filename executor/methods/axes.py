"""What an executor method module provides, one Protocol per axis of meshplan/dp_methods.py: the
contract data_parallel.py, parallelize.py, check.py and the profiler call, checked by mypy (the
registry, executor/methods/__init__.py, types each axis' table by its Protocol, and a module is
its own implementation). Every module of an axis gives every member: where a method has nothing
to do, its member says so (a hook of None, the optimizer class unchanged, a check that passes),
so the callers never ask a module what it has.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch import nn

from meshplan.comm_bytes import ByteCounter
from meshplan.executor.methods.allreduce import ReplicaGradReducer
from meshplan.executor.methods.compressed import Codec
from meshplan.executor.methods.sync import SyncMethod

CommHook = tuple[Any, Callable[..., Any]]
"""(state, hook) for DDP.register_comm_hook."""


class Compression(Protocol):
    """compression=NAME: how the gradients travel (allreduce.py, fp16.py, powersgd.py, the codecs)."""

    def comm_hook(self, group: Any, params: dict, counter: ByteCounter, axis: str) -> CommHook:
        """DDP's comm hook, counting what it sends into `counter` on mesh `axis`."""
        ...

    def replica_reducer(
        self,
        params: list[nn.Parameter],
        group: Any,
        *,
        counter: ByteCounter,
        axis: str,
        bucket_bytes: int,
        method_params: dict,
    ) -> ReplicaGradReducer:
        """The reducer of tensor-parallel replicas and split-backward schedules, where DDP cannot
        run: one bucketed exchange of the local shards after backward."""
        ...

    def check_optimizer(self, params: dict, optimizer: str) -> None:
        """Raise MeshplanError for a run optimizer the method cannot sit under."""
        ...

    def optimizer_kwargs(self, params: dict, optimizer: str, kwargs: dict) -> dict:
        """The run optimizer's keyword arguments under this method."""
        ...

    @property
    def TIMED_CODEC(self) -> type[Codec] | None:
        """The codec `meshplan profile` times for this method (executor/methods/codecs.py), or
        None: nothing to time (the plain all-reduce)."""
        ...


class Sync(Protocol):
    """sync=NAME: how the replicas agree (allreduce.py: DDP itself; sync_*.py)."""

    @property
    def USES_DDP(self) -> bool:
        """The replicas are wrapped in DDP (False: the method exchanges them itself)."""
        ...

    def ddp_comm_hook(self, group: Any, params: dict, counter: ByteCounter, axis: str) -> CommHook | None:
        """The comm hook the method registers on DDP in place of the compression's, or None."""
        ...

    def build(self, par: Any, params: dict, counter: ByteCounter) -> SyncMethod | None:
        """The SyncMethod whose train_step replaces train.py's (sync.py), or None: train.py's."""
        ...


class CommSchedule(Protocol):
    """comm_schedule=NAME: when the gradients are sent (buckets.py, bytescheduler.py)."""

    def wrap(self, part: nn.Module, group: Any, params: dict, counter: ByteCounter) -> nn.Module | None:
        """The module that replaces DDP's reducer, or None: DDP, in buckets of `bucket_bytes`."""
        ...

    def bucket_bytes(self, params: dict) -> int:
        """DDP's bucket (its bucket_cap_mb, in bytes) and the replica reducer's."""
        ...


class Offload(Protocol):
    """offload=NAME: where the training states live (device.py, offload_cpu.py, offload_nvme.py)."""

    def fsdp_kwargs(self, params: dict, device: torch.device, zero: int = 3) -> dict:
        """Extra keyword arguments of fully_shard (ZeRO-2/3)."""
        ...

    def shard_device(self, params: dict, device: torch.device, zero: int = 3) -> torch.device:
        """The device the parameter shards are materialised on."""
        ...

    def optimizer_class(
        self, cls: type, params: dict, *, zero: int, counter: ByteCounter, folder: str, optimizer: str
    ) -> type:
        """The torch optimizer class this rank builds (`cls`, or a host-stepping one)."""
        ...

    def check(self, params: dict, zero: int, checkpoint_every: int = 0) -> None:
        """Raise MeshplanError for what the method cannot run with."""
        ...

    def prepare_part(self, part: nn.Module, params: dict, *, zero: int, counter: ByteCounter, folder: str) -> None:
        """Move what the method keeps off the device out of `part` before the optimizer is built."""
        ...


class Waves(Protocol):
    """waves=NAME: nothing to apply inside one job (executor/waves.py launches a plan's waves)."""

"""What a data-parallel method's cost object provides, one Protocol per axis of
meshplan/dp_methods.py: the contract rank/dp_cost.py's DataParallelCost calls, checked by mypy
(each registry's factory returns its axis' Protocol). A new method is a class that satisfies its
axis' Protocol, registered in that axis' table (compressors.py COMPRESSORS, sync.py SYNCS,
comm_schedule.py SCHEDULES, offload.py's costs); waves is priced on a rank's timeline
(rank/waves.py) and has no cost object.
"""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Protocol

from meshplan.model_profile import LayerProfile
from meshplan.planner.context import Context


class CompressionCost(Protocol):
    """A gradient compressor (methods/compression.py, methods/compression_quant.py)."""

    name: str
    collective: str
    """How the payload is exchanged: "all_reduce" (summable) or "all_gather" (per-rank payloads)."""
    group: int
    """Ranks exchanging (DataParallelCost sets it)."""
    banded: bool
    """The bytes vary between steps (Accordion): priced as a band as well."""
    rounds: int
    """Collectives one after another per step (PowerSGD's P then Q: 2); each beyond the first
    adds a latency."""

    def payload_bytes(self, layer: LayerProfile, split: int) -> float:
        """Bytes one rank contributes per step for this layer's tensor-parallel shard."""
        ...

    def state_bytes(self, layer: LayerProfile, split: int) -> float:
        """Bytes the compressor keeps between steps on each rank."""
        ...

    def compute_s(self, ctx: Context, layer: LayerProfile, split: int) -> float:
        """Compression and decompression seconds per step and rank."""
        ...


class SyncCost(Protocol):
    """A replica-synchronisation method (methods/sync.py)."""

    name: str
    replaces_ddp: bool
    """True: its own exchange (sync_s, bytes) replaces DDP's bucketed all-reduce, which
    DataParallelCost prices itself for the methods that keep it."""
    ddp_buckets: bool
    """DDP's buckets (a second fp32 copy of the gradients) are allocated."""

    def state_bytes(self, local: float) -> float:
        """Extra bytes per layer of `local` parameters (copies, buffers) on each rank."""
        ...

    def extra_compute_s(self, layer: LayerProfile, split: int, b: int, m: int) -> float: ...

    def sync_s(self, params: float, backward_window_s: float) -> float:
        """Exposed seconds per step of the exchange of `params` parameters."""
        ...

    def bytes(self, params: int) -> Fraction:
        """Bytes one rank sends per step for `params` parameters."""
        ...


class ScheduleCost(Protocol):
    """A communication schedule of DDP's gradient exchange (methods/comm_schedule.py)."""

    name: str
    replaces_ddp: bool
    ddp_buckets: bool

    def sync_s(self, local_params: float, backward_window_s: float) -> float:
        """Exposed seconds per step of the gradients' exchange."""
        ...


class OffloadCost(Protocol):
    """Where the training states live and what moving them costs (methods/offload.py)."""

    host_step: bool
    """The optimizer step runs on the host (the device's layer optimizer step is not paid)."""

    def state_bytes(self, local: float, weights: float, grads: float, optim: float) -> tuple[float, float, float]:
        """(weights, grads, optimizer) bytes left on the device."""
        ...

    def per_microbatch_s(self, local: float) -> float: ...

    def step_s(self, local_params: float, backward_window_s: float) -> float: ...

    def bytes_per_step(self, local_elems: float, paged_elems: float = 0.0) -> Mapping[str, float | Fraction]:
        """Bytes per step by link (host_device, nvme)."""
        ...

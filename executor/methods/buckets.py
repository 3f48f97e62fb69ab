"""comm_schedule=buckets: gradients all-reduced in fixed-size buckets as backward produces them.

`bucket_mb` is DDP's bucket_cap_mb (DDP's first bucket stays at torch's 1 MiB,
dist._DEFAULT_FIRST_BUCKET_BYTES) and the ReplicaGradReducer's bucket size for TP replicas.
Bucketing changes when bytes are sent, not how many.
"""

from __future__ import annotations

from torch import nn

from meshplan.comm_bytes import ByteCounter


def wrap(part: nn.Module, group, params: dict, counter: ByteCounter) -> None:
    """Nothing replaces DDP: its reducer sends the buckets."""
    return None


def bucket_bytes(params: dict) -> int:
    return params["bucket_mb"] * 2**20

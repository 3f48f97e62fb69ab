"""The local shard of a tensor: shared by the gradient reducers, the host optimizer, the NVMe
store and the tied-weight sync, below all of them in the executor's imports."""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor


def local_shard(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local tensor (sharing storage); any other tensor as it is."""
    return t._local_tensor if isinstance(t, DTensor) else t

"""offload=cpu: FSDP2 CPUOffloadPolicy (ZeRO-3 only): the sharded parameters, gradients and the
optimizer step live on the host; each gather copies the shard to the device first.

Pinned host memory needs an accelerator (torch-gloo.md 3c), so it is pinned only on CUDA. The
shards are materialised on the host (torchtitan does the same). The data-parallel collectives and
their bytes are FSDP2's, unchanged.
"""
from __future__ import annotations

import torch
from torch.distributed.fsdp import CPUOffloadPolicy


def fsdp_kwargs(params: dict, device: torch.device) -> dict:
    return {"offload_policy": CPUOffloadPolicy(pin_memory=device.type == "cuda")}


def shard_device(params: dict, device: torch.device) -> torch.device:
    return torch.device("cpu")

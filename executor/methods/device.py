"""offload=none and waves=1: nothing to apply (states stay on the training device; one wave of
training per device). Kept as a module so every registry row has its executor module."""

from __future__ import annotations

import torch


def fsdp_kwargs(params: dict, device: torch.device, zero: int = 3) -> dict:
    return {}


def shard_device(params: dict, device: torch.device, zero: int = 3) -> torch.device:
    return device

"""offload=none and waves=1: nothing to apply (states stay on the training device; one wave of
training per device). Kept as a module so every registry row has its executor module."""

from __future__ import annotations

import torch
from torch import nn

from meshplan.comm_bytes import ByteCounter


def fsdp_kwargs(params: dict, device: torch.device, zero: int = 3) -> dict:
    return {}


def shard_device(params: dict, device: torch.device, zero: int = 3) -> torch.device:
    return device


def optimizer_class(cls: type, params: dict, *, zero: int, counter: ByteCounter, folder: str, optimizer: str) -> type:
    """The run's optimizer steps on the training device."""
    return cls


def check(params: dict, zero: int, checkpoint_every: int = 0) -> None:
    """Runs with every ZeRO stage and checkpoint setting."""


def prepare_part(part: nn.Module, params: dict, *, zero: int, counter: ByteCounter, folder: str) -> None:
    """Nothing leaves the device."""

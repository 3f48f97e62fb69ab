"""The optimizers the executor builds by name: one spec, shared by the data-parallel wrappers
(data_parallel.py), the sync methods that keep optimizers of their own (sync_crossbow.py), the
single-process reference (reference.py) and the profiler (wrappers.py)."""

from __future__ import annotations

import torch
from torch import nn


def make_optimizer(params: list[nn.Parameter], name: str, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    cls, kwargs = optimizer_spec(name, lr, weight_decay)
    return cls(params, **kwargs)


def optimizer_spec(name: str, lr: float, weight_decay: float) -> tuple[type[torch.optim.Optimizer], dict]:
    if name == "sgd":  # with momentum, so checkpoints and ZeRO-1 carry optimizer state
        return torch.optim.SGD, {"lr": lr, "momentum": 0.9}
    assert name == "adamw", name
    return torch.optim.AdamW, {"lr": lr, "weight_decay": weight_decay, "betas": (0.9, 0.95)}

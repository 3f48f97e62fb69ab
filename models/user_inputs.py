"""Dict inputs and raw model outputs of user factories, carried through the executor as tensors.

A factory's example batch may be a dict of tensors (`{"input_ids": ..., "attention_mask": ...,
"labels": ...}`, batch in dim 0), called as `module(**batch)`. Every step of meshplan (data-
parallel slices, microbatch chunks, pipeline sends) cuts tensors along dim 0, so the dict is
packed into one float64 (B, F) tensor, each entry flattened per sample (exact for integer ids
below 2**53 and for float32 values), and `DictInputs` unpacks it before calling the module.
Outputs: a tensor as is; a transformers ModelOutput gives its `loss` when the batch carried
labels (the model's own loss, meaned by meshplan over microbatches), else its `logits`.
"""

from __future__ import annotations

import math

import torch
from torch import nn

PACK_DTYPE = torch.float64


def pack(batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[tuple[str, tuple[int, ...], torch.dtype]]]:
    """(B, F) float64 tensor and the layout [(key, per-sample shape, dtype)] to unpack it."""
    layout = [(k, tuple(v.shape[1:]), v.dtype) for k, v in batch.items()]
    flat = [v.reshape(v.shape[0], -1).to(PACK_DTYPE) for v in batch.values()]
    return torch.cat(flat, dim=1), layout


def unpack(x: torch.Tensor, layout) -> dict[str, torch.Tensor]:
    out, start = {}, 0
    for key, shape, dtype in layout:
        n = math.prod(shape)
        out[key] = x[:, start : start + n].reshape(x.shape[0], *shape).to(dtype)
        start += n
    return out


def model_output(out) -> torch.Tensor:
    """The tensor a user module's output stands for: itself, .loss (when computed) or .logits."""
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, dict) and not hasattr(out, "logits"):  # a plain dict: {"loss": ..., "logits": ...}
        for key in ("loss", "logits"):
            if isinstance(out.get(key), torch.Tensor):
                return out[key]
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor):
        return loss
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    raise TypeError(
        f"the model returned {type(out).__name__}; return a tensor, a dict with a 'loss' or 'logits' tensor, "
        "or an object with .loss or .logits"
    )


class DictInputs(nn.Module):
    """`module(**unpack(x))` -> a tensor (see the module docstring)."""

    def __init__(self, module: nn.Module, layout):
        super().__init__()
        self.module = module
        self.layout = layout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return model_output(self.module(**unpack(x, self.layout)))


class OutputTensor(nn.Module):
    """A module whose output is not a tensor (a ModelOutput): its loss or logits."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return model_output(self.module(x))

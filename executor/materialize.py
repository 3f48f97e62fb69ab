"""Materialise a (meta) stage so that every plan starts from the single-process model's weights.

After pipeline splitting, TP and FSDP2 have rewritten the parameters (DTensors with Shard,
_StridedShard or Replicate placements), the stage is allocated with `to_empty` and each
parameter's local shard is cut from its full initial value: `init_tensor(fqn, shape, seed)`
(models/zoo/base.py, a pure function of FQN and shape), or the user's own weights and buffers
when `apply` was handed a real model (`models.identity.full_state`: every FQN, non-persistent
buffers such as RoPE's inv_freq included, as the model's own code initialised them). Cutting uses `distribute_tensor(..., src_data_rank=None)`:
every rank slices its shard locally, with no communication.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from meshplan.models.zoo.base import init_tensor


@dataclass(frozen=True)
class FullValue:
    """Where each parameter's and buffer's full (unsharded) initial value comes from."""

    value: Callable[[str, torch.Size, torch.dtype], torch.Tensor]
    """(fqn, shape, dtype) -> the full tensor."""
    state: dict[str, torch.Tensor] = field(default_factory=dict)
    """A real model's state dict, if the values come from one: its buffers are then copied as
    they are (running stats included)."""

    def __call__(self, fqn: str, shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
        return self.value(fqn, shape, dtype)


def init_source(seed: int) -> FullValue:
    """Full initial values from the zoo's init rule."""
    return FullValue(value=lambda fqn, shape, dtype: init_tensor(fqn, shape, seed, dtype))


def state_source(state: dict[str, torch.Tensor]) -> FullValue:
    """Full initial values from a real model's state dict (apply() on a materialised model)."""
    return FullValue(value=lambda fqn, shape, dtype: state[fqn].to(dtype), state=state)


def clean_fqn(fqn: str) -> str:
    """Strip wrapper prefixes (DDP's leading "module.", checkpoint and compile wrappers) to the
    model's FQN; a model's own submodule named "module" keeps its name."""
    fqn = fqn.removeprefix("module.")
    for prefix in ("_checkpoint_wrapped_module.", "_orig_mod."):
        fqn = fqn.replace(prefix, "")
    return fqn


@torch.no_grad()
def materialize(part: nn.Module, device: torch.device, full_value: FullValue) -> None:
    """Allocate `part` on `device` and fill parameters (and buffers) from `full_value`."""
    if any(p.is_meta for p in part.parameters()) or any(b.is_meta for b in part.buffers()):
        part.to_empty(device=device)
    for fqn, param in part.named_parameters():
        _fill(param, full_value(clean_fqn(fqn), param.shape, param.dtype))
    for fqn, buf in part.named_buffers():
        _fill_buffer(clean_fqn(fqn), buf, full_value)


def _fill(param: torch.Tensor, full: torch.Tensor) -> None:
    if isinstance(param, DTensor):
        shard = distribute_tensor(full, param.device_mesh, param.placements, src_data_rank=None)
        param.to_local().copy_(shard.to_local())
    else:
        param.copy_(full)


def _fill_buffer(fqn: str, buf: torch.Tensor, full_value: FullValue) -> None:
    if fqn in full_value.state:
        _fill(buf, full_value(fqn, buf.shape, buf.dtype))
    elif fqn.endswith("running_var"):
        buf.fill_(1.0)
    elif fqn.endswith(("running_mean", "num_batches_tracked")):
        buf.zero_()
    else:
        try:
            _fill(buf, full_value(fqn, buf.shape, buf.dtype))
        except KeyError:
            raise AssertionError(f"buffer {fqn} has no initial value; give the model an init rule") from None

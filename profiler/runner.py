"""Run one real layer forward and backward: materialise it, make its input, time or trace it.

Shared by the timing loop (timing.py) and the busy worker processes (concurrency.py), so the
extra ranks run exactly the code being timed.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from meshplan.models.zoo.base import LayeredModel, init_tensor


@dataclass(frozen=True)
class InputSpec:
    """A layer's input for one sample: shape with batch dim 1, dtype name, first layer or not."""

    shape: tuple[int, ...]
    dtype: str
    first: bool
    parts: tuple[tuple[tuple[int, ...], str], ...] = ()
    """(shape, dtype) of each input when the layer takes several (the tensors crossing a cut of
    a model split from its fx graph, models/fx_layers.py); `shape`/`dtype` are then the first's."""


def run_dtype(device: str) -> torch.dtype:
    """Timing precision: bf16 on CUDA (training precision), float32 on CPU (what CPU runs use)."""
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


@torch.no_grad()
def materialise_layer(model: LayeredModel, fqn: str, device: str, seed: int = 0) -> nn.Module:
    """A real copy of layer `fqn` on `device` in the run dtype (zoo init rule for meta weights)."""
    source = model.get_submodule(fqn)
    layer = copy.deepcopy(source)
    if any(t.is_meta for t in list(layer.parameters()) + list(layer.buffers())):
        layer = layer.to_empty(device=device)
        for name, param in layer.named_parameters():
            param.copy_(init_tensor(f"{fqn}.{name}", param.shape, seed, param.dtype))
    dtype = run_dtype(device)
    return layer.to(device=device, dtype=dtype).train()


def make_input(model: LayeredModel, spec: InputSpec, batch: int, device: str, seed: int = 0):
    """A real input for `batch` samples: the model's example batch for the first layer, else noise
    (a tuple of them for a layer taking several tensors)."""
    if spec.parts:
        return tuple(
            make_input(model, InputSpec(shape, dtype, False), batch, device, seed + i)
            for i, (shape, dtype) in enumerate(spec.parts)
        )
    gen = torch.Generator().manual_seed(seed)
    if spec.first:
        x = model.example_batch(batch, gen)[0]
    elif spec.dtype.startswith("torch.float") or spec.dtype == "torch.bfloat16":
        x = torch.randn((batch, *spec.shape[1:]), generator=gen)
    else:
        x = torch.zeros((batch, *spec.shape[1:]), dtype=getattr(torch, spec.dtype.removeprefix("torch.")))
    x = x.to(device)
    if x.is_floating_point():
        x = x.to(run_dtype(device)).requires_grad_()
    return x


def forward_backward(layer: nn.Module, x: torch.Tensor) -> None:
    """One training step's worth of work for the layer (output gradient of ones)."""
    for p in layer.parameters():
        p.grad = None
    backward_ones(call(layer, x))


def call(layer: nn.Module, x):
    """The layer on its input: one tensor, or the tuple of tensors crossing its cut."""
    return layer(*x) if isinstance(x, tuple) else layer(x)


def backward_ones(y) -> None:
    """Backward from every output needing a gradient, each with a gradient of ones."""
    outs = [t for t in (y if isinstance(y, tuple) else (y,)) if t.requires_grad]
    if outs:
        torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])


def clear_grad(x) -> None:
    for t in x if isinstance(x, tuple) else (x,):
        t.grad = None


def nbytes(x) -> int:
    return sum(t.numel() * t.element_size() for t in (x if isinstance(x, tuple) else (x,)))

"""What a model *is*, independent of how it is run: its unique parameters, its tied weights, its
full state and a hash of its structure.

- `tied_groups`: parameters reachable under several FQNs (an LM head sharing the embedding's
  weight, T5/BART's shared embedding). `nn.Module.to("meta")` and `to_empty` untie them (each
  owning module gets a new Parameter), so the executor records the groups before it touches the
  model and keeps the copies equal (executor/tied.py); the profile counts each group once.
- `full_state`: every parameter and buffer under every FQN it has, non-persistent buffers
  included (RoPE `inv_freq`, BERT `position_ids`): what the model's own code initialised, which
  `state_dict()` leaves out.
- `structure_hash`: sha256 over module classes, parameter/buffer FQNs, shapes, dtypes and the
  tied groups; the plan carries it, so `meshplan run` refuses to train a model other than the
  profiled one.
"""

from __future__ import annotations

import hashlib
from typing import TypeVar

import torch
from torch import nn

M = TypeVar("M", bound=nn.Module)


def tied_groups(model: nn.Module) -> list[list[str]]:
    """FQN lists (execution order of registration) of parameters that appear more than once."""
    by_id: dict[int, list[str]] = {}
    for fqn, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(fqn)
    return [names for names in by_id.values() if len(names) > 1]


def unique_parameters(model: nn.Module) -> list[nn.Parameter]:
    """Each parameter once (tied ones included once), in registration order."""
    return list(model.parameters())  # nn.Module.parameters() removes duplicates


def num_params(model: nn.Module, trainable: bool | None = None) -> int:
    """Unique parameter count; trainable=True/False counts only those with/without requires_grad."""
    return sum(p.numel() for p in unique_parameters(model) if trainable is None or p.requires_grad == trainable)


@torch.no_grad()
def full_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and buffer by every FQN (shared modules and tied weights under each name,
    non-persistent buffers too), detached copies on the CPU."""
    state = {fqn: p.detach().cpu().clone() for fqn, p in model.named_parameters(remove_duplicate=False)}
    for fqn, b in model.named_buffers(remove_duplicate=False):
        state[fqn] = b.detach().cpu().clone()
    return state


def retie(model: M, groups: list[list[str]]) -> M:
    """Make every FQN of each group point at the first one's Parameter again (after .to())."""
    for names in groups:
        owner = model.get_parameter(names[0])
        for fqn in names[1:]:
            module_name, _, leaf = fqn.rpartition(".")
            setattr(model.get_submodule(module_name), leaf, owner)
    return model


def structure_hash(model: nn.Module) -> str:
    """16 hex digits of sha256 over classes, tensor FQNs/shapes/dtypes/requires_grad and ties."""
    h = hashlib.sha256()
    for fqn, module in model.named_modules(remove_duplicate=False):
        h.update(f"m {fqn} {type(module).__qualname__}\n".encode())
    for fqn, p in model.named_parameters(remove_duplicate=False):
        h.update(f"p {fqn} {tuple(p.shape)} {p.dtype} {p.requires_grad}\n".encode())
    for fqn, b in model.named_buffers(remove_duplicate=False):
        h.update(f"b {fqn} {tuple(b.shape)} {b.dtype}\n".encode())
    for names in tied_groups(model):
        h.update(f"t {' '.join(names)}\n".encode())
    return h.hexdigest()[:16]

"""The layered-model convention every zoo model follows (and user models are wrapped into).

A model's children run in a fixed order: `embed`, then `layers` (an nn.ModuleDict keyed "0",
"1", ...), then `head`. These are the profile's layers and the units of pipeline stages: a stage
keeps a contiguous subset and sets the rest to None / drops them from `layers` (torchtitan's
pattern), so module FQNs never change between the whole model and its stages.

Weights are a pure function of (seed, parameter FQN, shape): `init_weights` gives every plan,
however it shards or splits the model, the same starting weights as the single-process model.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn

from meshplan.model_profile import ModelArchitecture

Output = torch.Tensor | tuple[torch.Tensor, ...]
"""What a model or a pipeline stage of it returns: a tensor, or the tensors crossing a cut of a
user model's fx graph when a stage ends there (models/user_models.py)."""


class LayeredModel(nn.Module):
    """embed -> layers.0 .. layers.L-1 -> head; any part may be absent on a pipeline stage."""

    family = "layered"

    def __init__(self, embed: nn.Module | None, layers: Sequence[nn.Module], head: nn.Module | None):
        super().__init__()
        self.embed = embed
        self.layers = nn.ModuleDict({str(i): layer for i, layer in enumerate(layers)})
        self.head = head
        self.warnings: list[str] = []
        """What the profile's notes and stderr must say about this model (unused parameters)."""
        self.notes: list[str] = []
        """How the model was taken (attention implementation, why it is one layer): profile notes."""

    def forward(self, x: torch.Tensor) -> Output:
        if self.embed is not None:
            x = self.embed(x)
        for layer in self.layers.values():
            x = layer(x)
        if self.head is not None:
            x = self.head(x)
        return x

    def architecture(self) -> ModelArchitecture | None:
        """The decoder's architecture beyond its shape (ModelProfile.architecture); None when the model is
        not a decoder meshplan can name."""
        return None

    def layer_names(self) -> list[str]:
        """Layer FQNs in execution order (the profile's nodes, the plan's stage units)."""
        names = ["embed"] if self.embed is not None else []
        names += [f"layers.{k}" for k in self.layers.keys()]
        return names + (["head"] if self.head is not None else [])

    def graph_edges(self) -> list[tuple[int, int, str, int]]:
        """(producer, consumer, value, position) of tensors crossing the cuts between layers other
        than the one each layer hands the next: [] for a chain (a user model's fx cuts may have some)."""
        return []

    def layer(self, fqn: str) -> nn.Module:
        return self.get_submodule(fqn)

    def loss(self, output: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
        """Mean cross-entropy; output (B, T, V) or (B, C), target (B, T) or (B,). None is the
        target of a batch without targets, which only a user model's batches may be."""
        assert target is not None, f"{type(self).__name__} trains on targets"
        return nn.functional.cross_entropy(output.flatten(0, -2), target.flatten())

    def example_batch(
        self, batch_size: int, generator: torch.Generator | None = None, device: str | torch.device = "cpu"
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Synthetic seeded (inputs, targets) for `batch_size` samples."""
        raise NotImplementedError

    @property
    def seq_len(self) -> int:
        return 1


class LMShape(Protocol):
    """What a causal LM's config holds for its batches: sequence length and vocabulary size."""

    seq: int
    vocab: int


class CausalLM(LayeredModel):
    """A next-token language model: `config` has `seq` and `vocab`; batches are random tokens."""

    config: LMShape

    @property
    def seq_len(self) -> int:
        return self.config.seq

    def example_batch(self, batch_size, generator=None, device="cpu"):
        tokens = torch.randint(0, self.config.vocab, (batch_size, self.config.seq + 1), generator=generator)
        tokens = tokens.to(device)
        return tokens[:, :-1], tokens[:, 1:]  # inputs (B, T), next-token targets (B, T)


def _seed_for(seed: int, fqn: str) -> int:
    digest = hashlib.sha256(f"{seed}:{fqn}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def init_tensor(
    fqn: str, shape: torch.Size | tuple[int, ...], seed: int = 0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """The initial value of parameter `fqn`: a function of (seed, fqn, shape) only.

    Norm weights are 1, biases 0, everything else N(0, 0.02) (GPT-2's init).
    """
    leaf = fqn.rsplit(".", 1)[-1]
    owner = fqn.rsplit(".", 2)[-2] if fqn.count(".") >= 1 else ""
    if leaf == "bias" or leaf.endswith("_bias"):
        return torch.zeros(shape, dtype=dtype)
    if "norm" in owner or owner.startswith("ln") or owner.startswith("bn"):
        return torch.ones(shape, dtype=dtype)
    gen = torch.Generator().manual_seed(_seed_for(seed, fqn))
    return (torch.randn(shape, generator=gen) * 0.02).to(dtype)


@torch.no_grad()
def init_weights(model: nn.Module, seed: int = 0) -> nn.Module:
    """Fill every parameter and buffer of a (materialised, unsharded) model from `init_tensor`."""
    for fqn, param in model.named_parameters():
        param.copy_(init_tensor(fqn, param.shape, seed, param.dtype))
    for fqn, buf in model.named_buffers():
        if buf.is_floating_point() and fqn.endswith("running_var"):
            buf.fill_(1.0)
        elif buf.is_floating_point() and fqn.endswith("running_mean"):
            buf.zero_()
    return model

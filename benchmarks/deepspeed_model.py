"""The small model benchmarks/deepspeed_bytes.py trains under real DeepSpeed and meshplan prices
through `--model benchmarks/deepspeed_model.py:build`: torch only (the DeepSpeed side runs in the
export tools' venv, where meshplan is not installed). An embedding, `layers` pre-norm residual MLP
blocks, a final norm and an untied head, as an nn.Sequential (meshplan's layers are its children)."""

from __future__ import annotations

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.norm = nn.LayerNorm(hidden)
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm(x))))


def build(layers: int = 4, hidden: int = 256, vocab: int = 512, seq: int = 32, batch: int = 4, device: str = "cpu"):
    """(module, (tokens, next tokens)): a learnable synthetic batch, the same on every rank and call."""
    with torch.device(device):
        blocks = [Block(hidden) for _ in range(layers)]
        model = nn.Sequential(
            nn.Embedding(vocab, hidden), *blocks, nn.LayerNorm(hidden), nn.Linear(hidden, vocab, bias=False)
        )
    tokens = torch.randint(vocab, (batch, seq), generator=torch.Generator().manual_seed(0))
    return model, (tokens, torch.roll(tokens, -1, dims=1))

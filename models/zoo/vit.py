"""Vision Transformer (Dosovitskiy et al. 2021): patch embedding, CLS token, pre-LN encoder blocks.

Shapes from the paper's Table 1: ViT-B/16 (12 layers, 768, 12 heads, MLP 3072, 86M), ViT-L/16
(24, 1024, 16, 4096, 304M), ViT-H/14 (32, 1280, 16, 5120, 632M), 224x224 images. The encoder
block is the GPT block with bidirectional attention; no dropout. seq = (image/patch)^2 + 1.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from meshplan.model_profile import TPRule
from meshplan.models.zoo.base import LayeredModel
from meshplan.models.zoo.gpt import Block, GPTConfig


@dataclass(kw_only=True)
class ViTConfig:
    layers: int = 12
    hidden: int = 768
    heads: int = 12
    ffn_hidden: int = 0
    """MLP width; 0 means 4 x hidden."""
    image: int = 224
    patch: int = 16
    channels: int = 3
    classes: int = 1000

    def __post_init__(self):
        if not self.ffn_hidden:
            self.ffn_hidden = 4 * self.hidden
        if self.image % self.patch:
            raise ValueError(f"image={self.image} must be a multiple of patch={self.patch}")

    @property
    def seq(self) -> int:
        return (self.image // self.patch) ** 2 + 1


class PatchEmbedding(nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.conv = nn.Conv2d(cfg.channels, cfg.hidden, cfg.patch, stride=cfg.patch)
        self.cls = nn.Parameter(torch.empty(1, 1, cfg.hidden))
        self.pos = nn.Parameter(torch.empty(1, cfg.seq, cfg.hidden))

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.conv(images).flatten(2).transpose(1, 2)  # (B, T-1, h)
        return torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos  # (B, T, h)


class ClassifierHead(nn.Module):
    def __init__(self, cfg: ViTConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x[:, 0]))  # CLS token -> (B, classes)


class ViT(LayeredModel):
    family = "vit"

    def __init__(self, cfg: ViTConfig):
        block_cfg = GPTConfig(
            layers=cfg.layers, hidden=cfg.hidden, heads=cfg.heads, vocab=1, seq=cfg.seq, ffn_hidden=cfg.ffn_hidden
        )
        blocks: list[nn.Module] = [Block(block_cfg, causal=False) for _ in range(cfg.layers)]
        super().__init__(PatchEmbedding(cfg), blocks, ClassifierHead(cfg))
        self.config = cfg

    @property
    def seq_len(self) -> int:
        return self.config.seq

    def example_batch(self, batch_size, generator=None, device="cpu"):
        cfg = self.config
        images = torch.randn(batch_size, cfg.channels, cfg.image, cfg.image, generator=generator)
        labels = torch.randint(0, cfg.classes, (batch_size,), generator=generator)
        return images.to(device), labels.to(device)


TP_RULES = {
    # the patch embedding and the classifier are small: kept whole (blocks use the GPT rule)
    PatchEmbedding: lambda m: TPRule(kind="none"),
    ClassifierHead: lambda m: TPRule(kind="none"),
}
"""TP rules by layer class, read by meshplan.models.tp_rules."""

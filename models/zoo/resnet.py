"""ResNet-style CNN (He et al. 2016, bottleneck blocks) so the tool is not transformer-only.

ResNet-50: stem (7x7/2 conv, 3x3/2 max-pool), bottleneck stages of (3, 4, 6, 3) blocks with widths
64..512 (x4 expansion), global average pool and a linear classifier: 25.56M parameters.
Normalisation is GroupNorm (Wu & He 2018) instead of BatchNorm, with the same parameter count:
per-sample statistics keep the result independent of how a batch is split across ranks and
microbatches (loss equality), and there are no running buffers to synchronise. Each block is a
layer; blocks at a stage's start (stride/width change) have their own shapes and are profiled
separately, the rest reuse them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from meshplan.models.zoo.base import LayeredModel


@dataclass(kw_only=True)
class ResNetConfig:
    blocks: str = "3,4,6,3"
    """Bottleneck blocks per stage, comma-separated."""
    width: int = 64
    """Bottleneck width of the first stage (doubles per stage; outputs are 4x)."""
    image: int = 224
    classes: int = 1000
    groups: int = 32
    """GroupNorm groups (reduced to divide small widths)."""

    @property
    def stage_blocks(self) -> list[int]:
        return [int(n) for n in str(self.blocks).split(",")]


def _norm(channels: int, groups: int) -> nn.GroupNorm:
    g = groups
    while channels % g:
        g //= 2
    return nn.GroupNorm(g, channels)


class Stem(nn.Module):
    def __init__(self, cfg: ResNetConfig):
        super().__init__()
        self.conv = nn.Conv2d(3, cfg.width, 7, stride=2, padding=3, bias=False)
        self.norm = _norm(cfg.width, cfg.groups)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(F.relu(self.norm(self.conv(images))), 3, stride=2, padding=1)


class Bottleneck(nn.Module):
    def __init__(self, in_ch: int, width: int, stride: int, groups: int):
        super().__init__()
        out_ch = 4 * width
        self.conv1 = nn.Conv2d(in_ch, width, 1, bias=False)
        self.norm1 = _norm(width, groups)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.norm2 = _norm(width, groups)
        self.conv3 = nn.Conv2d(width, out_ch, 1, bias=False)
        self.norm3 = _norm(out_ch, groups)
        self.down_conv: nn.Conv2d | None = None
        self.down_norm: nn.Module | None = None
        if stride != 1 or in_ch != out_ch:
            self.down_conv = nn.Conv2d(in_ch, out_ch, 1, stride=stride, bias=False)
            self.down_norm = _norm(out_ch, groups)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.norm1(self.conv1(x)))
        y = F.relu(self.norm2(self.conv2(y)))
        y = self.norm3(self.conv3(y))
        skip = x if self.down_conv is None or self.down_norm is None else self.down_norm(self.down_conv(x))
        return F.relu(y + skip)


class PoolHead(nn.Module):
    def __init__(self, channels: int, classes: int):
        super().__init__()
        self.proj = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x.mean((2, 3)))  # global average pool -> (B, classes)


class ResNet(LayeredModel):
    family = "resnet"

    def __init__(self, cfg: ResNetConfig):
        blocks, in_ch = [], cfg.width
        for stage, count in enumerate(cfg.stage_blocks):
            width = cfg.width * 2**stage
            for i in range(count):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(Bottleneck(in_ch, width, stride, cfg.groups))
                in_ch = 4 * width
        super().__init__(Stem(cfg), blocks, PoolHead(in_ch, cfg.classes))
        self.config = cfg

    def example_batch(self, batch_size, generator=None, device="cpu"):
        cfg = self.config
        images = torch.randn(batch_size, 3, cfg.image, cfg.image, generator=generator)
        labels = torch.randint(0, cfg.classes, (batch_size,), generator=generator)
        return images.to(device), labels.to(device)


TP_RULES: dict = {}
"""Convolutions are not tensor-parallel here: every layer is kind "none" (replicated)."""

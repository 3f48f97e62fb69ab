"""BERT-style encoder (Devlin et al. 2019): post-LN blocks, bidirectional attention, MLM head.

Differences from the published model, on purpose: no dropout (deterministic loss equality), no
pooler/NSP head, and an untied MLM decoder (tying would join the first and last pipeline stage),
so bert-base counts 133M parameters rather than the published 110M. Training objective: masked-
token prediction on a fixed 15% of positions per sample (seeded), others ignored (-100).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from meshplan.model_profile import TPRule
from meshplan.models.zoo.base import LayeredModel
from meshplan.models.zoo.gpt import MLP, Attention, GPTConfig, block_rule

IGNORE_INDEX = -100


@dataclass(kw_only=True)
class BertConfig(GPTConfig):
    """GPT's shape keys (BERT-base defaults) plus the segment vocabulary and the masking rate."""

    vocab: int = 30522
    seq: int = 512
    type_vocab: int = 2
    mask_fraction: float = 0.15


class BertEmbedding(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq, cfg.hidden)
        self.typ = nn.Embedding(cfg.type_vocab, cfg.hidden)
        self.norm = nn.LayerNorm(cfg.hidden)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        types = torch.zeros_like(positions)  # single-segment inputs
        return self.norm(self.tok(idx) + self.pos(positions) + self.typ(types))  # (B, T, h)


class BertBlock(nn.Module):
    """Post-LN: x = LN(x + attn(x)); x = LN(x + mlp(x))."""

    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.attn = Attention(cfg.hidden, cfg.heads, causal=False)
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.mlp = MLP(cfg.hidden, cfg.ffn_hidden)
        self.ln2 = nn.LayerNorm(cfg.hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.ln1(x + self.attn(x))
        return self.ln2(x + self.mlp(x))


class MLMHead(nn.Module):
    def __init__(self, cfg: BertConfig):
        super().__init__()
        self.dense = nn.Linear(cfg.hidden, cfg.hidden)
        self.norm = nn.LayerNorm(cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(F.gelu(self.dense(x))))  # (B, T, V)


class Bert(LayeredModel):
    family = "bert"

    def __init__(self, cfg: BertConfig):
        super().__init__(BertEmbedding(cfg), [BertBlock(cfg) for _ in range(cfg.layers)], MLMHead(cfg))
        self.config = cfg

    @property
    def seq_len(self) -> int:
        return self.config.seq

    def example_batch(self, batch_size, generator=None, device="cpu"):
        cfg = self.config
        tokens = torch.randint(1, cfg.vocab, (batch_size, cfg.seq), generator=generator)
        masked = torch.rand(batch_size, cfg.seq, generator=generator) < cfg.mask_fraction
        masked[:, 0] = True  # at least one target per sample
        inputs = tokens.masked_fill(masked, 0)  # token 0 plays [MASK]
        targets = tokens.masked_fill(~masked, IGNORE_INDEX)
        return inputs.to(device), targets.to(device)

    def loss(self, output: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
        assert target is not None, "BERT trains on masked tokens"
        return F.cross_entropy(output.flatten(0, -2), target.flatten(), ignore_index=IGNORE_INDEX)


TP_RULES = {
    BertBlock: block_rule,  # same children as GPT's Block
    BertEmbedding: lambda m: TPRule(
        row=["tok"], replicated=["pos", "typ", "norm"], num_allreduce_fwd=1, kind="embedding"
    ),
    MLMHead: lambda m: TPRule(column=["proj"], replicated=["dense", "norm"], kind="head"),
}
"""TP rules by layer class, read by meshplan.models.tp_rules."""

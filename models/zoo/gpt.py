"""GPT (GPT-2 / GPT-3 shapes): learned positions, pre-LN blocks, GELU MLP, tied-free LM head.

Dropout is left out (p = 0 in every published large run's reproduction we compare against, and
it keeps loss-equality tests exact), so activation memory has no dropout-mask terms.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
from torch import nn
from torch.nn import functional as F

from meshplan.model_profile import ModelArchitecture, TPRule
from meshplan.models.analytic import gpt_architecture
from meshplan.models.zoo.base import CausalLM


@dataclass(kw_only=True)
class GPTConfig:
    layers: int = 12
    hidden: int = 768
    heads: int = 12
    vocab: int = 50257
    seq: int = 1024
    ffn_hidden: int = 0
    """MLP width; 0 means 4 x hidden."""

    def __post_init__(self):
        if not self.ffn_hidden:
            self.ffn_hidden = 4 * self.hidden


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, causal: bool = True):
        super().__init__()
        self.head_dim = hidden // heads
        self.causal = causal  # decoder (True) or bidirectional encoder (BERT, ViT)
        self.wq = nn.Linear(hidden, hidden)
        self.wk = nn.Linear(hidden, hidden)
        self.wv = nn.Linear(hidden, hidden)
        self.wo = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # local heads: under tensor parallelism wq/wk/wv hold heads/t heads each
        q = self.wq(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        k = self.wk(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        v = self.wv(x).view(B, T, -1, self.head_dim).transpose(1, 2)  # (B, nh, T, hs)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)  # (B, nh, T, hs)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))  # (B, T, h)


class MLP(nn.Module):
    def __init__(self, hidden: int, ffn_hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(hidden, ffn_hidden)
        self.fc2 = nn.Linear(ffn_hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class Block(nn.Module):
    """Pre-LN transformer block; `causal=False` makes it an encoder block (ViT)."""

    def __init__(self, cfg: GPTConfig, causal: bool = True):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = Attention(cfg.hidden, cfg.heads, causal)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.mlp = MLP(cfg.hidden, cfg.ffn_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Embedding(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)
        self.pos = nn.Embedding(cfg.seq, cfg.hidden)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        return self.tok(idx) + self.pos(positions)  # (B, T, h)


class Head(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.norm = nn.LayerNorm(cfg.hidden)
        self.proj = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))  # (B, T, V)


class GPT(CausalLM):
    family = "gpt"

    def __init__(self, cfg: GPTConfig):
        super().__init__(Embedding(cfg), [Block(cfg) for _ in range(cfg.layers)], Head(cfg))
        self.config = cfg

    def architecture(self) -> ModelArchitecture | None:
        cfg = self.config
        assert isinstance(cfg, GPTConfig)
        return gpt_architecture(cfg.heads, cfg.ffn_hidden)


class AttentionMLPBlock(Protocol):
    """A block built from this file's Attention and MLP (GPT's Block, BERT's BertBlock)."""

    attn: Attention
    mlp: MLP


def block_rule(block: AttentionMLPBlock) -> TPRule:
    """Shoeybi et al. 2019 §3: QKV and fc1 column-parallel, out-proj and fc2 row-parallel.
    Any block built from this file's Attention and MLP with norms ln1/ln2 (GPT, BERT)."""
    return TPRule(
        column=["attn.wq", "attn.wk", "attn.wv", "mlp.fc1"],
        row=["attn.wo", "mlp.fc2"],
        replicated=["ln1", "ln2"],
        divisors={"heads": block.attn.wq.out_features // block.attn.head_dim, "ffn": block.mlp.fc1.out_features},
        num_allreduce_fwd=2,
        kind="block",
    )


TP_RULES = {
    Block: block_rule,
    # vocab-parallel token embedding (torchtitan: RowwiseParallel on nn.Embedding) ends with one
    # all-reduce; DTensor allows uneven vocab splits, so the vocabulary is not a divisor
    Embedding: lambda m: TPRule(row=["tok"], replicated=["pos"], num_allreduce_fwd=1, kind="embedding"),
    # vocab-parallel logits (ColwiseParallel): no all-reduce, the loss runs on the shards
    Head: lambda m: TPRule(column=["proj"], replicated=["norm"], kind="head"),
}
"""TP rules by layer class, read by meshplan.models.tp_rules."""

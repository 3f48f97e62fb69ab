"""Llama-3-style decoder: RMSNorm, SwiGLU MLP, grouped-query attention, rotary embeddings.

Shapes from Meta's Llama 3 / 3.1 model cards (Dubey et al. 2024, Table 3): 8B (32 layers, 4096,
32 heads, 8 KV heads, FFN 14336), 70B (80, 8192, 64, 8, 28672), 405B (126, 16384, 128, 8, 53248),
vocabulary 128256, untied output projection, no biases. Parameters:
  P = 2Vh + L(2h^2 + 2h*kv*hd + 3hf + 2h) + h   (hd = h/heads)
which gives 8.03B / 70.55B / 405.85B. RoPE angles are computed in forward from the positions
(no buffers), so a meta-built model needs nothing beyond its parameters to materialise.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from meshplan.model_profile import ModelArchitecture, TPRule
from meshplan.models.analytic import llama_architecture
from meshplan.models.zoo.base import CausalLM


@dataclass(kw_only=True)
class LlamaConfig:
    layers: int = 32
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    """Key/value heads (grouped-query attention); heads must be a multiple."""
    vocab: int = 128256
    seq: int = 8192
    ffn_hidden: int = 14336
    rope_theta: float = 500000.0
    norm_eps: float = 1e-5

    def __post_init__(self):
        if min(self.heads, self.kv_heads) < 1:
            raise ValueError(f"heads={self.heads} and kv_heads={self.kv_heads} must be >= 1")
        if self.heads % self.kv_heads or self.hidden % self.heads:
            raise ValueError(
                f"heads={self.heads} must be a multiple of kv_heads={self.kv_heads} and divide hidden={self.hidden}"
            )


def rotary(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate pairs (x_i, x_{i+d/2}) by position * theta^(-2i/d) (Su et al. 2021; HF layout)."""
    T, d = x.shape[1], x.shape[-1]
    inv_freq = theta ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = torch.outer(torch.arange(T, device=x.device, dtype=torch.float32), inv_freq)  # (T, d/2)
    cos = torch.cat([angles.cos(), angles.cos()], -1)[None, :, None, :].to(x.dtype)  # (1, T, 1, d)
    sin = torch.cat([angles.sin(), angles.sin()], -1)[None, :, None, :].to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    return x * cos + torch.cat([-x2, x1], -1) * sin


class GQAttention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.head_dim = cfg.hidden // cfg.heads
        self.theta = cfg.rope_theta
        self.wq = nn.Linear(cfg.hidden, cfg.heads * self.head_dim, bias=False)
        self.wk = nn.Linear(cfg.hidden, cfg.kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(cfg.hidden, cfg.kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(cfg.heads * self.head_dim, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # local heads (-1): under tensor parallelism each rank holds heads/t and kv_heads/t
        q = rotary(self.wq(x).view(B, T, -1, self.head_dim), self.theta)  # (B, T, nh, hd)
        k = rotary(self.wk(x).view(B, T, -1, self.head_dim), self.theta)  # (B, T, nkv, hd)
        v = self.wv(x).view(B, T, -1, self.head_dim)  # (B, T, nkv, hd)
        n_rep = q.shape[2] // k.shape[2]
        k, v = k.repeat_interleave(n_rep, dim=2), v.repeat_interleave(n_rep, dim=2)  # (B, T, nh, hd)
        y = F.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
        )  # (B, nh, T, hd)
        return self.wo(y.transpose(1, 2).reshape(B, T, -1))  # (B, T, h)


class SwiGLU(nn.Module):
    """w2(silu(w1 x) * w3 x) (Shazeer 2020), the Llama MLP."""

    def __init__(self, hidden: int, ffn_hidden: int):
        super().__init__()
        self.w1 = nn.Linear(hidden, ffn_hidden, bias=False)
        self.w3 = nn.Linear(hidden, ffn_hidden, bias=False)
        self.w2 = nn.Linear(ffn_hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class LlamaBlock(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.attn = GQAttention(cfg)
        self.ffn_norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg.hidden, cfg.ffn_hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x))
        return x + self.mlp(self.ffn_norm(x))


class LlamaEmbedding(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.tok = nn.Embedding(cfg.vocab, cfg.hidden)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.tok(idx)  # (B, T, h)


class LlamaHead(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.proj = nn.Linear(cfg.hidden, cfg.vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))  # (B, T, V)


class Llama(CausalLM):
    family = "llama"

    def __init__(self, cfg: LlamaConfig):
        super().__init__(LlamaEmbedding(cfg), [LlamaBlock(cfg) for _ in range(cfg.layers)], LlamaHead(cfg))
        self.config = cfg

    def architecture(self) -> ModelArchitecture:
        c = self.config
        assert isinstance(c, LlamaConfig)
        return llama_architecture(c.kv_heads, c.ffn_hidden, c.rope_theta, c.norm_eps)


def _block_rule(block: LlamaBlock) -> TPRule:
    hd = block.attn.head_dim
    return TPRule(
        column=["attn.wq", "attn.wk", "attn.wv", "mlp.w1", "mlp.w3"],
        row=["attn.wo", "mlp.w2"],
        replicated=["attn_norm", "ffn_norm"],
        divisors={
            "heads": block.attn.wq.out_features // hd,
            "kv_heads": block.attn.wk.out_features // hd,
            "ffn": block.mlp.w1.out_features,
        },
        num_allreduce_fwd=2,
        kind="block",
    )


TP_RULES = {
    LlamaBlock: _block_rule,
    LlamaEmbedding: lambda m: TPRule(row=["tok"], num_allreduce_fwd=1, kind="embedding"),
    LlamaHead: lambda m: TPRule(column=["proj"], replicated=["norm"], kind="head"),
}
"""TP rules by layer class, read by meshplan.models.tp_rules."""

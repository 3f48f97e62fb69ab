"""Mixture-of-experts transformer: GPT blocks whose MLP is a top-k routed set of experts.

Routing follows GShard/Switch (Lepikhin et al. 2021; Fedus et al. 2022): a linear router, softmax,
top-k experts per token, and a fixed capacity C = ceil(capacity_factor * T * k / E) slots per
expert and per sample; tokens over capacity are dropped (their MoE output is 0, the residual
carries them). Dispatch is sort-based with static shapes, so the layer runs on meta and fake
tensors and its FLOPs are those of C slots per expert (router 2ThE, experts 4*E*C*h*f per sample).
Capacity is per sample, so splitting a batch across data-parallel ranks or microbatches never
changes which tokens are dropped (loss equality holds). No auxiliary balancing loss, no dropout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F

from meshplan.model_profile import ModelArchitecture, TPRule
from meshplan.models.zoo.gpt import GPT, Attention, GPTConfig


@dataclass(kw_only=True)
class MoEConfig(GPTConfig):
    experts: int = 8
    top_k: int = 2
    capacity_factor: float = 1.25


class MoEMLP(nn.Module):
    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.top_k, self.num_experts = cfg.top_k, cfg.experts
        self.capacity_factor = cfg.capacity_factor
        self.router = nn.Linear(cfg.hidden, cfg.experts, bias=False)
        self.w1 = nn.Parameter(torch.empty(cfg.experts, cfg.hidden, cfg.ffn_hidden))
        self.b1 = nn.Parameter(torch.empty(cfg.experts, 1, cfg.ffn_hidden))
        self.w2 = nn.Parameter(torch.empty(cfg.experts, cfg.ffn_hidden, cfg.hidden))
        self.b2 = nn.Parameter(torch.empty(cfg.experts, 1, cfg.hidden))

    def capacity(self, tokens: int) -> int:
        return max(1, math.ceil(self.capacity_factor * tokens * self.top_k / self.num_experts))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, h = x.shape
        E, k, C = self.num_experts, self.top_k, self.capacity(T)
        gates, expert = self.router(x).softmax(-1).topk(k, dim=-1)  # (B, T, k)
        key = (torch.arange(B, device=x.device).view(B, 1) * E + expert.view(B, T * k)).flatten()
        order = torch.sort(key, stable=True).indices  # (B*T*k,) grouped by (sample, expert)
        counts = torch.zeros(B * E, dtype=key.dtype, device=x.device).index_add(0, key, torch.ones_like(key))
        sorted_key = key[order]
        pos = torch.arange(key.numel(), device=x.device) - (counts.cumsum(0) - counts)[sorted_key]
        slot = torch.where(pos < C, sorted_key * C + pos, B * E * C)  # overflow -> a dummy slot
        token = order // k  # flat token index of each sorted assignment
        buf = x.new_zeros(B * E * C + 1, h).index_add(0, slot, x.reshape(B * T, h)[token])
        buf = buf[:-1].view(B, E, C, h).transpose(0, 1).reshape(E, B * C, h)  # (E, B*C, h)
        hid = F.gelu(torch.baddbmm(self.b1, buf, self.w1))  # (E, B*C, f)
        out = torch.baddbmm(self.b2, hid, self.w2)  # (E, B*C, h)
        out = out.view(E, B, C, h).transpose(0, 1).reshape(B * E * C, h)
        out = torch.cat([out, out.new_zeros(1, h)])[slot]  # (B*T*k, h); dropped tokens get 0
        weighted = out * gates.reshape(-1)[order].unsqueeze(1).to(out.dtype)
        return x.new_zeros(B * T, h).index_add(0, token, weighted).view(B, T, h)


class MoEBlock(nn.Module):
    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.hidden)
        self.attn = Attention(cfg.hidden, cfg.heads)
        self.ln2 = nn.LayerNorm(cfg.hidden)
        self.moe = MoEMLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.moe(self.ln2(x))


class MoE(GPT):
    """GPT embedding and head; every block's MLP replaced by experts."""

    family = "moe"

    def __init__(self, cfg: MoEConfig):
        super().__init__(
            GPTConfig(
                layers=0, hidden=cfg.hidden, heads=cfg.heads, vocab=cfg.vocab, seq=cfg.seq, ffn_hidden=cfg.ffn_hidden
            )
        )
        for i in range(cfg.layers):
            self.layers[str(i)] = MoEBlock(cfg)
        self.config = cfg

    def architecture(self) -> ModelArchitecture | None:
        return None  # experts: not a decoder the exports can name


def _block_rule(block: MoEBlock) -> TPRule:
    # attention is split Megatron-style; the experts stay whole on every TP rank
    return TPRule(
        column=["attn.wq", "attn.wk", "attn.wv"],
        row=["attn.wo"],
        replicated=["ln1", "ln2", "moe"],
        divisors={"heads": block.attn.wq.out_features // block.attn.head_dim},
        num_allreduce_fwd=1,
        kind="block",
    )


TP_RULES = {MoEBlock: _block_rule}
"""TP rules by layer class, read by meshplan.models.tp_rules."""

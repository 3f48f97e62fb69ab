"""A transformers model as layers: `embed`, `layers.i` (each HF decoder/encoder layer), `head`.

`split(model)` recognises the layouts transformers uses for decoder-only and encoder-only models:
the base model (`model.base_model`, or its `.decoder` for OPT) holds an input embedding, an
`nn.ModuleList` of layers (`layers`, `h`, `encoder.layer`), an optional final norm and rotary
module; the top-level modules outside the base model are the head (`lm_head`, `embed_out`,
BERT's `cls`). Each layer is called the way its model calls it: hidden states positionally,
`attention_mask=None` (causal SDPA for decoders, full attention for encoders) and, for RoPE
models, `position_ids` / `position_embeddings` computed per layer for the full sequence (under
sequence parallelism the local shard is 1/`seq_shards` of it). Anything else — encoder-decoders
(T5, BART), unknown layouts — is one layer (`HFWhole`) that returns the model's logits.
"""

from __future__ import annotations

import torch
from torch import nn

from meshplan.model_profile import TPRule

NORM_NAMES = ("norm", "ln_f", "final_layer_norm")
LAYER_LISTS = ("layers", "h", "layer", "block")


class HFEmbed(nn.Module):
    """Token (+ learned position) embeddings; OPT's positions take an offset and project_in."""

    def __init__(
        self,
        tok: nn.Module,
        pos: nn.Module | None = None,
        project_in: nn.Module | None = None,
        whole: nn.Module | None = None,
    ):
        super().__init__()
        self.tok, self.pos, self.project_in, self.whole = tok, pos, project_in, whole

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if self.whole is not None:  # BERT-style embeddings module (token + position + type + norm)
            return self.whole(input_ids=idx)
        x = self.tok(idx)  # (B, T, h)
        if self.project_in is not None:
            x = self.project_in(x)
        if self.pos is not None:
            positions = torch.arange(idx.shape[1], device=idx.device)
            if type(self.pos).__name__ == "OPTLearnedPositionalEmbedding":
                x = x + self.pos(torch.ones_like(idx), position_ids=positions.unsqueeze(0))
            else:
                x = x + self.pos(positions)
        return x


class HFBlock(nn.Module):
    """One HF layer, hidden states in and out (attention_mask=None; RoPE angles for the full
    sequence: `seq_shards` > 1 when sequence parallelism hands this layer 1/seq_shards of it)."""

    def __init__(self, block: nn.Module, rotary: nn.Module | None):
        super().__init__()
        self.block, self.rotary = block, rotary
        self.seq_shards = 1
        self.tp_plan: dict[str, str] = {}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kwargs = {"attention_mask": None}
        if self.rotary is not None:
            positions = torch.arange(x.shape[1] * self.seq_shards, device=x.device).unsqueeze(0)
            kwargs.update(position_ids=positions, position_embeddings=self.rotary(x, positions))
        out = self.block(x, **kwargs)
        return out[0] if isinstance(out, tuple) else out


class HFHead(nn.Module):
    def __init__(self, norm: nn.Module | None, proj: nn.Module, project_out: nn.Module | None = None):
        super().__init__()
        self.norm, self.project_out, self.proj = norm, project_out, proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm is not None:
            x = self.norm(x)
        if self.project_out is not None:
            x = self.project_out(x)
        return self.proj(x)  # (B, T, V)


class HFWhole(nn.Module):
    """A model split() does not recognise, as one layer: token ids in, logits out (encoder-
    decoders read the same ids as decoder inputs)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        kwargs = {"decoder_input_ids": idx} if getattr(self.model.config, "is_encoder_decoder", False) else {}
        return self.model(input_ids=idx, use_cache=False, **kwargs).logits


def split(model: nn.Module) -> tuple[nn.Module | None, list[nn.Module], nn.Module | None]:
    """(embed, layers, head) of a transformers model; (None, [HFWhole(model)], None) if unknown."""
    config = model.config
    base = getattr(model, "base_model", model)
    body = base.decoder if hasattr(base, "decoder") and not config.is_encoder_decoder else base
    blocks = _layer_list(body)
    head_modules = [m for n, m in model.named_children() if m is not base]
    if config.is_encoder_decoder or blocks is None or len(head_modules) != 1:
        return None, [HFWhole(model)], None
    rotary = getattr(body, "rotary_emb", None)
    blocks = [HFBlock(b, rotary) for b in blocks]
    plan = dict(getattr(config, "base_model_tp_plan", None) or {})
    for block in blocks:
        block.tp_plan = plan
    norm = next((getattr(body, n) for n in NORM_NAMES if isinstance(getattr(body, n, None), nn.Module)), None)
    if hasattr(body, "embeddings"):  # BERT-style
        embed = HFEmbed(body.embeddings.word_embeddings, whole=body.embeddings)
    else:
        pos = getattr(body, "wpe", None) or getattr(body, "embed_positions", None)
        embed = HFEmbed(body.get_input_embeddings(), pos, getattr(body, "project_in", None))
    return embed, blocks, HFHead(norm, head_modules[0], getattr(body, "project_out", None))


def _layer_list(body: nn.Module) -> nn.ModuleList | None:
    for name in LAYER_LISTS:
        found = getattr(body, name, None)
        if isinstance(found, nn.ModuleList) and len(found):
            return found
    encoder = getattr(body, "encoder", None)
    return _layer_list(encoder) if isinstance(encoder, nn.Module) and encoder is not body else None


def hf_block_rule(block: HFBlock) -> TPRule:
    """TPRule from the config's `base_model_tp_plan`, only where meshplan's executor applies it
    exactly: attention q/k/v colwise + o rowwise (heads split whole), GPT-NeoX's fused
    query_key_value colwise + dense rowwise (_per_head_qkv), a dense MLP's colwise/rowwise pair.
    Qwen3's per-head q/k norms are replicated children inside the attention (_HEAD_NORMS). A MoE
    MLP (packed experts) is replicated inside the block; GPT-2's fused Conv1D c_attn ([q | k | v]
    columns: a contiguous shard would mix them) and other styles give "none" (kept whole)."""
    plan = {k.removeprefix("layers.*."): v for k, v in block.tp_plan.items() if k.startswith("layers.*.")}
    attn_name = "attention" if _per_head_qkv(block) else "self_attn"
    head_norms = [k for k, v in plan.items() if v == "replicated_with_grad_allreduce" and k in _HEAD_NORMS]
    attn = {k: v for k, v in plan.items() if k.startswith(f"{attn_name}.") and k not in head_norms}
    mlp = {k: v for k, v in plan.items() if not k.startswith(f"{attn_name}.")}
    if any(v == "replicated_with_grad_allreduce" for v in attn.values()):
        return TPRule(kind="none")
    config = getattr(getattr(block.block, attn_name, None), "config", None)
    if config is None or not _pairs(attn, attn_name) or set(attn.values()) != {"colwise", "rowwise"}:
        return TPRule(kind="none")  # a style we do not translate (or no plan)
    column = [f"block.{k}" for k, v in attn.items() if v == "colwise"]
    row = [f"block.{k}" for k, v in attn.items() if v == "rowwise"]
    replicated = [f"block.{n}" for n, m in block.block.named_children() if "norm" in type(m).__name__.lower()]
    replicated += [f"block.{k}" for k in head_norms]  # inside the split attention: executor/tensor_parallel.py
    divisors = {
        "heads": config.num_attention_heads,
        "kv_heads": getattr(config, "num_key_value_heads", config.num_attention_heads),
    }
    dense = {k: v for k, v in mlp.items() if k.count(".") == 1}
    if dense and set(dense.values()) == {"colwise", "rowwise"} and len(dense) == len(mlp):
        column += [f"block.{k}" for k, v in dense.items() if v == "colwise"]
        row += [f"block.{k}" for k, v in dense.items() if v == "rowwise"]
        divisors["ffn"] = config.intermediate_size
    elif hasattr(block.block, "mlp"):
        replicated.append("block.mlp")  # MoE (or untranslated) MLP: whole on every TP rank
    return TPRule(column=column, row=row, replicated=replicated, num_allreduce_fwd=2, kind="block", divisors=divisors)


def _pairs(attn: dict[str, str], name: str = "self_attn") -> bool:
    if name == "attention":  # fused: query_key_value colwise, dense rowwise
        return attn == {"attention.query_key_value": "colwise", "attention.dense": "rowwise"}
    return set(attn) == {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj"}


_HEAD_NORMS = ("self_attn.q_norm", "self_attn.k_norm")
"""Qwen3's RMSNorms over each head's q and k (after the colwise q/k projections, before RoPE):
one weight of head_dim shared by all heads, so under TP each rank normalises its own heads with
the same replicated weight and the weight's gradient is the sum over the TP ranks
("replicated_with_grad_allreduce" in its base_model_tp_plan)."""


def _per_head_qkv(block: HFBlock) -> bool:
    """GPT-NeoX's fused projection: its output is viewed as (B, T, heads, 3 x head_size), so the
    weight's rows run head by head [q_h; k_h; v_h] and a contiguous ColwiseParallel shard of
    heads/t x 3 x head_size rows is whole heads, q, k and v together; its forward reshapes with
    -1 heads, so each TP rank attends over its own. (transformers GPTNeoXAttention.forward.)"""
    attention = getattr(block.block, "attention", None)
    return type(attention).__name__ == "GPTNeoXAttention" and hasattr(attention, "query_key_value")


def _register_rules() -> None:
    from meshplan.models.tp_rules import register_tp_rule

    register_tp_rule(HFBlock, hf_block_rule)
    register_tp_rule(
        HFEmbed,
        lambda m: (
            TPRule(row=["tok"], replicated=["pos"] if m.pos is not None else [], num_allreduce_fwd=1, kind="embedding")
            if m.whole is None and m.project_in is None
            else TPRule(kind="none")
        ),
    )
    register_tp_rule(
        HFHead,
        lambda m: (
            TPRule(column=["proj"], replicated=["norm"] if m.norm is not None else [], kind="head")
            if isinstance(m.proj, nn.Linear) and m.project_out is None
            else TPRule(kind="none")
        ),
    )


_register_rules()

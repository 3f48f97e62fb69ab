"""A transformers model as layers: `embed`, `layers.i` (each HF decoder/encoder layer), `head`.

`split(model)` recognises the layouts transformers uses for decoder-only and encoder-only models:
the base model (`model.base_model`, or its `.decoder` for OPT) holds an input embedding, an
`nn.ModuleList` of layers (`layers`, `h`, `encoder.layer`), an optional final norm and rotary
module; the top-level modules outside the base model are the head (`lm_head`, `embed_out`,
BERT's `cls`). Each layer is called the way its model calls it: hidden states positionally;
for a causal layer the attention mask the model's own forward builds (transformers'
`create_causal_mask`, or `create_sliding_window_causal_mask` for a layer the config's
`layer_types` calls sliding): None under SDPA (its is_causal path), the (B, 1, T, T) additive
causal mask under eager attention — so no layout attends to future tokens; `attention_mask=None`
(full attention) for an encoder's layers; for RoPE models `position_ids` / `position_embeddings`
computed per layer for the full sequence (under sequence parallelism the local shard is
1/`seq_shards` of it); None for a positional parameter the layer takes as optional (Falcon's
`alibi` when the config has none).
A split is kept only when it is the model: every parameter of the model lies in `embed`, a layer
or `head`, and (checked on real weights: the model itself, or for a meta-device model a CPU twin
built from its config when that has at most `VERIFY_MAX_PARAMS` parameters) the layers chained
give the model's own logits. Anything else — encoder-decoders (T5, BART), unknown layouts,
parameters used outside the layers (BLOOM's embedding norm), masks or positions built in a way
the layers are not given — is one layer (`HFWhole`) that returns the model's logits;
`split_note(model)` says why.
"""

from __future__ import annotations

import inspect
from typing import Any, cast

import torch
from torch import nn

from meshplan.model_profile import TPRule

NORM_NAMES = ("norm", "ln_f", "final_layer_norm")
LAYER_LISTS = ("layers", "h", "layer", "block")


class HFEmbed(nn.Module):
    """Token (+ learned position) embeddings; OPT's positions take an offset and project_in."""

    def __init__(
        self,
        tok: nn.Module | None,
        pos: nn.Module | None = None,
        project_in: nn.Module | None = None,
        whole: nn.Module | None = None,
    ):
        super().__init__()
        self.tok, self.pos, self.project_in, self.whole = tok, pos, project_in, whole

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if self.whole is not None:  # BERT-style embeddings module (token + position + type + norm)
            return self.whole(input_ids=idx)
        assert self.tok is not None
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
    """One HF layer, hidden states in and out: the causal mask its model builds (None for an
    encoder layer), RoPE angles for the full sequence (`seq_shards` > 1 when sequence
    parallelism hands this layer 1/seq_shards of it), None for optional positional parameters."""

    def __init__(
        self, block: nn.Module, rotary: nn.Module | None, config: Any = None, causal: bool = False, layer_type: str = ""
    ):
        super().__init__()
        self.block, self.rotary = block, rotary
        self.seq_shards = 1
        self.tp_plan: dict[str, str] = {}
        self.config, self.causal, self.layer_type = config, causal, layer_type
        self.optional_positional = _optional_positional(block)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = x.shape[1] * self.seq_shards
        kwargs: dict[str, Any] = {name: None for name in self.optional_positional}
        positions = torch.arange(seq, device=x.device).unsqueeze(0)
        kwargs["attention_mask"] = self._mask(x, seq) if self.causal else None
        if self.rotary is not None:
            kwargs.update(position_ids=positions, position_embeddings=self.rotary(x, positions))
        out = self.block(x, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def _mask(self, x: torch.Tensor, seq: int):
        """The model's own mask for this layer (transformers.masking_utils), for `seq` tokens."""
        from transformers import masking_utils

        sliding = self.layer_type == "sliding_attention"
        build = masking_utils.create_sliding_window_causal_mask if sliding else masking_utils.create_causal_mask
        shape = torch.empty((x.shape[0], seq, 0), dtype=x.dtype, device=x.device)  # (B, T, -): batch, length, dtype
        return build(config=self.config, inputs_embeds=shape, attention_mask=None, cache=None, position_ids=None)


class HFHead(nn.Module):
    """Final norm, output projection, and what the model's own forward does to the logits after
    it (read from its config): Gemma 2's `final_logit_softcapping` (tanh(l / c) c), Cohere's
    `logit_scale` (l s), Granite's `logits_scaling` (l / s)."""

    def __init__(self, norm: nn.Module | None, proj: nn.Module, project_out: nn.Module | None = None, config=None):
        super().__init__()
        self.norm, self.project_out, self.proj = norm, project_out, proj
        self.softcap = _number(config, "final_logit_softcapping")
        self.scale = (_number(config, "logit_scale") or 1.0) / (_number(config, "logits_scaling") or 1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.norm is not None:
            x = self.norm(x)
        if self.project_out is not None:
            x = self.project_out(x)
        logits = self.proj(x)  # (B, T, V)
        if self.scale != 1.0:
            logits = logits * self.scale
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def _number(config, name: str) -> float | None:
    value = getattr(config, name, None)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class HFWhole(nn.Module):
    """A model split() does not recognise, as one layer: token ids in, logits out (encoder-
    decoders read the same ids as decoder inputs)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        kwargs = {"decoder_input_ids": idx} if getattr(self.model.config, "is_encoder_decoder", False) else {}
        return self.model(input_ids=idx, use_cache=False, **kwargs).logits


VERIFY_MAX_PARAMS = 20_000_000
"""A meta-device model's split is checked on a CPU twin built from its config up to this size."""

_NOTES: dict[int, str] = {}


def split_note(model: nn.Module) -> str:
    """Why split() kept `model` whole ("" when it was split, or not tried)."""
    return _NOTES.get(id(model), "")


Parts = tuple[nn.Module | None, list[nn.Module], nn.Module | None]
"""(embed, layers, head); embed and head None when the model is one HFWhole layer."""
SplitParts = tuple[nn.Module, list[nn.Module], nn.Module]
"""(embed, layers, head) of a model split into layers."""


def hf_config(model: nn.Module) -> Any:
    """A transformers model's PretrainedConfig (untyped here: nn.Module's stubs have no `config`)."""
    return cast(Any, model).config


def split(model: nn.Module) -> Parts:
    """(embed, layers, head) of a transformers model; (None, [HFWhole(model)], None) when its
    layout is not recognised or the split would not compute the model (module docstring)."""
    parts, why = _split(model)
    if parts is not None:
        why = _unplaced(model, parts) or _differs(model, parts)
    if parts is None or why:
        _NOTES[id(model)] = why
        return None, [HFWhole(model)], None
    return parts


def _split(model: nn.Module) -> tuple[SplitParts | None, str]:
    config = hf_config(model)
    base: Any = getattr(model, "base_model", model)  # a transformers module: its attributes untyped
    body: Any = base.decoder if hasattr(base, "decoder") and not config.is_encoder_decoder else base
    blocks = _layer_list(body)
    head_modules = [m for n, m in model.named_children() if m is not base]
    if config.is_encoder_decoder:
        return None, "an encoder-decoder: one layer"
    if blocks is None or len(head_modules) != 1:
        return None, "no list of layers with one head module beside it"
    missing = _required_unknown(blocks[0])
    if missing:
        return None, f"its layers take {', '.join(missing)}, which the model builds in its own forward"
    rotary = getattr(body, "rotary_emb", None)
    types = list(getattr(config, "layer_types", None) or [])
    causal = _is_causal(blocks[0])
    layers = [HFBlock(b, rotary, config, causal, types[i] if i < len(types) else "") for i, b in enumerate(blocks)]
    plan = dict(getattr(config, "base_model_tp_plan", None) or {})
    for layer in layers:
        layer.tp_plan = plan
    norm = _final_norm(body)
    embeddings = getattr(body, "embeddings", None)
    if isinstance(embeddings, nn.Module) and isinstance(getattr(embeddings, "word_embeddings", None), nn.Embedding):
        embed = HFEmbed(None, whole=embeddings)  # BERT-style, this model's own (its word embeddings inside)
    else:
        pos = getattr(body, "wpe", None) or getattr(body, "embed_positions", None)
        embed = HFEmbed(body.get_input_embeddings(), pos, getattr(body, "project_in", None))
    return (embed, list(layers), HFHead(norm, head_modules[0], getattr(body, "project_out", None), config)), ""


def _final_norm(body: nn.Module) -> nn.Module | None:
    """The body's final norm: a known name, else its one direct child that is a norm."""
    named = next((getattr(body, n) for n in NORM_NAMES if isinstance(getattr(body, n, None), nn.Module)), None)
    if named is not None:
        return named
    norms = [m for m in body.children() if "norm" in type(m).__name__.lower()]
    return norms[0] if len(norms) == 1 else None


def _is_causal(block: nn.Module) -> bool:
    """A decoder's layer: an attention module in it says is_causal (GPT-2, Llama, Falcon, BERT as
    a decoder). A layer without one (Mamba's mixer) gets no mask; a split whose attention would
    then see the future differs from the model's logits and is kept whole (`_differs`)."""
    return any(getattr(m, "is_causal", None) is True for m in block.modules())


def _optional_positional(block: nn.Module) -> list[str]:
    """Positional parameters after the hidden states that have no default but take None."""
    return [
        p.name for p in _positional(block)[1:] if p.default is inspect.Parameter.empty and "None" in str(p.annotation)
    ]


def _positional(block: nn.Module) -> list[inspect.Parameter]:
    try:
        params = inspect.signature(block.forward).parameters.values()
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p for p in params if p.kind in kinds]


_GIVEN = ("attention_mask", "position_ids", "position_embeddings")


def _required_unknown(block: nn.Module) -> list[str]:
    """Required parameters (after the hidden states) HFBlock cannot give."""
    optional = set(_optional_positional(block))
    return [
        p.name
        for p in _positional(block)[1:]
        if p.default is inspect.Parameter.empty and p.name not in optional and p.name not in _GIVEN
    ]


def _unplaced(model: nn.Module, parts: SplitParts) -> str:
    """Parameters of the model outside embed, the layers and head (used by its own forward)."""
    embed, blocks, head = parts
    placed = {id(p) for part in (embed, *blocks, head) for p in part.parameters()}
    missing = [n for n, p in model.named_parameters() if id(p) not in placed]
    if not missing:
        return ""
    return f"{len(missing)} parameter(s) outside its layers ({', '.join(missing[:3])}{', ...' if len(missing) > 3 else ''})"


def _differs(model: nn.Module, parts: SplitParts) -> str:
    """ "" when the chained parts give the model's own logits on a probe (see module docstring)."""
    if any(p.is_meta for p in model.parameters()):
        twin = _twin(model)
        if twin is None:
            return ""  # too large to build here: the structural checks only
        twin_parts, why = _split(twin)
        if twin_parts is None:
            return why
        return _unplaced(twin, twin_parts) or _differs(twin, twin_parts)
    vocab = int(getattr(hf_config(model), "vocab_size", 0) or 0)
    seq = min(8, int(getattr(hf_config(model), "max_position_embeddings", 8) or 8))
    if vocab < 2:
        return "no vocabulary to probe"
    ids = torch.randint(0, vocab, (2, seq), generator=torch.Generator().manual_seed(0))
    training = model.training
    model.eval()  # dropout off: the same function twice
    try:
        with torch.no_grad():
            expected = model(input_ids=ids, use_cache=False).logits
            x = ids
            for part in (parts[0], *parts[1], parts[2]):
                x = part(x)
    except Exception as exc:
        return f"its layers fail when called on their own ({type(exc).__name__})"
    finally:
        model.train(training)
    if x.shape != expected.shape or not torch.allclose(x, expected, rtol=1e-6, atol=1e-6):  # the same ops
        return "its layers called on their own do not give the model's logits"
    return ""


def _twin(model: nn.Module) -> nn.Module | None:
    """The model rebuilt on the CPU from its config, when small enough (VERIFY_MAX_PARAMS)."""
    if sum(p.numel() for p in model.parameters()) > VERIFY_MAX_PARAMS:
        return None
    config = hf_config(model)
    state = torch.random.get_rng_state()
    try:
        with torch.device("cpu"):
            model_class: Any = type(model)  # a transformers PreTrainedModel subclass
            return model_class._from_config(config, attn_implementation=config._attn_implementation)
    finally:
        torch.random.set_rng_state(state)


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

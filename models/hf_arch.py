"""The architecture of a transformers decoder beyond its shape (ModelProfile.architecture), read from the
config it was built from and the modules it was built into: kv heads, MLP width and activation, norm,
position embedding, biases, tied output. Exports need it (Megatron's architecture flags, torchtitan's
llama3 flavours); None where the model is not a plain decoder of embed / blocks / head that these
names describe (an encoder, one HFWhole layer, mixed biases, an unknown norm or activation, logit
soft-capping or scaling, projections around the blocks, parallel attention and MLP, partial rotary,
a sliding window, heads wider or narrower than hidden / heads).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from meshplan.model_profile import ModelArchitecture
from meshplan.models.hf_layers import HFBlock, HFEmbed, HFHead

GATE_NAMES = ("gate_proj", "gate_up_proj")
"""Module names of a gated MLP's gate projection (Llama, Mistral, Qwen2, Gemma)."""
QK_NORM_NAMES = ("q_norm", "k_norm")
"""Norms of the queries and keys per head (Qwen3, OLMo 2)."""


def hf_architecture(config: Any, embed: Any, blocks: list[nn.Module], head: Any) -> ModelArchitecture | None:
    """The decoder's architecture (module docstring), or None."""
    if getattr(config, "is_encoder_decoder", False) or not blocks or not all(isinstance(b, HFBlock) for b in blocks):
        return None
    if not isinstance(embed, HFEmbed) or embed.tok is None or embed.whole is not None or embed.project_in is not None:
        return None
    if not isinstance(head, HFHead) or head.norm is None or head.project_out is not None:
        return None
    if head.softcap or head.scale != 1.0 or _unnamed(config):
        return None
    first = blocks[0]
    assert isinstance(first, HFBlock)
    block = first.block
    norm, bias, activation = _norm(block, head.norm), _bias(block), _activation(config, block)
    position = "rope" if first.rotary is not None else "learned_absolute" if embed.pos is not None else None
    theta = _rope_theta(config) if position == "rope" else 0.0
    eps = _first(config, "rms_norm_eps", "layer_norm_epsilon", "layer_norm_eps", "norm_eps")
    heads = int(_first(config, "num_attention_heads", "n_head", "num_heads") or 0)
    hidden = int(_first(config, "hidden_size", "n_embd", "d_model") or 0)
    if None in (norm, bias, activation, position, theta, eps) or not heads or not hidden:
        return None
    out_weight = getattr(head.proj, "weight", None)
    return ModelArchitecture(
        model_type=str(config.model_type),
        kv_heads=int(_first(config, "num_key_value_heads") or heads),
        ffn_hidden=int(_first(config, "intermediate_size", "n_inner", "ffn_dim") or 4 * hidden),
        norm=str(norm),
        norm_eps=float(eps),
        activation=str(activation),
        position=str(position),
        rope_theta=float(theta or 0.0),
        bias=bool(bias),
        qk_norm=any(n.rsplit(".", 1)[-1] in QK_NORM_NAMES for n, _ in block.named_modules()),
        tied=out_weight is not None and out_weight is getattr(embed.tok, "weight", None),
    )


def _unnamed(config: Any) -> bool:
    """What the architecture's names do not say: parallel attention and MLP (GPT-NeoX, Falcon), rotary
    positions on part of each head, a sliding attention window in use, a head width other than hidden / heads."""
    params = getattr(config, "rope_parameters", None)
    partial = _first(config, "partial_rotary_factor", "rotary_pct") or (
        params.get("partial_rotary_factor") if isinstance(params, dict) else None
    )
    window = getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True)
    parallel = getattr(config, "use_parallel_residual", False) or getattr(config, "parallel_attn", False)
    heads, hidden = _first(config, "num_attention_heads", "n_head"), _first(config, "hidden_size", "n_embd")
    head_dim = getattr(config, "head_dim", None)
    wide = bool(head_dim and heads and hidden and int(head_dim) * int(heads) != int(hidden))
    return bool(parallel or window or wide or (partial is not None and float(partial) < 1.0))


def _first(config: Any, *names: str) -> Any:
    return next((getattr(config, n) for n in names if getattr(config, n, None) is not None), None)


def _norm(block: nn.Module, final: nn.Module) -> str | None:
    """ "RMSNorm" or "LayerNorm" when the block's norms and the final one are all of that kind."""
    kinds = {_norm_kind(m) for m in [*block.modules(), final] if "norm" in type(m).__name__.lower()}
    return kinds.pop() if len(kinds) == 1 and None not in kinds else None


def _norm_kind(module: nn.Module) -> str | None:
    if "rmsnorm" in type(module).__name__.lower():
        return "RMSNorm"
    return "LayerNorm" if isinstance(module, nn.LayerNorm) else None


def _bias(block: nn.Module) -> bool | None:
    """Whether every linear of the block has a bias (True) or none does (False); None when some do."""
    linears = [m for m in block.modules() if isinstance(m, nn.Linear) or type(m).__name__ == "Conv1D"]
    kinds = {getattr(m, "bias", None) is not None for m in linears}
    return kinds.pop() if len(kinds) == 1 else None


def _activation(config: Any, block: nn.Module) -> str | None:
    """gelu / relu, or swiglu / geglu for a gated MLP (a gate projection in the block)."""
    name = str(_first(config, "hidden_act", "activation_function", "hidden_activation") or "")
    base = "silu" if name in ("silu", "swish") else "gelu" if name.startswith("gelu") else name
    gated = any(n.rsplit(".", 1)[-1] in GATE_NAMES for n, _ in block.named_modules())
    if gated:
        return {"silu": "swiglu", "gelu": "geglu"}.get(base)
    return base if base in ("gelu", "relu") else None


def _rope_theta(config: Any) -> float | None:
    """The rotary base: the config's rope_theta, or its rope_parameters' (transformers 5)."""
    theta = getattr(config, "rope_theta", None)
    params = getattr(config, "rope_parameters", None)
    if theta is None and isinstance(params, dict):
        theta = params.get("rope_theta")
    return float(theta) if isinstance(theta, (int, float)) and theta > 0 else None

"""HuggingFace transformers models built from configs written here (no download, HF_HUB_OFFLINE=1).

`hf:NAME` builds `AutoModelForCausalLM.from_config(config)` and splits it into the layered
convention: `embed` (token [+ position] embeddings), `layers.i` (each HF decoder layer, wrapped to
take and return hidden states; causal SDPA attention, rotary angles computed per layer), `head`
(final norm + LM head). Tied output embeddings stay tied (counted once; the executor keeps the
copies of a weight split across stages equal: executor/tied.py). Dropout is 0. Build on meta costs nothing;
the forward needs fake tensors (HF mask code calls .item(), ../shared/notes/torch-gloo.md §4.13),
which is how the profiler runs it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from meshplan.errors import MeshplanError
from meshplan.model_profile import TPRule
from meshplan.models.zoo.base import CausalLM

_LLAMA31_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192, "rope_theta": 500000.0}


def _llama(layers: int, hidden: int, heads: int, ffn: int, seq: int = 8192, vocab: int = 128256,
           kv_heads: int = 8) -> dict:
    return dict(kind="llama", seq=seq, num_hidden_layers=layers, hidden_size=hidden, num_attention_heads=heads,
                num_key_value_heads=kv_heads, intermediate_size=ffn, vocab_size=vocab,
                max_position_embeddings=131072, rope_parameters=dict(_LLAMA31_ROPE), rms_norm_eps=1e-5)


def _gpt2(layers: int, hidden: int, heads: int, vocab: int = 50257) -> dict:
    return dict(kind="gpt2", seq=1024, n_layer=layers, n_embd=hidden, n_head=heads, vocab_size=vocab,
                bos_token_id=vocab - 1, eos_token_id=vocab - 1)


# Published config.json shapes (Radford et al. 2019; Meta Llama 3.1/3.2 model cards)
CONFIGS: dict[str, dict[str, Any]] = {
    "gpt2": _gpt2(12, 768, 12), "gpt2-medium": _gpt2(24, 1024, 16),
    "gpt2-large": _gpt2(36, 1280, 20), "gpt2-xl": _gpt2(48, 1600, 25),
    "meta-llama/Llama-3.2-1B": _llama(16, 2048, 32, 8192),
    "meta-llama/Llama-3.1-8B": _llama(32, 4096, 32, 14336),
    "meta-llama/Llama-3.1-70B": _llama(80, 8192, 64, 28672),
    "meta-llama/Llama-3.1-405B": _llama(126, 16384, 128, 53248),
    "tiny-gpt2": dict(_gpt2(2, 64, 4, vocab=256), seq=32),
    "tiny-llama": _llama(2, 64, 4, 160, seq=32, vocab=256, kv_heads=2),
}
ALIASES = {"layers": "num_hidden_layers", "hidden": "hidden_size", "heads": "num_attention_heads",
           "vocab": "vocab_size", "kv_heads": "num_key_value_heads", "ffn_hidden": "intermediate_size"}


@dataclass(kw_only=True)
class HFShape:
    """The shape an HF model was built with (ModelProfile.model_config; valid `--set` keys)."""
    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int


def load_hf_model(name: str, overrides: dict[str, Any] | None, device: str, seed: int = 0) -> "HFLayered":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError:
        raise MeshplanError(f"--model hf:{name} needs HuggingFace transformers: pip install 'meshplan[hf]'") from None
    config, seq = _config(transformers, name, overrides or {})
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    return HFLayered(model, config, HFShape(layers=config.num_hidden_layers, hidden=config.hidden_size,
                                            heads=config.num_attention_heads, vocab=config.vocab_size, seq=seq))


def _config(transformers, name: str, overrides: dict[str, Any]):
    if name not in CONFIGS:
        raise MeshplanError(f"--model hf:{name}: no built-in config (nothing is downloaded); use one of "
                            f"{', '.join(sorted(CONFIGS))}, or a zoo name / file.py:factory")
    values = dict(CONFIGS[name])
    kind, seq = values.pop("kind"), int(overrides.get("seq", values.pop("seq")))
    cls = transformers.LlamaConfig if kind == "llama" else transformers.GPT2Config
    defaults = cls(**values)
    for key, value in overrides.items():
        attr = defaults.attribute_map.get(ALIASES.get(key, key), ALIASES.get(key, key))
        if key != "seq" and not hasattr(defaults, attr):
            raise MeshplanError(f"--set {key}={value}: hf:{name} has no {key!r}; use "
                                f"{', '.join(['seq', *ALIASES])} or a {cls.__name__} field")
        if key != "seq":
            current = getattr(defaults, attr)
            values[attr] = type(current)(value) if isinstance(current, (int, float, str)) else value
    if kind == "gpt2":  # no dropout; special tokens inside the (possibly smaller) vocabulary
        last = values["vocab_size"] - 1
        values.update(resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=last, eos_token_id=last)
    return cls(**values), seq


class HFEmbed(nn.Module):
    def __init__(self, tok: nn.Module, pos: nn.Module | None):
        super().__init__()
        self.tok, self.pos = tok, pos

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx)  # (B, T, h)
        if self.pos is not None:
            x = x + self.pos(torch.arange(idx.shape[1], device=idx.device))
        return x


class HFBlock(nn.Module):
    """One HF decoder layer, hidden states in and out (attention_mask=None: causal SDPA)."""

    def __init__(self, block: nn.Module, rotary: nn.Module | None):
        super().__init__()
        self.block, self.rotary = block, rotary

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[1], device=x.device).unsqueeze(0)
        kwargs = {"attention_mask": None}
        if self.rotary is not None:
            kwargs.update(position_ids=positions, position_embeddings=self.rotary(x, positions))
        out = self.block(x, **kwargs)
        return out[0] if isinstance(out, tuple) else out


class HFHead(nn.Module):
    def __init__(self, norm: nn.Module, proj: nn.Module):
        super().__init__()
        self.norm, self.proj = norm, proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.norm(x))  # (B, T, V)


class HFLayered(CausalLM):
    family = "hf"

    def __init__(self, model: nn.Module, hf_config, shape: HFShape):
        if hasattr(model, "transformer"):  # GPT-2
            body = model.transformer
            embed, blocks, norm, rotary = HFEmbed(body.wte, body.wpe), list(body.h), body.ln_f, None
        else:  # Llama
            body = model.model
            embed, blocks, norm, rotary = HFEmbed(body.embed_tokens, None), list(body.layers), body.norm, body.rotary_emb
        super().__init__(embed, [HFBlock(b, rotary) for b in blocks], HFHead(norm, model.lm_head))
        self.config = shape
        plan = dict(getattr(hf_config, "base_model_tp_plan", None) or {})
        for block in self.layers.values():
            block.tp_plan = plan


def hf_block_rule(block: HFBlock) -> TPRule:
    """TPRule from the HF config's `base_model_tp_plan` ("layers.*.x": colwise/rowwise)."""
    plan = {k.removeprefix("layers.*."): v for k, v in block.tp_plan.items() if k.startswith("layers.*.")}
    column = [f"block.{k}" for k, v in plan.items() if v == "colwise"]
    row = [f"block.{k}" for k, v in plan.items() if v == "rowwise"]
    if not column or not row or len(column) + len(row) != len(plan):
        return TPRule(kind="none")  # a style we do not translate (or no plan: GPT-2's fused c_attn)
    config = block.block.self_attn.config
    norms = [f"block.{n}" for n, m in block.block.named_children() if "norm" in type(m).__name__.lower()]
    return TPRule(column=column, row=row, replicated=norms, num_allreduce_fwd=2, kind="block",
                  divisors={"heads": config.num_attention_heads, "kv_heads": config.num_key_value_heads,
                            "ffn": config.intermediate_size})


def _register_rules() -> None:
    from meshplan.models.tp_rules import register_tp_rule

    register_tp_rule(HFBlock, hf_block_rule)
    register_tp_rule(HFEmbed, lambda m: TPRule(row=["tok"], replicated=["pos"] if m.pos is not None else [],
                                               num_allreduce_fwd=1, kind="embedding"))
    register_tp_rule(HFHead, lambda m: TPRule(column=["proj"], replicated=["norm"], kind="head"))


_register_rules()

"""HuggingFace transformers models built from configs (nothing is downloaded: HF_HUB_OFFLINE=1).

`hf:SPEC` takes a built-in name (`CONFIGS`: published shapes and tiny test configs of every
common architecture), a local `config.json` or a directory holding one. The model class is the
config's own `architectures[0]` when transformers has it, else AutoModelForSeq2SeqLM for
encoder-decoders (T5, BART), AutoModelForMaskedLM for encoder-only models (BERT), else
AutoModelForCausalLM, else AutoModel. `--set` keys are config fields (any, e.g. rope_theta) or
the aliases in `ALIASES`, and `seq`. The model is split into layers by models/hf_layers.py
(`embed`, `layers.i`, `head`; one `HFWhole` layer when the layout is not recognised). Tied output
embeddings stay tied (counted once; executor/tied.py keeps copies across stages equal).
Dropout is 0 unless --set turns it on. Building on meta costs nothing; the forward needs fake
tensors (HF mask code calls .item()), which is how the
profiler runs it.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from meshplan.errors import MeshplanError
from meshplan.model_profile import ModelArchitecture
from meshplan.models.hf_arch import hf_architecture
from meshplan.models.hf_layers import HFBlock, HFEmbed, HFHead, HFWhole, hf_config, split, split_note  # noqa: F401 (public here)
from meshplan.models.zoo.base import CausalLM

_LLAMA31_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_theta": 500000.0,
}


def _llama(
    layers: int,
    hidden: int,
    heads: int,
    ffn: int,
    seq: int = 8192,
    vocab: int = 128256,
    kv_heads: int = 8,
    tied: bool = False,
) -> dict:
    return dict(
        model_type="llama",
        seq=seq,
        num_hidden_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        intermediate_size=ffn,
        vocab_size=vocab,
        max_position_embeddings=131072,
        rope_parameters=dict(_LLAMA31_ROPE),
        rms_norm_eps=1e-5,
        tie_word_embeddings=tied,
    )


def _gpt2(layers: int, hidden: int, heads: int, vocab: int = 50257) -> dict:
    return dict(
        model_type="gpt2",
        seq=1024,
        n_layer=layers,
        n_embd=hidden,
        n_head=heads,
        vocab_size=vocab,
        bos_token_id=vocab - 1,
        eos_token_id=vocab - 1,
    )


def _tiny(model_type: str, **fields) -> dict:
    """A shrunk config of `model_type` (2 layers, h = 64, 4 heads, V = 256, s = 32)."""
    base = dict(
        model_type=model_type,
        seq=32,
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=128,
        vocab_size=256,
        max_position_embeddings=64,
    )
    return {**base, **fields}


_TINY_MOE = dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
TINY = {
    "tiny-mistral": _tiny("mistral", num_key_value_heads=2, sliding_window=None),
    "tiny-qwen2": _tiny("qwen2", num_key_value_heads=2),
    "tiny-qwen3": _tiny("qwen3", num_key_value_heads=2, head_dim=16),
    "tiny-mixtral": _tiny("mixtral", **_TINY_MOE),
    "tiny-qwen2-moe": _tiny(
        "qwen2_moe",
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=64,
        shared_expert_intermediate_size=64,
    ),
    "tiny-gpt-neox": _tiny("gpt_neox", hidden_dropout=0.0, attention_dropout=0.0),
    "tiny-opt": dict(
        model_type="opt",
        seq=32,
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        ffn_dim=128,
        vocab_size=256,
        max_position_embeddings=64,
        word_embed_proj_dim=64,
        dropout=0.0,
        attention_dropout=0.0,
    ),
    "tiny-bert": _tiny("bert", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0),
    "tiny-t5": dict(
        model_type="t5",
        seq=32,
        num_layers=2,
        num_decoder_layers=2,
        d_model=64,
        d_ff=128,
        d_kv=16,
        num_heads=4,
        vocab_size=256,
        dropout_rate=0.0,
        decoder_start_token_id=0,
    ),
    "tiny-bart": dict(
        model_type="bart",
        seq=32,
        encoder_layers=2,
        decoder_layers=2,
        d_model=64,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        vocab_size=256,
        max_position_embeddings=64,
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=None,
    ),
}

# Published config.json shapes (Radford et al. 2019; Meta Llama 3.1/3.2 model cards)
CONFIGS: dict[str, dict[str, Any]] = {
    "gpt2": _gpt2(12, 768, 12),
    "gpt2-medium": _gpt2(24, 1024, 16),
    "gpt2-large": _gpt2(36, 1280, 20),
    "gpt2-xl": _gpt2(48, 1600, 25),
    "meta-llama/Llama-3.2-1B": _llama(16, 2048, 32, 8192, tied=True),  # its config.json ties the output head
    "meta-llama/Llama-3.1-8B": _llama(32, 4096, 32, 14336),
    "meta-llama/Llama-3.1-70B": _llama(80, 8192, 64, 28672),
    "meta-llama/Llama-3.1-405B": _llama(126, 16384, 128, 53248),
    "tiny-gpt2": dict(_gpt2(2, 64, 4, vocab=256), seq=32),
    "tiny-llama": _llama(2, 64, 4, 160, seq=32, vocab=256, kv_heads=2),
    **TINY,
}
ALIASES = {
    "layers": "num_hidden_layers",
    "hidden": "hidden_size",
    "heads": "num_attention_heads",
    "vocab": "vocab_size",
    "kv_heads": "num_key_value_heads",
    "ffn_hidden": "intermediate_size",
}


@dataclass(kw_only=True)
class HFShape:
    """The shape an HF model was built with (ModelProfile.model_config; valid `--set` keys)."""

    layers: int
    hidden: int
    heads: int
    vocab: int
    seq: int


def load_hf_model(name: str, overrides: dict[str, Any] | None, device: str, seed: int = 0) -> HFLayered:
    """The transformers model of `hf:name` as a LayeredModel (see the module docstring)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        import transformers
    except ImportError:
        raise MeshplanError(f"--model hf:{name} needs HuggingFace transformers: pip install 'meshplan[hf]'") from None
    config, seq = _config(transformers, name, overrides or {})
    torch.manual_seed(seed)
    with torch.device(device):
        model = build_from_config(transformers, config)
    return wrap_hf_model(model, seq)


def wrap_hf_model(model: nn.Module, seq: int, batch: tuple | None = None) -> HFLayered:
    """A built transformers model (from hf:NAME or a user factory) as layers; `batch` is a
    factory's own (inputs, targets), trained on instead of the task's synthetic batches."""
    config = hf_config(model)
    shape = HFShape(
        layers=_get(config, "num_hidden_layers", "num_layers", "n_layer"),
        hidden=_get(config, "hidden_size", "d_model", "n_embd"),
        heads=_get(config, "num_attention_heads", "num_heads", "n_head"),
        vocab=int(config.vocab_size),
        seq=seq,
    )
    return HFLayered(model, shape, batch)


def _get(config, *names) -> int:
    return int(next((getattr(config, n) for n in names if getattr(config, n, None) is not None), 0))


def build_from_config(transformers, config) -> nn.Module:
    """The config's own architecture class if transformers has it, else the Auto class for its
    kind; with SDPA attention where the class offers it, else eager (`ATTENTION` order)."""
    for arch in getattr(config, "architectures", None) or []:
        cls = getattr(transformers, arch, None)
        if cls is not None:
            try:
                return _with_attention(lambda impl, cls=cls: cls._from_config(config, attn_implementation=impl))
            except _NoModel:
                continue
    autos = [transformers.AutoModelForSeq2SeqLM] if config.is_encoder_decoder else []
    if not config.is_encoder_decoder and not getattr(config, "is_decoder", False) and _encoder_only(config):
        autos.append(transformers.AutoModelForMaskedLM)
    autos += [transformers.AutoModelForCausalLM, transformers.AutoModel]
    for auto in filter(None, autos):
        try:
            return _with_attention(lambda impl, auto=auto: auto.from_config(config, attn_implementation=impl))
        except _NoModel:  # this Auto class has no model for the config type
            continue
    raise MeshplanError(
        f"--model hf: transformers {transformers.__version__} has no model for "
        f"model_type {config.model_type!r}; upgrade transformers or use a file.py:factory"
    )


ATTENTION = ("sdpa", "eager")
"""Attention implementations tried in order: the fused kernel where the architecture has one,
else transformers' eager attention (which saves the s x s probabilities: the profile measures
them, models/hf_layers.py gives its layers the model's causal mask)."""


class _NoModel(Exception):
    pass


def _with_attention(build):
    """build(impl) for the first implementation in ATTENTION the class accepts."""
    last: Exception | None = None
    for impl in ATTENTION:
        try:
            return build(impl)
        except ValueError as exc:  # unknown config type for an Auto class, or impl not supported
            text = str(exc).lower()
            if "attn_implementation" not in text and "attention" not in text and "sdpa" not in text:
                raise _NoModel(str(exc)) from None
            last = exc
    raise _NoModel(str(last))


def _encoder_only(config) -> bool:
    """BERT-style: transformers has a masked-LM class for it (BERT also has a BertLMHeadModel,
    used only when the config says is_decoder)."""
    from transformers.models.auto import modeling_auto as auto

    return config.model_type in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES


def _config(transformers, name: str, overrides: dict[str, Any]):
    """(config, seq) for a built-in name, a config.json or a directory holding one, with --set applied."""
    values = _config_values(name)
    model_type = values.pop("model_type", None)
    raw_seq = overrides.get("seq", values.pop("seq", 0) or _default_seq(values))
    if isinstance(raw_seq, bool) or not isinstance(raw_seq, int) or raw_seq < 1:
        raise MeshplanError(f"--set seq={raw_seq}: expected a whole number of tokens >= 1")
    seq = raw_seq
    defaults = _build_config(transformers, name, model_type, values)
    for key, value in overrides.items():
        if key == "seq":
            continue
        attr = ALIASES.get(key, key)
        attr = defaults.attribute_map.get(attr, attr)
        current = getattr(defaults, attr, None)
        try:
            values[attr] = _coerce(value, current)
        except ValueError:
            raise MeshplanError(f"--set {key}={value}: expected {type(current).__name__}") from None
    if model_type == "gpt2":  # special tokens inside the (possibly smaller) vocabulary
        last = int(values.get("vocab_size", defaults.vocab_size)) - 1
        values.setdefault("resid_pdrop", 0.0), values.setdefault("embd_pdrop", 0.0)
        values.setdefault("attn_pdrop", 0.0)
        values.update(bos_token_id=last, eos_token_id=last)
    config = _build_config(transformers, name, model_type, values)
    stored = config.to_dict()
    for key in overrides:  # a key the config class neither has nor consumes (rope_theta is) is a typo
        attr = defaults.attribute_map.get(ALIASES.get(key, key), ALIASES.get(key, key))
        if key != "seq" and not hasattr(defaults, attr) and attr in stored:
            raise MeshplanError(
                f"--set {key}={overrides[key]}: hf:{name}'s {model_type} config has no {attr!r}; use "
                f"{', '.join(ALIASES)}, seq, or a field of its config.json"
            )
    _check_shape(name, config)
    return config, seq


def _build_config(transformers, name: str, model_type, values: dict):
    """AutoConfig.for_model, its failures as one line: an unknown model_type asks for a newer
    transformers, a config the class's own validators refuse (hidden 64 / heads 5) says why."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    try:
        return transformers.AutoConfig.for_model(model_type, **values)
    except Exception as exc:  # transformers raises ValueError, KeyError or huggingface_hub's own errors
        if model_type not in CONFIG_MAPPING_NAMES:
            raise MeshplanError(
                f"--model hf:{name}: transformers {transformers.__version__} cannot build "
                f"model_type {model_type!r} ({exc}); upgrade transformers"
            ) from None
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        reason = lines[-1] if lines else type(exc).__name__
        raise MeshplanError(f"--model hf:{name}: transformers refuses the config: {reason}; fix it or --set") from None


def _check_shape(name: str, config) -> None:
    """Sizes >= 1 and heads that split the hidden size (and kv heads that split the heads),
    refused before a tensor is made: layers=-2 built one block, hidden 64 / heads 5 raised."""
    sizes = {alias: getattr(config, attr, None) for alias, attr in ALIASES.items()}
    for alias, value in sizes.items():
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise MeshplanError(f"--model hf:{name}: {alias} ({ALIASES[alias]}) = {value}; must be >= 1")
    hidden, heads, kv = sizes["hidden"], sizes["heads"], sizes["kv_heads"]
    if isinstance(hidden, int) and isinstance(heads, int) and hidden % heads:
        raise MeshplanError(
            f"--model hf:{name}: hidden_size {hidden} is not divisible by num_attention_heads {heads}; "
            "pick heads that divide hidden (--set heads=N)"
        )
    if isinstance(heads, int) and isinstance(kv, int) and heads % kv:
        raise MeshplanError(
            f"--model hf:{name}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}; "
            "--set kv_heads=N with N dividing heads"
        )


def _coerce(value, current):
    if isinstance(current, bool) and isinstance(value, str):
        return value.lower() in ("1", "true", "yes")
    if isinstance(current, (int, float, str)) and not isinstance(current, bool):
        return type(current)(value)
    return value


def _default_seq(values: dict) -> int:
    return int(min(values.get("max_position_embeddings", 2048) or 2048, 2048))


def _config_values(name: str) -> dict[str, Any]:
    if name in CONFIGS:
        return dict(CONFIGS[name])
    path = Path(name)
    if path.is_dir():
        path = path / "config.json"
    if path.suffix == ".json" and path.is_file():
        try:
            values = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise MeshplanError(f"--model hf:{name}: cannot read {path} ({exc}); give a valid config.json") from None
        if "model_type" not in values:
            raise MeshplanError(f'--model hf:{name}: {path} has no "model_type"; it is not a transformers config')
        values.pop("transformers_version", None)
        values.pop("torch_dtype", None), values.pop("dtype", None)
        return values
    raise MeshplanError(
        f"--model hf:{name}: no built-in config and no config.json at {name} (nothing is "
        f"downloaded); give a local config.json or a directory with one, or one of "
        f"{', '.join(sorted(CONFIGS))}"
    )


class HFLayered(CausalLM):
    """A transformers model as embed / layers.i / head (or one HFWhole layer), trained on its
    task's targets (`task`): next tokens for a causal LM (and an encoder-decoder, whose decoder
    reads the same ids), the tokens at 15% of the positions of each sequence for a masked LM (the
    rest -100, ignored), a class per sequence for a sequence classifier; or the factory's own batch."""

    family = "hf"

    def __init__(self, model: nn.Module, shape: HFShape, batch: tuple | None = None):
        embed, blocks, head = split(model)
        super().__init__(embed, blocks, head)
        self.config = shape
        self.hf_config = model.config
        self.task = _task(model)
        self._batch = None if batch is None else tuple(t.detach().cpu() for t in batch)
        self._architecture = hf_architecture(model.config, embed, list(blocks), head) if self.task == "causal" else None
        if split_note(model):
            self.notes.append(f"{type(model).__name__} is one layer ({split_note(model)}): no pipeline split")
        impl = getattr(model.config, "_attn_implementation", None)
        if impl == "eager":
            self.notes.append(
                f"{type(model).__name__} runs eager attention: the s x s attention probabilities are saved "
                "for backward, counted in activation_bytes and freed by selective recompute"
            )

    def architecture(self) -> ModelArchitecture | None:
        """From the config and the built modules (models/hf_arch.py); None for encoders, classifiers and
        decoders whose architecture these names do not describe."""
        return self._architecture

    def example_batch(self, batch_size, generator=None, device="cpu"):
        if self._batch is not None:  # the factory's (ids, labels), tiled to batch_size
            tile = lambda t: t.repeat(-(-batch_size // t.shape[0]), *([1] * (t.dim() - 1)))[:batch_size]  # noqa: E731
            return tuple(tile(t).to(device) for t in self._batch)
        if self.task == "classification":
            ids = torch.randint(0, self.config.vocab, (batch_size, self.config.seq), generator=generator)
            labels = torch.randint(0, int(self.hf_config.num_labels), (batch_size,), generator=generator)
            return ids.to(device), labels.to(device)
        if self.task == "masked":
            ids = torch.randint(0, self.config.vocab, (batch_size, self.config.seq), generator=generator)
            k = max(1, round(MASK_FRACTION * self.config.seq))  # the same count in every sequence
            order = torch.rand((batch_size, self.config.seq), generator=generator).argsort(dim=1)
            chosen = torch.zeros_like(ids, dtype=torch.bool).scatter_(1, order[:, :k], True)
            labels = torch.where(chosen, ids, torch.full_like(ids, -100))
            mask_id = getattr(self.hf_config, "mask_token_id", None)
            if mask_id is not None and 0 <= int(mask_id) < self.config.vocab:
                ids = torch.where(chosen, torch.full_like(ids, int(mask_id)), ids)
            return ids.to(device), labels.to(device)
        return super().example_batch(batch_size, generator, device)


MASK_FRACTION = 0.15
"""BERT's masked fraction (Devlin et al. 2019, §3.1), the same number of positions in every
sequence: a microbatch's or replica's mean loss over its masked tokens is then the global mean's
share, as in one process on the whole batch (a varying count would weight them unequally)."""


def _task(model: nn.Module) -> str:
    """ "classification", "masked" or "causal", from the class transformers maps the model to."""
    from transformers.models.auto import modeling_auto as auto

    name = type(model).__name__
    if name in set(auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES.values()):
        return "classification"
    config = hf_config(model)
    if name in set(auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES.values()) and not getattr(config, "is_decoder", False):
        return "masked" if not config.is_encoder_decoder else "causal"
    return "causal"

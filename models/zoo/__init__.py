"""Built-in model zoo: every model is built from a config, never from downloaded weights.

`build_model(name, overrides, device)` accepts a zoo name ("gpt-tiny", "gpt3-175b", ...) or a
family name ("gpt", "llama", ...) plus `--set` overrides. Large models are built on the meta
device by the profiler; nothing is allocated until the executor materialises a stage.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from meshplan.errors import MeshplanError
from meshplan.models.zoo.base import LayeredModel, init_weights
from meshplan.models.zoo.bert import Bert, BertConfig
from meshplan.models.zoo.gpt import GPT, GPTConfig
from meshplan.models.zoo.llama import Llama, LlamaConfig
from meshplan.models.zoo.moe import MoE, MoEConfig
from meshplan.models.zoo.resnet import ResNet, ResNetConfig
from meshplan.models.zoo.vit import ViT, ViTConfig

# family -> (config class, model class)
FAMILIES: dict[str, tuple[type, type]] = {
    "gpt": (GPTConfig, GPT),
    "llama": (LlamaConfig, Llama),
    "bert": (BertConfig, Bert),
    "vit": (ViTConfig, ViT),
    "moe": (MoEConfig, MoE),
    "resnet": (ResNetConfig, ResNet),
}

# zoo name -> (family, config overrides). GPT shapes: Brown et al. 2020 Table 2.1 and
# ../shared/reference/published-runs.csv.
ZOO: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt-tiny": ("gpt", dict(layers=4, hidden=64, heads=4, vocab=256, seq=32)),
    "gpt2-125m": ("gpt", dict(layers=12, hidden=768, heads=12, vocab=50257, seq=1024)),
    "gpt2-350m": ("gpt", dict(layers=24, hidden=1024, heads=16, vocab=50257, seq=1024)),
    "gpt2-760m": ("gpt", dict(layers=24, hidden=1536, heads=16, vocab=50257, seq=1024)),
    "gpt2-1.5b": ("gpt", dict(layers=48, hidden=1600, heads=25, vocab=50257, seq=1024)),
    "gpt3-1.3b": ("gpt", dict(layers=24, hidden=2048, heads=16, vocab=51200, seq=2048)),
    "gpt3-2.7b": ("gpt", dict(layers=32, hidden=2560, heads=32, vocab=51200, seq=2048)),
    "gpt3-6.7b": ("gpt", dict(layers=32, hidden=4096, heads=32, vocab=51200, seq=2048)),
    "gpt3-13b": ("gpt", dict(layers=40, hidden=5120, heads=40, vocab=51200, seq=2048)),
    "gpt3-175b": ("gpt", dict(layers=96, hidden=12288, heads=96, vocab=51200, seq=2048)),
    # Narayanan et al. SC21 Table 1 and Korthikanti et al. 2022 Table 3 (V = 51200, s = 2048)
    **{
        f"megatron-{name}": ("gpt", dict(layers=l, hidden=h, heads=a, vocab=51200, seq=2048))
        for name, l, h, a in [
            ("1.7b", 24, 2304, 24),
            ("3.6b", 30, 3072, 32),
            ("7.5b", 36, 4096, 32),
            ("18.4b", 40, 6144, 48),
            ("22b", 48, 6144, 64),
            ("39.1b", 48, 8192, 64),
            ("76.1b", 60, 10240, 80),
            ("145.6b", 80, 12288, 96),
            ("310.1b", 96, 16384, 128),
            ("530b", 105, 20480, 128),
            ("1t", 128, 25600, 160),
        ]
    },
    # Llama 3 / 3.1 (Dubey et al. 2024, Table 3)
    "llama-tiny": ("llama", dict(layers=4, hidden=64, heads=4, kv_heads=2, vocab=256, seq=32, ffn_hidden=160)),
    "llama3-8b": (
        "llama",
        dict(layers=32, hidden=4096, heads=32, kv_heads=8, vocab=128256, seq=8192, ffn_hidden=14336),
    ),
    "llama3-70b": (
        "llama",
        dict(layers=80, hidden=8192, heads=64, kv_heads=8, vocab=128256, seq=8192, ffn_hidden=28672),
    ),
    "llama3-405b": (
        "llama",
        dict(layers=126, hidden=16384, heads=128, kv_heads=8, vocab=128256, seq=8192, ffn_hidden=53248),
    ),
    # BERT (Devlin et al. 2019)
    "bert-tiny": ("bert", dict(layers=4, hidden=64, heads=4, vocab=256, seq=32)),
    "bert-base": ("bert", dict(layers=12, hidden=768, heads=12, vocab=30522, seq=512)),
    "bert-large": ("bert", dict(layers=24, hidden=1024, heads=16, vocab=30522, seq=512)),
    # ViT (Dosovitskiy et al. 2021, Table 1)
    "vit-tiny": ("vit", dict(layers=4, hidden=64, heads=4, image=32, patch=8, classes=10)),
    "vit-b16": ("vit", dict(layers=12, hidden=768, heads=12, image=224, patch=16)),
    "vit-l16": ("vit", dict(layers=24, hidden=1024, heads=16, image=224, patch=16)),
    "vit-h14": ("vit", dict(layers=32, hidden=1280, heads=16, image=224, patch=14)),
    # mixture of experts: GPT blocks with top-2 routed experts (our shapes)
    "moe-tiny": ("moe", dict(layers=4, hidden=64, heads=4, vocab=256, seq=32, experts=4, top_k=2)),
    "moe-1.3b-e8": ("moe", dict(layers=24, hidden=2048, heads=16, vocab=51200, seq=2048, experts=8, top_k=2)),
    # ResNet (He et al. 2016) with GroupNorm
    "resnet-tiny": ("resnet", dict(blocks="1,1,1,1", width=8, image=32, classes=10, groups=4)),
    "resnet50": ("resnet", dict(blocks="3,4,6,3", width=64, image=224, classes=1000)),
    "resnet101": ("resnet", dict(blocks="3,4,23,3", width=64, image=224, classes=1000)),
}

DEFAULT_MODEL = "gpt-tiny"


def register_family(name: str, config_cls: type, model_cls: type) -> None:
    FAMILIES[name] = (config_cls, model_cls)


def resolve(name: str, overrides: dict[str, Any] | None = None) -> tuple[str, Any]:
    """(family, config) for a zoo or family name with overrides applied and checked."""
    overrides = dict(overrides or {})
    if name in ZOO:
        family, base = ZOO[name]
        values = {**base, **overrides}
    elif name in FAMILIES:
        family, values = name, overrides
    else:
        known = ", ".join(sorted(set(ZOO) | set(FAMILIES)))
        raise MeshplanError(
            f"--model {name!r} is not in the zoo; use one of {known}, file.py:factory, module:factory or hf:NAME"
        )
    config_cls, _ = FAMILIES[family]
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    for key, value in values.items():
        if key not in fields:
            raise MeshplanError(f"--set {key}={value}: {family} has no {key!r}; known keys are {', '.join(fields)}")
    try:
        config = config_cls(**{k: _coerce(fields[k], k, v) for k, v in values.items()})
    except MeshplanError:
        raise
    except (TypeError, ValueError) as exc:
        raise MeshplanError(f"--set for {family}: {exc}") from None
    _check_shape(family, config, fields)
    return family, config


def _check_shape(family: str, config: Any, fields: dict[str, dataclasses.Field]) -> None:
    """Sizes are positive (0 only where the field's default 0 means "derived", as ffn_hidden);
    attention heads split the hidden size evenly. Refused here, before any tensor is made."""
    for key, field in fields.items():
        value = getattr(config, key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if value < 0 or (value == 0 and field.default != 0) or value != value:
            raise MeshplanError(f"--set {key}={value}: {family} needs {key} >= 1")
    hidden, heads = getattr(config, "hidden", None), getattr(config, "heads", None)
    if isinstance(hidden, int) and isinstance(heads, int) and hidden % heads:
        raise MeshplanError(
            f"--set heads={heads}: {family}'s hidden size {hidden} is not divisible by "
            f"heads {heads}; pick heads that divide hidden (e.g. {_divisor_near(hidden, heads)})"
        )


def _divisor_near(n: int, k: int) -> int:
    return min((d for d in range(1, n + 1) if n % d == 0), key=lambda d: (abs(d - k), d))


def _coerce(field: dataclasses.Field, key: str, value: Any) -> Any:
    kind = (
        field.type
        if isinstance(field.type, type)
        else {"int": int, "float": float, "str": str, "bool": bool}.get(str(field.type), None)
    )
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise MeshplanError(f"--set {key}={value}: expected an integer")
    if kind is None or isinstance(value, kind):
        return value
    try:
        if kind is bool:
            return str(value).lower() in ("1", "true", "yes", "on")
        return kind(value)
    except ValueError:
        raise MeshplanError(f"--set {key}={value}: expected {kind.__name__}") from None


def build_model(
    name: str, overrides: dict[str, Any] | None = None, device: str | torch.device = "cpu", seed: int = 0
) -> LayeredModel:
    """Build a zoo model; on "meta" nothing is allocated, elsewhere weights come from init_weights."""
    family, config = resolve(name, overrides)
    _, model_cls = FAMILIES[family]
    with torch.device(device):
        model = model_cls(config)
    if str(device) != "meta":
        init_weights(model, seed)
    return model


def zoo_names() -> list[str]:
    return sorted(ZOO)

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

# zoo name -> (family, config overrides): a torch-free table, so `meshplan presets` lists it
# without importing torch (tests/test_cli_presets.py holds catalog.FAMILY_NAMES to FAMILIES)
from meshplan.models.catalog import ZOO  # noqa: E402

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
    except (TypeError, ValueError, ArithmeticError) as exc:  # a config's own check, or its arithmetic
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

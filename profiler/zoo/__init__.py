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
from meshplan.profiler.zoo.base import LayeredModel, init_weights
from meshplan.profiler.zoo.gpt import GPT, GPTConfig

# family -> (config class, model class)
FAMILIES: dict[str, tuple[type, type]] = {"gpt": (GPTConfig, GPT)}

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
        raise MeshplanError(f"--model {name!r} is not in the zoo; use one of {known}, "
                            "file.py:factory, module:factory or hf:NAME")
    config_cls, _ = FAMILIES[family]
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    for key, value in values.items():
        if key not in fields:
            raise MeshplanError(f"--set {key}={value}: {family} has no {key!r}; "
                                f"known keys are {', '.join(fields)}")
    try:
        config = config_cls(**{k: _coerce(fields[k], k, v) for k, v in values.items()})
    except (TypeError, ValueError) as exc:
        raise MeshplanError(f"--set for {family}: {exc}") from None
    return family, config


def _coerce(field: dataclasses.Field, key: str, value: Any) -> Any:
    kind = field.type if isinstance(field.type, type) else {"int": int, "float": float, "str": str,
                                                             "bool": bool}.get(str(field.type), None)
    if kind is None or isinstance(value, kind):
        return value
    try:
        if kind is bool:
            return str(value).lower() in ("1", "true", "yes", "on")
        return kind(value)
    except ValueError:
        raise MeshplanError(f"--set {key}={value}: expected {kind.__name__}") from None


def build_model(name: str, overrides: dict[str, Any] | None = None,
                device: str | torch.device = "cpu", seed: int = 0) -> LayeredModel:
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

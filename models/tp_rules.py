"""Tensor-parallel rules per layer: which linears are column/row parallel (Megatron-LM style).

Shoeybi et al. 2019 §3: in a transformer block the first GEMM of each pair is split by columns
(output dim) and the second by rows (input dim), so attention and MLP each need one all-reduce
in forward. The executor turns a TPRule into `parallelize_module` styles (ColwiseParallel /
RowwiseParallel); the planner reads `divisors` (the TP degree must divide each) and
`num_allreduce_fwd`. Rules are looked up by layer class: each zoo module exports `TP_RULES`
({class: rule function}); HF and user layers may register theirs; anything else is "none".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

from meshplan.model_profile import TPRule
from meshplan.models.zoo.base import LayeredModel

ZOO_MODULES = ("gpt", "llama", "bert", "vit", "moe", "resnet")

_RULES: dict[type, Callable[[Any], TPRule]] = {}
"""Layer class -> its rule; a rule is called only on layers of its key's class (layer_tp_rule)."""
_zoo_loaded = False
"""Whether the zoo modules' TP_RULES are in _RULES (loaded on the first lookup)."""

Layer = TypeVar("Layer", bound=nn.Module)


def register_tp_rule(cls: type[Layer], rule: Callable[[Layer], TPRule]) -> None:
    """Use `rule(layer) -> TPRule` for layers of class `cls` (and its subclasses)."""
    _RULES[cls] = rule


def layer_tp_rule(layer: nn.Module) -> TPRule:
    """The rule for one layer module; layers TP cannot split get kind "none" (kept whole)."""
    _load_zoo_rules()
    for cls in type(layer).__mro__:
        if cls in _RULES:
            return _RULES[cls](layer)
    return TPRule(kind="none")


def tp_rules(model: LayeredModel) -> dict[str, TPRule]:
    """TPRule per layer FQN of a LayeredModel (embed, layers.i, head), in execution order."""
    return {fqn: layer_tp_rule(model.get_submodule(fqn)) for fqn in model.layer_names()}


def _load_zoo_rules() -> None:
    global _zoo_loaded
    if _zoo_loaded:
        return
    _zoo_loaded = True
    for name in ZOO_MODULES:
        module = importlib.import_module(f"meshplan.models.zoo.{name}")
        for cls, rule in getattr(module, "TP_RULES", {}).items():
            _RULES.setdefault(cls, rule)

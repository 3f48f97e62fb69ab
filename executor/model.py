"""Rebuild the plan's model (on the meta device) and look up its tensor-parallel rules.

Zoo names go through `meshplan.models.zoo.build_model`; user models ("file.py:factory",
"module:factory", "hf:NAME") through the models' loader. `tp_rules_for` is the single place the
executor learns how to split a layer: the models' `tp_rules` (models/tp_rules.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from meshplan.errors import MeshplanError
from meshplan.model_profile import TPRule
from meshplan.models.tp_rules import tp_rules
from meshplan.models.zoo.base import LayeredModel
from meshplan.plan import Plan


def build_model_for_plan(plan: Plan, device: str | torch.device = "meta", seed: int = 0) -> LayeredModel:
    """The plan's model, unsharded; on "meta" nothing is allocated."""
    return build_named_model(plan.model_name, plan.model_config, device, seed)


def is_zoo_name(name: str) -> bool:
    return ":" not in name


def build_for_apply(plan: Plan, seed: int = 0) -> LayeredModel:
    """What `apply` gets in the worker: zoo models on meta (weights from init_tensor), user and HF
    models built for real (their own init under torch.manual_seed(seed), identical on every rank)."""
    model = build_model_for_plan(plan, "meta" if is_zoo_name(plan.model_name) else "cpu", seed)
    check_real_layers(plan, model)
    return model


def check_real_layers(plan: Plan, model: LayeredModel) -> None:
    """Refuse `model` (built on the CPU) if its layers are not the plan's: a factory with a `device`
    parameter was profiled and planned on meta, where a cut is checked on shapes only, and its
    real weights split differently (one layer where the values do not reproduce the module)."""
    names = model.layer_names()
    if plan.layers and names != plan.layers:
        raise MeshplanError(
            f"plan.layers: {plan.model_name} built on the CPU has {len(names)} layer(s) ({names[0]} .. "
            f"{names[-1]}), the plan {len(plan.layers)} from its meta-device profile: the split checked on "
            "meta shapes does not reproduce the model; profile it on the CPU (a factory without a `device` "
            "parameter) and re-plan"
        )


def built_on_meta(model: nn.Module) -> bool:
    """Whether a build asked for on meta really is on meta (a factory without `device` builds on the CPU)."""
    return any(p.is_meta for p in model.parameters())


def build_named_model(
    name: str, config: dict[str, Any], device: str | torch.device = "meta", seed: int = 0
) -> LayeredModel:
    """Zoo, family, user-file or HF model as a LayeredModel, through the profiler's loader."""
    try:
        from meshplan.models.loader import load_model
    except ImportError:  # an older profiler: zoo names only
        from meshplan.models import zoo

        return zoo.build_model(name, config, device=device, seed=seed)
    try:
        model = load_model(name, config, str(device), seed)
    except MeshplanError as exc:  # the loader speaks of --set; in a plan the values are model_config's
        text = str(exc)
        if not text.startswith("--set"):
            raise
        raise MeshplanError("plan.model_config" + text[len("--set") :]) from None
    if not isinstance(model, LayeredModel):
        raise MeshplanError(f"plan.model_name = {name!r}: the loader did not return a LayeredModel")
    return model


def tp_rules_for(model: LayeredModel) -> dict[str, TPRule]:
    """TPRule per layer FQN (embed, layers.i, head)."""
    return tp_rules(model)

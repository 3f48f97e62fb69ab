"""Re-target a profile's attention core to the runtime's kernel (`--attention`), analytically.

Korthikanti et al. 2022 Sec 4.1 / Eq. 1: an attention core that materialises the scores keeps the
softmax output for backward, `2as^2` bytes per sample (16-bit; with attention dropout also its
mask and output, `3as^2`, which only the closed-form profiles with dropout carry); a flash kernel
keeps the fp32 log-sum-exp instead, `4as` bytes (profiler/activations.py). Either way selective
recompute drops the core and re-runs its `4s^2h` FLOPs (QK^T and AV, App. A). The core of a block
is `activation_bytes - selective_activation_bytes` (the seqscale.py convention); a closed-form
flash block stores its log-sum-exp inside the rest (selective == activation bytes).
Only blocks (TPRule kind "block") change; an already matching block is returned as it is.
"""

from __future__ import annotations

import dataclasses

from meshplan.model_profile import LayerProfile, ModelProfile


def is_materialized(layer: LayerProfile, a: int, s: int) -> bool:
    """The block keeps its s x s attention scores for backward (at least a x s^2 bytes of core)."""
    core = layer.activation_bytes - layer.selective_activation_bytes if layer.selective_activation_bytes > 0 else 0.0
    return core >= a * s * s


def _retarget(layer: LayerProfile, kind: str, a: int, s: int, h: int) -> LayerProfile:
    if layer.tp.kind != "block" or is_materialized(layer, a, s) == (kind == "materialized"):
        return layer
    sel = layer.selective_activation_bytes
    core = layer.activation_bytes - sel if sel > 0 else 0.0
    rest = sel if core > 0 else layer.activation_bytes - 4.0 * a * s  # everything but the core
    new_core = 2.0 * a * s * s if kind == "materialized" else 4.0 * a * s
    return dataclasses.replace(
        layer,
        activation_bytes=rest + new_core,
        selective_activation_bytes=rest,
        recompute_flops_selective=4.0 * s * s * h,
        timings=[],
    )


def with_attention(profile: ModelProfile, kind: str | None) -> ModelProfile:
    """The same model with its blocks' attention core as `kind` keeps it (None: unchanged)."""
    if kind is None or not profile.heads:
        return profile
    a, s, h = profile.heads, profile.seq_len, profile.hidden
    layers = [_retarget(lp, kind, a, s, h) for lp in profile.layers]
    if all(new is old for new, old in zip(layers, profile.layers)):
        return profile
    return dataclasses.replace(
        profile, layers=layers, notes=profile.notes + [f"planner re-targeted the attention core to {kind}"]
    )

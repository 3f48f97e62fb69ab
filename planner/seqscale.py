"""Re-target a profile to another sequence length (`--seq`), analytically.

A transformer block's per-sample cost has a part linear in s (GEMMs, norms, the saved inputs)
and a part quadratic in s (attention scores): forward FLOPs `24sh^2 + 4s^2h` (Korthikanti et al.
2022 App. A), activations `sh(34 + 5as/h)` (Eq. 1). The quadratic FLOPs are `4s^2h` (QK^T and AV)
for blocks; the quadratic bytes are what selective recompute drops (the attention core). Measured
timings are dropped: they were taken at the profiled length (the FLOPs model takes over).
"""

from __future__ import annotations

import dataclasses

from meshplan.model_profile import LayerProfile, ModelProfile


def _scale_layer(layer: LayerProfile, s0: int, s1: int, hidden: int) -> LayerProfile:
    r = s1 / s0
    quad_fwd = min(layer.forward_flops, 4.0 * s0 * s0 * hidden) if layer.tp.kind == "block" else 0.0
    lin_fwd = layer.forward_flops - quad_fwd
    quad_bwd = min(layer.backward_flops, 2 * quad_fwd)
    quad_act = (
        max(layer.activation_bytes - layer.selective_activation_bytes, 0.0)
        if layer.selective_activation_bytes > 0
        else 0.0
    )
    return dataclasses.replace(
        layer,
        forward_flops=lin_fwd * r + quad_fwd * r * r,
        backward_flops=(layer.backward_flops - quad_bwd) * r + quad_bwd * r * r,
        activation_bytes=(layer.activation_bytes - quad_act) * r + quad_act * r * r,
        selective_activation_bytes=layer.selective_activation_bytes * r,
        recompute_flops_selective=layer.recompute_flops_selective * r * r,
        tp_replicated_activation_bytes=layer.tp_replicated_activation_bytes * r,
        input_bytes=layer.input_bytes * r,
        output_bytes=layer.output_bytes * r,
        gemm_shapes=[[round(g[0] * r), *g[1:]] for g in layer.gemm_shapes],
        timings=[],
    )


def with_seq_len(profile: ModelProfile, seq: int | None) -> ModelProfile:
    """The same model at `seq` tokens per sample (unchanged when seq is None or equal)."""
    if not seq or seq == profile.seq_len:
        return profile
    layers = [_scale_layer(lp, profile.seq_len, seq, profile.hidden) for lp in profile.layers]
    return dataclasses.replace(
        profile,
        seq_len=seq,
        layers=layers,
        forward_flops_per_sample=sum(lp.forward_flops for lp in layers),
        edge_tensors=[{k: v * seq / profile.seq_len for k, v in t.items()} for t in profile.edge_tensors],
        notes=profile.notes + [f"planner rescaled seq_len {profile.seq_len} -> {seq} analytically"],
    )

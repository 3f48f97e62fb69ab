"""Per-layer compute time on one rank for one microbatch.

Measured LayerTimings when the profile was taken on this kind of device (interpolated, or scaled
linearly, in microbatch size); otherwise FLOPs / (peak x efficiency), where the efficiency comes
from the device's GEMM-size curve (ClusterSpec.device.gemm_efficiency, interpolated in log FLOPs)
at the size of the layer's local GEMMs: tensor parallelism divides each GEMM by t and so lowers
its efficiency (docs/design.md, "Cost model"). The layer's efficiency is the FLOP-weighted harmonic
mean over its GEMMs: time = sum_g flops_g / (peak x eff(flops_g)).
"""

from __future__ import annotations

import math
from bisect import bisect_left

from meshplan.model_profile import LayerProfile
from meshplan.planner.context import Context
from meshplan.planner.cost.in_place import between, linear_in_b, measured_points
from meshplan.planner.sac import matmuls, op_policy_reruns


def gemm_efficiency(curve: list[list[float]], flops: float) -> float:
    """Achieved fraction of peak for one GEMM of `flops`, log-linear between curve points."""
    if not curve:
        return 1.0
    if flops <= curve[0][0]:
        return curve[0][1]
    if flops >= curve[-1][0]:
        return curve[-1][1]
    xs = [p[0] for p in curve]
    i = bisect_left(xs, flops)
    (x0, y0), (x1, y1) = curve[i - 1], curve[i]
    w = (math.log(flops) - math.log(x0)) / (math.log(x1) - math.log(x0))
    return y0 + w * (y1 - y0)


def layer_efficiency(ctx: Context, layer: LayerProfile, b: int, split: int, cp: int) -> float:
    """FLOP-weighted efficiency of the layer's GEMMs at their local sizes. A closed-form block
    lists Megatron's fused projections (one QKV GEMM, one gate+up GEMM); a runtime whose model
    runs one GEMM per projection (RuntimeSpec.fused_projections False: torchtitan, torch models) is
    read at those smaller sizes (sac.matmuls)."""
    curve = ctx.gemm_curve
    per_sample = (
        [fl for _, fl in matmuls(layer)]
        if not ctx.spec.fused_projections
        else [2.0 * g[0] * g[1] * g[2] for g in layer.gemm_shapes]
    )
    gemms = [fl * b / cp / split for fl in per_sample]
    if not gemms:
        return gemm_efficiency(curve, layer.forward_flops * b / (split * cp))
    return sum(gemms) / sum(g / gemm_efficiency(curve, g) for g in gemms)


def _interp_timing(layer: LayerProfile, b: int) -> tuple[float, float]:
    """Measured (forward_s, backward_s) at microbatch b: linear between measured sizes,
    proportional to b beyond them (per-sample cost of the nearest measurement)."""
    pts = sorted((t.microbatch_size, t.forward_s, t.backward_s) for t in layer.timings)
    for (b0, f0, k0), (b1, f1, k1) in zip(pts, pts[1:]):
        if b0 <= b <= b1:
            w = (b - b0) / (b1 - b0)
            return f0 + w * (f1 - f0), k0 + w * (k1 - k0)
    near = pts[0] if b < pts[0][0] else pts[-1]
    return near[1] * b / near[0], near[2] * b / near[0]


def attention_efficiency(ctx: Context, layer: LayerProfile, b: int, split: int, cp: int) -> float:
    """Efficiency of a block's attention core (QK^T, AV), per-(sample, head) GEMMs of [s/c, s, d_head]
    (tensor parallelism splits heads, not head_dim). A core that materialises the scores
    (Megatron-LM's baddbmm over b x heads/t) is one batched GEMM per product: the curve is read at
    that kernel's FLOPs, all b x heads/t pairs together. A flash kernel is not a GEMM; it stays at
    one pair's GEMM size (measured FlashAttention rates were tried and not adopted: the validation
    notes, reports/validation.md)."""
    prof = ctx.profile
    head_dim = prof.hidden / prof.heads if prof.heads else prof.hidden
    pair = 2.0 * ctx.seq / cp * ctx.seq * head_dim
    if prof.heads and ctx.keeps_scores(layer):
        pair *= b * max(prof.heads / split, 1.0)
    return gemm_efficiency(ctx.cluster.device.gemm_efficiency, pair)


def _flops_time_s(ctx: Context, layer: LayerProfile, flops: float, b: int, split: int, cp: int) -> float:
    """Seconds for `flops` of this layer (per sample) on one rank: the GEMM share at the layer's
    GEMM efficiency, the rest of a block's FLOPs (attention core) at the attention efficiency."""
    if flops <= 0:
        return 0.0
    scale = b / (split * cp)
    gemm_fwd = sum(2.0 * g[0] * g[1] * g[2] for g in layer.gemm_shapes)
    other = max(layer.forward_flops - gemm_fwd, 0.0) / layer.forward_flops if layer.tp.kind == "block" else 0.0
    rate = ctx.gemm_peak_flops * layer_efficiency(ctx, layer, b, split, cp)  # fp8 GEMMs at the fp8 peak
    attn_rate = ctx.peak_flops * attention_efficiency(ctx, layer, b, split, cp) if other else rate
    return flops * scale * ((1 - other) / rate + other / attn_rate)


def timing_scale(ctx: Context, b: int) -> float:
    """Factor on the measured layer timings at microbatch b (Context.timing_scale: the whole
    model's in-place pass over the layers' sum), linear between the measured microbatches and
    held at the nearest beyond them; 1.0 when not measured."""
    pts = ctx.timing_scale
    if not pts:
        return 1.0
    if b <= pts[0][0]:
        return pts[0][1]
    if b >= pts[-1][0]:
        return pts[-1][1]
    return between(pts, b)


def layer_compute_s(ctx: Context, layer: LayerProfile, b: int, split: int, cp: int) -> tuple[float, float, float]:
    """(forward_s, backward_s, selective_recompute_s) of one layer, one microbatch, one rank."""
    overhead = ctx.cluster.calibration.kernel_overhead_s
    if ctx.measured and layer.timings:
        fwd, bwd = _interp_timing(layer, b)
        scale = timing_scale(ctx, b) / (split * cp)
        fwd, bwd = fwd * scale, bwd * scale
        sel = fwd * layer.recompute_flops_selective / layer.forward_flops if layer.forward_flops else 0.0
        return fwd + overhead, bwd + overhead, sel
    return (
        _flops_time_s(ctx, layer, layer.forward_flops, b, split, cp) + overhead,
        _flops_time_s(ctx, layer, layer.backward_flops, b, split, cp)
        + flash_recompute_s(ctx, layer, b, split, cp)
        + overhead,
        _selective_recompute_s(ctx, layer, b, split, cp),
    )


def _selective_recompute_s(ctx: Context, layer: LayerProfile, b: int, split: int, cp: int) -> float:
    """Seconds --recompute selective re-runs per microbatch: the attention core again at the
    attention efficiency (Megatron's policy), or under torchtitan's op-level policy the matmuls it
    did not keep (every second one; torchao's float8 linears reach the policy as aten.mm on
    Float8Tensor arguments, their _scaled_mm runs beneath it, as the equal memory of torchtitan's
    2024-12 bf16 and Float8 8B rows shows), each at its own GEMM size on the GEMM dtype's curve."""
    if ctx.spec.op_level_selective and layer.tp.kind == "block" and layer.recompute_flops_selective > 0:
        scale = b / (split * cp)
        rerun = [fl * scale for fl in op_policy_reruns(layer)]
        return sum(fl / (ctx.gemm_peak_flops * gemm_efficiency(ctx.gemm_curve, fl)) for fl in rerun)
    attn_rate = ctx.peak_flops * attention_efficiency(ctx, layer, b, split, cp)
    return layer.recompute_flops_selective * b / (split * cp) / attn_rate


def flash_recompute_s(ctx: Context, layer: LayerProfile, b: int, split: int, cp: int) -> float:
    """Seconds a flash attention backward spends recomputing the scores S = QK^T, one microbatch,
    one rank. A flash kernel keeps no s x s scores, so its backward runs five GEMMs per tile (S
    again, dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q; Dao 2023, FlashAttention-2 Alg. 2)
    where the profile's backward counts four, the model FLOPs (2x the core's forward, QK^T and
    AV; profiler/flop_formulas.py): one more QK^T is half the core's forward FLOPs (a block's
    forward FLOPs beyond its GEMMs, as _flops_time_s splits them), at the attention efficiency.
    A core that materialises the scores (Megatron-LM's baddbmm) keeps them and pays nothing."""
    prof = ctx.profile
    if layer.tp.kind != "block" or not prof.heads or ctx.keeps_scores(layer):
        return 0.0
    core_fwd = max(layer.forward_flops - sum(2.0 * g[0] * g[1] * g[2] for g in layer.gemm_shapes), 0.0)
    attn_rate = ctx.peak_flops * attention_efficiency(ctx, layer, b, split, cp)
    return 0.5 * core_fwd * b / (split * cp) / attn_rate


def recompute_overheads_s(ctx: Context, layer: LayerProfile, b: int) -> tuple[float, float]:
    """(full, selective) checkpoint machinery per microbatch of size b beyond the recomputed
    arithmetic: the measured recompute cost — in place on all ranks at once where measured
    (profiler/insitu.py, "recompute_full@1:bB"), else on one rank (profiler/wrapper_timing.py,
    "recompute_full:bB") — minus the forward the cost model charges at that microbatch B (full) or the modelled
    selective share of it, linear in b through the measured sizes (saved-tensor hooks and policy
    dispatch are per call, the copies and allocations they make grow with the bytes). Measured
    profiles only; the machinery's cost does not shrink with TP."""
    fw = layer.framework_overhead_s if ctx.measured and layer.timings else {}
    out = []
    for mode in ("full", "selective"):
        share = (
            1.0
            if mode == "full"
            else (layer.recompute_flops_selective / layer.forward_flops if layer.forward_flops else 0.0)
        )
        pts = measured_points(fw, f"recompute_{mode}@1") or measured_points(fw, f"recompute_{mode}")
        machinery = [
            (mb, max(0.0, measured - share * timing_scale(ctx, mb) * _interp_timing(layer, mb)[0]))
            for mb, measured in pts
        ]
        out.append(linear_in_b(machinery, b) or 0.0)
    return out[0], out[1]

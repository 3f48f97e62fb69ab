"""Memory per rank: activations by recompute mode, temporary buffers. Training state by state
layout, ZeRO stage and data-parallel method is the data-parallel cost object's (planner/rank/dp_cost.py).

Training state per parameter, unsharded (ZeRO, Rajbhandari et al. 2020 Sec 3; docs/design.md):
- "torch" (AMP / FSDP2 mixed precision, and fp32 training): fp32 weights 4 + fp32 grads 4 +
  Adam m, v 8 = 16 bytes.
- "megatron": bf16 weights 2 + fp32 main grads 4 + fp32 master + Adam 12 = 18 bytes.
ZeRO-3 holds only the layer being run (and the prefetched next one): stage_buffer_bytes.

Activations per layer (Korthikanti et al. 2022 Table 2): the layer's saved bytes, of which the
TP-replicated part (`10sbh`, Eq. 2) stays whole on every TP rank unless sequence parallelism
splits it; selective recompute keeps `selective_activation_bytes` (Eq. 6); full recompute keeps
only the layer input (`2sbh`, /t with sequence parallelism).
"""

from __future__ import annotations

import math

from meshplan.model_profile import LayerProfile
from meshplan.planner.context import Context
from meshplan.planner.cost.uniform_recompute import uniform_saved_bytes, uniform_transient_bytes
from meshplan.runtimes import DEEPSPEED_REDUCE_BUCKET_ELEMS

GIB = 1024**3


def replicated_activation_bytes(ctx: Context, layer: LayerProfile) -> float:
    """TP-replicated part of a layer's saved bytes per sample (Korthikanti Eq. 2's 10sbh)."""
    if layer.tp_replicated_activation_bytes > 0:
        return layer.tp_replicated_activation_bytes
    if layer.tp.kind == "block" and ctx.profile.hidden:
        return min(10.0 * ctx.seq * ctx.profile.hidden * ctx.profile.activation_dtype_bytes / 2, layer.activation_bytes)
    return 0.0


def recompute_modes(layer: LayerProfile) -> tuple[str, ...]:
    """Recompute choices that make sense for this layer (embedding and head: none)."""
    if layer.tp.kind in ("embedding", "head") or layer.activation_bytes <= layer.input_bytes:
        return ("none",)
    if 0 < layer.selective_activation_bytes < layer.activation_bytes:
        return ("none", "selective", "full")
    return ("none", "full")


def activation_scale(ctx: Context) -> float:
    """Profiles count activations at `activation_dtype_bytes` (2: bf16 training); an fp32 run
    (CPU ranks) saves its floating-point activations at 4 bytes (masks and indices aside)."""
    run_bytes = 4 if ctx.request.precision == "fp32" else 2
    return run_bytes / (ctx.profile.activation_dtype_bytes or 2)


def activation_bytes(ctx: Context, layer: LayerProfile, mode: str, b: int, split: int, cp: int, sp: bool) -> float:
    """Bytes one microbatch of this layer keeps for backward on one rank."""
    if mode == "full":  # the block input; one per group of N under Megatron's uniform method
        group = ctx.request.recompute_num_layers if layer.tp.kind == "block" else 1
        return uniform_saved_bytes(checkpoint_input_bytes(ctx, layer, b, split, cp, sp), group)
    return activation_scale(ctx) * _activation_bytes(ctx, layer, mode, b, split, cp, sp)


def checkpoint_input_bytes(ctx: Context, layer: LayerProfile, b: int, split: int, cp: int, sp: bool) -> float:
    """The input one microbatch of a fully recomputed layer keeps (its checkpoint), on one rank:
    sequence-sharded under sequence parallelism, at the run's activation dtype."""
    return activation_scale(ctx) * layer.input_bytes * b / cp / (split if sp else 1)


def _activation_bytes(ctx: Context, layer: LayerProfile, mode: str, b: int, split: int, cp: int, sp: bool) -> float:
    saved = layer.selective_activation_bytes if mode == "selective" else layer.activation_bytes
    rep = min(replicated_activation_bytes(ctx, layer), saved) if split > 1 else 0.0
    per_sample = (saved - rep) / split + (rep / split if sp else rep)
    return per_sample * b / cp


def _largest_tensor_elems(layer: LayerProfile, split: int) -> float:
    """Elements of the layer's largest weight on one TP rank: from its parameter shapes, else its
    largest GEMM's weight (n x k), else the whole layer."""
    if layer.param_shapes:
        sizes = [float(math.prod(shape)) for shape in layer.param_shapes]
    else:
        sizes = [float(n * k) for _, n, k in layer.gemm_shapes]
    return min(max(sizes, default=float(layer.num_params)), float(layer.num_params)) / split


def fsdp_unit_buffer_bytes(gather_bytes: int, reduce_bytes: int, buffers: str = "fsdp2") -> int:
    """Bytes per element of the largest ZeRO-3 unit held at its backward peak.

    - fsdp2 (torch 2.13 _fully_shard: _fsdp_param_group.pre_backward / post_backward,
      _fsdp_collectives.foreach_reduce), the moment before unit i's post_backward: its unsharded
      parameters and their unsharded gradients (both in the gather dtype), the all-gather output of
      unit i-1 (prefetched in i's pre_backward, copied out only in i-1's), and the reduce-scatter
      input of unit i+1, a copy in the reduce dtype kept by comm_ctx.reduce_scatter_states
      (reduce_scatter_max_input_buffers = 1) until i's post_backward pops it: 3 x gather + reduce,
      16 under fp32, 10 under bf16 weights with fp32 reduction.
    - backward_pre (FSDP1 BackwardPrefetch.BACKWARD_PRE): the unit's parameters, the next unit's
      and the unit's gradients in the parameter dtype; FSDP1 reduce-scatters the flat gradient
      itself, so a copy (reduce dtype) only where the reduce dtype differs: 3 x gather (+ reduce).
    - backward_post (BACKWARD_POST, Composer's default): the unit's parameters are freed before the
      next unit is gathered ("holding the next set of parameters and current set of gradients at
      the peak", torch.distributed.fsdp.BackwardPrefetch): 2 x gather (+ reduce)."""
    if buffers == "fsdp2":
        return 3 * gather_bytes + reduce_bytes
    copy = reduce_bytes if reduce_bytes != gather_bytes else 0
    return (2 if buffers == "backward_post" else 3) * gather_bytes + copy


def zero3_buffer_bytes(ctx: Context, layers: list[LayerProfile], split_of) -> float:
    """ZeRO-3's transient gathered weights and unsharded gradients on a rank. FSDP (prefetch 0:
    a whole layer ahead) holds the largest layer's buffers of fsdp_unit_buffer_bytes. DeepSpeed (request.zero3_prefetch_elems > 0) gathers per
    submodule: the running weight plus at most the prefetch bound in 16 bits, that weight's 16-bit
    gradient, and one reduce bucket of 16-bit gradients (RuntimeSpec.reduce_bucket_elems, else
    DeepSpeed's default reduce_bucket_size); a block's other weights are released after their
    submodule runs."""
    ahead = ctx.spec.zero3_prefetch_elems
    if ahead <= 0:
        unit = max(lp.num_params / split_of(lp) for lp in layers)
        spec = ctx.spec
        return fsdp_unit_buffer_bytes(spec.fsdp_gather_bytes, spec.fsdp_reduce_bytes, spec.fsdp_unit_buffers) * unit
    weight = max(_largest_tensor_elems(lp, split_of(lp)) for lp in layers)
    layer = max(lp.num_params / split_of(lp) for lp in layers)
    bucket = ctx.spec.reduce_bucket_elems or DEEPSPEED_REDUCE_BUCKET_ELEMS
    return 2 * min(weight + ahead, layer) + 2 * weight + 2 * min(bucket, layer)


def stage_buffer_bytes(ctx: Context, layers: list[LayerProfile], b: int, split_of, zero: int, cp: int) -> float:
    """Largest temporary buffers of a rank: the gathered bf16 weights and unsharded fp32 grads of
    the largest layer twice over (ZeRO-3 prefetch), and the loss's transient fp32 logit-sized
    tensors beyond the one the head keeps (head stage; RuntimeSpec.loss_held). DDP's buckets are per
    parameter (planner/rank/dp_cost.py)."""
    buf = 0.0
    if zero == 3 and layers:
        buf += zero3_buffer_bytes(ctx, layers, split_of)
    for lp in layers:
        if lp.tp.kind == "head":
            logits = fp32_logit_bytes(ctx, lp)
            copies = ctx.spec.loss_held(head_keeps_logits(lp, logits))
            buf += copies * logits * b / cp / split_of(lp)
    group = ctx.request.recompute_num_layers
    blocks = [lp for lp in layers if lp.tp.kind == "block"]
    if group > 1 and blocks:  # a uniform chunk's blocks re-run together (sequence parallel: if pinned)
        sp = bool(ctx.request.sequence_parallel)
        largest = max(activation_bytes(ctx, lp, "none", b, split_of(lp), cp, sp) for lp in blocks)
        buf += uniform_transient_bytes(largest, min(group, len(blocks)))
    return buf


def fp32_logit_bytes(ctx: Context, head: LayerProfile) -> float:
    """Bytes per sample of the loss's fp32 logits (s x vocab x 4, before the TP split): the
    cross-entropy works in fp32 whatever dtype the head's projection writes (a captured head
    reports its bf16 output; the closed-form head its fp32 logits). Without a vocabulary (a
    classifier), the head's output."""
    vocab = ctx.profile.vocab
    return 4.0 * ctx.seq * vocab if vocab else head.output_bytes


def head_keeps_logits(head: LayerProfile, logits: float) -> bool:
    """Whether the head's saved bytes already hold the loss's saved fp32 log-probabilities: a
    closed-form head counts them (Korthikanti's 4sbv, models/analytic.py); a captured head ends at
    its projection (the loss runs outside the module), so the loss's saved copy is one more."""
    return head.activation_bytes >= logits


def fits(total_bytes: float, capacity_bytes: float) -> bool:
    """The one feasibility test every path uses (search, estimate, brute force)."""
    return total_bytes <= capacity_bytes * (1 + 1e-12)

"""Memory per rank: training state by precision / state layout / ZeRO stage, activations by
recompute mode, temporary buffers.

Training state per parameter, unsharded (ZeRO, Rajbhandari et al. 2020 Sec 3; DESIGN.md):
- "torch" (AMP / FSDP2 mixed precision, and fp32 training): fp32 weights 4 + fp32 grads 4 +
  Adam m, v 8 = 16 bytes.
- "megatron": bf16 weights 2 + fp32 main grads 4 + fp32 master + Adam 12 = 18 bytes.
ZeRO-1 shards the optimizer states over the data-parallel group, ZeRO-2 also the gradients,
ZeRO-3 also the weights. FSDP2's ZeRO-2 (reshard_after_forward=False) keeps the gathered bf16
weights of every layer from its forward to its backward; ZeRO-3 holds only the layer being run
(and the prefetched next one).

Activations per layer (Korthikanti et al. 2022 Table 2): the layer's saved bytes, of which the
TP-replicated part (`10sbh`, Eq. 2) stays whole on every TP rank unless sequence parallelism
splits it; selective recompute keeps `selective_activation_bytes` (Eq. 6); full recompute keeps
only the layer input (`2sbh`, /t with sequence parallelism).
"""
from __future__ import annotations

from meshplan.model_profile import LayerProfile
from meshplan.planner.context import Context

GIB = 1024**3
DDP_BUCKET_BYTES = 25 * 1024**2
"""PyTorch DDP's default bucket_cap_mb (the last-bucket rule in pipeline.py)."""

_STATE = {"torch": (4, 4, 8), "megatron": (2, 4, 12)}
"""(weights, grads, optimizer) bytes per parameter, unsharded."""


def state_bytes(ctx: Context) -> tuple[int, int, int]:
    return _STATE[ctx.request.state_layout]


def ddp_bucket_bytes_per_param(ctx: Context, zero: int, dp: int, tp: int) -> float:
    """PyTorch DDP (ZeRO-0/1, no tensor parallelism: executor/data_parallel.apply_ddp) allocates
    its buckets for every gradient when it is built (Reducer::initialize_buckets; buckets of at
    most bucket_cap_mb partition the gradients), and with gradient_as_bucket_view=False they are a
    second copy of the fp32 gradients. Megatron's contiguous grad buffer is the main grads."""
    if zero >= 2 or dp <= 1 or tp > 1 or ctx.request.state_layout != "torch":
        return 0.0
    return 4.0


def layer_static_bytes(ctx: Context, layer: LayerProfile, split: int, zero: int, dp: int,
                       tp: int = 1, num_microbatches: int = 1) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes of one layer on one rank; grads include DDP's bucket copy
    and, for ZeRO-2/3 accumulating over several microbatches without gradient sync (FSDP2,
    executor/parallelize._grad_sync), the unsharded gradients held until the last microbatch."""
    n = layer.num_params / split
    w, g, o = state_bytes(ctx)
    weights = n * w / (dp if zero >= 3 else 1)
    if zero == 2:
        weights += n * 2  # FSDP2 ZeRO-2: the gathered bf16 weights stay from forward to backward
    grads = n * g / (dp if zero >= 2 else 1) + n * ddp_bucket_bytes_per_param(ctx, zero, dp, tp)
    if zero >= 2 and dp > 1 and num_microbatches > 1 and ctx.request.state_layout == "torch":
        grads += n * g  # unsharded fp32 gradients accumulated across microbatches
    optim = n * o / (dp if zero >= 1 else 1)
    return weights, grads, optim


def replicated_activation_bytes(ctx: Context, layer: LayerProfile) -> float:
    """TP-replicated part of a layer's saved bytes per sample (Korthikanti Eq. 2's 10sbh)."""
    if layer.tp_replicated_activation_bytes > 0:
        return layer.tp_replicated_activation_bytes
    if layer.tp.kind == "block" and ctx.profile.hidden:
        return min(10.0 * ctx.seq * ctx.profile.hidden * ctx.profile.activation_dtype_bytes / 2,
                   layer.activation_bytes)
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
    return activation_scale(ctx) * _activation_bytes(ctx, layer, mode, b, split, cp, sp)


def _activation_bytes(ctx: Context, layer: LayerProfile, mode: str, b: int, split: int, cp: int, sp: bool) -> float:
    if mode == "full":
        return layer.input_bytes * b / cp / (split if sp else 1)
    saved = layer.selective_activation_bytes if mode == "selective" else layer.activation_bytes
    rep = min(replicated_activation_bytes(ctx, layer), saved) if split > 1 else 0.0
    per_sample = (saved - rep) / split + (rep / split if sp else rep)
    return per_sample * b / cp


def stage_buffer_bytes(ctx: Context, layers: list[LayerProfile], b: int, split_of, zero: int, cp: int) -> float:
    """Largest temporary buffers of a rank: the gathered bf16 weights and unsharded fp32 grads of
    the largest layer twice over (ZeRO-3 prefetch), a transient fp32 copy of the logits in the
    loss (head stage). DDP's buckets are per parameter (ddp_bucket_bytes_per_param)."""
    buf = 0.0
    if zero == 3 and layers:
        largest = max(lp.num_params / split_of(lp) for lp in layers)
        buf += 2 * (2 + 4) * largest
    for lp in layers:
        if lp.tp.kind == "head":
            buf += lp.output_bytes * b / cp / split_of(lp)
    return buf


def fits(total_bytes: float, capacity_bytes: float) -> bool:
    """The one feasibility test every path uses (search, estimate, brute force)."""
    return total_bytes <= capacity_bytes * (1 + 1e-12)

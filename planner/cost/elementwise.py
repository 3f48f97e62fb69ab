"""Memory-bound traffic an unfused implementation adds to a closed-form block (runtime behaviour
`elementwise`, meshplan/runtimes.py; `--elementwise`).

The generic memory-bound term (layer_cost.FWD_PASSES / BWD_PASSES) moves each saved byte a fixed
number of times: what fused kernels do (Megatron's fused LayerNorm, bias-GeLU, bias-dropout-add and
scale-mask-softmax; Transformer Engine's fused RMSNorm, rotary and SwiGLU; GQA read natively by
flash attention). The A100 calibration row ran so (presets.py). An implementation that runs the
same maths as separate torch ops moves more bytes; this module counts the extra, per token, in
bytes, for GPT-style and gated (Llama-style) blocks (_widths):

- "fused": nothing beyond the generic term.
- "eager" (torch ops one by one: torchtitan without `compile.enable`, meshplan's executor, an
  HF model under DeepSpeed):
  - RMSNorm, 2 per Llama block, width h, TP-replicated unless sequence parallel. Eager it is
    cast to fp32 (r2 w4), pow (r4 w4), mean (r4), x * rsqrt (r4 w4), cast back (r4 w2) and
    x weight (r2 w2): 36 B per element against a fused kernel's 4. Extra: 32.
  - Rotary on q (h) and k (kv): cast to fp32 (r2 w4), the complex product (r4 w4), cast back
    (r4 w2), 20 B per element against 4. Extra: 16.
  - GQA (kv < h): repeat_kv materialises K and V at full width for SDPA (r2kv w2h each).
  - SwiGLU: silu (r2 w2) then the product (r4 w2) over f, 10 B per element against a fused 6.
    Extra: 4.
  - The attention output transposed back to (b, s, h) before wo: a copy (r2 w2) over h.
  A GPT block's eager kernels (native layer_norm, gelu, addmm with bias) are each one pass as
  fused ones are; only the attention output copy is extra. (Eager dropout-add and eager
  materialised softmax are not counted: no runtime in the table runs them.)
- "compiled" (torch.compile / inductor): the elementwise chains fuse; the copies that feed an
  opaque kernel stay: repeated K and V (written at width h) and the attention output copy.

Backward: an unfused chain runs one gradient kernel per forward op, each reading the incoming
gradient and what the op saved and writing one gradient: about twice the forward's traffic
(BACKWARD_FACTOR). Full recompute repeats the forward's traffic (layer_cost.base_cost);
torchtitan's op-level selective recompute re-runs every non-matmul op, so its recompute repeats
it too. Under --precision fp8 an implementation that is not Transformer Engine (torchao float8:
torchtitan) casts each linear's input and output gradient dynamically and transposes the fp8
operands for the weight gradient (FP8_CAST_BYTES, FP8_TRANSPOSE_BYTES). Time = bytes / HBM
bandwidth, as the generic term. Measured profiles carry their own
timings and get nothing from here.
"""

from __future__ import annotations

from meshplan.model_profile import LayerProfile
from meshplan.planner.sac import projections

LEVELS = ("fused", "compiled", "eager")

BACKWARD_FACTOR = 2.0
"""Backward traffic of an unfused elementwise chain over its forward traffic."""

_NORM_EXTRA, _ROPE_EXTRA, _SWIGLU_EXTRA, _COPY = 32.0, 16.0, 4.0, 4.0
"""Extra bytes per element over fused kernels (module docstring)."""


def _widths(layer: LayerProfile) -> tuple[float, float, float, bool] | None:
    """(h, kv, f, gated) of a transformer block from its projections in forward order
    (sac.projections: a closed-form block's fused GEMMs split, a built model's one per linear):
    q, k, v, o, then fc1, fc2 (6) or w1, w3, w2 (7). A gated (SwiGLU) block is taken as
    Llama-style: RMSNorm and rotary."""
    if layer.tp.kind != "block":
        return None
    mats = projections(layer)
    if len(mats) not in (6, 7):
        return None
    return float(mats[0][2]), float(mats[1][1]), float(mats[-1][2]), len(mats) == 7


def extra_bytes_per_token(layer: LayerProfile, level: str, fp8: bool = False) -> dict[str, tuple[float, float]]:
    """Extra bytes per token of one block at `level`, {"forward": (replicated, split), "backward":
    (replicated, split)}: the replicated part (over h: the norms, the norms' outputs cast to fp8)
    is divided by t only under sequence parallelism, the split part (heads, FFN) always."""
    if level not in LEVELS:
        raise ValueError(f"elementwise level {level!r} is unknown; use one of {', '.join(LEVELS)}")
    widths = _widths(layer)
    if widths is None or level == "fused":
        return {"forward": (0.0, 0.0), "backward": (0.0, 0.0)}
    h, kv, f, gated = widths
    gqa = kv < h
    rep, split = 0.0, _COPY * h
    if level == "compiled":
        split += 4.0 * h if gqa else 0.0
    elif gated:
        rep += 2 * _NORM_EXTRA * h
        split += _ROPE_EXTRA * (h + kv) + (4.0 * (h + kv) if gqa else 0.0) + _SWIGLU_EXTRA * f
    bwd_rep, bwd_split = BACKWARD_FACTOR * rep, BACKWARD_FACTOR * split
    if fp8:
        # forward casts the linear inputs (the two norm outputs, the attention output, the FFN
        # activation); backward casts every linear's output gradient (q, k, v, o, fc1 or w1 and w3,
        # fc2 or w2) and transposes both fp8 operands of each weight-gradient GEMM
        cast = FP8_CAST_BYTES[level]
        outputs = 3 * h + 2 * kv + (2 * f if gated else f)
        rep += 2 * h * cast
        split += (h + f) * cast
        bwd_split += outputs * cast + (3 * h + f + outputs) * FP8_TRANSPOSE_BYTES
    return {"forward": (rep, split), "backward": (bwd_rep, bwd_split)}


FP8_CAST_BYTES = {"compiled": 3.0, "eager": 5.0}
"""Bytes per element of a dynamic (tensorwise) fp8 cast, torchao float8 (torchtitan
model.converters = float8): the bf16 tensor read for its amax (fused into the producer by
torch.compile, a separate read eager: 2) and read again to write fp8 (2 + 1). Transformer Engine
("fused") casts inside its fused norm + linear kernels and pays none of it."""

FP8_TRANSPOSE_BYTES = 2.0
"""An fp8 operand transposed for the weight-gradient GEMM (cuBLAS fp8 wants both in TN layout):
read 1, write 1."""


def extra_s(
    layer: LayerProfile,
    level: str,
    tokens: float,
    split: int,
    sp: bool,
    hbm_bytes_per_s: float,
    op_sac: bool,
    fp8: bool = False,
) -> tuple[float, float, float]:
    """(forward, backward, selective-recompute) seconds the unfused kernels (and, under fp8, the
    casts) add to one microbatch of `tokens` tokens (samples x seq / cp) of this block on one rank."""
    extra = extra_bytes_per_token(layer, level, fp8)

    def seconds(rep: float, part: float) -> float:
        return tokens * (rep / (split if sp else 1) + part / split) / hbm_bytes_per_s

    fwd = seconds(*extra["forward"])
    return fwd, seconds(*extra["backward"]), fwd if op_sac else 0.0

"""What `--recompute selective` keeps, as the runtime defines it (meshplan/runtimes.py,
behaviour `selective_recompute`), by re-targeting each block's selective fields.

- "attention core" (Megatron-LM, Megatron-Core `--recompute-granularity selective`; Korthikanti
  et al. 2022 Sec 5): the profile's own selective fields, unchanged. With flash attention the core
  keeps only its log-sum-exp, so it saves almost nothing (planner/cost/memory.py then offers no
  selective mode).
- "op" (torchtitan `[activation_checkpoint] mode = "selective"`, `selective_ac_option = "op"`;
  torchtitan/models/llama3/infra/parallelize.py `_save_list` and `_custom_policy`): inside each
  checkpointed block, outputs of `aten.mm` are saved except every second one (a per-block count,
  fresh for every call), outputs of SDPA (flash / efficient: the attention output and its fp32
  log-sum-exp) are saved, everything else (norms, rotary, SwiGLU, residual adds) is recomputed.
  Kept per sample: the block input + the odd-numbered matmul outputs in forward order + the
  attention output `2sh` + the log-sum-exp `4as`. Recomputed: the even-numbered matmuls' FLOPs
  (each at its own GEMM size on the GEMM curve, planner/cost/compute.py) and the memory-bound kernels of what is not kept.
  Torchtitan's Llama runs its matmuls unfused, in the order wq, wk, wv, wo, w1, w3, w2 (GQA: wk,
  wv have kv = h x kv_heads / heads outputs); a closed-form block's fused shapes are split so.
  Tensor parallelism is applied as planner/cost/memory.py applies it to any selective share (an
  approximation: a row-parallel matmul's output is a full-size partial sum before its reduce).

Per-layer "every k-th block" (`selective_ac_option = k`) is a full / none choice per block, which
the per-layer recompute solver already plans; the torchtitan export writes such a plan as k.
"""

from __future__ import annotations

import dataclasses

from meshplan.model_profile import LayerProfile, ModelProfile

POLICIES = ("attention core", "op")


def projections(layer: LayerProfile) -> list[tuple[float, float, float]]:
    """[m, n, k] per sample of each matmul of a block, in forward order, one per projection: a
    closed-form block's fused QKV and gate+up GEMMs (models/analytic.py) split into q, k, v and
    w1, w3 (GQA: k, v have kv = h x kv_heads / heads outputs); any other layer's shapes as listed."""
    shapes = layer.gemm_shapes
    if layer.kind in ("gpt_block", "llama_block") and len(shapes) == 4:  # models/analytic.py, fused
        (s, qkv, h), _, (_, up, _), (_, _, f) = shapes
        kv = (qkv - h) / 2
        mlp = [(f, h), (f, h)] if layer.kind == "llama_block" else [(f, h)]  # SwiGLU w1, w3 / GeLU fc1
        widths = [(h, h), (kv, h), (kv, h), (h, h)] + mlp + [(h, f)]
        return [(s, n, k) for n, k in widths]
    return [(m, n, k) for m, n, k in shapes]


def matmuls(layer: LayerProfile) -> list[tuple[float, float]]:
    """(output elements, FLOPs) per sample of each matmul of a block, in forward order (projections)."""
    return [(m * n, 2.0 * m * n * k) for m, n, k in projections(layer)]


def op_policy_reruns(layer: LayerProfile) -> list[float]:
    """FLOPs per sample of each matmul the op policy does not keep and so re-runs: the 2nd, 4th, ..."""
    return [fl for i, (_, fl) in enumerate(matmuls(layer)) if i % 2 == 1]


def _op_policy(layer: LayerProfile, profile: ModelProfile) -> LayerProfile:
    if layer.tp.kind != "block" or not layer.gemm_shapes or not profile.heads:
        return layer
    dtype = profile.activation_dtype_bytes or 2
    s, h, a = profile.seq_len, profile.hidden, profile.heads
    saved = sum(out for i, (out, _) in enumerate(matmuls(layer)) if i % 2 == 0) * dtype  # 1st, 3rd, ... kept
    recompute = sum(op_policy_reruns(layer))
    kept = layer.input_bytes + saved + dtype * s * h + 4.0 * a * s  # + SDPA output and log-sum-exp
    if kept >= layer.activation_bytes:
        return dataclasses.replace(layer, selective_activation_bytes=0.0, recompute_flops_selective=0.0)
    return dataclasses.replace(
        layer, selective_activation_bytes=float(kept), recompute_flops_selective=float(recompute)
    )


def with_selective(profile: ModelProfile, policy: str | None) -> ModelProfile:
    """The same model with its blocks' selective fields as `policy` defines selective recompute."""
    if policy in (None, "attention core"):
        return profile
    if policy != "op":
        raise ValueError(f"selective recompute policy {policy!r} is unknown; use {' or '.join(POLICIES)}")
    layers = [_op_policy(lp, profile) for lp in profile.layers]
    return dataclasses.replace(
        profile,
        layers=layers,
        notes=profile.notes + ["planner re-targeted selective recompute to torchtitan's op policy (planner/sac.py)"],
    )

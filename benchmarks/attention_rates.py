"""Attention kernel rates on a GPU beside the cost model's price for them (a section of the prepared
GPU script, benchmarks/gpu_check.py).

The cost model prices a flash attention core as a closed-form block counts it: the non-causal
`4 s^2 h` forward FLOPs per sample (Korthikanti et al. 2022 App. A), read on the device's GEMM
curve at one (sample, head) pair's GEMM size `2 s^2 d` (planner/cost/compute.attention_efficiency),
the backward at twice the forward plus the QK^T a flash backward runs again
(compute.flash_recompute_s): 2.5 forwards. Whether that price holds for a causal FlashAttention-2
kernel (torch SDPA's flash backend), a Hopper-native one (cuDNN) or the memory-efficient kernel,
at 1k-32k tokens, is what docs/validation.md leaves open without a GPU: this section times each
SDPA backend, forward and forward + backward, with CUDA events and writes measured / priced.
"""

from __future__ import annotations

import statistics

HEADS, HEAD_DIM = 32, 128
"""Llama-3 8B's attention: 32 query heads of 128 (K and V repeated to every head, as torchtitan
feeds SDPA)."""
TOKENS = 32768
"""Tokens per timed call: batch = TOKENS // seq (at least 1), so short sequences fill the GPU too."""
SEQS = (1024, 2048, 4096, 8192, 16384, 32768)
BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")
BACKWARD_FORWARDS = 2.5
"""A flash backward in forwards: the model's 2 (dQ, dK, dV through dS and dP) plus the QK^T it
recomputes (compute.flash_recompute_s)."""


def priced_s(curve: list[list[float]], peak_flops: float, seq: int, batch: int) -> tuple[float, float]:
    """(forward, backward) seconds the cost model charges one causal flash attention call of
    `batch` sequences of `seq` tokens over HEADS heads of HEAD_DIM: the profile's non-causal core
    FLOPs at the GEMM-curve efficiency of one (sample, head) pair."""
    from meshplan.planner.cost.compute import gemm_efficiency

    pair = 2.0 * seq * seq * HEAD_DIM
    forward = 4.0 * seq * seq * HEADS * HEAD_DIM * batch / (peak_flops * gemm_efficiency(curve, pair))
    return forward, BACKWARD_FORWARDS * forward


def causal_flops(seq: int, batch: int) -> tuple[float, float]:
    """(forward, backward) FLOPs a causal kernel does (FlashAttention papers' convention: half the
    square, the backward 2.5 forwards)."""
    forward = 2.0 * seq * seq * HEADS * HEAD_DIM * batch
    return forward, BACKWARD_FORWARDS * forward


def _timed(fn, repeats: int) -> float:
    import torch

    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def _time_sdpa(q, k, v, grad, repeats: int) -> tuple[float, float]:
    """(forward, forward + backward) seconds of one causal SDPA call under the active backend."""
    import torch.nn.functional as F

    def forward():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def both():
        forward().backward(grad)

    both()  # warm-up: kernel selection, workspace
    return _timed(forward, repeats), _timed(both, repeats)


def measure(seqs: tuple[int, ...] = SEQS, repeats: int = 5) -> list[dict]:
    """Each SDPA backend at each sequence length: measured forward and backward seconds (median
    of `repeats`, after a warm-up call), TFLOP/s on the causal FLOPs, and measured / priced."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from benchmarks.gpu_check import preset_for_gpu
    from meshplan.presets import cluster_preset

    device = cluster_preset(preset_for_gpu(), 1).device
    peak = device.peak_flops["bf16"]
    rows = []
    for seq in seqs:
        batch = max(1, TOKENS // seq)
        shape = (batch, HEADS, seq, HEAD_DIM)
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        grad = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        price_f, price_b = priced_s(device.gemm_efficiency, peak, seq, batch)
        flops_f, flops_b = causal_flops(seq, batch)
        for name in BACKENDS:
            row: dict = {"backend": name, "seq": seq, "batch": batch, "priced_forward_s": price_f}
            try:
                with sdpa_kernel([getattr(SDPBackend, name)]):
                    fwd, total = _time_sdpa(q, k, v, grad, repeats)
            except (RuntimeError, AttributeError) as exc:  # a backend this GPU / build lacks
                row["error"] = str(exc).splitlines()[0][:200]
                rows.append(row)
                continue
            bwd = max(total - fwd, 0.0)
            row.update(
                forward_s=fwd,
                backward_s=bwd,
                forward_tflops=flops_f / fwd / 1e12,
                backward_tflops=flops_b / bwd / 1e12 if bwd else None,
                forward_over_priced=fwd / price_f,
                backward_over_priced=bwd / price_b,
            )
            rows.append(row)
        del q, k, v, grad
        torch.cuda.empty_cache()
    return rows

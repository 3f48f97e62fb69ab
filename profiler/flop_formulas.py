"""FLOP formulas torch's counter lacks: the CPU fused attention kernels.

On CPU (real or fake tensors) `F.scaled_dot_product_attention` dispatches to
`aten._scaled_dot_product_flash_attention_for_cpu(_backward)`, which has no entry in
`torch.utils.flop_counter`, so attention would count 0 FLOPs.
Forward: QK^T and PV, 2 * 2bs^2h = 4bs^2h (Korthikanti et al. 2022 App. A, full, not causal-
halved). Backward: model FLOPs, 2x forward (the four GEMMs dQ, dK, dV, dP); the fused kernel
also recomputes QK^T (hardware FLOPs), which MFU by convention does not count.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import flop_registry, register_flop_formula, sdpa_flop_count

aten = torch.ops.aten

ATTENTION_CORE_OPS = {
    aten._scaled_dot_product_flash_attention_for_cpu.default,
    aten._scaled_dot_product_flash_attention.default,
    aten._scaled_dot_product_efficient_attention.default,
    aten._scaled_dot_product_cudnn_attention.default,
}
"""Ops that make up the attention core (what selective recompute recomputes)."""


def _forward(query, key, value, *args, out_shape=None, **kwargs) -> int:
    return sdpa_flop_count(query, key, value)


def _backward(grad_out, query, key, value, *args, out_shape=None, **kwargs) -> int:
    return 2 * sdpa_flop_count(query, key, value)


def register_cpu_attention_formulas() -> None:
    """Idempotent: add the CPU flash-attention formulas to torch's FLOP registry."""
    fwd = aten._scaled_dot_product_flash_attention_for_cpu
    bwd = aten._scaled_dot_product_flash_attention_for_cpu_backward
    if fwd not in flop_registry:
        register_flop_formula(fwd)(_forward)
    if bwd not in flop_registry:
        register_flop_formula(bwd)(_backward)

"""Closed forms for what a GPT block saves for backward (the check on the measured capture).

Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", Eq. 1:
a transformer layer with 16-bit activations saves sbh(34 + 5as/h) bytes
(s = sequence, b = microbatch, h = hidden, a = heads). Its terms, in bytes:
  attention  11sbh + 5as^2b = QKV-GEMM input 2sbh, Q and K 4sbh, softmax output 2as^2b,
             softmax dropout mask as^2b, dropout output 2as^2b, V 2sbh,
             output-projection input 2sbh, attention dropout mask sbh;
  MLP        19sbh = fc1 input 2sbh, GeLU input 8sbh, fc2 input 8sbh, dropout mask sbh;
  LayerNorm  4sbh  = the two LayerNorm inputs.
Adapted to OUR block (models/zoo/gpt.py):
  - no dropout: drop the two sbh masks and the as^2b softmax mask            -> 32sbh + 4as^2b;
  - attention is fused SDPA (flash on CPU and GPU): it saves Q, K, V, its output O and the
    fp32 log-sum-exp (4asb bytes) instead of the softmax output and dropout output (4as^2b);
    O is the same storage the output projection saves, so it adds nothing;
  - LayerNorm also saves mean and rstd per token: 2 norms x 2 x s b x (element bytes).
Total = 32sbh + 4asb + 4sb*e bytes at e = 2 bytes per activation element (the 32 and 4sb*e
scale with e/2). Selective recompute (Korthikanti §4.2: recompute the attention core) then
frees only what the core alone keeps: the log-sum-exp, 4asb bytes, for 4bs^2h extra FLOPs.
"""

from __future__ import annotations


def gpt_block_activation_bytes(s: int, b: int, h: int, a: int, element_bytes: int = 2) -> int:
    """Bytes a GPT block (no dropout, fused attention) saves for backward; see module docstring."""
    return 16 * s * b * h * element_bytes + 4 * a * s * b + 4 * s * b * element_bytes


def gpt_block_selective_bytes(s: int, b: int, h: int, a: int, element_bytes: int = 2) -> int:
    """Saved bytes with the attention core recomputed: the log-sum-exp is no longer kept."""
    return gpt_block_activation_bytes(s, b, h, a, element_bytes) - 4 * a * s * b


def korthikanti_eq1_bytes(s: int, b: int, h: int, a: int) -> float:
    """Korthikanti et al. 2022 Eq. 1 as published (dropout, unfused attention, 16-bit)."""
    return s * b * h * (34 + 5 * a * s / h)

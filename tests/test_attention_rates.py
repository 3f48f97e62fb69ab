"""benchmarks/attention_rates.py prices an SDPA call as the cost model prices a flash block's core:
checked against the planner's own functions on a closed-form Llama block, so the GPU section's
measured / priced column compares a kernel with what plans are really charged."""

from __future__ import annotations

import pytest

from benchmarks.attention_rates import BACKWARD_FORWARDS, HEAD_DIM, HEADS, causal_flops, priced_s
from meshplan.models.analytic import llama_profile
from meshplan.planner import PlanRequest
from meshplan.planner.context import Context
from meshplan.planner.cost.compute import attention_efficiency, flash_recompute_s
from meshplan.presets import cluster_preset


@pytest.mark.parametrize("seq", [1024, 8192, 32768])
def test_the_price_is_the_planners_flash_core(seq):
    prof = llama_profile(layers=1, hidden=HEADS * HEAD_DIM, heads=HEADS, kv_heads=8, ffn_hidden=14336, seq=seq)
    cluster = cluster_preset("h100-80g", 8)
    ctx = Context.build(prof, cluster, PlanRequest(num_gpus=8, global_batch=8, runtime="torchtitan"))
    block = next(lp for lp in prof.layers if lp.tp.kind == "block")
    gemms = sum(2.0 * g[0] * g[1] * g[2] for g in block.gemm_shapes)
    core = block.forward_flops - gemms  # the profile's non-causal 4 s^2 h
    peak = ctx.peak_flops
    planner_forward = core / (peak * attention_efficiency(ctx, block, 1, 1, 1))
    forward, backward = priced_s(cluster.device.gemm_efficiency, peak, seq, batch=1)
    assert forward == pytest.approx(planner_forward, rel=1e-9)
    # the backward: twice the core plus the QK^T the flash backward recomputes
    assert backward == pytest.approx(2 * planner_forward + flash_recompute_s(ctx, block, 1, 1, 1), rel=1e-9)


def test_causal_work_is_half_the_counted_square():
    forward, backward = causal_flops(4096, batch=2)
    assert forward == 0.5 * 4 * 4096**2 * HEADS * HEAD_DIM * 2
    assert backward == BACKWARD_FORWARDS * forward

"""Runtime behaviour cp_kv_exchange: torch's context_parallel (torchtitan, meshplan) gathers every
rank's K and V at the first ring step, at the width SDPA receives them (the model repeats K/V to
every query head), and waits for them at the second step, so only the first step's attention
hides the gather; Megatron-Core's ring sends one GQA block per step under that step's compute."""

from __future__ import annotations

import pytest

from meshplan.planner import estimate
from meshplan.planner.context import Context
from meshplan.planner.cost.comm import collective_s, group_tier
from meshplan.planner.cost.compute import layer_compute_s
from meshplan.planner.rank.layer_cost import _cp_comm_s, _ring_merge_s, base_cost
from meshplan.validation.published import cli_inputs

LLAMA_405B = "layers=8 hidden=16384 heads=128 kv_heads=8 ffn_hidden=53248 vocab=128256 seq=262144"
ARGV = ["estimate", "--model", "analytic:llama", "--set", *LLAMA_405B.split(), "--cluster", "h100-96g"]
ARGV += "--num-gpus 512 --global-batch 8 --tp 8 --pp 8 --dp 1 --cp 8 --zero 2 --microbatch 1".split()
ARGV += "--recompute full --sequence-parallel --schedule 1f1b --runtime torchtitan".split()


def _ctx(*extra: str) -> Context:
    return Context.build(*cli_inputs([*ARGV, *extra]))


def test_the_gather_carries_every_heads_kv_and_hides_behind_one_step():
    ctx = _ctx()
    block = next(lp for lp in ctx.layers if lp.tp.kind == "block")
    fwd, bwd, _ = layer_compute_s(ctx, block, 1, 8, 8)
    got_fwd, got_bwd = _cp_comm_s(ctx, block, 1, 8, 8, fwd, bwd)
    kv = 2 * block.input_bytes / 8  # K and V at all 128 heads, this TP rank's 16
    one = collective_s(ctx.cluster, "all_gather", 8, kv, group_tier(ctx.cluster, 8, 8))
    gemm = sum(2.0 * g[0] * g[1] * g[2] for g in block.gemm_shapes)
    attn = (block.forward_flops - gemm) / block.forward_flops
    assert got_fwd == pytest.approx(one - attn * fwd / 8)
    assert got_bwd == pytest.approx(2 * one - attn * bwd / 8)
    assert got_fwd > 0 and got_bwd > 0  # across nodes at 256k the gather outlasts one step

    ring = _ctx("--cp-kv-exchange", "ring")
    assert _cp_comm_s(ring, block, 1, 8, 8, fwd, bwd) == (0.0, 0.0)  # 1/16 the bytes, under every step


def test_a_full_recompute_gathers_kv_again():
    ctx = _ctx()
    block = next(lp for lp in ctx.layers if lp.tp.kind == "block")
    fwd, bwd, _ = layer_compute_s(ctx, block, 1, 8, 8)
    cp_fwd, cp_bwd = _cp_comm_s(ctx, block, 1, 8, 8, fwd, bwd)
    costs = base_cost(ctx, block, 1, 8, True, 8)
    merge_fwd, merge_bwd = _ring_merge_s(ctx, block, 1, 8, 8)
    assert costs.cp_s["full"] == pytest.approx(2 * (cp_fwd + merge_fwd) + cp_bwd + merge_bwd)


def test_it_reaches_the_step():
    gathered = estimate(*cli_inputs(ARGV)).prediction
    ring = estimate(*cli_inputs([*ARGV, "--cp-kv-exchange", "ring"])).prediction
    assert gathered.breakdown["cp_comm"] > 0 == ring.breakdown["cp_comm"]
    assert gathered.step_time_s > ring.step_time_s


def test_torch_ring_attention_merges_and_copies_cost_hbm_time_per_step():
    """torch's ring attention upcasts, merges and concatenates outside SDPA (layer_cost.RING_MERGE_*):
    bytes per element of the rank's query block, once per call plus per later ring step; Megatron-Core's
    ring (Transformer Engine) pays none of it."""
    from meshplan.planner.rank.layer_cost import RING_MERGE_BYTES

    ctx = _ctx()
    block = next(lp for lp in ctx.layers if lp.tp.kind == "block")
    elems = block.input_bytes / 2 / (8 * 8)  # b = 1, s / cp, this TP rank's 16 of 128 heads
    hbm = ctx.cluster.device.hbm_gbps * 1e9
    fwd, bwd = _ring_merge_s(ctx, block, 1, 8, 8)
    (f_once, f_step), (b_once, b_step) = RING_MERGE_BYTES["eager"]  # torchtitan without --compile
    assert fwd == pytest.approx((f_once + 7 * f_step) * elems / hbm)
    assert bwd == pytest.approx((b_once + 7 * b_step) * elems / hbm)
    compiled = _ring_merge_s(_ctx("--compile"), block, 1, 8, 8)
    assert 0 < compiled[0] < fwd and 0 < compiled[1] < bwd  # inductor fuses the merges, drops dead copies
    assert _ring_merge_s(ctx, block, 1, 8, 4)[0] < fwd  # fewer steps, fewer merges
    assert _ring_merge_s(_ctx("--cp-kv-exchange", "ring"), block, 1, 8, 8) == (0.0, 0.0)

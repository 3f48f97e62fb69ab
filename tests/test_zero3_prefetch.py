"""Runtime behaviour zero3_prefetch_elems: DeepSpeed fetches at most stage3_prefetch_bucket_size
(5e7) ZeRO-3 parameter elements ahead of use, so a larger layer's gathers wait on the critical
path; FSDP2 (meshplan, torchtitan) issues the next layer's all-gather whole and hides it."""

from __future__ import annotations

import pytest
from planner_profiles import candidate

from meshplan.planner import estimate
from meshplan.planner.context import Context
from meshplan.planner.rank.dp_cost import DataParallelCost
from meshplan.validation.published import cli_inputs

GPT3 = ["--model", "analytic:gpt", "--set", "layers=8", "hidden=12288", "heads=96", "vocab=51200", "seq=2048"]
PINS = "--cluster a100-80g --num-gpus 384 --global-batch 1536 --tp 1 --pp 1 --dp 384 --zero 3 --microbatch 4"
PINS += " --recompute full --schedule 1f1b"


def _inputs(*extra: str):
    return cli_inputs(["estimate", *GPT3, *PINS.split(), *extra])


def _dp_comm_s(*extra: str) -> float:
    return estimate(*_inputs(*extra)).prediction.breakdown["dp_comm"]


def test_deepspeed_leaves_a_large_layers_gathers_exposed():
    deepspeed = _dp_comm_s("--runtime", "deepspeed")
    prefetched = _dp_comm_s("--runtime", "deepspeed", "--zero3-prefetch-elems", "0")
    fsdp2 = _dp_comm_s(
        "--runtime", "torchtitan", "--state-layout", "zero", "--fsdp-reduce-dtype", "bf16"
    )  # 16 bits too
    assert deepspeed > 5 * prefetched  # 1.8e9-element blocks: 97% of each gather waits
    assert fsdp2 == pytest.approx(prefetched, rel=0.2)


def test_the_exposed_share_is_what_does_not_fit_the_prefetch_bound():
    """With a 1e9-element bound the 1.8e9-parameter block waits for 1 - 1e9/1.8e9 of its two gathers
    (forward, backward); the 6.3e8-parameter LM head fits the bound and hides behind compute."""
    profile, cluster, request = _inputs(
        "--runtime", "deepspeed", "--zero3-prefetch-elems", "1000000000", "--zero3-gather", "layer"
    )
    ctx = Context.build(profile, cluster, request)
    cand = candidate(dp_shard=384, microbatch=4, zero=3)
    dp = DataParallelCost(ctx, cand)
    block, head = ctx.layers[1], ctx.layers[-1]
    assert head.num_params < 1e9 < block.num_params
    data = dp.layer(block, 1, 4, 1)
    assert data.exposed_s / (2 * _gather_s(dp, block)) == pytest.approx(1 - 1e9 / block.num_params, rel=1e-6)
    assert 0 < data.exposed_s < data.comm_s
    assert dp.layer(head, 1, 4, 1).exposed_s == 0


def _gather_s(dp: DataParallelCost, layer) -> float:
    from meshplan.planner.cost.comm import collective_s
    from meshplan.planner.rank.dp_cost import fsdp_width, gathered_elems

    elems = gathered_elems(layer, 1, dp.shard) * dp.shard
    return collective_s(dp.ctx.cluster, "all_gather", dp.shard, elems * fsdp_width(dp.ctx), dp.shard_tier)


def test_deepspeed_holds_a_submodule_not_two_blocks():
    """530B (5e9 parameters a block) under ZeRO-3 on 640 A100 (Narayanan et al. 2021 Table 2 ran it
    with DeepSpeed): FSDP2's gathered blocks (10 bytes a parameter, 50 GB) leave no room;
    DeepSpeed's running weight (fc1, 1.7e9) + prefetch, its 16-bit gradient and a 5e8 bucket fit."""
    shape = ["--set", "layers=105", "hidden=20480", "heads=128", "vocab=51200", "seq=2048"]
    argv = ["estimate", "--model", "analytic:gpt", *shape, "--cluster", "a100-80g", "--num-gpus", "640"]
    argv += (
        "--global-batch 2560 --tp 1 --pp 1 --dp 640 --zero 3 --microbatch 4 --recompute full --schedule 1f1b".split()
    )
    deepspeed = estimate(*cli_inputs([*argv, "--runtime", "deepspeed"])).prediction
    as_fsdp2 = ["--zero3-prefetch-elems", "0", "--fsdp-unit-buffers", "fsdp2", "--fsdp-reduce-dtype", "fp32"]
    fsdp2 = estimate(*cli_inputs([*argv, "--runtime", "deepspeed", *as_fsdp2])).prediction
    block = 12 * 20480**2
    gib = 2**30
    fsdp2_unit = (3 * 2 + 4) * block  # block i's bf16 params and grads, i-1's gather, i+1's fp32 RS input
    assert fsdp2.stage_memory[0].buffers_bytes >= fsdp2_unit
    weight = 4 * 20480**2  # fc1
    assert deepspeed.stage_memory[0].buffers_bytes == pytest.approx(
        fsdp2.stage_memory[0].buffers_bytes - fsdp2_unit + 2 * (weight + 5e7) + 2 * weight + 2 * 5e8, rel=1e-3
    )
    assert deepspeed.peak_memory_bytes < 80 * gib < fsdp2.peak_memory_bytes


def test_fsdp2_buffers_are_the_largest_unit_at_16_bytes_under_fp32():
    """fp32 ZeRO-3 (the gloo runs): unit i's params and grads, unit i-1's all-gather output and unit
    i+1's reduce-scatter input, 4 bytes each (planner/cost/memory.py fsdp_unit_buffer_bytes); a
    bf16-weight reading (2 bytes gathered) would under-price them by a quarter."""
    shape = ["--set", "layers=4", "hidden=384", "heads=6", "vocab=256", "seq=32"]
    argv = ["estimate", "--model", "gpt", *shape, "--cluster", "local-cpu", "--num-gpus", "4", "--precision", "fp32"]
    argv += "--global-batch 8 --tp 1 --pp 1 --dp 4 --zero 3 --microbatch 2 --recompute none --schedule 1f1b".split()
    got = estimate(*cli_inputs(argv)).prediction.stage_memory[0].buffers_bytes
    block = 12 * 384**2 + 13 * 384  # a block's weights and biases
    assert got == pytest.approx(16 * block, rel=0.01)

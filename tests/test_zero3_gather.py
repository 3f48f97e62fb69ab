"""Runtime behaviour zero3_gather and the ring's hop latency: DeepSpeed gathers every submodule in
its own all-gather (and again for a full recompute's forward), each paying the latency of a ring
over all the data-parallel ranks, of which only the hops between nodes cross the network."""

from __future__ import annotations

import pytest
from planner_profiles import candidate

from meshplan.planner import estimate
from meshplan.planner.context import Context
from meshplan.planner.cost.comm import collective_latency_s, collective_s, group_tier, ring_latency_s
from meshplan.planner.rank.dp_cost import DataParallelCost
from meshplan.presets import cluster_preset
from meshplan.validation.published import cli_inputs

GPT3 = ["--model", "analytic:gpt", "--set", "layers=8", "hidden=12288", "heads=96", "vocab=51200", "seq=2048"]
PINS = "--cluster a100-80g --num-gpus 384 --global-batch 1536 --tp 1 --pp 1 --dp 384 --zero 3 --microbatch 4"
PINS += " --schedule 1f1b --runtime deepspeed"


def test_a_ring_pays_the_network_latency_only_between_nodes():
    """384 ranks, 8 a node: an all-gather's 383 hops are 47 between the 48 nodes and 336 NVLink
    hops (NCCL tuning.cc); an all-reduce runs the ring twice."""
    cluster = cluster_preset("a100-80g", 384)
    tier = group_tier(cluster, 1, 384)
    inter, intra = cluster.inter_node.latency_s, cluster.intra_node.latency_s
    assert intra < inter
    assert ring_latency_s(cluster, "all_gather", 384, tier) == pytest.approx(47 * inter + 336 * intra)
    assert ring_latency_s(cluster, "all_reduce", 384, tier) == pytest.approx(2 * (47 * inter + 336 * intra))
    one_per_node = group_tier(cluster, 8, 48)  # data parallel across tensor-parallel groups of 8
    assert ring_latency_s(cluster, "all_gather", 48, one_per_node) == pytest.approx(47 * inter)
    inside = group_tier(cluster, 1, 8)
    assert ring_latency_s(cluster, "all_gather", 8, inside) == pytest.approx(7 * intra)
    tiny = collective_s(cluster, "all_gather", 384, 1.0, tier)
    assert tiny == pytest.approx(collective_latency_s(cluster, "all_gather", 384, tier), rel=1e-3)


def _dp(*extra: str):
    profile, cluster, request = cli_inputs(["estimate", *GPT3, *PINS.split(), "--recompute", "full", *extra])
    ctx = Context.build(profile, cluster, request)
    cand = candidate(dp_shard=384, microbatch=4, zero=3)
    return DataParallelCost(ctx, cand), ctx


def test_deepspeed_pays_one_collective_latency_per_submodule():
    """A GPT block's TP rule names 8 submodules with parameters (q, k, v, o, fc1, fc2, two norms):
    DeepSpeed's gather of the block costs 7 more ring latencies than FSDP2's one all-gather."""
    module, ctx = _dp()
    layer, _ = _dp("--zero3-gather", "layer")
    block = ctx.layers[1]
    rule = block.tp
    assert len(rule.column) + len(rule.row) + len(rule.replicated) == 8
    alpha = collective_latency_s(ctx.cluster, "all_gather", 384, module.shard_tier)
    assert alpha > 1e-3  # milliseconds at 384 ranks
    local = block.num_params
    assert module._gather_s(block, local) - layer._gather_s(block, local) == pytest.approx(7 * alpha)


def test_deepspeed_gathers_again_for_the_recompute_fsdp2_does_not():
    module, ctx = _dp()
    layer, _ = _dp("--zero3-gather", "layer")
    block = ctx.layers[1]
    ds, fsdp = module.layer(block, 1, 4, 1), layer.layer(block, 1, 4, 1)
    assert ds.recompute_gather_s == pytest.approx(module._gather_s(block, block.num_params))
    assert 0 < ds.recompute_gather_exposed_s <= ds.recompute_gather_s
    assert fsdp.recompute_gather_s == 0 == fsdp.recompute_gather_exposed_s


def test_the_recompute_gather_reaches_the_step_only_under_full_recompute():
    argv = ["estimate", *GPT3, *PINS.split()]
    full = estimate(*cli_inputs([*argv, "--recompute", "full"])).prediction.breakdown["dp_comm"]
    none = estimate(*cli_inputs([*argv, "--recompute", "none"])).prediction.breakdown["dp_comm"]
    full_fsdp = estimate(*cli_inputs([*argv, "--recompute", "full", "--zero3-gather", "layer"])).prediction
    none_fsdp = estimate(*cli_inputs([*argv, "--recompute", "none", "--zero3-gather", "layer"])).prediction
    assert full > 1.3 * none  # a third gather per block
    assert full_fsdp.breakdown["dp_comm"] == pytest.approx(none_fsdp.breakdown["dp_comm"], rel=0.05)

"""The cost model against the formulas it cites and the layer measurements it is calibrated by."""

from __future__ import annotations

import dataclasses

import pytest
from planner_profiles import candidate

from meshplan import runtimes
from meshplan.cluster import CollectiveFit
from meshplan.model_profile import LayerTiming
from meshplan.models.analytic import gpt_profile
from meshplan.planner import PlanRequest, estimate
from meshplan.planner.context import Context
from meshplan.planner.cost.comm import collective_s, group_tier, p2p_s
from meshplan.planner.cost.memory import activation_bytes
from meshplan.planner.cost.pipeline import in_flight
from meshplan.planner.rank.layer_cost import layer_cost as _layer_cost
from meshplan.planner.seqscale import with_seq_len
from meshplan.presets import cluster_preset, local_cpu


def layer_cost(ctx, layer, b, tp, sp, cp, zero, dp):
    """One layer's cost on a candidate with these degrees (dp replicated, or sharded for ZeRO-2/3)."""
    cand = candidate(
        dp_replicate=1 if zero >= 2 else dp,
        dp_shard=dp if zero >= 2 else 1,
        cp=cp,
        tp=tp,
        microbatch=b,
        num_microbatches=max(ctx.request.global_batch // (dp * b), 1),
        zero=zero,
        sequence_parallel=sp,
    )
    return _layer_cost(ctx, layer, cand)


P22 = gpt_profile(layers=48, hidden=6144, heads=64)
MEGATRON_LM = runtimes.request_behaviours("megatron-lm", {})
"""The PlanRequest behaviours of Korthikanti et al.'s runs (Megatron-LM's engine and state layout)."""
S, H, A, T, B = 2048, 6144, 64, 8, 4


def _ctx(profile=P22, n=8, preset="a100-80g", **req):
    return Context.build(profile, cluster_preset(preset, n), PlanRequest(num_gpus=n, global_batch=4, **req))


@pytest.mark.parametrize(
    "sp,mode,measured_ms",
    [
        (False, "none", 19.6),
        (True, "none", 19.0),
        (False, "full", 27.2),
        (False, "selective", 20.9),
        (True, "selective", 20.3),
    ],
)
def test_korthikanti_table4_layer_times(sp, mode, measured_ms):
    """22B layer, b=4, t=8 (Korthikanti et al. 2022 Table 4). The first row calibrates the A100
    GEMM plateau (presets.py); the other four are predictions, under Megatron-LM's engine (its SP regather)."""
    ctx = _ctx(**MEGATRON_LM)
    got_ms = layer_cost(ctx, P22.layers[1], B, T, sp, 1, 0, 1).modes[mode].time_s * 1e3
    assert got_ms == pytest.approx(measured_ms, rel=0.05 if (sp, mode) != (False, "none") else 0.01)


def test_megatron_sequence_parallel_gathers_the_linear_inputs_again_in_backward():
    """Megatron-LM's SP saves the sharded input of QKV and FC1 and all-gathers it again for the
    weight gradient; torch's DTensor SP (the executor) keeps the gathered input."""
    from meshplan.planner.rank.layer_cost import _tp_comm_s

    block = P22.layers[1]
    gather = collective_s(cluster_preset("a100-80g", 8), "all_gather", T, block.output_bytes * B, "intra_node")
    torch_fwd, torch_bwd = _tp_comm_s(_ctx(), block, B, T, 1, True)
    mega_fwd, mega_bwd = _tp_comm_s(_ctx(**MEGATRON_LM), block, B, T, 1, True)  # runtime behaviour sp_regather
    assert mega_fwd == torch_fwd and gather > 0
    assert mega_bwd == pytest.approx(torch_bwd + block.tp.num_allreduce_fwd * gather)
    assert _tp_comm_s(_ctx(**MEGATRON_LM), block, B, T, 1, False) == _tp_comm_s(_ctx(), block, B, T, 1, False)


@pytest.mark.parametrize(
    "sp,mode,per_sbh",
    [
        (False, "none", 10 + 24 / T + 5 * A * S / (H * T)),  # Eq. 2
        (True, "none", 34 / T + 5 * A * S / (H * T)),  # Eq. 4
        (False, "selective", 10 + 24 / T),  # Table 2
        (True, "selective", 34 / T),  # Eq. 6
        (False, "full", 2.0),
    ],
)  # Table 2, full recompute
def test_activation_bytes_follow_korthikanti(sp, mode, per_sbh):
    got = activation_bytes(_ctx(), P22.layers[1], mode, B, T, 1, sp)
    assert got == pytest.approx(S * B * H * per_sbh, rel=1e-9)


def test_interleaved_in_flight_is_korthikanti_factor():
    p, v = 8, 3
    cand = candidate(pp=p, tp=8, num_microbatches=64, schedule="Interleaved1F1B", virtual_stages=v)
    assert in_flight(cand, 0) == pytest.approx(p * (1 + (p - 1) / (p * v)))
    plain = dataclasses.replace(cand, schedule="1F1B", virtual_stages=1)
    assert [in_flight(plain, r) for r in range(p)] == list(range(p, 0, -1))


def test_mfu_uses_eq7_model_flops():
    prof = gpt_profile(layers=96, hidden=12288, heads=96)
    req = PlanRequest(
        num_gpus=64,
        global_batch=64,
        tp=8,
        pp=8,
        dp=1,
        microbatch=1,
        schedule="interleaved",
        virtual_stages=3,
        recompute="full",
    )
    plan = estimate(prof, cluster_preset("a100-80g", 64), req)
    s, h, L, V, Bg = 2048, 12288, 96, 51200, 64
    eq7 = 72 * Bg * L * s * h**2 * (1 + s / (6 * h) + V / (12 * h * L))
    pr = plan.prediction
    assert pr.mfu * pr.step_time_s * 64 * 312e12 == pytest.approx(eq7, rel=2e-3)
    assert pr.hfu > pr.mfu * 1.3  # full recompute adds a forward pass


def test_bubble_is_p_minus_1_over_m():
    req = PlanRequest(num_gpus=4, global_batch=8, tp=1, pp=4, dp=1, microbatch=1, schedule="gpipe")
    plan = estimate(gpt_profile(layers=8, hidden=1024, heads=16), cluster_preset("a100-80g", 4), req)
    bd = plan.prediction.breakdown
    per_mb = (plan.prediction.step_time_s - bd["bubble"] - bd["optimizer"] - bd["dp_comm"]) / 8
    assert bd["bubble"] == pytest.approx(3 * per_mb, rel=1e-9)


def test_estimate_reports_oom():
    req = PlanRequest(num_gpus=8, global_batch=4, tp=8, pp=1, dp=1, microbatch=4, recompute="none")
    plan = estimate(P22, cluster_preset("a100-80g", 8), req)
    assert plan.prediction.binding_constraint.startswith("OOM by")
    plan.validate()


def test_seq_override_scales_quadratic_part():
    longer = with_seq_len(P22, 2 * S)
    blk = longer.layers[1]
    assert blk.forward_flops == pytest.approx(24 * 2 * S * H**2 + 4 * (2 * S) ** 2 * H, rel=1e-9)
    assert blk.activation_bytes == pytest.approx(2 * S * H * (34 + 5 * A * 2 * S / H), rel=1e-9)


def test_state_bytes_by_layout_and_zero():
    prof = gpt_profile(layers=4, hidden=1024, heads=16)
    blk = prof.layers[1]
    torch_lc = layer_cost(_ctx(prof, n=8), blk, 1, 1, False, 1, 0, 8)
    # 16 bytes of state + DDP's bucket copy of the fp32 gradients (4)
    assert torch_lc.weights_bytes + torch_lc.grads_bytes + torch_lc.optim_bytes == 20 * blk.num_params
    alone = layer_cost(_ctx(prof, n=8), blk, 1, 1, False, 1, 0, 1)  # no DDP on one replica
    assert alone.weights_bytes + alone.grads_bytes + alone.optim_bytes == 16 * blk.num_params
    tp_lc = layer_cost(_ctx(prof, n=8), blk, 1, 2, False, 1, 0, 4)  # TP: bucketed reducer, no DDP
    assert tp_lc.weights_bytes + tp_lc.grads_bytes + tp_lc.optim_bytes == 8 * blk.num_params
    # Megatron's grad buffer is the main grads (runtime behaviour ddp_bucket_copy, not the state layout)
    mega = layer_cost(_ctx(prof, n=8, state_layout="megatron", ddp_bucket_copy=False), blk, 1, 1, False, 1, 0, 8)
    assert mega.weights_bytes + mega.grads_bytes + mega.optim_bytes == 18 * blk.num_params
    mega_ddp = layer_cost(_ctx(prof, n=8, state_layout="megatron"), blk, 1, 1, False, 1, 0, 8)  # torch DDP's buckets
    assert mega_ddp.weights_bytes + mega_ddp.grads_bytes + mega_ddp.optim_bytes == 22 * blk.num_params
    z3 = layer_cost(_ctx(prof, n=8), blk, 1, 1, False, 1, 3, 8)
    assert z3.weights_bytes + z3.grads_bytes + z3.optim_bytes == pytest.approx(2 * blk.num_params)
    # ZeRO-2 as FSDP2 (reshard_after_forward=False): the fp32 weights sharded, the gathered copy
    # (bf16 gathers: 2 B) kept forward to backward; DeepSpeed's ZeRO-2 keeps 16-bit weights whole
    z2 = layer_cost(_ctx(prof, n=8, fsdp_gather_bytes=2), blk, 1, 1, False, 1, 2, 8)
    assert z2.weights_bytes == pytest.approx((4 / 8 + 2) * blk.num_params)
    # (runtime behaviour zero2_shards_weights, not the state layout: the zero layout under FSDP2 shards)
    ds2 = layer_cost(_ctx(prof, n=8, state_layout="zero", zero2_shards_weights=False), blk, 1, 1, False, 1, 2, 8)
    assert ds2.weights_bytes == pytest.approx(2 * blk.num_params)
    fsdp_zero = layer_cost(_ctx(prof, n=8, state_layout="zero", fsdp_gather_bytes=2), blk, 1, 1, False, 1, 2, 8)
    assert fsdp_zero.weights_bytes == pytest.approx((2 / 8 + 2) * blk.num_params)


def test_measured_timings_are_used_on_cpu():
    prof = gpt_profile(layers=2, hidden=64, heads=4, vocab=128, seq=32)
    prof.device = "cpu"
    blk = prof.layers[1]
    blk.timings = [
        LayerTiming(microbatch_size=1, forward_s=0.01, backward_s=0.02),
        LayerTiming(microbatch_size=4, forward_s=0.03, backward_s=0.05),
    ]
    ctx = Context.build(prof, local_cpu(2), PlanRequest(num_gpus=2, global_batch=4))
    lc = layer_cost(ctx, blk, 2, 1, False, 1, 0, 2)
    assert lc.modes["none"].compute_s == pytest.approx(0.01 + 0.02 / 3 + 0.02 + 0.01, rel=1e-9)


def test_collective_fits_replace_link_tiers():
    spec = local_cpu(4)
    before = collective_s(spec, "all_reduce", 4, 1e6, "intra_node")
    spec.collectives = [CollectiveFit(collective="all_reduce", group_size=4, latency_s=1e-3, bandwidth_gbps=0.5)]
    assert collective_s(spec, "all_reduce", 4, 1e6, "intra_node") == pytest.approx(1e-3 + 1e6 / 0.5e9)
    assert before != collective_s(spec, "all_reduce", 4, 1e6, "intra_node")


def test_tp_within_a_node_uses_nvlink():
    spec = cluster_preset("a100-80g", 32)
    assert group_tier(spec, 1, 8) == "intra_node" and group_tier(spec, 1, 16) == "inter_node"
    assert collective_s(spec, "all_reduce", 16, 1e8, "inter_node") > 5 * collective_s(
        spec, "all_reduce", 8, 1e8, "intra_node"
    )


@pytest.mark.parametrize(
    "preset,nic_gbps,measured_busbw_gbps",
    [
        ("h100-80g", 50.0, 487.09),  # 2 x p5: EFA 3,200 Gb/s per node, all-reduce 16 GiB
        ("a100-80g", 6.25, 78.33),
    ],
)  # 2 x p4de: EFA 4 x 100 Gb/s per node, all-reduce 2 GiB
def test_a_group_spanning_nodes_uses_every_nic_of_its_node(preset, nic_gbps, measured_busbw_gbps):
    """nccl-tests on two 8-GPU nodes (a published run): the all-reduce's bus
    bandwidth is the node's NICs together, ~10x one GPU's share. The ring model (no tree or
    NVLS) stays below the measurement but within 2x; one NIC per rank would be 8-10x below."""
    spec = cluster_preset(preset, 16)  # two nodes on one switch: the nominal 0.9 of the wire
    spec.inter_node = dataclasses.replace(spec.inter_node, bandwidth_gbps=nic_gbps, efficiency={"default": 0.9})
    size, g = 16 * 1024**3 if preset == "h100-80g" else 2 * 1024**3, 16
    tier = group_tier(spec, 1, g)
    assert tier == "inter_node" and tier.ranks_per_node == 8
    busbw = size * 2 * (g - 1) / g / collective_s(spec, "all_reduce", g, size, tier) / 1e9
    assert 0.5 * measured_busbw_gbps < busbw < measured_busbw_gbps
    one_nic = size * 2 * (g - 1) / g / collective_s(spec, "all_reduce", g, size, "inter_node") / 1e9
    assert one_nic < 0.15 * measured_busbw_gbps
    # data parallel across t = 8 tensor-parallel ranks: one rank per node, its own NIC
    assert group_tier(spec, 8, 2).ranks_per_node == 1


def test_loss_moves_the_fp32_logits_more_than_a_layer_moves_its_activations():
    """The head's memory-bound time counts the cross-entropy's passes over the fp32 logits
    (StateLayout.loss_passes), not the generic 2 forward + 3 backward."""
    from meshplan.planner.rank.layer_cost import BWD_PASSES, FWD_PASSES, _memory_bound_s
    from meshplan.runtimes import STATE_LAYOUTS

    prof = gpt_profile(layers=2, hidden=2048, heads=16, vocab=131072, seq=4096)
    head = prof.layers[-1]
    for layout in ("megatron", "torch"):
        ctx = _ctx(prof, 8, "h100-80g", state_layout=layout)
        fwd, bwd, _ = _memory_bound_s(ctx, head, 4, 1, 1, False)
        hbm = ctx.cluster.device.hbm_gbps * 1e9
        logits, rest = 4 * head.output_bytes, 4 * (head.activation_bytes - head.output_bytes)
        assert fwd == pytest.approx((STATE_LAYOUTS[layout].loss_passes[0] * logits + FWD_PASSES * rest) / hbm)
        assert bwd == pytest.approx((STATE_LAYOUTS[layout].loss_passes[1] * logits + BWD_PASSES * rest) / hbm)
        assert sum(STATE_LAYOUTS[layout].loss_passes) > FWD_PASSES + BWD_PASSES


def test_a_captured_head_and_the_closed_form_head_pay_the_same_loss():
    """The loss's fp32 logits (s x vocab x 4) are what the cross-entropy keeps and moves, whatever
    dtype the head writes: the zoo's Llama head (captured: ends at its bf16 projection, the loss
    outside it) and the closed-form head (counts the fp32 log-probs it keeps) get the same loss
    memory (saved copy + transients) and the same loss passes."""
    from meshplan.inputs import build_profile
    from meshplan.models.analytic import llama_profile
    from meshplan.planner.cost.memory import activation_bytes, stage_buffer_bytes
    from meshplan.planner.rank.layer_cost import _memory_bound_s

    shape = dict(layers=2, hidden=256, heads=4, kv_heads=2, ffn_hidden=512, vocab=32000, seq=512)
    captured = build_profile("llama", [f"{k}={v}" for k, v in shape.items()])
    closed = llama_profile(**shape)
    out = {}
    for name, prof in (("captured", captured), ("closed", closed)):
        ctx = _ctx(prof, 8, "h100-80g")
        head = prof.layers[-1]
        assert head.tp.kind == "head"
        loss_mem = stage_buffer_bytes(ctx, [head], 2, lambda lp: 1, 0, 1)
        loss_mem += activation_bytes(ctx, head, "none", 2, 1, 1, False)
        out[name] = (loss_mem, sum(_memory_bound_s(ctx, head, 2, 1, 1, False)))
    logits = 4 * 512 * 32000 * 2
    assert captured.layers[-1].output_bytes * 2 == logits / 2  # the captured head writes bf16
    for i in (0, 1):
        assert out["captured"][i] == pytest.approx(out["closed"][i], rel=0.02)
    assert out["captured"][0] >= 3 * logits  # torch's loss: saved log-probs + 2 transients


def test_zero_bubble_third_of_the_bubble_same_memory():
    prof = gpt_profile(layers=96, hidden=12288, heads=96)
    common = dict(num_gpus=64, global_batch=64, tp=8, pp=8, dp=1, microbatch=1, virtual_stages=2, recompute="full")
    inter = estimate(prof, cluster_preset("a100-80g", 64), PlanRequest(schedule="interleaved", **common)).prediction
    zb = estimate(prof, cluster_preset("a100-80g", 64), PlanRequest(schedule="zerobubble", **common)).prediction
    assert zb.breakdown["bubble"] == pytest.approx(inter.breakdown["bubble"] / 3, rel=1e-9)
    assert zb.peak_memory_bytes == pytest.approx(inter.peak_memory_bytes, rel=1e-9)


def test_measured_gpu_timings_used_only_on_the_same_gpu_model():
    prof = gpt_profile(layers=2, hidden=1024, heads=16)
    prof.device = "cuda:NVIDIA H100 80GB HBM3"
    blk = prof.layers[1]
    blk.timings = [LayerTiming(microbatch_size=1, forward_s=0.004, backward_s=0.008)]
    on_h100 = Context.build(prof, cluster_preset("h100-80g", 8), PlanRequest(num_gpus=8, global_batch=8))
    on_a100 = Context.build(prof, cluster_preset("a100-80g", 8), PlanRequest(num_gpus=8, global_batch=8))
    assert on_h100.measured and not on_a100.measured
    assert layer_cost(on_h100, blk, 2, 1, False, 1, 0, 8).modes["none"].compute_s == pytest.approx(0.024)


def _measured_cpu_ctx(n=4, **req):
    prof = gpt_profile(layers=2, hidden=64, heads=4, vocab=128, seq=32)
    prof.device = "cpu"
    for lp in prof.layers:
        lp.timings = [LayerTiming(microbatch_size=1, forward_s=0.01, backward_s=0.02)]
        lp.optimizer_step_s = 0.008
        lp.framework_overhead_s = {
            "tp": 0.005,
            "fsdp": 0.002,
            "tp_optimizer": 0.001,
            "fsdp_optimizer": 0.003,
            "optimizer_call": 0.004,
        }
    return Context.build(prof, local_cpu(n), PlanRequest(num_gpus=n, global_batch=4, precision="fp32", **req))


def test_measured_optimizer_step_is_split_by_tp_and_zero_shard():
    ctx = _measured_cpu_ctx()
    blk = ctx.layers[1]
    assert layer_cost(ctx, blk, 1, 1, False, 1, 0, 4).optimizer_s == pytest.approx(0.008)
    assert layer_cost(ctx, blk, 1, 1, False, 1, 1, 4).optimizer_s == pytest.approx(0.002)  # ZeRO-1 over 4
    # TP 2 halves the measured work and adds the DTensor optimizer overhead, which does not shrink
    assert layer_cost(ctx, blk, 1, 2, False, 1, 0, 2).optimizer_s == pytest.approx(0.004 + 0.001)


def test_wrapper_overheads_only_where_the_wrapper_runs():
    ctx = _measured_cpu_ctx()
    blk = ctx.layers[1]
    plain = layer_cost(ctx, blk, 1, 1, False, 1, 0, 4).modes["none"]
    tp = layer_cost(ctx, blk, 1, 2, False, 1, 0, 2).modes["none"]
    z3 = layer_cost(ctx, blk, 1, 1, False, 1, 3, 4).modes["none"]
    assert plain.tp_s == 0 and plain.dp_s == 0
    assert tp.tp_s >= 0.005 and tp.dp_s == 0
    assert z3.dp_s >= 0.002 and z3.tp_s == 0
    one_replica = layer_cost(ctx, blk, 1, 1, False, 1, 3, 1).modes["none"]  # no FSDP2 on dp = 1
    assert one_replica.dp_s == 0


def test_optimizer_call_is_paid_once_per_rank():
    ctx = _measured_cpu_ctx()
    req = dict(tp=1, dp=4, microbatch=1)
    plan = estimate(ctx.profile, local_cpu(4), PlanRequest(num_gpus=4, global_batch=4, precision="fp32", **req))
    assert plan.prediction.breakdown["optimizer"] == pytest.approx(4 * 0.008 + 0.004)


def test_fp32_runs_save_twice_the_bf16_activation_bytes():
    fp32 = _measured_cpu_ctx()
    blk = fp32.layers[1]
    bf16 = Context.build(fp32.profile, local_cpu(4), PlanRequest(num_gpus=4, global_batch=4, precision="bf16"))
    assert activation_bytes(fp32, blk, "none", 2, 1, 1, False) == pytest.approx(
        2 * activation_bytes(bf16, blk, "none", 2, 1, 1, False)
    )


def test_zero3_accumulation_holds_unsharded_grads_and_reduces_once():
    """FSDP2 accumulating without gradient sync (executor/parallelize._grad_sync): the unsharded
    fp32 gradients stay until the last microbatch, whose reduce-scatter is the only one."""
    ctx = _measured_cpu_ctx()
    ctx2 = Context.build(ctx.profile, local_cpu(2), PlanRequest(num_gpus=2, global_batch=4, precision="fp32"))
    blk = ctx.layers[1]
    one = layer_cost(ctx2, blk, 2, 1, False, 1, 3, 2)  # 4 / (2 x 2): m = 1
    two = layer_cost(ctx2, blk, 1, 1, False, 1, 3, 2)  # 4 / (2 x 1): m = 2
    assert one.grads_bytes == pytest.approx(blk.num_params * 4 / 2)
    assert two.grads_bytes == pytest.approx(blk.num_params * 4 / 2 + blk.num_params * 4)


def _in_place_ctx(n=4):
    ctx = _measured_cpu_ctx(n)
    for lp in ctx.profile.layers:
        lp.framework_overhead_s.update(
            {
                "tp@2:b1": 0.010,
                "tp@2:b1:fwd": 0.004,
                "tp@2:b3": 0.014,
                "tp@2:b3:fwd": 0.006,
                "zero3@4:b1": 0.020,
                "zero3@4:b3": 0.020,
                "zero3@4:b1:fwd": 0.01,
                "zero3@4:b3:fwd": 0.01,
            }
        )
    return Context.build(ctx.profile, local_cpu(n), PlanRequest(num_gpus=n, global_batch=12, precision="fp32"))


def test_in_place_overhead_is_linear_in_the_microbatch():
    from meshplan.planner.cost.in_place import in_place_overhead_s

    fw = {"tp@2:b1": 0.010, "tp@2:b1:fwd": 0.004, "tp@2:b3": 0.014, "tp@2:b3:fwd": 0.006}
    assert in_place_overhead_s(fw, "tp@2", 2) == pytest.approx(0.012)
    assert in_place_overhead_s(fw, "tp@2", 5) == pytest.approx(0.018)
    assert in_place_overhead_s(fw, "tp@2", 2, forward_only=True) == pytest.approx(0.005)
    assert in_place_overhead_s(fw, "tp_sp@2", 2) is None and in_place_overhead_s(fw, "tp@4", 2) is None


def test_in_place_overhead_is_piecewise_between_measured_sizes():
    """With more than two sizes measured, a size between two of them reads those two, not the
    line through the ends (here that line would give 0.0165 at b 4); beyond the range, the line
    through the smallest and largest."""
    from meshplan.planner.cost.in_place import in_place_overhead_s

    fw = {"tp@2:b1": 0.010, "tp@2:b2": 0.020, "tp@2:b4": 0.030, "tp@2:b8": 0.024}
    assert in_place_overhead_s(fw, "tp@2", 4) == pytest.approx(0.030)
    assert in_place_overhead_s(fw, "tp@2", 3) == pytest.approx(0.025)
    assert in_place_overhead_s(fw, "tp@2", 6) == pytest.approx(0.027)
    assert in_place_overhead_s(fw, "tp@2", 15) == pytest.approx(0.010 + 14 * 0.014 / 7)


def test_in_place_measurements_replace_modelled_tp_and_zero3_costs():
    """Measured on real ranks, the wrapper's overhead is the whole TP (or ZeRO-3 gather) cost:
    no link-model collectives or one-rank overheads on top; full recompute pays the forward again,
    selective only its non-collective part."""
    ctx = _in_place_ctx()
    blk = ctx.layers[1]
    tp = layer_cost(ctx, blk, 2, 2, False, 1, 0, 2).modes
    assert tp["none"].tp_s == pytest.approx(0.012)
    assert tp["full"].tp_s == pytest.approx(0.012 + 0.005)
    assert 0.012 <= tp["selective"].tp_s <= 0.017
    sp = layer_cost(ctx, blk, 2, 2, True, 1, 0, 2).modes  # not measured with SP: the link model
    assert sp["none"].tp_s != pytest.approx(0.012)
    z3 = layer_cost(ctx, blk, 1, 1, False, 1, 3, 4)  # m = 12 / 4 = 3 microbatches
    scatter = collective_s(ctx.cluster, "reduce_scatter", 4, blk.num_params * 4, "intra_node")
    assert z3.modes["none"].dp_s == pytest.approx(0.020 + scatter / 3)


def test_zero3_reduce_scatter_measured_in_place_replaces_the_link_fit():
    """With gradient sync on, the same layer measured in place pays its gathers and the
    reduce-scatter between busy ranks: the difference is the scatter, once per step where
    gradients accumulate unsharded (m = 3), and not below zero where noise made it negative."""
    ctx = _in_place_ctx()
    blk = ctx.layers[1]
    blk.framework_overhead_s.update({"zero3_sync@4:b1": 0.032, "zero3_sync@4:b3": 0.038})
    z3 = layer_cost(ctx, blk, 1, 1, False, 1, 3, 4)  # microbatch 1, m = 3
    assert z3.modes["none"].dp_s == pytest.approx(0.020 + (0.032 - 0.020) / 3)
    blk.framework_overhead_s.update({"zero3_sync@4:b1": 0.015, "zero3_sync@4:b3": 0.015})
    ctx = Context.build(ctx.profile, ctx.cluster, ctx.request)  # layer costs are memoised per context
    assert layer_cost(ctx, blk, 1, 1, False, 1, 3, 4).modes["none"].dp_s == pytest.approx(0.020)


def test_pipeline_p2p_measured_in_place_replaces_the_link_fit():
    """A CPU profile's in-place pipeline measurement (step_overhead_s "pp@P:bB", seconds per
    microbatch and chunk) is the p2p a pipeline rank pays, linear in the microbatch, v times with
    v chunks; the link fit only where it is missing: another pipeline degree, a GPU profile, a
    1/cp slice or a scattered boundary crossing."""
    from meshplan.planner.cost.pipeline import p2p_per_microbatch_s

    ctx = _measured_cpu_ctx()
    ctx.profile.step_overhead_s.update({"pp@2:b1": 0.002, "pp@2:b3": 0.004})
    ctx = Context.build(ctx.profile, ctx.cluster, ctx.request)
    bsh = ctx.layers[1].output_bytes

    def fit(cand):
        return 2 * cand.virtual_stages * p2p_s(ctx.cluster, bsh * cand.microbatch / cand.cp, "intra_node")

    pp2 = candidate(pp=2, microbatch=2, num_microbatches=2)
    assert p2p_per_microbatch_s(ctx, pp2, bsh) == pytest.approx(0.003)
    looped = candidate(pp=2, microbatch=3, num_microbatches=2, virtual_stages=2, schedule="Interleaved1F1B")
    assert p2p_per_microbatch_s(ctx, looped, bsh) == pytest.approx(2 * 0.004)
    pp4 = candidate(pp=4, microbatch=1, num_microbatches=4)
    assert p2p_per_microbatch_s(ctx, pp4, bsh) == pytest.approx(fit(pp4)) != pytest.approx(0.002)
    cp2 = candidate(pp=2, cp=2, microbatch=1, num_microbatches=2)
    assert p2p_per_microbatch_s(ctx, cp2, bsh) == pytest.approx(fit(cp2))
    sp = candidate(pp=2, tp=2, sequence_parallel=True, microbatch=1, num_microbatches=2)
    assert p2p_per_microbatch_s(ctx, sp, bsh) != pytest.approx(0.002)
    on_gpu = Context.build(
        dataclasses.replace(ctx.profile, device="cuda"),
        cluster_preset("h100-80g", 4),
        ctx.request,
    )
    assert p2p_per_microbatch_s(on_gpu, pp2, bsh) != pytest.approx(0.003)


def test_pipeline_plan_charges_the_in_place_p2p_per_microbatch():
    ctx = _measured_cpu_ctx()
    ctx.profile.step_overhead_s.update({"pp@2:b1": 0.002, "pp@2:b2": 0.002})
    req = PlanRequest(num_gpus=2, global_batch=4, pp=2, dp=1, microbatch=1, schedule="1F1B", precision="fp32")
    plan = estimate(ctx.profile, local_cpu(2), req)
    assert plan.prediction.breakdown["pp_comm"] == pytest.approx(4 * 0.002)  # m = 4 microbatches
    bare = dataclasses.replace(ctx.profile, step_overhead_s={})
    assert estimate(bare, local_cpu(2), req).prediction.breakdown["pp_comm"] != pytest.approx(4 * 0.002)


def test_grad_clipping_pays_a_norm_all_reduce_per_sharded_group():
    from meshplan.planner.cost.optimizer import grad_norm_sync_s

    ctx = _ctx(P22, n=64)
    ar = lambda g, tier: collective_s(ctx.cluster, "all_reduce", g, 8.0, tier)  # noqa: E731
    plain = candidate(dp_replicate=64)
    assert grad_norm_sync_s(ctx, plain) == 0.0  # DDP replicas hold whole gradients
    hybrid = dataclasses.replace(plain, pp=4, dp_replicate=1, dp_shard=2, tp=8, zero=3)
    expected = ar(4, "inter_node") + 2 * ar(8, "intra_node") + ar(2, "inter_node")
    assert grad_norm_sync_s(ctx, hybrid) == pytest.approx(expected)


def test_measured_recompute_machinery_is_charged_beyond_the_forward():
    """Checkpointing a layer costs its forward again plus the machinery measured around it
    (wrapper_timing: recompute_full:bB = checkpointed - plain, at microbatch B)."""
    ctx = _measured_cpu_ctx()
    for lp in ctx.profile.layers:
        lp.framework_overhead_s.update({"recompute_full:b1": 0.016, "recompute_selective:b1": 0.003})
    ctx = Context.build(ctx.profile, local_cpu(4), PlanRequest(num_gpus=4, global_batch=8, precision="fp32"))
    blk = ctx.layers[1]
    modes = layer_cost(ctx, blk, 2, 1, False, 1, 0, 4).modes  # forward at b=2: 0.02 s
    assert modes["full"].recompute_s == pytest.approx(0.02 + (0.016 - 0.01))
    sel_share = blk.recompute_flops_selective / blk.forward_flops
    assert modes["selective"].recompute_s == pytest.approx(0.02 * sel_share + (0.003 - 0.01 * sel_share))
    assert modes["none"].recompute_s == 0


def test_materialized_attention_is_one_batched_gemm_and_flash_one_pair():
    """Megatron-LM's materialised core runs QK^T and AV as one baddbmm over the b x heads/t (sample,
    head) pairs: its efficiency is read at that kernel's FLOPs, so it rises with b and falls with t.
    A flash core is priced at one pair's GEMM size whatever b and t."""
    from meshplan.planner.attention import is_materialized
    from meshplan.planner.cost.compute import attention_efficiency, gemm_efficiency

    curve = cluster_preset("a100-80g", 8).device.gemm_efficiency
    pair = 2.0 * S * S * (H / A)
    for kind in ("materialized", "flash"):
        ctx = _ctx(attention=kind)
        block = ctx.layers[1]
        assert is_materialized(block, A, S) == (kind == "materialized")
        for b, t in ((1, 8), (4, 8), (4, 2)):
            want = gemm_efficiency(curve, pair * (b * A / t if kind == "materialized" else 1))
            assert attention_efficiency(ctx, block, b, t, 1) == pytest.approx(want, rel=1e-12)
    mat, flash = _ctx(attention="materialized"), _ctx(attention="flash")
    four, one = (attention_efficiency(mat, mat.layers[1], b, 8, 1) for b in (4, 1))
    assert four > 1.1 * one and one > 1.2 * attention_efficiency(flash, flash.layers[1], 1, 8, 1)


def test_the_op_policy_does_not_turn_a_flash_core_into_materialised_scores():
    """torchtitan's op-level selective policy frees every other matmul output, which can be more
    than a x s^2 bytes at a short sequence (here 2048 tokens, 16 heads, hidden 2048); the block's
    flash core must still be priced as flash (one pair's GEMM size, QK^T again in backward), the
    same as under the attention-core policy. It was read as a materialised core: 1.5x too fast."""
    from meshplan.models.analytic import gpt_profile
    from meshplan.planner.attention import is_materialized
    from meshplan.planner.cost.compute import layer_compute_s

    prof = gpt_profile(layers=4, hidden=2048, heads=16, vocab=50368, seq=2048)
    op, core = (_ctx(prof, 8, "h100-80g", attention="flash", selective_recompute=p) for p in ("op", "attention core"))
    block_op, block_core = op.layers[1], core.layers[1]
    assert is_materialized(block_op, 16, 2048)  # the selective fields alone would say so
    assert not op.keeps_scores(block_op) and not core.keeps_scores(block_core)
    fwd_op, bwd_op, _ = layer_compute_s(op, block_op, 14, 1, 1)
    fwd_core, bwd_core, _ = layer_compute_s(core, block_core, 14, 1, 1)
    assert (fwd_op, bwd_op) == pytest.approx((fwd_core, bwd_core), rel=1e-12)


def test_the_op_policy_reruns_its_matmuls_at_their_gemm_rates():
    """torchtitan's op-level selective recompute re-runs every second matmul of a block (planner/sac.py):
    GEMMs of their own sizes, on the GEMM curve at the GEMM dtype's peak (fp8 under --precision fp8),
    not the attention core's rate."""
    from meshplan.models.analytic import llama_profile
    from meshplan.planner.cost.compute import gemm_efficiency, layer_compute_s
    from meshplan.planner.sac import matmuls

    prof = llama_profile(layers=4, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256, seq=8192)
    for precision in ("bf16", "fp8"):
        ctx = _ctx(prof, 8, "h100-80g", attention="flash", selective_recompute="op", precision=precision)
        block = ctx.layers[1]
        rerun = [2 * fl for i, (_, fl) in enumerate(matmuls(block)) if i % 2 == 1]  # b = 2
        assert sum(rerun) == pytest.approx(2 * block.recompute_flops_selective)
        want = sum(fl / (ctx.gemm_peak_flops * gemm_efficiency(ctx.gemm_curve, fl)) for fl in rerun)
        assert layer_compute_s(ctx, block, 2, 1, 1)[2] == pytest.approx(want, rel=1e-12)


def test_a_flash_backward_recomputes_qk_and_a_materialised_one_does_not():
    """A flash kernel keeps no scores: its backward runs QK^T again, half the core's forward FLOPs
    (4s^2h per sample) at the attention efficiency, on top of the four model-FLOP GEMMs. Megatron-LM's
    materialised core keeps the scores and pays nothing more."""
    from meshplan.planner.cost.compute import attention_efficiency, flash_recompute_s, layer_compute_s

    flash, mat = _ctx(attention="flash"), _ctx(attention="materialized")
    b, t, cp = 2, 8, 2
    block = flash.layers[1]
    core_fwd = 4.0 * S * S * H  # QK^T and AV, per sample (Korthikanti et al. 2022 App. A)
    rate = flash.peak_flops * attention_efficiency(flash, block, b, t, cp)
    assert flash_recompute_s(flash, block, b, t, cp) == pytest.approx(0.5 * core_fwd * b / (t * cp) / rate, rel=1e-9)
    assert flash_recompute_s(mat, mat.layers[1], b, t, cp) == 0.0
    assert flash_recompute_s(flash, flash.layers[0], b, t, cp) == 0.0  # the embedding is no attention block
    fwd, bwd, _ = layer_compute_s(flash, block, b, t, cp)
    assert bwd - flash_recompute_s(flash, block, b, t, cp) == pytest.approx(2 * fwd, rel=0.02)


def test_the_closed_form_llama_has_the_published_parameter_counts():
    """Llama 3.1 8B, 70B and 405B as Meta counts them: RMSNorm has a weight and no bias, the final one too (the
    closed form once counted a LayerNorm's bias there, one hidden more)."""
    from meshplan.models.analytic import LLAMA3_405B, llama_profile

    llama = dict(kv_heads=8, vocab=128256, seq=8192)
    assert llama_profile(layers=32, hidden=4096, heads=32, ffn_hidden=14336, **llama).num_params == 8_030_261_248
    assert llama_profile(layers=80, hidden=8192, heads=64, ffn_hidden=28672, **llama).num_params == 70_553_706_496
    assert llama_profile(**LLAMA3_405B).num_params == 405_853_388_800

"""TP and ZeRO-3 wrappers timed in place on real gloo ranks (profiler/insitu.py), and the cost
model charging exactly those measurements for a plan that runs them."""

from __future__ import annotations

import dataclasses

import pytest

from meshplan.planner import PlanRequest, estimate
from meshplan.presets import local_cpu
from meshplan.profiler import profile_model
from meshplan.profiler.insitu import STEP

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def measured():
    """The profile and the unclamped in-place table (insitu.measure_in_place's return) that its
    framework_overhead_s and step_overhead_s store clamped at zero."""
    from meshplan.profiler import insitu

    raw, real = {}, insitu.measure_in_place

    def keep(*args, **kwargs):
        raw.update(real(*args, **kwargs))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(insitu, "measure_in_place", keep)
        made = profile_model("gpt-tiny", device="cpu", concurrent=2, microbatch_sizes=[1, 2])
    return made, raw


@pytest.fixture(scope="module")
def profile(measured):
    return measured[0]


def test_the_profile_stores_the_in_place_measurement_clamped_at_zero(measured):
    profile, raw = measured
    assert raw.get(STEP) and all(raw.get(lp.timings[0].reused_from or lp.name) for lp in profile.layers)
    for lp in profile.layers:
        for key, value in raw[lp.timings[0].reused_from or lp.name].items():
            assert lp.framework_overhead_s[key] == max(0.0, value), (lp.name, key)
    for key, value in raw[STEP].items():
        assert profile.step_overhead_s[key] == max(0.0, value), key


def test_every_layer_gets_in_place_overheads(measured):
    """Unclamped, a wrapper never takes less than half the plain layer's time off a pass (it does
    the layer's share of the arithmetic and more), and the forward is part of the whole pass."""
    profile, raw = measured
    for lp in profile.layers:
        row = raw[lp.timings[0].reused_from or lp.name]
        for key in ("tp@2", "tp_sp@2", "zero3@2", "zero3_sync@2"):
            for b in (1, 2):
                plain = next(t for t in lp.timings if t.microbatch_size == b)
                pass_s = plain.forward_s + plain.backward_s
                whole, fwd = row[f"{key}:b{b}"], row[f"{key}:b{b}:fwd"]
                assert whole > -0.5 * pass_s and fwd > -0.5 * plain.forward_s, (lp.name, key, b, whole, fwd)
                assert whole - fwd > -0.5 * plain.backward_s, (lp.name, key, b, whole, fwd)  # the backward's
    block = profile.layers[1].framework_overhead_s
    assert block["tp@2:b1"] > 0 and block["zero3@2:b1"] > 0  # dispatch and collectives cost something
    assert any("measured in place on 2 gloo ranks" in n for n in profile.notes)


def test_tp_plan_is_charged_the_in_place_measurement(profile):
    plan = estimate(
        profile, local_cpu(2), PlanRequest(num_gpus=2, global_batch=2, tp=2, dp=1, microbatch=1, precision="fp32")
    )
    expected = sum(lp.framework_overhead_s["tp@2:b1"] for lp in profile.layers) * 2  # 2 microbatches
    assert plan.prediction.breakdown["tp_comm"] == pytest.approx(expected, rel=1e-6)


def test_tp_degrees_that_no_plan_runs_are_not_timed():
    from meshplan.model_profile import TPRule
    from meshplan.profiler.insitu import tp_degree_valid

    gqa = [TPRule(kind="block", divisors={"heads": 4, "kv_heads": 2, "ffn": 160}), TPRule(kind="head")]
    assert tp_degree_valid(gqa, 2) and not tp_degree_valid(gqa, 4)  # llama-tiny: 2 KV heads


def test_ddp_zero1_and_the_optimizer_are_measured_once_per_step_for_the_whole_model(profile):
    assert set(profile.step_overhead_s) == {
        "ddp@2:b1",
        "ddp@2:b2",
        "zero1@2",
        "optimizer@1",
        "model@1:b1",
        "model@1:b2",
        "pp@2:b1",
        "pp@2:b2",
    }
    assert profile.step_overhead_s["zero1@2"] > 0  # the broadcast costs something
    assert profile.step_overhead_s["optimizer@1"] > 0


def test_the_in_place_model_pass_sets_the_scale_of_the_layer_timings(profile):
    """A rank running the whole model (pure DP, one microbatch) is charged exactly the plain
    model's in-place pass; without that measurement, the layers' timings as they are."""
    from meshplan.planner.context import timing_scale_points

    req = dict(num_gpus=2, global_batch=2, dp=2, pp=1, microbatch=1, precision="fp32")
    cluster = local_cpu(2)
    per_call = 2 * len(profile.layers) * cluster.calibration.kernel_overhead_s
    compute = estimate(profile, cluster, PlanRequest(**req)).prediction.breakdown["compute"]
    assert compute == pytest.approx(profile.step_overhead_s["model@1:b1"] + per_call, rel=1e-6)
    layers = sum(lp.timings[0].forward_s + lp.timings[0].backward_s for lp in profile.layers)
    (b1, r1), (b2, _) = timing_scale_points(profile)
    assert (b1, b2) == (1, 2) and r1 == pytest.approx(profile.step_overhead_s["model@1:b1"] / layers)
    bare = dataclasses.replace(
        profile, step_overhead_s={k: v for k, v in profile.step_overhead_s.items() if not k.startswith("model@1")}
    )
    assert timing_scale_points(bare) == ()
    unscaled = estimate(bare, cluster, PlanRequest(**req)).prediction.breakdown["compute"]
    assert unscaled == pytest.approx(layers + per_call, rel=1e-6)


def test_an_overhead_is_the_slowest_wrapped_rank_against_the_mean_plain_rank():
    from meshplan.profiler.insitu import MODEL_PASS, combine_ranks

    ranks = [
        {"blk": {"tp@2:b1": (0.030, 0.010)}, STEP: {f"{MODEL_PASS}:b1": (0.020, 0.0)}},
        {"blk": {"tp@2:b1": (0.032, 0.004)}, STEP: {f"{MODEL_PASS}:b1": (0.030, 0.0)}},
    ]
    raw = combine_ranks(ranks)
    # the slowest rank's own difference (0.032 - 0.004) would take the luckiest plain pass
    assert raw["blk"]["tp@2:b1"] == pytest.approx(0.032 - 0.007)
    assert raw[STEP][f"{MODEL_PASS}:b1"] == pytest.approx(0.025)  # absolute: the mean rank


def test_the_in_place_optimizer_step_sets_the_scale_of_the_one_rank_timings(profile):
    """A rank holding the whole model (pure DP, no ZeRO) is charged exactly the in-place
    measurement; a pipeline stage its layers' share of it."""
    from meshplan.planner.context import Context, optimizer_scale

    whole = profile.step_overhead_s["optimizer@1"]
    req = dict(num_gpus=2, global_batch=4, microbatch=1, precision="fp32")
    ddp = estimate(profile, local_cpu(2), PlanRequest(dp=2, pp=1, **req)).prediction.breakdown["optimizer"]
    assert ddp == pytest.approx(whole, rel=1e-6)
    scale = optimizer_scale(profile)
    call = max(lp.framework_overhead_s["optimizer_call"] for lp in profile.layers)
    assert scale == pytest.approx(whole / (sum(lp.optimizer_step_s for lp in profile.layers) + call))
    bare = dataclasses.replace(
        profile, step_overhead_s={k: v for k, v in profile.step_overhead_s.items() if k != "optimizer@1"}
    )
    assert Context.build(bare, local_cpu(2), PlanRequest(num_gpus=2, global_batch=4)).optimizer_scale == 1.0
    unscaled = estimate(bare, local_cpu(2), PlanRequest(dp=2, pp=1, **req)).prediction.breakdown["optimizer"]
    assert unscaled == pytest.approx(whole / scale, rel=1e-6)


def test_zero1_plan_is_charged_the_measured_broadcast_instead_of_the_fit(profile):
    from meshplan.planner.cost.comm import collective_s

    req = dict(num_gpus=2, global_batch=4, dp=2, microbatch=1, precision="fp32")
    measured = estimate(profile, local_cpu(2), PlanRequest(zero=1, **req)).prediction.breakdown["dp_comm"]
    ddp = estimate(profile, local_cpu(2), PlanRequest(zero=0, **req)).prediction.breakdown["dp_comm"]
    # torch's ZeRO-1 keeps DDP's all-reduce (same term) and adds the broadcast as measured
    assert measured == pytest.approx(ddp + profile.step_overhead_s["zero1@2"], rel=1e-6)
    fit = collective_s(local_cpu(2), "all_gather", 2, profile.num_params * 4.0, "intra_node")
    assert fit != pytest.approx(profile.step_overhead_s["zero1@2"], rel=1e-3)


def test_recompute_is_measured_in_place_and_preferred(profile):
    from meshplan.planner.context import Context
    from meshplan.planner.cost.compute import recompute_overheads_s, timing_scale

    block = profile.layers[1]
    fw = block.framework_overhead_s
    for mode in ("full", "selective"):
        assert fw[f"recompute_{mode}@1:b1"] > 0 and fw[f"recompute_{mode}@1:b2"] > 0
    ctx = Context.build(profile, local_cpu(2), PlanRequest(num_gpus=2, global_batch=2, precision="fp32"))
    full, _ = recompute_overheads_s(ctx, block, 1)
    fwd_b1 = block.timings[0].forward_s * timing_scale(ctx, 1)  # the forward the plan is charged
    assert full == pytest.approx(max(0.0, fw["recompute_full@1:b1"] - fwd_b1))
    # the one-rank measurement is only the fallback
    bare = dataclasses.replace(block, framework_overhead_s={k: v for k, v in fw.items() if "@1" not in k})
    assert recompute_overheads_s(ctx, bare, 1)[0] == pytest.approx(max(0.0, fw["recompute_full:b1"] - fwd_b1))


def test_ddp_contention_is_paid_once_per_step_on_top_of_the_link_fit(profile):
    from meshplan.planner.cost.comm import collective_s

    req = dict(num_gpus=2, global_batch=4, dp=2, microbatch=1, precision="fp32")
    measured = estimate(profile, local_cpu(2), PlanRequest(**req)).prediction.breakdown["dp_comm"]
    bare = dataclasses.replace(profile, step_overhead_s={})
    modelled = estimate(bare, local_cpu(2), PlanRequest(**req)).prediction.breakdown["dp_comm"]
    cluster = local_cpu(2)
    fit_whole = collective_s(cluster, "all_reduce", 2, profile.num_params * 4.0, "intra_node")
    assert measured == pytest.approx(modelled + max(0.0, profile.step_overhead_s["ddp@2:b1"] - fit_whole))


def test_wrapped_optimizer_steps_are_measured_in_place_and_preferred(profile):
    from meshplan.planner.context import Context
    from meshplan.planner.rank.layer_cost import wrapper_overheads_s

    ctx = Context.build(profile, local_cpu(2), PlanRequest(num_gpus=2, global_batch=2, precision="fp32"))
    for lp in profile.layers:
        fw = lp.framework_overhead_s
        assert {"tp_optimizer@2", "fsdp_optimizer@2"} <= set(fw), lp.name
        assert wrapper_overheads_s(ctx, lp, 2, 0, 1)[2] == fw["tp_optimizer@2"]
        assert wrapper_overheads_s(ctx, lp, 1, 3, 2)[2] == fw["fsdp_optimizer@2"]
        bare = dataclasses.replace(lp, framework_overhead_s={k: v for k, v in fw.items() if "optimizer@" not in k})
        assert wrapper_overheads_s(ctx, bare, 2, 0, 1)[2] == fw["tp_optimizer"]  # the one-rank fallback


def test_the_pipeline_schedule_is_measured_in_place_and_charged_per_microbatch(measured):
    """The 2-stage 1F1B schedule of the block costs, per microbatch slot, at least the plain
    block's pass less noise (it does that arithmetic) and, unclamped, more: the sends and the
    pipelining runtime's actions; a pp = 2 plan pays it once per microbatch instead of the link
    fit's two sends, and the link fit again without it."""
    profile, raw = measured
    block = next(t for t in profile.layers[1].timings if t.microbatch_size == 1)
    assert raw[STEP]["pp@2:b1"] > -0.5 * (block.forward_s + block.backward_s)
    req = PlanRequest(num_gpus=2, global_batch=4, pp=2, dp=1, microbatch=1, schedule="1F1B", precision="fp32")
    charged = estimate(profile, local_cpu(2), req).prediction.breakdown["pp_comm"]
    assert charged == pytest.approx(4 * profile.step_overhead_s["pp@2:b1"], rel=1e-6)  # 4 microbatches
    bare = dataclasses.replace(
        profile, step_overhead_s={k: v for k, v in profile.step_overhead_s.items() if not k.startswith("pp@")}
    )
    fit = estimate(bare, local_cpu(2), req).prediction.breakdown["pp_comm"]
    assert fit > 0 and fit != pytest.approx(charged, rel=1e-6)

"""DeepSpeed's ZeRO-2 all-reduces its gradient buckets (runtime behaviour zero2_grad_collective "all_reduce":
zero/stage_1_and_2.py average_tensor under the default use_multi_rank_bucket_allreduce), where FSDP2's
ZeRO-2 and every runtime's ZeRO-3 reduce-scatter: twice the bytes, and the time of an all-reduce."""

from __future__ import annotations

import pytest
from test_runtimes import DP, DP_PINS, _estimate, _inputs

from meshplan import runtimes
from meshplan.planner.cost.comm import collective_s, group_tier
from meshplan.presets import cluster_preset

RANKS = 16  # DP_PINS: --dp 16
MICROBATCHES = 1  # DP: --global-batch 64 over 16 ranks at --microbatch 4


def _ds(zero: int, *flags: str):
    return _estimate("--runtime", "deepspeed", "--zero", str(zero), *flags, base=DP, pins=DP_PINS).prediction


SCATTER = ("--zero2-grad-collective", "reduce_scatter")
"""DeepSpeed as it runs with use_multi_rank_bucket_allreduce false: ZeRO-2 reduce-scattered."""


def test_the_runtimes_say_which_collective_reduces_zero2():
    got = {name: runtimes.runtime(name).value("zero2_grad_collective") for name in runtimes.NAMES}
    assert got == {name: "all_reduce" if name == "deepspeed" else "reduce_scatter" for name in runtimes.NAMES}


def test_the_engine_not_the_state_layout_decides_deepspeed_reduction():
    """How DeepSpeed reduces is its engine's, whatever layout keeps the state: under --state-layout torch
    its ZeRO-2 still all-reduces and keeps its weights whole, its stage 0 still waits for backward's end."""
    torch_layout = ("--state-layout", "torch")
    # per element: the bf16 gradients all-reduced (2 x 2 bytes) or reduce-scattered (2), beside the
    # weights as this layout keeps them (4 bytes), gathered once after the step
    scattered = _ds(2, *torch_layout, *SCATTER).comm_bytes_per_step["dp_shard"]
    ratio = (2 * 2 + 4) / (2 + 4)
    assert _ds(2, *torch_layout).comm_bytes_per_step["dp_shard"] / scattered == pytest.approx(ratio, rel=1e-6)
    on = _ds(0, *torch_layout, "--overlap-dp-comm").breakdown["dp_comm"]
    assert on == _ds(0, *torch_layout, "--no-overlap-dp-comm").breakdown["dp_comm"] > 0
    # and its ZeRO-2 keeps the weights whole: four microbatches send four bf16 gradient all-reduces
    # (2 x 2 bytes an element) and one gather of the weights as kept (4 bytes under this layout)
    one = _ds(2, *torch_layout).comm_bytes_per_step["dp_shard"]
    pins = [*DP_PINS[:-6], "--microbatch", "1", *DP_PINS[-4:]]
    four = _estimate("--runtime", "deepspeed", "--zero", "2", *torch_layout, base=DP, pins=pins).prediction
    assert four.comm_bytes_per_step["dp_shard"] / one == pytest.approx((4 * 2 * 2 + 4) / (2 * 2 + 4), rel=0.001)


def test_deepspeed_zero2_sends_an_all_reduce_of_its_16_bit_gradients():
    """DeepSpeed's ZeRO-2 keeps its weights whole: per microbatch it all-reduces its bf16 gradients (each
    rank sends 2 x 15/16 of them), and after the step it all-gathers the updated bf16 partitions once
    (15/16 of the weights). Counted from the profile's parameters, not from the cost model's bytes."""
    profile, _, _ = _inputs(["estimate", *DP, *DP_PINS])
    pred = _ds(2)
    share = (RANKS - 1) / RANKS
    expected = (2 * share * MICROBATCHES + share) * 2 * profile.num_params
    assert pred.comm_bytes_per_step["dp_shard"] == pytest.approx(expected, rel=0.001)  # shard padding


def test_deepspeed_zero2_gathers_its_weights_once_a_step_not_per_microbatch():
    one = _ds(2).comm_bytes_per_step["dp_shard"]
    four = _estimate(
        "--runtime", "deepspeed", "--zero", "2", base=DP, pins=[*DP_PINS[:-6], "--microbatch", "1", *DP_PINS[-4:]]
    ).prediction.comm_bytes_per_step["dp_shard"]
    # 4 microbatches of 1: four gradient all-reduces (2 units each), still one weight gather (1 unit)
    assert four / one == pytest.approx((4 * 2 + 1) / (2 + 1), rel=0.001)


def test_the_all_reduce_is_twice_the_reduce_scatter_it_replaced():
    """Same gather after the step; the gradients' 2 x 15/16 against 15/16."""
    scattered = _ds(2, *SCATTER).comm_bytes_per_step["dp_shard"]
    assert _ds(2).comm_bytes_per_step["dp_shard"] / scattered == pytest.approx(3 / 2, rel=1e-6)


def test_exposed_zero2_time_is_the_all_reduce():
    """Not overlapped, the gradient time grows by what an all-reduce of the buffer costs over its
    reduce-scatter on the preset: the time follows the collective, not only the byte count."""
    scatter = _ds(2, "--no-overlap-dp-comm", *SCATTER)
    reduce = _ds(2, "--no-overlap-dp-comm")
    profile, _, _ = _inputs(["estimate", *DP, *DP_PINS])
    cluster = cluster_preset("a100-80g", RANKS)
    tier = group_tier(cluster, 1, RANKS)
    gap = 0.0
    for layer in profile.layers:  # one collective per layer's bf16 gradients
        grads = 2.0 * layer.num_params
        gap += collective_s(cluster, "all_reduce", RANKS, grads, tier)
        gap -= collective_s(cluster, "reduce_scatter", RANKS, grads, tier)
    assert gap > 0
    assert reduce.breakdown["dp_comm"] - scatter.breakdown["dp_comm"] == pytest.approx(gap, rel=0.01)
    assert reduce.step_time_s > scatter.step_time_s


def test_zero3_reduce_scatters_under_deepspeed():
    """The behaviour is ZeRO-2's: DeepSpeed's ZeRO-3 (stage3.py __avg_scatter_grads) does not move with it."""
    before = _ds(3, *SCATTER)
    after = _ds(3)
    assert after.comm_bytes_per_step == before.comm_bytes_per_step
    assert after.step_time_s == before.step_time_s


def test_fsdp2_zero2_still_reduce_scatters():
    """torchtitan's ZeRO-2 (FSDP2, reshard_after_forward False): each microbatch a bf16 gather of the
    sharded weights (the other 15 ranks' shards: 15/16 x 2 bytes an element) and a reduce-scatter of the
    fp32 gradients (15/16 x 4), no all-reduce."""
    profile, _, _ = _inputs(["estimate", *DP, *DP_PINS])
    titan = _estimate("--runtime", "torchtitan", "--zero", "2", base=DP, pins=DP_PINS).prediction
    share = (RANKS - 1) / RANKS
    expected = MICROBATCHES * (share * 2 + share * 4) * profile.num_params
    assert titan.comm_bytes_per_step["dp_shard"] == pytest.approx(expected, rel=0.001)


def test_deepspeed_stage0_reduces_after_backward_whatever_overlap_comm_says():
    """engine.allreduce_gradients at stage 0 is buffered_allreduce_fallback on the finished gradients:
    the all-reduce is exposed whole with or without --overlap-dp-comm (which reaches ZeRO-1/2's hooks);
    DeepSpeed's ZeRO-1 and Megatron's grad buffer hide part of theirs behind backward."""
    on = _ds(0, "--overlap-dp-comm").breakdown["dp_comm"]
    assert on == _ds(0, "--no-overlap-dp-comm").breakdown["dp_comm"] > 0
    assert _ds(1, "--overlap-dp-comm").breakdown["dp_comm"] < _ds(1, "--no-overlap-dp-comm").breakdown["dp_comm"]
    megatron = lambda flag: _estimate(  # noqa: E731
        "--runtime", "megatron-core", "--zero", "0", flag, base=DP, pins=DP_PINS
    ).prediction.breakdown["dp_comm"]
    assert megatron("--overlap-dp-comm") < megatron("--no-overlap-dp-comm")


SMALL = [*DP[:3], "layers=4", *DP[4:]]  # 4 blocks: ~0.3e9 parameters, under one DeepSpeed bucket


def test_deepspeed_zero1_under_one_bucket_reduces_after_backward():
    """With fewer gradient elements than reduce_bucket_size (5e8) the ipg bucket never fills during
    backward: everything is reduced in the epilogue, so overlap buys nothing; over 5e8 (DP's 0.62e9)
    only the remainder waits."""
    profile, _, _ = _inputs(["estimate", *SMALL, *DP_PINS])
    assert profile.num_params < runtimes.DEEPSPEED_REDUCE_BUCKET_ELEMS
    small = lambda flag: _estimate(  # noqa: E731
        "--runtime", "deepspeed", "--zero", "1", flag, base=SMALL, pins=DP_PINS
    ).prediction.breakdown["dp_comm"]
    assert small("--overlap-dp-comm") == small("--no-overlap-dp-comm") > 0


def test_deepspeed_zero1_tail_is_the_unfilled_bucket():
    """DP's 0.62e9 gradients: one full 5e8 bucket reduced during backward, the 0.12e9 left after it. A
    1e8 bucket (--reduce-bucket-elems) leaves 0.02e9, less than the embedding's gradient (0.1e9), which
    finishes last and waits anyway, as it does with DDP's 25 MB buckets (0): the exposed sync follows the
    larger of the two."""
    tail = _ds(1).breakdown["dp_comm"]
    smaller = _ds(1, "--reduce-bucket-elems", "100000000").breakdown["dp_comm"]
    assert _ds(1, "--reduce-bucket-elems", "0").breakdown["dp_comm"] == smaller < tail


PP_PINS = ["--tp", "1", "--pp", "2", "--dp", "8", "--microbatch", "2", "--schedule", "1f1b", "--recompute", "none"]
SMALL_BUCKET = ("--reduce-bucket-elems", "1000000")
"""Keeps ZeRO-1's bucket rule out of the pipeline tests: a stage's 0.3e9 gradients under one 5e8 bucket
would wait for backward's end anyway."""


def _dp_comm(runtime: str, zero: int, pins: list[str], *flags: str) -> float:
    return _estimate("--runtime", runtime, "--zero", str(zero), *flags, base=DP, pins=pins).prediction.breakdown[
        "dp_comm"
    ]


@pytest.mark.parametrize("zero", [0, 1])
def test_deepspeed_pipeline_reduces_after_the_last_backward(zero):
    """DeepSpeed's pipeline engine reduces in the schedule's ReduceGrads instruction, after every backward
    (pipe/engine.py _exec_reduce_grads): overlap_comm hides nothing, at ZeRO-0 or ZeRO-1; Megatron-Core's
    grad buffer, and torch pipelining's DDP, reduce during the last microbatch's backward."""
    on, off = (
        _dp_comm("deepspeed", zero, PP_PINS, flag, *SMALL_BUCKET)
        for flag in ("--overlap-dp-comm", "--no-overlap-dp-comm")
    )
    assert on == off > 0
    for runtime in ("megatron-core", "meshplan"):
        assert _dp_comm(runtime, zero, PP_PINS, "--overlap-dp-comm") < _dp_comm(
            runtime, zero, PP_PINS, "--no-overlap-dp-comm"
        )


def test_deepspeed_zero1_overlaps_without_pipelining():
    """The same bucket without a pipeline: ZeRO-1's hooks reduce during backward."""
    on, off = (
        _dp_comm("deepspeed", 1, DP_PINS, flag, *SMALL_BUCKET) for flag in ("--overlap-dp-comm", "--no-overlap-dp-comm")
    )
    assert on < off


def test_deepspeed_zero2_under_one_bucket_reduces_in_the_epilogue():
    """ZeRO-2's bucket fills with the rank's whole gradients before partitioning: under one 5e8 bucket
    (SMALL's 0.3e9) every micro-step's reduction waits for the epilogue, overlap or not; with 1e6-element
    buckets all but the last reduce during backward."""

    def small(*flags: str) -> float:
        return _estimate(
            "--runtime", "deepspeed", "--zero", "2", *flags, base=SMALL, pins=DP_PINS
        ).prediction.breakdown["dp_comm"]

    assert small("--overlap-dp-comm") == small("--no-overlap-dp-comm") > 0
    assert small("--overlap-dp-comm", *SMALL_BUCKET) < small("--no-overlap-dp-comm", *SMALL_BUCKET)
    titan = lambda flag: _estimate(  # noqa: E731  FSDP2 reduce-scatters per layer, no bucket
        "--runtime", "torchtitan", "--zero", "2", flag, base=SMALL, pins=DP_PINS
    ).prediction.breakdown["dp_comm"]
    assert titan("--overlap-dp-comm") < titan("--no-overlap-dp-comm")

"""ZeRO-2/3 under gradient accumulation, as each runtime runs it (runtime behaviour
fsdp_reduce_every_microbatch): meshplan's executor leaves it to the plan, turning FSDP2's gradient
sync off on every microbatch but the last (unsharded fp32 gradients accumulate, one reduce-scatter
follows) where that fits and keeping it on where it does not;
torchtitan's training loop leaves it on (each backward reduce-scatters into the shards, nothing
unsharded is held) except under torch pipelining, which defers it for any runtime; DeepSpeed's
ZeRO-2/3 reduce every micro-step."""

from __future__ import annotations

import dataclasses

import pytest

from meshplan.planner import estimate
from meshplan.planner.context import Context
from meshplan.planner.rank.dp_cost import DataParallelCost
from meshplan.planner.search import search as search_plan
from meshplan.planner.search.enumerate import pinned_candidate
from meshplan.validation.published import cli_inputs
from meshplan.views import describe, reduces_each_microbatch

LLAMA = "layers=8 hidden=4096 heads=32 kv_heads=8 ffn_hidden=14336 vocab=128256 seq=4096"
GA = 4  # microbatches per step


def _inputs(runtime: str, *extra: str, pp: int = 1):
    argv = ["estimate", "--model", "analytic:llama", "--set", *LLAMA.split(), "--cluster", "h100-80g"]
    argv += f"--num-gpus {16 * pp} --global-batch {16 * GA} --tp 1 --pp {pp} --dp 16 --zero 3 --microbatch 1".split()
    argv += ["--recompute", "full", "--schedule", "1f1b", "--runtime", runtime, *extra]
    return cli_inputs(argv)


def _grads_bytes(runtime: str, *extra: str, pp: int = 1) -> float:
    plan = estimate(*_inputs(runtime, *extra, pp=pp))
    return plan.prediction.stage_memory[0].grads_bytes


def _dp(runtime: str, *extra: str, pp: int = 1) -> DataParallelCost:
    ctx = Context.build(*_inputs(runtime, *extra, pp=pp))
    return DataParallelCost(ctx, pinned_candidate(ctx))


def test_torchtitan_holds_no_unsharded_gradients_without_a_pipeline():
    profile = _inputs("torchtitan")[0]
    params = sum(lp.num_params for lp in profile.layers)
    executor, titan = _grads_bytes("meshplan"), _grads_bytes("torchtitan")
    # the executor's accumulation is every parameter's fp32 gradient, unsharded, beside the shards
    assert executor - titan == pytest.approx(4 * params, rel=0.01)
    assert titan == pytest.approx(4 * params / 16, rel=0.05)
    assert not _dp("torchtitan").unsharded_accumulation and _dp("meshplan").unsharded_accumulation


def test_each_microbatch_reduce_scatters_where_the_runtime_keeps_sync_on():
    for runtime, share in (("meshplan", 1 / GA), ("torchtitan", 1.0)):
        dp = _dp(runtime)
        layer = dp.ctx.layers[1]
        local = float(layer.num_params)
        per_microbatch = dp._fsdp_comm_s(layer, 1, local, 1, GA)[0]
        gathers = 2 * dp._gather_s(layer, local)  # ZeRO-3: forward and backward
        assert per_microbatch == pytest.approx(gathers + share * dp._scatter_s(local), rel=1e-9), runtime
    titan = _dp("torchtitan")
    held = [(lp, 1) for lp in titan.ctx.layers]
    every = titan.bytes_per_step(held)["dp_shard"]
    titan.unsharded_accumulation = True  # the same rank with its gradient sync off until the last microbatch
    once = titan.bytes_per_step(held)["dp_shard"]
    # fp32 gradients (torchtitan reduces in fp32), each rank's ring share of a reduce-scatter
    params = sum(lp.num_params for lp in titan.ctx.layers)
    one_scatter = 4 * params * (16 - 1) / 16
    assert every - once == pytest.approx((GA - 1) * one_scatter, rel=0.01)


def test_torch_pipelining_defers_for_torchtitan_too():
    titan = _dp("torchtitan", pp=2)
    assert titan.unsharded_accumulation and titan.pipeline_deferred


def test_deepspeed_reduces_every_micro_step_and_holds_partitions_only():
    ds = _dp("deepspeed")
    assert not ds.unsharded_accumulation
    layer = ds.ctx.layers[1]
    local = float(layer.num_params)
    per_microbatch = ds._fsdp_comm_s(layer, 1, local, 1, GA)[0]
    gathers = 2 * ds._gather_s(layer, local)
    assert per_microbatch >= gathers + ds._scatter_s(local) - 1e-12  # the whole scatter, every micro-step
    assert _grads_bytes("deepspeed") < _grads_bytes("meshplan")


# --- meshplan's executor: the plan chooses (runtime behaviour "planned") ----------------------

BIG = "layers=16 hidden=8192 heads=64 kv_heads=8 ffn_hidden=28672 vocab=128256 seq=4096"
"""16 Llama-70B blocks: 15.6e9 parameters, whose unsharded fp32 gradients (62 GB) do not fit beside
the rest on an 80 GB part, while the shards of a 16-way FSDP do."""


def _big(runtime: str, verb: str = "estimate"):
    argv = [verb, "--model", "analytic:llama", "--set", *BIG.split(), "--cluster", "h100-80g"]
    argv += f"--num-gpus 16 --global-batch {16 * GA} --tp 1 --pp 1 --dp 16 --zero 3 --microbatch 1".split()
    argv += ["--recompute", "full", "--schedule", "1f1b", "--runtime", runtime]
    return cli_inputs(argv)


def _fits(plan) -> bool:
    return all(s.total_bytes <= s.capacity_bytes for s in plan.prediction.stage_memory)


def test_meshplan_keeps_deferral_where_it_fits():
    plan = estimate(*_inputs("meshplan"))
    assert _fits(plan) and plan.runtime_behaviours["fsdp_reduce_every_microbatch"] is False
    # deferring pays one reduce-scatter where the other choice pays GA, and is not slower
    profile, cluster, request = _inputs("meshplan")
    each = estimate(profile, cluster, dataclasses.replace(request, fsdp_reduce_every_microbatch=True))
    params = sum(lp.num_params for lp in profile.layers)
    extra = each.prediction.comm_bytes_per_step["dp_shard"] - plan.prediction.comm_bytes_per_step["dp_shard"]
    assert extra == pytest.approx((GA - 1) * 4 * params * (16 - 1) / 16, rel=0.01)
    assert plan.prediction.step_time_s <= each.prediction.step_time_s


def test_meshplan_reduces_every_microbatch_where_deferral_does_not_fit():
    plan, titan = estimate(*_big("meshplan")), estimate(*_big("torchtitan"))
    assert plan.runtime_behaviours["fsdp_reduce_every_microbatch"] is True and _fits(plan)
    # the same bytes as torchtitan, which never holds unsharded gradients without a pipeline
    assert plan.prediction.stage_memory[0].grads_bytes == pytest.approx(titan.prediction.stage_memory[0].grads_bytes)
    assert "reduce-scatter every microbatch" in describe(plan)
    # the deferring variant of the same layout is the one that does not fit
    ctx = Context.build(*_big("meshplan"))
    deferred = DataParallelCost(ctx, pinned_candidate(ctx))
    assert deferred.unsharded_accumulation and not ctx.reduces_every_microbatch(pinned_candidate(ctx))


def test_the_search_offers_both_only_where_the_choice_exists():
    ctx = Context.build(*_big("meshplan"))
    assert ctx.grad_sync_choices(3, 16, GA, 1) == (False, True)
    assert ctx.grad_sync_choices(3, 16, GA, 2) == (False,)  # torch pipelining defers
    assert ctx.grad_sync_choices(3, 16, 1, 1) == (False,)  # nothing to accumulate
    assert ctx.grad_sync_choices(1, 16, GA, 1) == (False,)  # ZeRO-1: DDP's no_sync
    assert Context.build(*_big("torchtitan")).grad_sync_choices(3, 16, GA, 1) == (False,)  # the runtime decides
    best = search_plan(*_big("meshplan", "plan"))
    assert best.runtime_behaviours["fsdp_reduce_every_microbatch"] is reduces_each_microbatch(best)
    assert _fits(best)

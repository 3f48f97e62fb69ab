"""FSDP2 under torch.distributed.pipelining reduce-scatters a stage's gradients only after its last
backward (stage.py backward_maybe_with_nosync): the rank finishing last waits for its last
chunk's scatter once per step instead of hiding it behind backward."""

from __future__ import annotations

import pytest

from meshplan.planner import estimate
from meshplan.planner.context import Context
from meshplan.planner.rank.dp_cost import DataParallelCost
from meshplan.planner.search.enumerate import pinned_candidate
from meshplan.validation.published import cli_inputs

LLAMA = "layers=16 hidden=8192 heads=64 kv_heads=8 ffn_hidden=28672 vocab=128256 seq=4096"
ARGV = ["estimate", "--model", "analytic:llama", "--set", *LLAMA.split(), "--cluster", "h100-80g"]
ARGV += "--num-gpus 64 --global-batch 64 --tp 8 --dp 4 --zero 2 --microbatch 1 --recompute full".split()
ARGV += "--sequence-parallel --runtime torchtitan".split()


def _pp(pp: int, schedule: str = "1f1b", v: int = 1, *extra: str):
    return cli_inputs([*ARGV, "--pp", str(pp), "--schedule", schedule, "--virtual-stages", str(v), *extra])


def test_the_last_chunks_scatter_is_exposed_once_per_step():
    ctx = Context.build(*_pp(2))
    dp = DataParallelCost(ctx, pinned_candidate(ctx))
    assert dp.pipeline_deferred
    local = 1e9
    assert dp.sync_s(local, 0.0, 0.0, 1.0, 0.0) == pytest.approx(dp._scatter_s(local))
    inter = Context.build(*_pp(2, "interleaved", 2))
    dp2 = DataParallelCost(inter, pinned_candidate(inter))
    assert dp2.sync_s(local, 0.0, 0.0, 1.0, 0.0) == pytest.approx(dp2._scatter_s(local / 2))


def test_it_reaches_the_step_and_leaves_plain_fsdp_alone():
    deferred = estimate(*_pp(2)).prediction.breakdown["dp_comm"]
    ddp = estimate(*_pp(2, "1f1b", 1, "--zero", "0")).prediction.breakdown["dp_comm"]
    assert deferred > 0.0 and ddp >= 0.0
    flat = Context.build(*_pp(1, "1f1b", 1, "--dp", "8"))
    assert not DataParallelCost(flat, pinned_candidate(flat)).pipeline_deferred  # no pipeline: scatter under backward
    # an engine that reduces every micro-step into the shards (runtime behaviour fsdp_full_grad_accumulation
    # off: DeepSpeed's), whatever state layout, defers nothing
    deepspeed = Context.build(*_pp(2, "1f1b", 1, "--runtime", "deepspeed", "--state-layout", "torch"))
    assert not DataParallelCost(deepspeed, pinned_candidate(deepspeed)).pipeline_deferred

"""Three engine properties are runtime behaviours, not state-layout fields: FSDP2's unsharded fp32
accumulation until the last microbatch (fsdp_full_grad_accumulation), DDP's second fp32 copy of the
gradients in its buckets (ddp_bucket_copy) and the after-backward all-reduce of replicas DDP cannot wrap
(replica_sync_after_backward). Each runtime's engine decides them, whatever --state-layout keeps the state:
`--runtime deepspeed --state-layout torch` priced torch DDP's and FSDP2's while they were layout fields."""

from __future__ import annotations

import pytest
from planner_profiles import candidate, small_gpt
from test_tp_replica_sync import exposed_sync_s

from meshplan import runtimes
from meshplan.planner import PlanRequest
from meshplan.planner.context import Context
from meshplan.planner.rank.dp_cost import DataParallelCost
from meshplan.presets import cluster_preset

ENGINE_ROWS = ("fsdp_full_grad_accumulation", "ddp_bucket_copy", "replica_sync_after_backward")
TORCH_ENGINES = ("meshplan", "torchtitan")
"""Runtimes whose data parallelism is torch DDP / FSDP2 (with torch pipelining)."""


def _cost(runtime: str, layout: str, overlap: bool | None = None, **fields) -> DataParallelCost:
    """The data-parallel cost object of a candidate under `runtime`'s behaviours, state layout `layout` and
    overlap_dp_comm `overlap` (None: the runtime's)."""
    world = fields.get("dp_replicate", 1) * fields.get("dp_shard", 1) * fields.get("tp", 1) * fields.get("pp", 1)
    behaviours = runtimes.request_behaviours(runtime, {"state_layout": layout, "overlap_dp_comm": overlap})
    request = PlanRequest(num_gpus=world, global_batch=8 * world, **behaviours)
    ctx = Context.build(small_gpt(), cluster_preset("a100-80g", world), request)
    return DataParallelCost(ctx, candidate(**fields))


@pytest.mark.parametrize("name", ENGINE_ROWS)
def test_every_runtime_states_the_engine_rows(name):
    got = {rt: runtimes.runtime(rt).value(name) for rt in runtimes.NAMES}
    for rt in TORCH_ENGINES:
        assert got[rt] is True, (name, rt)
    for rt in ("megatron-lm", "megatron-core", "deepspeed"):
        assert got[rt] is False, (name, rt)


@pytest.mark.parametrize("layout", tuple(runtimes.STATE_LAYOUTS))
def test_ddp_bucket_copy_is_the_engines(layout):
    """4 B a parameter for DDP's buckets beside the fp32 gradients: torch DDP's (the executor), not
    DeepSpeed's or Megatron's, under every state layout."""
    replicas = dict(dp_replicate=4)
    assert _cost("meshplan", layout, **replicas)._ddp_bucket_bytes_per_param() == 4.0
    assert _cost("deepspeed", layout, **replicas)._ddp_bucket_bytes_per_param() == 0.0
    assert _cost("megatron-core", layout, **replicas)._ddp_bucket_bytes_per_param() == 0.0


@pytest.mark.parametrize("layout", tuple(runtimes.STATE_LAYOUTS))
def test_unsharded_accumulation_under_a_pipeline_is_fsdp2s(layout):
    """Under torch pipelining FSDP2's ZeRO-2 gradients accumulate unsharded and reduce-scatter after the
    stage's last backward; DeepSpeed's engine reduces each micro-step into its partitions."""
    sharded = dict(dp_shard=4, pp=2, zero=2, num_microbatches=4)
    torch_cost = _cost("meshplan", layout, **sharded)
    assert torch_cost.unsharded_accumulation and torch_cost.pipeline_deferred
    deepspeed = _cost("deepspeed", layout, **sharded)
    assert not deepspeed.unsharded_accumulation and not deepspeed.pipeline_deferred


@pytest.mark.parametrize("layout", tuple(runtimes.STATE_LAYOUTS))
def test_tensor_parallel_replicas_sync_after_backward_only_under_torch_ddp(layout):
    """The executor all-reduces TP (DTensor) replicas after backward, the whole of it exposed; DeepSpeed's
    hooks and Megatron-Core's grad buffer reduce them during backward, under any state layout."""

    def exposed(runtime: str, overlap: bool = True) -> float:  # ZeRO-1: DeepSpeed's stage 0 waits for backward
        return exposed_sync_s(2, layout, overlap, runtime=runtime, zero=1)

    whole = exposed("meshplan", overlap=False)
    assert whole > 0 and exposed("meshplan") == whole
    assert exposed("megatron-core") < 0.5 * exposed("megatron-core", overlap=False)
    # DeepSpeed hides what fills its 5e8-element buckets during backward; the unfilled remainder waits
    # for backward's end (reduce_bucket_elems): less than the whole, not less than half here
    assert exposed("deepspeed") < 0.7 * exposed("deepspeed", overlap=False)

"""The ZeRO-0/1 gradient all-reduce of replicas torch DDP cannot wrap
(runtime behaviour replica_sync_after_backward): DDP cannot take DTensor parameters, nor see a split-backward
schedule's weight-gradient pass, so meshplan's executor all-reduces those replicas after backward
(executor/methods/allreduce.py) and nothing of the sync hides; Megatron's grad buffer overlaps it with
backward as for any replica."""

from __future__ import annotations

from planner_profiles import candidate, small_gpt

from meshplan import runtimes
from meshplan.planner import PlanRequest
from meshplan.planner.context import Context
from meshplan.planner.rank.dp_cost import DataParallelCost
from meshplan.planner.rank.tail import last_bucket_params
from meshplan.presets import cluster_preset

RUNTIME = {"torch": "meshplan", "megatron": "megatron-core"}
"""The engine of each state layout these cases name: meshplan's executor (torch DDP), Megatron's grad buffer."""


def exposed_sync_s(tp: int, layout: str, overlap: bool = True, runtime: str | None = None, **fields) -> float:
    """One rank's exposed gradient sync of the whole model, dp 4 x tp, a long backward window, under the
    behaviours of `runtime` (default: `layout`'s engine, RUNTIME); `fields`: the candidate's pp, schedule,
    virtual_stages, zero."""
    profile = small_gpt()
    engine = runtime or RUNTIME[layout]
    behaviours = runtimes.request_behaviours(engine, {"state_layout": layout, "overlap_dp_comm": overlap})
    ctx = Context.build(
        profile, cluster_preset("a100-80g", 4 * tp), PlanRequest(num_gpus=4 * tp, global_batch=8, **behaviours)
    )
    local = profile.num_params / tp
    last = last_bucket_params("block", local)
    return DataParallelCost(ctx, candidate(dp_replicate=4, tp=tp, **fields)).sync_s(local, 4 * local, 0.0, 10.0, last)


def test_tensor_parallel_replicas_sync_after_backward_under_torch_ddp():
    """Under the torch layout a tp 2 plan pays the whole all-reduce, as with overlap off; a tp 1
    plan (plain DDP) hides all but its last bucket behind the backward window."""
    whole = exposed_sync_s(2, "torch", overlap=False)
    assert whole > 0
    assert exposed_sync_s(2, "torch") == whole
    assert exposed_sync_s(1, "torch") < 0.5 * exposed_sync_s(1, "torch", overlap=False)


def test_megatron_grad_buffer_overlaps_tensor_parallel_replicas():
    """Megatron's DDP buckets the local shards during backward: the tp 2 sync hides as tp 1's does."""
    assert exposed_sync_s(2, "megatron") < 0.5 * exposed_sync_s(2, "megatron", overlap=False)


def test_split_backward_stages_sync_after_backward_under_torch_ddp():
    """A zero-bubble stage's weight gradients come after DDP's hooks: the executor reduces them after
    backward (executor/parallelize.py), so even at tp 1 the sync is whole; an Interleaved1F1B stage
    keeps DDP's overlap."""
    zb = dict(pp=2, schedule="InterleavedZeroBubble", virtual_stages=2)
    looped = dict(pp=2, schedule="Interleaved1F1B", virtual_stages=2)
    whole = exposed_sync_s(1, "torch", overlap=False, **zb)
    assert whole > 0
    assert exposed_sync_s(1, "torch", **zb) == whole
    assert exposed_sync_s(1, "torch", **looped) < 0.5 * exposed_sync_s(1, "torch", overlap=False, **looped)
    assert exposed_sync_s(1, "megatron", **zb) < 0.5 * whole

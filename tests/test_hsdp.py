"""HSDP (dp_replicate x dp_shard, both > 1) is plannable: the search picks it where the cost model
says it is cheapest — two nodes of two ranks joined by a slow link, where sharding inside a node
and all-reducing the shards across keeps the per-microbatch gathers off the slow link — and the
plan it writes runs and reproduces the single-process losses."""

from __future__ import annotations

import dataclasses

import pytest

from meshplan.executor.launch import LaunchOptions, run_plans
from meshplan.executor.reference import reference_losses
from meshplan.planner import PlanRequest
from meshplan.planner.search import search
from meshplan.presets import local_cpu
from meshplan.profiler import profile_model

TRAIN = dict(optimizer="sgd", lr=0.5, grad_clip=1.0)


def _two_slow_nodes():
    c = local_cpu(4)
    return dataclasses.replace(
        c,
        num_nodes=2,
        devices_per_node=2,
        collectives=[],
        inter_node=dataclasses.replace(c.inter_node, bandwidth_gbps=0.05),
    )


def _hsdp_plan():
    prof = profile_model("gpt-tiny", {}, device="meta")
    return search(prof, _two_slow_nodes(), PlanRequest(num_gpus=4, global_batch=8, dp=4, precision="fp32", top_k=8))


def test_the_search_picks_hsdp_where_it_is_cheapest():
    plan = _hsdp_plan()
    assert (plan.data_parallel_replicate_degree, plan.data_parallel_shard_degree) == (2, 2)
    fsdp = [
        p for p in plan.search.alternatives if p.data_parallel_shard_degree == 4 and p.zero_stage == plan.zero_stage
    ]
    assert fsdp and all(p.prediction.step_time_s > plan.prediction.step_time_s for p in fsdp)
    # the gradient shards cross the slow link (dp_replicate) once per step; the gathers stay in the node
    assert plan.prediction.comm_bytes_per_step["dp_replicate"] > 0 and "dp_shard" in plan.prediction.comm_bytes_per_step


@pytest.mark.slow
def test_the_searched_hsdp_plan_matches_the_single_process_losses(tmp_path):
    plan = _hsdp_plan()
    (result,) = run_plans([plan], LaunchOptions(steps=4, out_dir=str(tmp_path), quiet=True, timeout_s=240, **TRAIN))
    ref = reference_losses(plan, steps=4, **TRAIN)
    rel = [abs(a - b) / abs(b) for a, b in zip(result.losses, ref)]
    assert len(result.losses) == 4 and max(rel) <= 1e-4, (result.losses, ref)

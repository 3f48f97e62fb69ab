"""Runtime behaviour hybrid_shard: the search offers HSDP (dp_replicate x dp_shard) only where the
runtime runs it. DeepSpeed's ZeRO partitions over its whole data-parallel group (MiCS is gone from its
config), so a DeepSpeed plan never comes back with replicas beside its shards, which its export could
only warn about."""

from __future__ import annotations

import dataclasses

import pytest
from test_runtimes import _inputs

from meshplan import runtimes
from meshplan.planner.context import Context
from meshplan.planner.search import search
from meshplan.planner.search.enumerate import shard_degrees

BASE = [
    "plan",
    "--model",
    "analytic:gpt",
    "--set",
    "layers=24",
    "hidden=2048",
    "heads=16",
    "--cluster",
    "a100-80g",
    "--num-gpus",
    "64",
    "--global-batch",
    "512",
]


def _context(runtime: str) -> Context:
    profile, cluster, request = _inputs([*BASE, "--runtime", runtime])
    return Context.build(profile, cluster, request)


def _ranked(runtime: str) -> list:
    profile, cluster, request = _inputs([*BASE, "--runtime", runtime])
    best = search(profile, cluster, dataclasses.replace(request, top_k=20))
    assert best.search is not None
    return [best, *best.search.alternatives]


@pytest.mark.parametrize("runtime", runtimes.NAMES)
def test_shard_degrees_follow_the_runtime(runtime):
    ctx = _context(runtime)
    got = shard_degrees(ctx, 64, 1, 1)
    if runtimes.RUNTIMES[runtime].behaviours["hybrid_shard"].value:
        assert got == [8, 64]  # one node's shard group (8 A100s) and FSDP over all 64
    else:
        assert got == [64]


def test_deepspeed_plans_shard_over_the_whole_group():
    """On this job the other runtimes' searches rank HSDP candidates among their best; DeepSpeed's
    contains none, however many plans it keeps."""
    assert runtimes.RUNTIMES["deepspeed"].behaviours["hybrid_shard"].value is False
    deepspeed = _ranked("deepspeed")
    assert len(deepspeed) > 1
    assert all(p.data_parallel_replicate_degree == 1 or p.zero_stage <= 1 for p in deepspeed)
    titan = _ranked("torchtitan")
    assert any(p.data_parallel_replicate_degree > 1 and p.data_parallel_shard_degree > 1 for p in titan)


def test_a_pinned_dp_shard_is_kept_under_deepspeed():
    profile, cluster, request = _inputs([*BASE, "--runtime", "deepspeed", "--zero", "3", "--dp-shard", "8"])
    assert shard_degrees(Context.build(profile, cluster, request), 64, 1, 1) == [8]

"""The recompute transient (planner/rank/stages.py): a recomputing rank holds, once, the bytes one
microbatch of a block re-materialises in its backward, and the solvers stay exact under it."""

from __future__ import annotations

import math

import pytest
from planner_profiles import brute_force_best, candidate, cluster, small_gpt

from meshplan.planner import PlanRequest, estimate
from meshplan.planner.context import Context
from meshplan.planner.cost.memory import activation_bytes
from meshplan.planner.rank.layer_cost import CostTable
from meshplan.planner.rank.stages import RankModel
from meshplan.planner.search import search
from meshplan.planner.search.partition import solve

PROFILE = small_gpt(4)
PINS = dict(pp=1, tp=1, dp=1, microbatch=2, schedule="1F1B", zero=0, sequence_parallel=False)


def _block_gap(ctx: Context, mode: str) -> float:
    block = ctx.layers[1]
    none = activation_bytes(ctx, block, "none", 2, 1, 1, False)
    return none - activation_bytes(ctx, block, mode, 2, 1, 1, False)


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_a_recomputing_rank_holds_one_blocks_gap_once(mode):
    """Buffers with every block recomputed = buffers without recompute + one block's
    (none - mode) bytes of one microbatch, whatever the number of blocks and microbatches."""
    spec = cluster(1, 80.0)
    req = dict(num_gpus=1, global_batch=8, **PINS)
    none = estimate(PROFILE, spec, PlanRequest(recompute="none", **req)).prediction.stage_memory[0]
    got = estimate(PROFILE, spec, PlanRequest(recompute=mode, **req)).prediction.stage_memory[0]
    ctx = Context.build(PROFILE, spec, PlanRequest(**req))
    assert got.buffers_bytes - none.buffers_bytes == pytest.approx(_block_gap(ctx, mode), rel=1e-9)


def test_the_leanest_mode_used_sets_the_transient():
    ctx = Context.build(PROFILE, cluster(1, 80.0), PlanRequest(num_gpus=1, global_batch=8, **PINS))
    cand = candidate(microbatch=2, num_microbatches=4)
    model = RankModel(ctx, cand, CostTable(ctx).for_candidate(cand))
    layers = list(range(len(ctx.layers)))
    base = {i: "none" for i in layers}
    assert model.transient_bytes(layers, base) == 0.0
    assert model.transient_bytes(layers, {**base, 1: "selective"}) == pytest.approx(_block_gap(ctx, "selective"))
    mixed = {**base, 1: "selective", 2: "full"}
    assert model.transient_bytes(layers, mixed) == pytest.approx(_block_gap(ctx, "full"))
    assert [p[1] for p in model.phases(layers)] == [0.0, *(model.transients(layers)[m] for m in ("selective", "full"))]


def test_a_plan_that_fits_only_without_the_transient_is_not_chosen():
    """At a capacity where all-full recompute fits only if the transient is ignored, the search
    keeps fewer blocks on full (or none fits), and every candidate's solve equals brute force."""
    spec0 = cluster(2, 80.0)
    req = dict(num_gpus=2, global_batch=16, pp=2, tp=1, dp=1, microbatch=2, schedule="1F1B", zero=0)
    req["sequence_parallel"] = False
    full = estimate(PROFILE, spec0, PlanRequest(recompute="full", **req)).prediction
    ctx = Context.build(PROFILE, spec0, PlanRequest(**req))
    peak = max(s.total_bytes for s in full.stage_memory)
    gap = _block_gap(ctx, "full")
    reserved = spec0.device.memory_reserved_fraction
    mem_gib = (peak - gap / 2) / (1 - reserved) / 2**30
    spec = cluster(2, mem_gib)
    pinned = estimate(PROFILE, spec, PlanRequest(recompute="full", **req)).prediction
    assert "OOM" in pinned.binding_constraint  # fits without the transient: peak - gap < capacity
    request = PlanRequest(top_k=1, **req)
    brute, per_candidate = brute_force_best(PROFILE, spec, request)
    table = CostTable(Context.build(PROFILE, spec, request))
    for cand, expected in per_candidate.items():
        sols, _, _ = solve(table.ctx, cand, table.for_candidate(cand))
        got = max(s.cost_s for s in sols) if sols else math.inf
        assert got == pytest.approx(expected, rel=1e-9), cand.label()
    if brute < math.inf:
        plan = search(PROFILE, spec, request)
        assert plan.prediction.step_time_s == pytest.approx(brute, rel=1e-9)
        assert max(s.total_bytes for s in plan.prediction.stage_memory) <= spec.device.memory_bytes * (1 - reserved)

"""estimate(): predict one fully given configuration, without searching.

Stage boundaries are the request's (stage_layers: layers per stage, what a config file pins), else a
balanced split of the blocks over the pp x v stages (the first stage also carries the embedding, the
last the head); every block uses the requested recompute mode (with recompute_blocks k: full on the first k
blocks of each stage, none on the rest). A configuration that does not fit still gets its prediction, its
binding constraint says the OOM.
What the runtime leaves to the plan and no flag pins (meshplan's executor: whether ZeRO-2/3
reduce-scatters every microbatch) is chosen as the search would: fitting, then fastest.
"""

from __future__ import annotations

import dataclasses

from meshplan import feasibility
from meshplan.cluster import ClusterSpec
from meshplan.errors import MeshplanError
from meshplan.model_profile import ModelProfile
from meshplan.plan import Plan
from meshplan.planner.context import Context
from meshplan.planner.cost.pipeline import p2p_per_microbatch_s
from meshplan.planner.rank import waves
from meshplan.planner.rank.layer_cost import CostTable, pinned_block_modes
from meshplan.planner.rank.stages import RankModel
from meshplan.planner.request import PlanRequest
from meshplan.planner.search import tuning
from meshplan.planner.search.enumerate import pinned_candidate, tp_divisors, tp_kinds
from meshplan.planner.search.method_choice import method_options
from meshplan.planner.search.partition import balanced_stages, pinned_stages
from meshplan.planner.search.predict import build_plan, provenance


def estimate(profile: ModelProfile, cluster: ClusterSpec, request: PlanRequest) -> Plan:
    """Prediction of the configuration the request pins (degrees, microbatch, schedule, ...)."""
    cluster = cluster if cluster.num_devices == request.num_gpus else cluster.with_num_devices(request.num_gpus)
    ctx = Context.build(profile, cluster, request)
    cand = pinned_candidate(ctx)
    invalid = [
        r.text
        for r in feasibility.reasons(
            cand.layout(ctx.seq), num_layers=len(ctx.layers), tp_divisors=tp_divisors(ctx), tp_kinds=tp_kinds(ctx)
        )
        if not r.runnable_only
    ]
    if invalid:  # the same rules as the search, Plan.validate and the executor's check_plan
        raise MeshplanError(f"{cand.label()}: {invalid[0]}")
    table = CostTable(ctx)
    plans = [
        _estimate(ctx, table, dataclasses.replace(cand, reduce_every_microbatch=each), profile, cluster)
        for each in ctx.grad_sync_choices(cand.zero, cand.state_shard, cand.num_microbatches, cand.pp)
    ]
    return min(plans, key=_preference)


def _preference(plan: Plan) -> tuple:
    """Where the plan leaves a choice open (Context.grad_sync_choices), the variant `meshplan plan`
    would take: one that fits before one that does not, then the faster, then the smaller."""
    pred = plan.prediction
    assert pred is not None
    over = max(s.total_bytes - s.capacity_bytes for s in pred.stage_memory)
    return (over > 0, pred.step_time_s if over <= 0 else over, pred.peak_memory_bytes)


def _estimate(ctx: Context, table: CostTable, cand, profile: ModelProfile, cluster: ClusterSpec) -> Plan:
    costs = table.for_candidate(cand)
    model = RankModel(ctx, cand, costs)
    num_stages = cand.pp * cand.virtual_stages
    pinned = ctx.request.stage_layers
    stages = pinned_stages(ctx, num_stages, pinned) if pinned else balanced_stages(ctx, num_stages)
    sols, pinned_modes = [], pinned_block_modes(ctx, stages, costs)
    for r in range(cand.pp):
        layers = sorted(i for s in range(r, len(stages), cand.pp) for i in stages[s])
        modes = {i: pinned_modes.get(i, next(iter(costs[i].modes))) for i in layers}
        if ctx.body is not None and cand.pp > 1:
            p2p = p2p_per_microbatch_s(ctx, cand, ctx.layers[ctx.body[0]].output_bytes)
        else:
            p2p = model.p2p(r, layers)
        sols.append(model.finish(r, layers, modes, p2p))
    sols = waves.solutions(ctx, table, cand, sols)  # waves=2: rank/waves.py
    if tuning.auto(cand):  # a parameter left to the planner (crossbow learners=0): search/tuning.py
        cand, sols, _ = tuning.tune(ctx, table, cand, sols)
    plan = build_plan(ctx, cand, sols, stages, provenance(profile, cluster))
    assert plan.prediction is not None  # build_plan predicts every plan
    plan.prediction.dp_method_options = method_options(ctx, table, cand, sols)
    return plan

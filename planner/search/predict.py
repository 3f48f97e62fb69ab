"""Turn a solved candidate (rank solutions + stage layout) into a Plan with its Prediction.

MFU counts model FLOPs only (forward + backward per sample, Korthikanti et al. 2022 Eq. 7 for a
GPT); HFU adds the recompute FLOPs (Narayanan et al. 2021 Eq. 3 counts the full-recompute pass).
"""

from __future__ import annotations

import meshplan
from meshplan import dp_methods
from meshplan.model_profile import ModelProfile
from meshplan.plan import DataParallelMethods, MethodChoice, Plan, Prediction, Provenance, StageMemory
from meshplan.planner.context import Candidate, Context
from meshplan.planner.cost.memory import GIB
from meshplan.planner.cost.pipeline import bubble_factor
from meshplan.planner.rank.dp_cost import comm_bytes_band, comm_bytes_per_step
from meshplan.planner.rank.stages import RankSolution
from meshplan.runtimes import PLANNED, REQUEST_FIELDS
from meshplan.schema import content_hash


def _flops(ctx: Context, modes: dict[int, str]) -> tuple[float, float]:
    """(model, hardware) FLOPs per sample."""
    model = hw = 0.0
    for i, lp in enumerate(ctx.layers):
        model += lp.forward_flops + lp.backward_flops
        mode = modes.get(i, "none")
        hw += lp.forward_flops if mode == "full" else lp.recompute_flops_selective if mode == "selective" else 0.0
    return model, model + hw


def _breakdown(cand: Candidate, sol: RankSolution) -> dict[str, float]:
    m = cand.num_microbatches
    p = sol.parts
    return {
        "compute": m * p["compute_s"],
        "recompute": m * p["recompute_s"],
        "bubble": bubble_factor(cand) * sol.time_s,
        "tp_comm": m * p["tp_s"],
        "pp_comm": m * sol.p2p_s,
        "cp_comm": m * p["cp_s"],
        "dp_comm": m * p["dp_s"] + sol.sync_s,
        "optimizer": sol.optimizer_s,
    }


def _memory(sol: RankSolution, capacity: float) -> StageMemory:
    act = sol.in_flight * sol.act_bytes
    total = sum(sol.static) + sol.buffers_bytes + act
    return StageMemory(
        stage=sol.rank,
        params_bytes=sol.static[0],
        grads_bytes=sol.static[1],
        optimizer_bytes=sol.static[2],
        activations_bytes=act,
        buffers_bytes=sol.buffers_bytes,
        total_bytes=total,
        capacity_bytes=capacity,
    )


def _binding(breakdown: dict[str, float], memory: list[StageMemory], step: float) -> str:
    worst = max(memory, key=lambda s: s.total_bytes - s.capacity_bytes)
    over = worst.total_bytes - worst.capacity_bytes
    if over > 0:
        return (
            f"OOM by {over / GIB:.2f} GiB on stage {worst.stage} "
            f"({worst.total_bytes / GIB:.1f} of {worst.capacity_bytes / GIB:.1f} GiB)"
        )
    if worst.total_bytes > 0.95 * worst.capacity_bytes:
        return f"memory on stage {worst.stage} ({worst.total_bytes / GIB:.1f} of {worst.capacity_bytes / GIB:.1f} GiB)"
    names = {
        "bubble": "pipeline bubble",
        "tp_comm": "tensor-parallel communication",
        "pp_comm": "pipeline point-to-point",
        "dp_comm": "data-parallel gradient sync",
        "recompute": "activation recompute",
        "optimizer": "optimizer step",
        "cp_comm": "context-parallel exchange",
    }
    term = max(names, key=lambda k: breakdown[k])
    share = f"{100 * breakdown[term] / step:.1f}% of the step"
    if breakdown[term] >= breakdown["compute"]:
        return f"{names[term]} ({share}, more than compute)"
    return f"compute-bound; largest overhead: {names[term]} ({share})"


def prediction(ctx: Context, cand: Candidate, sols: list[RankSolution]) -> Prediction:
    critical = max(sols, key=lambda s: (s.cost_s, -s.rank))
    step = critical.cost_s
    breakdown = _breakdown(cand, critical)
    memory = [_memory(s, ctx.capacity_bytes) for s in sols]
    modes = {i: mode for s in sols for i, mode in s.modes.items()}
    model_f, hw_f = _flops(ctx, modes)
    n, batch = ctx.request.num_gpus, ctx.request.global_batch
    model_tf = model_f * batch / step / n
    hw_tf = hw_f * batch / step / n
    return Prediction(
        step_time_s=step,
        breakdown=breakdown,
        stage_memory=memory,
        peak_memory_bytes=max(s.total_bytes for s in memory),
        mfu=model_tf / ctx.peak_flops,
        hfu=hw_tf / ctx.peak_flops,
        model_tflops_per_gpu=model_tf / 1e12,
        hardware_tflops_per_gpu=hw_tf / 1e12,
        tokens_per_s_per_gpu=batch * ctx.seq / step / n,
        binding_constraint=_binding(breakdown, memory, step),
        stage_times_s=[s.time_s for s in sols],
        comm_bytes_per_step=comm_bytes_per_step(ctx, cand, [s.layers for s in sols]),
        comm_bytes_band=comm_bytes_band(ctx, cand, [s.layers for s in sols]),
    )


def runtime_behaviours(request) -> dict:
    """The request's behaviour fields as the Plan records them (meshplan/runtimes.py)."""
    out = {key: getattr(request, key) for key in REQUEST_FIELDS}
    for key in (
        "zero_stages",
        "pipeline_zero_stages",
        "pipeline_schedules",
        "sequence_parallel_modes",
        "offload_methods",
        "also_runs",
        "model_parallel",
    ):
        out[key] = list(out[key]) if out[key] is not None else None
    return out


def _resolved_behaviours(ctx: Context, cand: Candidate) -> dict:
    """runtime_behaviours with what the search chose in place of a planned value: whether ZeRO-2/3
    reduce-scatters every microbatch (the executor reads it: executor/parallelize.py)."""
    out = runtime_behaviours(ctx.request)
    if out["fsdp_reduce_every_microbatch"] == PLANNED:
        out["fsdp_reduce_every_microbatch"] = ctx.reduces_every_microbatch(cand)
    return out


def provenance(profile: ModelProfile, cluster) -> Provenance:
    return Provenance(
        profile_hash=content_hash(profile), cluster_hash=content_hash(cluster), meshplan_version=meshplan.__version__
    )


def build_plan(
    ctx: Context, cand: Candidate, sols: list[RankSolution], stages: list[list[int]], prov: Provenance
) -> Plan:
    modes = {i: mode for s in sols for i, mode in s.modes.items()}
    plan = plan_of(ctx, cand, stages, modes)
    plan.prediction, plan.provenance = prediction(ctx, cand, sols), prov
    plan.warnings = tp_uncovered_warnings(ctx.profile, plan)
    return plan


def tp_uncovered_warnings(profile: ModelProfile, plan: Plan) -> list[str]:
    """Blocks whose profiled TP rule is "none" (no rule for their modules, Phi-3's fused qkv_proj
    for one): under tp > 1 they run whole on every TP rank, their compute duplicated."""
    if plan.tensor_parallel_degree < 2:
        return []
    blocks = [lp.name for lp in profile.layers if lp.name.startswith("layers.")]
    whole = [lp.name for lp in profile.layers if lp.name.startswith("layers.") and lp.tp.kind == "none"]
    if not whole:
        return []
    return [
        f"tensor_parallel_degree = {plan.tensor_parallel_degree}: {len(whole)} of {len(blocks)} blocks "
        f"({whole[0]} .. {whole[-1]}) have no tensor-parallel rule for their modules and run whole on every TP "
        "rank (their compute is duplicated, their weights replicated); only the layers with rules are split"
    ]


def plan_of(ctx: Context, cand: Candidate, stages: list[list[int]], modes: dict[int, str]) -> Plan:
    """The Plan of a candidate with these stages (layer indices) and recompute modes, without a
    prediction and not validated (check_plan and Plan.validate do that)."""
    names = [lp.name for lp in ctx.layers]
    plan = Plan(
        model_name=ctx.profile.model_name,
        model_config=dict(ctx.profile.model_config),
        model_family=ctx.profile.family,
        model_architecture=ctx.profile.architecture,
        model_num_params=ctx.profile.num_params,
        model_structure_hash=ctx.profile.structure_hash,
        cluster_name=ctx.cluster.name,
        world_size=ctx.request.num_gpus,
        pipeline_parallel_degree=cand.pp,
        data_parallel_replicate_degree=cand.dp_replicate,
        data_parallel_shard_degree=cand.dp_shard,
        context_parallel_degree=cand.cp,
        tensor_parallel_degree=cand.tp,
        zero_stage=cand.zero,
        sequence_parallel=cand.sequence_parallel,
        precision=ctx.request.precision,
        runtime=ctx.request.runtime,
        runtime_behaviours=_resolved_behaviours(ctx, cand),
        dp_methods=DataParallelMethods(
            **{axis: MethodChoice(name=cand.method(axis)[0], params=cand.method(axis)[1]) for axis in dp_methods.AXES}
        ),
        global_batch_size=ctx.request.global_batch,
        microbatch_size=cand.microbatch,
        num_microbatches=cand.num_microbatches,
        seq_len=ctx.seq,
        pipeline_schedule=cand.schedule,
        virtual_stages=cand.virtual_stages,
        layers=names,
        stages=[[names[i] for i in stage] for stage in stages],
        recompute={names[i]: modes.get(i, "none") for i in range(len(names))},
        recompute_num_layers=ctx.request.recompute_num_layers,
    )
    if ctx.seq != ctx.profile.model_config.get("seq", ctx.seq):
        plan.model_config["seq"] = ctx.seq
    return plan

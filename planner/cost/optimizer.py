"""The optimizer step's cost on one rank, once per step: the measured clip + AdamW + zero_grad
time where the profile has it, else memory-bound (the state layout's optimizer_step_bytes over
the HBM bandwidth); the optimizer call's fixed cost; and global-norm clipping's collectives
(grad_norm_sync_s).
"""

from __future__ import annotations

from meshplan.planner.context import Candidate, Context, optimizer_call_measured_s
from meshplan.planner.cost.comm import collective_s, group_tier


def layer_optimizer_s(ctx: Context, layer, local_params: float, shard: int, split: int) -> float:
    """Once-per-step optimizer work on one rank's share of a layer: the profile's measured
    clip + AdamW + zero_grad time (LayerProfile.optimizer_step_s, on this device, scaled to the
    in-place whole-model measurement: Context.optimizer_scale) divided by the
    tensor-parallel split and the ZeRO shard; else memory-bound, the state layout's
    optimizer_step_bytes per parameter over the HBM bandwidth."""
    if ctx.measured and layer.optimizer_step_s > 0:
        return layer.optimizer_step_s * ctx.optimizer_scale / (split * shard)
    per_param = ctx.spec.state.optimizer_step_bytes
    return local_params / shard * per_param / (ctx.cluster.device.hbm_gbps * 1e9)


def step_fixed_s(ctx: Context, cand: Candidate) -> float:
    """Once-per-step seconds every rank of a candidate pays whatever its layers: the optimizer
    call's fixed cost and the clip's norm all-reduces."""
    return optimizer_call_s(ctx) + grad_norm_sync_s(ctx, cand)


def grad_norm_sync_s(ctx: Context, cand: Candidate) -> float:
    """Global-norm gradient clipping's collectives, once per step (executor/grad_clip.py, as
    torchtitan and Megatron-LM clip): a scalar all-reduce over the pipeline group, one over the
    tensor-parallel group per sharded placement (column Shard(0), row Shard(1)), and one over
    the data-parallel group when ZeRO-2/3 shards the gradients. Latency-bound: negligible on
    NVLink, milliseconds between busy CPU ranks."""
    norm_bytes = 8.0
    calls = [(cand.pp, group_tier(ctx.cluster, cand.dp * cand.cp * cand.tp, cand.pp))] if cand.pp > 1 else []
    if cand.tp > 1:
        calls += [(cand.tp, group_tier(ctx.cluster, 1, cand.tp))] * 2
    if cand.zero >= 2 and cand.state_shard > 1:
        calls.append((cand.state_shard, group_tier(ctx.cluster, cand.tp, cand.state_shard)))
    return sum(collective_s(ctx.cluster, "all_reduce", g, norm_bytes, tier) for g, tier in calls)


def optimizer_call_s(ctx: Context) -> float:
    """Fixed cost of one optimizer step call on a rank (Python, foreach grouping: measured as
    framework_overhead_s["optimizer_call"]), paid once per rank whatever its layers."""
    if not ctx.measured:
        return 0.0
    return ctx.optimizer_scale * optimizer_call_measured_s(ctx.layers)

"""Pipeline schedules and the once-per-step tail (gradient sync, optimizer step).

Bubble (Narayanan et al. 2021 Sec 2.2): `(p-1)/m` of the ideal time for GPipe and 1F1B,
`(p-1)/(v m)` for interleaved 1F1B with v model chunks per rank, whose point-to-point traffic
grows by v. A rank's step time is `(m + bubble) x t_r + tail_r` with t_r its forward+backward
time of one microbatch; the step is the slowest rank's.
In-flight microbatches whose activations a rank holds (Korthikanti et al. 2022 Sec 4.2.3):
GPipe m; 1F1B rank i holds min(p - i, m); interleaved rank i runs (v-1)p + 2(p-1-i) + 1 chunk-
microbatches before its first backward (Megatron-LM / torch Interleaved1F1B warm-up), i.e.
`p (1 + (p-1)/(p v))` microbatches' worth on rank 0 — Korthikanti's interleaving factor.
Pipeline p2p: the boundary activation `bsh`, `bsh/t` with the scatter/gather optimisation; for
a model cut from its graph, every tensor crossing the boundary (crossing_bytes: a skip that
spans several stages is sent across each boundary in between).
Data parallel: the candidate's cost object (dp_cost.py) prices the once-per-step gradient sync;
clipping's global-norm all-reduces (grad_norm_sync_s). Optimizer: Adam is memory-bound — OPTIMIZER_BYTES_PER_PARAM over the HBM
bandwidth.
"""

from __future__ import annotations

from meshplan.model_profile import ModelProfile
from meshplan.planner.comm import collective_s, group_tier, p2p_s
from meshplan.planner.context import Candidate, Context, optimizer_call_measured_s
from meshplan.planner.dp_cost import DDP_BUCKET_BYTES, DataParallelCost

OPTIMIZER_BYTES_PER_PARAM = {"torch": 28, "megatron": 42, "zero": 28}
"""HBM bytes moved per parameter by the optimizer step. Fused Adam reads weights, grads, m, v (16)
and writes weights, m, v (12). Megatron-LM also reads the fp32 main grads for the global-norm
clip (4), zeroes them (4) and copies the fp32 master weights to the bf16 model (4 + 2). DeepSpeed
("zero": reads 16-bit grads, writes 16-bit weights beside the fp32 master) is counted as torch."""


ZERO_BUBBLE_SHARE = 1 / 3
"""Zero-bubble 1F1B (Qi et al. 2024, ZB-H1) splits backward into input-grad B and weight-grad W
and fills the bubble with W: bubble (p-1)(T_F + T_B - T_W) against 1F1B's (p-1)(T_F + T_B + T_W);
with T_F ~ T_B ~ T_W (each one GEMM pass) that is one third, at 1F1B's activation memory."""


def bubble_factor(cand: Candidate) -> float:
    if cand.pp == 1:
        return 0.0
    share = ZERO_BUBBLE_SHARE if cand.schedule == "InterleavedZeroBubble" else 1.0
    return share * (cand.pp - 1) / cand.virtual_stages


def in_flight(cand: Candidate, rank: int) -> float:
    """Microbatches' worth of a rank's activations held at its peak."""
    p, m, v = cand.pp, cand.num_microbatches, cand.virtual_stages
    if p == 1:
        return 1.0
    if cand.schedule in ("GPipe", "LoopedBFS"):  # every forward (of a chunk) before any backward
        return float(m)
    if v == 1:
        return float(min(p - rank, m))
    return min((v - 1) * p + 2 * (p - 1 - rank) + 1, m * v) / v


_CROSSING: list = [None, []]
"""The last profile's crossing bytes per cut (the profile object, the list): boundary_bytes is
asked per rank and candidate, the graph walk is done once per profile."""


def crossing_bytes(profile: ModelProfile) -> list[float]:
    """Bytes per sample sent across the cut after each layer (the last: what leaves the model).

    A chain (no `edges`): layer k's output_bytes. A graph (layers cut from the fx graph with
    several tensors crossing a cut, models/fx_layers.py): every tensor of every edge i -> j with
    i <= k < j, each tensor once (a skip spanning several cuts is sent across each of them;
    ModelProfile.edge_tensors)."""
    if _CROSSING[0] is profile:
        return _CROSSING[1]
    layers = profile.layers
    out = [lp.output_bytes for lp in layers]
    if profile.edges and profile.edge_tensors:
        order = {lp.name: i for i, lp in enumerate(layers)}
        spans = [(order[a], order[b], t) for (a, b), t in zip(profile.edges, profile.edge_tensors)]
        for k in range(len(layers) - 1):
            crossing: dict[str, float] = {}
            for src, dst, tensors in spans:
                if src <= k < dst:
                    crossing.update(tensors)
            out[k] = sum(crossing.values())
    _CROSSING[:] = [profile, out]
    return out


def boundary_bytes(ctx: Context, after: int) -> float:
    """Per-sample bytes a pipeline boundary after layer index `after` sends (crossing_bytes)."""
    return crossing_bytes(ctx.profile)[after]


def p2p_per_microbatch_s(ctx: Context, cand: Candidate, boundary_bytes: float) -> float:
    """Forward send + backward send of one microbatch's boundary tensor, per chunk boundary.

    With sequence parallelism the boundary is already split over the t ranks (bsh/t each).
    Without it the TP ranks hold replicas: Megatron-LM sends bsh/t from each and all-gathers it
    on the receiving side over the node (scatter/gather, Narayanan et al. 2021 Sec 4.1); torch
    pipelining (meshplan's executor) sends the whole replica from every TP rank."""
    if cand.pp == 1:
        return 0.0
    full = boundary_bytes * cand.microbatch / cand.cp
    tier = group_tier(ctx.cluster, cand.dp * cand.cp * cand.tp, cand.pp)
    scatter_gather = cand.tp > 1 and not cand.sequence_parallel and ctx.request.state_layout == "megatron"
    split = cand.tp if cand.tp > 1 and (cand.sequence_parallel or scatter_gather) else 1
    gather = (
        collective_s(ctx.cluster, "all_gather", cand.tp, full, group_tier(ctx.cluster, 1, cand.tp))
        if scatter_gather
        else 0.0
    )
    hidden = ctx.cluster.calibration.pp_overlap
    return 2 * cand.virtual_stages * (p2p_s(ctx.cluster, full / split, tier) + gather) * (1 - hidden)


def last_bucket_params(first_layer_kind: str, first_layer_local_params: float) -> float:
    """Parameters whose gradient sync cannot overlap backward: the bucket finished last. A rank
    that starts with the embedding finishes with its (often huge) gradient; otherwise the last
    bucket is DDP's bucket cap of fp32 gradients."""
    cap = DDP_BUCKET_BYTES / 4
    return max(first_layer_local_params, cap) if first_layer_kind == "embedding" else cap


def layer_optimizer_s(ctx: Context, layer, local_params: float, shard: int, split: int) -> float:
    """Once-per-step optimizer work on one rank's share of a layer: the profile's measured
    clip + AdamW + zero_grad time (LayerProfile.optimizer_step_s, on this device, scaled to the
    in-place whole-model measurement: Context.optimizer_scale) divided by the
    tensor-parallel split and the ZeRO shard; else memory-bound, OPTIMIZER_BYTES_PER_PARAM per
    parameter over the HBM bandwidth."""
    if ctx.measured and layer.optimizer_step_s > 0:
        return layer.optimizer_step_s * ctx.optimizer_scale / (split * shard)
    per_param = OPTIMIZER_BYTES_PER_PARAM[ctx.request.state_layout]
    return local_params / shard * per_param / (ctx.cluster.device.hbm_gbps * 1e9)


def step_fixed_s(ctx: Context, cand: Candidate) -> float:
    """Once-per-step seconds every rank of a candidate pays whatever its layers: the optimizer
    call's fixed cost and the clip's norm all-reduces."""
    return optimizer_call_s(ctx) + grad_norm_sync_s(ctx, cand)


def tail_s(
    data: DataParallelCost,
    fixed_s: float,
    local_params: float,
    payload_bytes: float,
    compress_s: float,
    backward_window_s: float,
    last_bucket: float = 0.0,
    optimizer_s: float = 0.0,
) -> tuple[float, float]:
    """(exposed gradient sync, optimizer step) seconds of one rank, once per step: the
    candidate's data-parallel cost object prices the sync (dp_cost.py); `optimizer_s` is the sum
    of the rank's layer_optimizer_s, `fixed_s` the candidate's step_fixed_s."""
    sync = data.sync_s(local_params, payload_bytes, compress_s, backward_window_s, last_bucket)
    return sync, optimizer_s + fixed_s


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

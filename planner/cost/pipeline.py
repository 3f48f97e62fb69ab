"""Pipeline schedules: bubble, in-flight microbatches and point-to-point traffic.

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
The once-per-step tail is rank/tail.py's (gradient sync) and cost/optimizer.py's (optimizer step).
"""

from __future__ import annotations

from meshplan.model_profile import ModelProfile
from meshplan.planner.context import Candidate, Context
from meshplan.planner.cost.comm import collective_s, group_tier, p2p_s
from meshplan.planner.cost.in_place import in_place_overhead_s

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
    pipelining (meshplan's executor) sends the whole replica from every TP rank (runtime behaviour
    pp_scatter_gather). Where the profile measured the schedule in place (in_place_p2p_s) and the
    whole tensor is sent, that measurement, once per chunk, instead of the link fit."""
    if cand.pp == 1:
        return 0.0
    full = boundary_bytes * cand.microbatch / cand.cp
    tier = group_tier(ctx.cluster, cand.dp * cand.cp * cand.tp, cand.pp)
    scatter_gather = cand.tp > 1 and not cand.sequence_parallel and ctx.spec.pp_scatter_gather
    split = cand.tp if cand.tp > 1 and (cand.sequence_parallel or scatter_gather) else 1
    measured = in_place_p2p_s(ctx, cand) if split == 1 and boundary_bytes > 0 else None
    if measured is not None:
        return cand.virtual_stages * measured
    gather = (
        collective_s(ctx.cluster, "all_gather", cand.tp, full, group_tier(ctx.cluster, 1, cand.tp))
        if scatter_gather
        else 0.0
    )
    hidden = ctx.cluster.calibration.pp_overlap
    return 2 * cand.virtual_stages * (p2p_s(ctx.cluster, full / split, tier) + gather) * (1 - hidden)


def in_place_p2p_s(ctx: Context, cand: Candidate) -> float | None:
    """A pipeline rank's per-microbatch cost beyond its stages' arithmetic, measured in place on
    busy CPU ranks (ModelProfile.step_overhead_s["pp@P:bB"], profiler/insitu.py PipelineCase: a P-stage
    1F1B schedule of the representative block; its two sends, the pipelining runtime's work
    around each action, the loss and the waits), linear in the microbatch; None where not
    measured: GPU profiles (collectives on their own engines, link fits describe them), another
    pipeline degree, a model cut from its graph (several tensors cross a cut) or context
    parallelism (a 1/cp sequence slice crosses)."""
    if not ctx.measured or ctx.profile.device != "cpu" or cand.cp > 1 or ctx.profile.edges:
        return None
    return in_place_overhead_s(ctx.profile.step_overhead_s, f"pp@{cand.pp}", cand.microbatch)

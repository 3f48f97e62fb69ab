"""A rank's solution under Wavelet's two waves (waves=2; the model: methods/waves.py): each
microbatch run as two half waves of b/2 on the same devices, their compute summed, one wave's
communication behind the other's compute, the activation peak two_wave_peak's; each wave a
process of its own (executor/waves.py), with its own replica, gradients, optimizer states and
optimizer step, and the cross-wave averaging (CROSS_WAVE_*) after every step."""

from __future__ import annotations

import dataclasses

from meshplan.planner.cost.comm import p2p_s
from meshplan.planner.methods.waves import two_wave_peak
from meshplan.planner.rank.stages import RankModel, RankSolution

CROSS_WAVE_HELD = 3
"""fp32 model copies a wave process holds between its steps (executor/waves.py): the partner's
newest model, the receive buffer the next one lands in, and its own copy still being sent."""
CROSS_WAVE_TRANSIENT = 2
"""fp32 model copies alive while a wave averages (the flattened parameters and their average with
the partner's), after its optimizer step; the two waves average at different times."""
CROSS_WAVE_TRAFFIC_BYTES = 44
"""Memory traffic per parameter of one cross-wave averaging: flatten the parameters (read 4,
write 4), x + y (read 8, write 4), / 2 (read 4, write 4), copy back into the parameters (read 4,
write 4), clone the copy to send (read 4, write 4)."""


def _cross_wave(model: RankModel, layers: list[int]) -> tuple[float, float]:
    """(seconds, bytes held) of one wave's cross-wave averaging per step: the memory passes
    (CROSS_WAVE_TRAFFIC_BYTES at the host's memory bandwidth where measured, else the device's)
    and the fp32 model sent to the partner on the same device (the send/recv link)."""
    local = sum(model.costs[i].local_params for i in layers)
    cluster = model.ctx.cluster
    bandwidth = (cluster.host_memory_gbps or cluster.device.hbm_gbps) * 1e9
    seconds = local * CROSS_WAVE_TRAFFIC_BYTES / bandwidth + p2p_s(cluster, 4 * local, "intra_node")
    return seconds, 4 * local


def solutions(ctx, table, cand, sols: list[RankSolution]) -> list[RankSolution]:
    """The rank solutions under the candidate's wave scheduling (unchanged for waves=1)."""
    if cand.method("waves")[0] != "2":
        return sols
    half = dataclasses.replace(cand.with_method("waves", "1", {}), microbatch=max(1, cand.microbatch // 2))
    costs = table.for_candidate(half)
    model = RankModel(ctx, half, costs)
    return [_two_waves(model, costs, s) for s in sols]


def _two_waves(model: RankModel, costs, sol: RankSolution) -> RankSolution:
    one = model.finish(sol.rank, sol.layers, sol.modes, sol.p2p_s / 2)  # one half wave (p2p: half the tensor)
    compute = one.parts["compute_s"] + one.parts["recompute_s"]
    comm = max(0.0, one.time_s - compute)
    time = max(2 * compute, 2 * comm)
    exposed = (time - 2 * compute) / (2 * comm) if comm > 0 else 0.0
    parts = {
        "compute_s": 2 * one.parts["compute_s"],
        "recompute_s": 2 * one.parts["recompute_s"],
        **{k: 2 * exposed * one.parts[k] for k in ("tp_s", "dp_s", "cp_s")},
    }
    modes = [costs[i].modes[sol.modes[i]] for i in sol.layers]
    peak = two_wave_peak(
        [mc.act_bytes for mc in modes],
        [max(0.0, mc.compute_s - costs[i].backward_s) for mc, i in zip(modes, sol.layers)],
        [costs[i].backward_s + mc.recompute_s for mc, i in zip(modes, sol.layers)],
    )
    # both wave processes step their own optimizer and average across waves once a step, on the
    # shared device: in series with the other wave's work
    cross_s, model_bytes = _cross_wave(model, sol.layers)
    sync = one.sync_s + min(compute, comm) + 2 * cross_s
    optimizer_s = 2 * one.optimizer_s
    return dataclasses.replace(
        sol,
        time_s=time,
        act_bytes=peak,
        static=(2 * one.static[0], 2 * one.static[1], 2 * one.static[2]),
        buffers_bytes=2 * one.buffers_bytes + (2 * CROSS_WAVE_HELD + CROSS_WAVE_TRANSIENT) * model_bytes,
        sync_s=sync,
        optimizer_s=optimizer_s,
        cost_s=model.factor * time + sync + optimizer_s,
        parts=parts,
    )

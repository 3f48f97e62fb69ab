"""A rank's solution under Wavelet's two waves (waves=2; the model: methods/waves.py): each
microbatch run as two half waves of b/2 on the same devices, their compute summed, one wave's
communication behind the other's compute, the activation peak two_wave_peak's."""

from __future__ import annotations

import dataclasses

from meshplan.planner.methods.waves import two_wave_peak
from meshplan.planner.rank.stages import RankModel, RankSolution


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
    sync = one.sync_s + min(compute, comm)
    return dataclasses.replace(
        sol,
        time_s=time,
        act_bytes=peak,
        sync_s=sync,
        optimizer_s=one.optimizer_s,
        cost_s=model.factor * time + sync + one.optimizer_s,
        parts=parts,
    )

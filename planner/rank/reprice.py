"""Re-pricing a solved split: the same stages and recompute under another candidate's methods
(RankModel.finish per rank, Wavelet's two waves where the candidate runs them)."""

from __future__ import annotations

from meshplan.planner.context import Candidate, Context
from meshplan.planner.cost.memory import fits
from meshplan.planner.rank import waves
from meshplan.planner.rank.layer_cost import CostTable
from meshplan.planner.rank.stages import RankModel, RankSolution


def reprice(
    ctx: Context, table: CostTable, cand: Candidate, sols: list[RankSolution]
) -> tuple[list[RankSolution], bool]:
    """The same stages and recompute under `cand`'s methods: (rank solutions, fits in memory)."""
    model = RankModel(ctx, cand, table.for_candidate(cand))
    out = waves.solutions(ctx, table, cand, [model.finish(s.rank, s.layers, s.modes, s.p2p_s) for s in sols])
    return out, all(fits(model.memory_bytes(s), model.capacity) for s in out)

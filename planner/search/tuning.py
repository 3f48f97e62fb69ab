"""Method tuning: the one hook through which the search loop, brute force and estimate reach a
data-parallel method's own search, so none of them names a method.

Two kinds of tuner, each a Protocol below, registered in VARIANTS and AUTO:
- a default variant: a method the planner prices exactly and so searches beside every candidate it
  composes with, at its tuned parameters (ByteScheduler's chunk and credit for the backward window,
  methods/comm_schedule.py). The search's bounds and brute force see the untuned variant
  (`variant`), the solved split the tuned one (`searched`, `solutions`).
- an auto parameter: a method whose parameter the user left to the planner (Crossbow's learners = 0,
  methods/sync.py): `tune` re-prices a solved split at every value the executor can run and keeps
  the best; a candidate without one is re-priced as it is.
"""

from __future__ import annotations

from typing import Protocol

from meshplan import feasibility
from meshplan.planner.context import Candidate, Context
from meshplan.planner.methods.comm_schedule import DEFAULT, ByteScheduler
from meshplan.planner.methods.sync import Crossbow
from meshplan.planner.rank.dp_cost import DataParallelCost
from meshplan.planner.rank.layer_cost import CostTable
from meshplan.planner.rank.reprice import reprice
from meshplan.planner.rank.stages import RankSolution
from meshplan.planner.search.partition import solve


class DefaultVariant(Protocol):
    """A method searched by default beside the candidates it composes with."""

    def composes(self, ctx: Context, cand: Candidate) -> bool: ...

    def owns(self, cand: Candidate) -> bool:
        """`cand` runs this method (it is one of this tuner's variants)."""
        ...

    def variant(self, ctx: Context, cand: Candidate) -> Candidate | None: ...

    def searched(self, ctx: Context, table: CostTable, cand: Candidate) -> list[Candidate]: ...

    def solutions(
        self, ctx: Context, table: CostTable, alt: Candidate, sols: list[RankSolution]
    ) -> tuple[list[RankSolution], bool]: ...


class AutoParameter(Protocol):
    """A method parameter the planner picks on a solved split."""

    def applies(self, cand: Candidate) -> bool: ...

    def tune(
        self, ctx: Context, table: CostTable, cand: Candidate, sols: list[RankSolution]
    ) -> tuple[Candidate, list[RankSolution], bool]: ...


class ByteSchedulerVariant:
    """comm_schedule=bytescheduler, searched by default at its tuned chunk and credit."""

    def composes(self, ctx: Context, cand: Candidate) -> bool:
        """ByteScheduler may be searched on this candidate: the axis unpinned, meshplan's executor
        (other runtimes express only the bucket order), and feasibility's rules (ZeRO-0 replicas
        without tensor or pipeline parallelism, no compression; the cheap ones checked first)."""
        if (
            "comm_schedule" in ctx.request.methods
            or ctx.request.runtime != "meshplan"
            or cand.method("comm_schedule")[0] != "buckets"
        ):
            return False
        if cand.zero != 0 or cand.pp != 1 or cand.tp != 1 or cand.dp_replicate * cand.cp <= 1:
            return False
        return cand.method("compression")[0] == "none" and cand.method("sync")[0] == "allreduce"

    def owns(self, cand: Candidate) -> bool:
        return cand.method("comm_schedule")[0] == "bytescheduler"

    def variant(self, ctx: Context, cand: Candidate) -> Candidate | None:
        """The candidate with ByteScheduler (default chunk and credit) where it composes, else None."""
        if not self.composes(ctx, cand):
            return None
        alt = cand.with_method("comm_schedule", "bytescheduler", DEFAULT)
        return None if feasibility.first(alt.layout(ctx.seq), also_runs=ctx.spec.also_runs) else alt

    def searched(self, ctx: Context, table: CostTable, cand: Candidate) -> list[Candidate]:
        """The candidate with ByteScheduler at its tuned chunk and credit, where it composes ([] else)."""
        alt = self.variant(ctx, cand)
        if alt is None:
            return []
        window = sum(table.get(i, cand).backward_s for i in range(len(ctx.layers)))  # pp = 1: every layer
        schedule = DataParallelCost(ctx, alt).schedule
        assert isinstance(schedule, ByteScheduler)
        tuned = schedule.tuned(window)
        return [cand.with_method("comm_schedule", "bytescheduler", tuned)]

    def solutions(
        self, ctx: Context, table: CostTable, alt: Candidate, sols: list[RankSolution]
    ) -> tuple[list[RankSolution], bool]:
        """(rank solutions, fit): the DDP split re-priced (ByteScheduler changes only the sync and
        frees DDP's bucket copy); re-solved when that split recomputes a layer, as the freed memory
        may let it recompute less (pp = 1: one rank, solved exactly)."""
        if all(mode == "none" for s in sols for mode in s.modes.values()):
            return reprice(ctx, table, alt, sols)
        got, _, _ = solve(ctx, alt, table.for_candidate(alt))
        return (got, True) if got is not None else reprice(ctx, table, alt, sols)


class CrossbowLearners:
    """sync=crossbow with learners = 0 (auto): the planner picks k."""

    def applies(self, cand: Candidate) -> bool:
        name, params = cand.method("sync")
        return name == "crossbow" and params.get("learners") == 0

    def tune(
        self, ctx: Context, table: CostTable, cand: Candidate, sols: list[RankSolution]
    ) -> tuple[Candidate, list[RankSolution], bool]:
        """Every k the executor can run re-priced on the same split (memory x k must fit), the
        least step time wins (the most throughput: the global batch is fixed), ties to the smaller
        k (less memory). Crossbow's own tuner adds learners while throughput rises (Koliousis et
        al. 2019 Sec 4.3); this one prices all of them, so a dip does not stop it. The learners run
        one after another, so k > 1 pays only where the profile says a smaller microbatch costs
        less per sample."""
        params = cand.method("sync")[1]
        best: tuple[Candidate, list[RankSolution], bool] | None = None
        sync = DataParallelCost(ctx, cand).sync
        assert isinstance(sync, Crossbow)
        for k in sync.learner_counts():
            alt = cand.with_method("sync", "crossbow", {**params, "learners": k})
            alt_sols, ok = reprice(ctx, table, alt, sols)
            step = max(s.cost_s for s in alt_sols)
            if best is None or (ok, -step) > (best[2], -max(s.cost_s for s in best[1])):
                best = (alt, alt_sols, ok)
        assert best is not None, "learner_counts always holds k = 1"
        return best


VARIANTS: tuple[DefaultVariant, ...] = (ByteSchedulerVariant(),)
AUTO: tuple[AutoParameter, ...] = (CrossbowLearners(),)


def composes(ctx: Context, cand: Candidate) -> bool:
    """Some default variant may be searched on this candidate."""
    return any(v.composes(ctx, cand) for v in VARIANTS)


def variant(ctx: Context, cand: Candidate) -> Candidate | None:
    """The first default variant of `cand` at its untuned parameters (for bounds and counting)."""
    return next((alt for v in VARIANTS if (alt := v.variant(ctx, cand)) is not None), None)


def searched(ctx: Context, table: CostTable, cand: Candidate) -> list[Candidate]:
    """Every default variant of `cand` at its tuned parameters: what the search and brute force
    price beside `cand`."""
    return [alt for v in VARIANTS for alt in v.searched(ctx, table, cand)]


def solutions(
    ctx: Context, table: CostTable, alt: Candidate, sols: list[RankSolution]
) -> tuple[list[RankSolution], bool]:
    """(rank solutions, fit) of a default variant from its base candidate's solutions."""
    owner = next((v for v in VARIANTS if v.owns(alt)), None)
    return owner.solutions(ctx, table, alt, sols) if owner else reprice(ctx, table, alt, sols)


def auto(cand: Candidate) -> bool:
    """`cand` has a parameter left to the planner."""
    return any(a.applies(cand) for a in AUTO)


def tune(
    ctx: Context, table: CostTable, cand: Candidate, sols: list[RankSolution]
) -> tuple[Candidate, list[RankSolution], bool]:
    """(candidate with its auto parameters picked, its rank solutions, fits); a candidate without
    one re-priced as it is."""
    for a in AUTO:
        if a.applies(cand):
            return a.tune(ctx, table, cand, sols)
    return (cand, *reprice(ctx, table, cand, sols))

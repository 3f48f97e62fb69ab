"""Brute force: the reference that search() is held against, and the baseline it is timed against.

The plan space of a request is, for every outer candidate of `enumerate.candidates`, every
contiguous split of the L profile layers into pp x v stages (stage s on rank s mod pp) and every
per-layer recompute choice (`layer_cost.allowed_modes`; under a runtime that runs one mode on every block, only
those assignments: `layer_cost.recompute_policies`), each candidate also with ByteScheduler
at its tuned chunk and credit where it composes (the search prices it by default:
planner/methods/comm_schedule.py). Brute force visits every plan of that space and takes its step time
as the slowest rank's cost (`RankModel.finish`, the cost function
the search uses), infinite when any rank overflows its memory (`memory.fits`). Nothing is pruned:
no lower bounds, no heap merge, no Pareto frontier. What is shared is only arithmetic: a rank's
cost for one recompute assignment of its layers is computed once per candidate and reused by every
plan that contains it, so a plan costs one comparison once its ranks' costs are known.

    count_plans(ctx) / space_size(profile, cluster, request)   exact size, without enumerating
    brute_force(profile, cluster, request, cap_s=None)          every plan, or until cap_s CPU seconds
    brute_force_best(profile, cluster, request)                 (best step, {candidate: its best})

brute_force_best falls back to offload as search() does (search/offload_search.py): when no plan
of the space fits on the device and the request leaves offload open, it visits the whole space
again under offload=cpu, then offload=nvme, and keeps the first whose best plan fits (for cpu, in
host memory too).

Size of the space (exact, in integers; it overflows any float for large models):
    sum over candidates of C(L - 1, pp*v - 1) x prod over layers of |recompute modes|
    (x |modes| instead of the product when one mode runs on every block),
C(L - 1, k - 1) being the number of compositions of L layers into k non-empty contiguous stages.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field

from meshplan.cluster import ClusterSpec
from meshplan.model_profile import ModelProfile
from meshplan.planner.context import Candidate, Context
from meshplan.planner.cost.memory import fits
from meshplan.planner.cost.pipeline import p2p_per_microbatch_s
from meshplan.planner.rank.layer_cost import (
    CostTable,
    allowed_modes,
    pin_modes,
    pinned_block_modes,
    policy_modes,
    recompute_policies,
    restrict,
)
from meshplan.planner.rank.stages import RankModel
from meshplan.planner.request import PlanRequest
from meshplan.planner.search import offload_search, tuning
from meshplan.planner.search.enumerate import Rejects, candidates

CHECK_EVERY = 4096
"""Plans (or rank costs) between two looks at the clock."""


@dataclass(kw_only=True)
class BruteForceResult:
    best_step_s: float
    """Least step time over the fully enumerated candidates (inf when no plan of them fits)."""
    per_candidate: dict[Candidate, float] = field(default_factory=dict)
    """Each fully enumerated candidate's optimum (inf when no plan of it fits)."""
    num_plans: int
    """Exact size of the plan space (count_plans), visited or not."""
    num_evaluated: int
    """Plans visited before the end or the cap."""
    finished: bool
    """True when every plan was visited; False when cap_s ran out first."""
    time_s: float
    """CPU seconds spent (time.process_time), context and cost tables included."""

    @property
    def seconds_per_plan(self) -> float | None:
        return self.time_s / self.num_evaluated if self.num_evaluated else None

    def estimate_s(self) -> float | None:
        """Extrapolation to the whole space: num_plans x the measured seconds per plan (exact
        when finished). Per-plan cost varies between candidates, so this is an order of magnitude."""
        per = self.seconds_per_plan
        if per is None:
            return None
        try:
            return float(self.num_plans) * per
        except OverflowError:  # more plans than a float holds (> 1e308)
            return math.inf


class OutOfTime(Exception):
    """Raised inside the enumeration when the CPU-time deadline has passed."""


class _Clock:
    """Counts visited plans and raises OutOfTime once the CPU-time deadline has passed."""

    def __init__(self, cap_s: float | None):
        self.deadline = None if cap_s is None else time.process_time() + cap_s
        self.plans = 0
        self._ticks = 0

    def tick(self, work: int = 1) -> None:
        self._ticks += work
        if self._ticks >= CHECK_EVERY:
            self._ticks = 0
            if self.deadline is not None and time.process_time() > self.deadline:
                raise OutOfTime


def _policy_mode_count(ctx: Context, layer, policy: str | None) -> int:
    """How many recompute modes `layer` may take under `policy` (layer_cost.restrict: at least one; one where
    recompute_blocks pins each block's by its place in its stage)."""
    if ctx.request.recompute_blocks is not None:
        return 1
    modes = allowed_modes(ctx, layer)
    if policy is None:
        return len(modes)
    return max(len(policy_modes(policy, modes)), 1) if layer.tp.kind == "block" else 1


def count_plans(ctx: Context, cands: list[Candidate] | None = None) -> int:
    """Exact number of plans in the space (a Python int, astronomically large for big models)."""
    cands = candidates(ctx, Rejects()) if cands is None else cands
    cands = cands + [alt for c in cands if (alt := tuning.variant(ctx, c)) is not None]
    per_split = {
        pp: sum(
            math.prod(_policy_mode_count(ctx, layer, policy) for layer in ctx.layers)
            for policy in recompute_policies(ctx, pp)
        )
        for pp in {c.pp for c in cands}
    }
    num_layers = len(ctx.layers)
    return sum(per_split[c.pp] * math.comb(num_layers - 1, c.pp * c.virtual_stages - 1) for c in cands)


def space_size(profile: ModelProfile, cluster: ClusterSpec, request: PlanRequest) -> int:
    return count_plans(Context.build(profile, cluster, request))


def compositions(num_layers: int, parts: int):
    """Every split of layers 0..num_layers-1 into `parts` non-empty contiguous stages."""
    for cuts in itertools.combinations(range(1, num_layers), parts - 1):
        bounds = (0,) + cuts + (num_layers,)
        yield [range(bounds[i], bounds[i + 1]) for i in range(parts)]


class _RankCosts:
    """One rank's cost for each recompute assignment of its layers, in itertools.product order,
    computed on first use (a rank holding most of a large model has more assignments than any
    cap allows; they are produced one by one, with the clock running)."""

    def __init__(self, model: RankModel, rank: int, layers: list[int], p2p_s: float):
        self.model, self.rank, self.layers, self.p2p_s = model, rank, layers, p2p_s
        self.values: list[float] = []
        self.size = math.prod(len(model.costs[i].modes) for i in layers)
        self._choices = itertools.product(*[tuple(model.costs[i].modes) for i in layers])

    def _next(self) -> float:
        choice = next(self._choices)
        sol = self.model.finish(self.rank, self.layers, dict(zip(self.layers, choice)), self.p2p_s)
        cost = sol.cost_s if fits(self.model.memory_bytes(sol), self.model.capacity) else math.inf
        self.values.append(cost)
        return cost

    def iterate(self, clock: _Clock):
        """Every value; the ones not yet computed are computed (and the clock checked) as they come."""
        yield from self.values
        while len(self.values) < self.size:
            clock.tick()
            yield self._next()


def _walk(tables: list[_RankCosts], depth: int, prefix_s: float, clock: _Clock, best_s: float) -> float:
    """Visit every plan of one split: each combination of the ranks' recompute assignments; a
    plan's step time is the max of its ranks' costs. Returns the least step time seen."""
    table = tables[depth]
    if depth < len(tables) - 1:
        for cost in table.iterate(clock):
            best_s = _walk(tables, depth + 1, cost if cost > prefix_s else prefix_s, clock, best_s)
        return best_s
    visited = 0
    try:
        for cost in table.iterate(clock):  # one plan per value
            step = cost if cost > prefix_s else prefix_s
            if step < best_s:
                best_s = step
            visited += 1
    finally:
        clock.plans += visited
    clock.tick(visited)
    return best_s


def _p2p_s(model: RankModel, ctx: Context, cand: Candidate, rank: int, layers: list[int]) -> float:
    """Per-microbatch p2p of a rank, as planner/search/partition.py charges it (identical blocks: the block's
    output on every rank; any other chain: the rank's contiguous boundaries)."""
    if ctx.body is not None and cand.pp > 1:
        return p2p_per_microbatch_s(ctx, cand, ctx.layers[ctx.body[0]].output_bytes)
    return model.p2p(rank, layers)


def brute_force_candidate(ctx: Context, cand: Candidate, table: CostTable, clock: _Clock | None = None) -> float:
    """Least step time over every split and recompute assignment of one candidate (inf if none fits)."""
    clock = clock or _Clock(None)
    best_s = math.inf
    if ctx.request.recompute_blocks is not None:  # each split's blocks pinned by their place in their stage
        p, v, costs = cand.pp, cand.virtual_stages, table.for_candidate(cand)
        for stages in compositions(len(ctx.layers), p * v):
            model = RankModel(ctx, cand, pin_modes(costs, pinned_block_modes(ctx, stages, costs)))
            tables = []
            for r in range(p):
                layers = sorted(i for s in range(r, p * v, p) for i in stages[s])
                tables.append(_RankCosts(model, r, layers, _p2p_s(model, ctx, cand, r, layers)))
            best_s = _walk(tables, 0, 0.0, clock, best_s)
        return best_s
    for policy in recompute_policies(ctx, cand.pp):  # (None,): every per-layer assignment; else one mode per block
        model = RankModel(ctx, cand, restrict(ctx, table.for_candidate(cand), policy))
        p, v = cand.pp, cand.virtual_stages
        rank_costs: dict[tuple, _RankCosts] = {}
        for stages in compositions(len(ctx.layers), p * v):
            tables = []
            for r in range(p):
                layers = sorted(i for s in range(r, p * v, p) for i in stages[s])  # stage s runs on rank s mod p
                key = (r, tuple(layers))
                if key not in rank_costs:
                    rank_costs[key] = _RankCosts(model, r, layers, _p2p_s(model, ctx, cand, r, layers))
                tables.append(rank_costs[key])
            best_s = _walk(tables, 0, 0.0, clock, best_s)
    return best_s


def brute_force(
    profile: ModelProfile, cluster: ClusterSpec, request: PlanRequest, cap_s: float | None = None
) -> BruteForceResult:
    """Visit every plan of the space (or stop after cap_s CPU seconds and say so)."""
    start = time.process_time()
    clock = _Clock(cap_s)
    cluster = cluster if cluster.num_devices == request.num_gpus else cluster.with_num_devices(request.num_gpus)
    ctx = Context.build(profile, cluster, request)
    table, cands = CostTable(ctx), candidates(ctx, Rejects())
    per: dict[Candidate, float] = {}
    finished = True
    try:
        for cand in cands:
            per[cand] = brute_force_candidate(ctx, cand, table, clock)
            for alt in tuning.searched(ctx, table, cand):  # exact methods searched by default
                per[alt] = brute_force_candidate(ctx, alt, table, clock)
    except OutOfTime:
        finished = False
    elapsed_s = time.process_time() - start
    return BruteForceResult(
        best_step_s=min(per.values(), default=math.inf),
        per_candidate=per,
        num_plans=count_plans(ctx, cands),
        num_evaluated=clock.plans,
        finished=finished,
        time_s=elapsed_s,
    )


def brute_force_best(profile: ModelProfile, cluster: ClusterSpec, request: PlanRequest) -> tuple[float, dict]:
    """(best step time, {candidate: its brute-force optimum}) over every candidate, no cap; with
    the offload fallback when nothing fits on the device (module docstring)."""
    result = brute_force(profile, cluster, request)
    if result.best_step_s < math.inf or "offload" in request.methods:
        return result.best_step_s, result.per_candidate

    def attempt(offloaded: PlanRequest):
        alt = brute_force(profile, cluster, offloaded)
        if alt.best_step_s == math.inf:
            return alt, None, None
        best = min(alt.per_candidate, key=lambda c: alt.per_candidate[c])
        return alt, Context.build(profile, cluster, offloaded), best

    found, _ = offload_search.first_fit(request, cluster, attempt)
    if found is not None:
        return found.best_step_s, found.per_candidate
    return result.best_step_s, result.per_candidate

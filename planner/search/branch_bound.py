"""search(): the best plan under the cost model, its top-K alternatives and the rejected families.

Branch and bound over the outer candidates (planner/search/enumerate.py): each gets a lower bound on its step
time — `(m + bubble) x sum of its layers' fastest per-microbatch times / pp` (a rank is at least
the average) — and a lower bound on its memory (weights, grads, optimizer states and the leanest
activations, averaged over the pp ranks). Candidates are solved exactly (planner/search/partition.py) in order
of their bound; the loop stops when the bound reaches the K-th best step time found, so the
result equals solving every candidate. Layer costs are memoised per layer signature.
"""

from __future__ import annotations

import heapq
import math
import time
from collections import Counter
from collections.abc import Callable

from meshplan.cluster import ClusterSpec
from meshplan.errors import ConflictError, InfeasibleError
from meshplan.model_profile import ModelProfile
from meshplan.plan import Plan, Rejection, SearchSummary
from meshplan.planner.context import Candidate, Context
from meshplan.planner.cost.comm import collectives_memoized
from meshplan.planner.cost.memory import GIB, fits
from meshplan.planner.cost.pipeline import bubble_factor, in_flight
from meshplan.planner.rank.layer_cost import CostTable
from meshplan.planner.request import PlanRequest
from meshplan.planner.search import offload_search, tuning
from meshplan.planner.search.enumerate import Rejects, candidates
from meshplan.planner.search.explain import infeasible_message, rule_conflict
from meshplan.planner.search.gc_pause import gc_paused
from meshplan.planner.search.method_choice import best_method, method_options
from meshplan.planner.search.partition import solve
from meshplan.planner.search.predict import _breakdown, build_plan, provenance
from meshplan.planner.search.recompute import solve_identical


class Bounds:
    """Lower bounds per candidate from per-signature layer costs (O(#distinct layers))."""

    def __init__(self, ctx: Context, table: CostTable):
        self.ctx, self.table = ctx, table
        self.multiplicity = Counter(ctx.signatures)
        self._memo: dict[tuple, tuple[float, float, float, float]] = {}

    def _sums(self, cand: Candidate) -> tuple[float, float, float, float]:
        """(sum of fastest per-layer times, slowest single layer, static bytes, leanest act bytes);
        the same for every candidate with the same layer costs (Candidate.cost_key)."""
        hit = self._memo.get(cand.cost_key)
        if hit is None:
            hit = self._memo[cand.cost_key] = self._layer_sums(cand)
        return hit

    def _layer_sums(self, cand: Candidate) -> tuple[float, float, float, float]:
        time_sum = slowest = static = act = 0.0
        for index, count in self.multiplicity.items():
            lc = self.table.get(index, cand)
            fastest = min(mc.time_s for mc in lc.modes.values())
            time_sum += count * fastest
            slowest = max(slowest, fastest)
            static += count * (lc.weights_bytes + lc.grads_bytes + lc.optim_bytes)
            act += count * min(mc.act_bytes for mc in lc.modes.values())
        return time_sum, slowest, static, act

    def __call__(self, cand: Candidate) -> tuple[float, float]:
        """(step-time lower bound, memory lower bound of the busiest rank)."""
        time_sum, slowest, static, act = self._sums(cand)
        factor = cand.num_microbatches + bubble_factor(cand)
        flight = in_flight(cand, cand.pp - 1)  # the last rank holds the fewest
        return factor * max(time_sum / cand.pp, slowest), (static + flight * act) / cand.pp

    def refine(self, cand: Candidate) -> float:
        """The memory-aware step-time bound (computed lazily: only for candidates near the top)."""
        time_sum, slowest, static, _ = self._sums(cand)
        flight = in_flight(cand, cand.pp - 1)  # the last rank holds the fewest
        time_sum = max(time_sum, self._memory_aware_time(cand, static, flight))
        return (cand.num_microbatches + bubble_factor(cand)) * max(time_sum / cand.pp, slowest)

    def _memory_aware_time(self, cand: Candidate, static: float, flight: float) -> float:
        """Least total per-microbatch time of all layers whose recompute lets the ranks' summed
        memory fit in pp x capacity (each rank holds >= the least in-flight count)."""
        if self.ctx.body is None:
            return 0.0
        start, end = self.ctx.body
        get = lambda i: self.table.get(i, cand)  # noqa: E731
        fixed = [get(i).modes["none"] for i in range(len(self.ctx.layers)) if not start <= i < end]
        opts = [(m, mc.time_s, mc.act_bytes) for m, mc in get(start).modes.items()]
        got = solve_identical(
            end - start,
            opts,
            static + flight * sum(mc.act_bytes for mc in fixed),
            flight,
            cand.pp * self.ctx.capacity_bytes,
        )
        return math.inf if got is None else got[0] + sum(mc.time_s for mc in fixed)


def _oom_family(cand: Candidate) -> str:
    return f"{cand.family} zero={cand.zero}{' sp' if cand.sequence_parallel else ''}"


class Searcher:
    def __init__(self, profile: ModelProfile, cluster: ClusterSpec, request: PlanRequest):
        self.ctx = Context.build(profile, cluster, request)
        self.table = CostTable(self.ctx)
        self.rejects = Rejects()
        self.oom: dict[str, list] = {}
        self.num_evaluated = 0
        self.frontiers: dict = {}
        self.family_best: dict[str, tuple] = {}
        """Degree family -> (step_s, candidate, rank solutions) of its best solved candidate."""
        self.family_bound: dict[str, float] = {}
        """Degree family -> least lower bound among its candidates never solved (pruned)."""
        self.family_size: Counter = Counter()

    def _reject_oom(self, cand: Candidate, excess_bytes: float, stage: str) -> None:
        fam = _oom_family(cand)
        entry = self.oom.setdefault(fam, [math.inf, 0, stage])
        if excess_bytes < entry[0]:
            entry[0], entry[2] = excess_bytes, stage
        entry[1] += 1

    def _queue(self, cands: list[Candidate], bound: Bounds) -> list:
        """Heap of (bound, refined?, candidate); candidates whose memory bound overflows are rejected."""
        cap, queue = self.ctx.capacity_bytes, []
        for cand in cands:
            lb_time, lb_mem = bound(cand)
            alt = None if fits(lb_mem, cap) else tuning.variant(self.ctx, cand)
            if alt is not None and fits(bound(alt)[1], cap):  # ByteScheduler frees DDP's bucket copy
                cand = tuning.searched(self.ctx, self.table, cand)[0]  # (search/tuning.py)
                lb_time, lb_mem = bound(cand)
            if fits(lb_mem, cap):
                queue.append((lb_time, False, cand))
            else:
                self._reject_oom(cand, lb_mem - cap, "the average rank (weights+grads+optimizer+leanest activations)")
        heapq.heapify(queue)
        return queue

    def run(
        self, top_k: int, on_progress: Callable[[int, int], None] | None = None
    ) -> tuple[list[tuple[float, Candidate, tuple]], int]:
        """The top_k (step_s, candidate, (rank solutions, stages)), best first; and the candidate count."""
        cands = candidates(self.ctx, self.rejects)
        bound = Bounds(self.ctx, self.table)
        queue = self._queue(cands, bound)
        best: list[tuple[float, Candidate, tuple]] = []  # sorted by (step, candidate)
        total = len(queue)  # grows when an OOM candidate queues its tuned alternatives
        while queue:
            if on_progress is not None:
                total = max(total, self.num_evaluated + len(queue))
                on_progress(self.num_evaluated, total)
            lb_time, refined, cand = heapq.heappop(queue)
            if len(best) >= top_k and lb_time >= best[-1][0] * (1 - 1e-12):
                break  # every remaining candidate is bounded below by this
            if not refined:  # tighten the bound first; solve only if it still leads
                heapq.heappush(queue, (max(lb_time, bound.refine(cand)), True, cand))
                continue
            sols, stages, excess = solve(self.ctx, cand, self.table.for_candidate(cand), self.frontiers)
            self.num_evaluated += 1
            if sols is None:
                self._reject_oom(cand, excess, f"stage {stages} (balanced split, leanest recompute)")
                for alt in tuning.searched(self.ctx, self.table, cand):  # as in _queue
                    heapq.heappush(queue, (lb_time, False, alt))
                continue
            step, cand, sols = best_method(
                self.ctx, self.table, cand, sols, best[-1][0] if len(best) >= top_k else math.inf
            )
            if step < self.family_best.get(cand.family, (math.inf,))[0]:
                self.family_best[cand.family] = (step, cand, sols)
            best.append((step, cand, (sols, stages)))
            best.sort(key=lambda item: (item[0], item[1]))
            del best[top_k:]
        if on_progress is not None:  # the rest is pruned by the bound: settled too
            on_progress(max(total, self.num_evaluated), max(total, self.num_evaluated))
        for lb_time, _, cand in queue:  # pruned by the bound: remember the family's best bound
            self.family_bound[cand.family] = min(lb_time, self.family_bound.get(cand.family, math.inf))
        self.family_size.update(c.family for c in cands)
        return best, len(cands)

    def lost(self, ranked: list) -> list[Rejection]:
        """Why each degree family absent from the top-K lost: its best step (and largest overhead)
        or, when never solved, its lower bound, against the best plan's step."""
        best_step, shown = ranked[0][0], {cand.family for _, cand, _ in ranked}
        out = []
        for fam in sorted(set(self.family_best) | set(self.family_bound)):
            if fam in shown:
                continue
            if fam in self.family_best:
                step, cand, sols = self.family_best[fam]
                crit = max(sols, key=lambda r: (r.cost_s, -r.rank))
                terms = {k: v for k, v in _breakdown(cand, crit).items() if k != "compute"}
                term = max(terms, key=lambda k: terms[k])
                reason = (
                    f"slower: {step:.3g} s per step vs {best_step:.3g} s (+{100 * (step / best_step - 1):.1f}%); "
                    f"largest overhead {term} {100 * terms[term] / step:.1f}% ({cand.label()})"
                )
            else:
                step = self.family_bound[fam]
                reason = (
                    f"slower: at least {step:.3g} s per step (bound) vs {best_step:.3g} s "
                    f"(+{100 * (step / best_step - 1):.1f}%)"
                )
            out.append(Rejection(family=fam, reason=reason, count=self.family_size[fam]))
        return out

    def rejections(self) -> list[Rejection]:
        out = [Rejection(family=f, reason=r, count=c) for (f, r), c in sorted(self.rejects.counts.items())]
        for fam, (excess, count, stage) in sorted(self.oom.items()):
            reason = f"OOM by {max(excess, 0) / GIB:.2f} GiB on {stage}" if excess >= 0 else "no feasible split"
            out.append(Rejection(family=fam, reason=reason, count=count))
        return out


@gc_paused
def search(
    profile: ModelProfile,
    cluster: ClusterSpec,
    request: PlanRequest,
    on_progress: Callable[[int, int], None] | None = None,
) -> Plan:
    """The best plan (with prediction and search summary) for `request` on `cluster`.
    `on_progress(settled, total)` is told how many candidates are settled (solved, or pruned by
    the bound) of how many; it sees the search, never steers it (the CLI's progress bar).
    Collective coefficients are worked out once per group for the search (comm.collectives_memoized)."""
    with collectives_memoized():
        return _search(profile, cluster, request, on_progress)


def _search(
    profile: ModelProfile,
    cluster: ClusterSpec,
    request: PlanRequest,
    on_progress: Callable[[int, int], None] | None,
) -> Plan:
    start = time.perf_counter()
    cluster = cluster if cluster.num_devices == request.num_gpus else cluster.with_num_devices(request.num_gpus)
    searcher = Searcher(profile, cluster, request)
    ranked, num_candidates = searcher.run(max(request.top_k, 1), on_progress)
    offload_notes: list[str] = []
    conflict = rule_conflict(searcher.ctx) if not ranked and not num_candidates else ""
    if conflict:  # every layout breaks a rule: the inputs contradict each other (exit 2)
        raise ConflictError(conflict)
    if not ranked:  # offload only when nothing fits on the device (search/offload_search.py)
        if "offload" in request.methods:
            raise InfeasibleError(
                infeasible_message(searcher, profile, cluster, request)
                + offload_search.pinned_hint(Searcher, profile, cluster, request)
            )
        found, ranked, num_candidates, offload_notes = offload_search.fallback(
            Searcher, profile, cluster, request, max(request.top_k, 1)
        )
        if found is None:
            raise InfeasibleError(
                infeasible_message(searcher, profile, cluster, request) + "; " + "; ".join(offload_notes) + "."
            )
        searcher = found
    prov = provenance(profile, cluster)
    plans = [build_plan(searcher.ctx, cand, sols, stages, prov) for _, cand, (sols, stages) in ranked]
    best = plans[0]
    assert best.prediction is not None  # build_plan predicts every plan
    best.prediction.dp_method_options = method_options(searcher.ctx, searcher.table, ranked[0][1], ranked[0][2][0])
    rejected = searcher.rejections()
    best.search = SearchSummary(
        search_time_s=time.perf_counter() - start,
        num_candidates=num_candidates,
        num_evaluated=searcher.num_evaluated,
        num_rejected=sum(r.count for r in rejected),
        alternatives=plans[1:],
        rejected=rejected + searcher.lost(ranked),
    )
    return best

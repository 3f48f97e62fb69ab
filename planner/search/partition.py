"""Exact stage boundaries + recompute for one candidate (see planner/rank/stages.py for the model).

`solve(ctx, cand, costs)` returns the per-rank solutions of the best split, or None with the
memory excess (bytes over capacity on the tightest rank of a balanced split with the leanest
recompute) when nothing fits.
"""

from __future__ import annotations

import heapq
import math

from meshplan.errors import MeshplanError
from meshplan.planner.context import Candidate, Context
from meshplan.planner.cost.memory import fits
from meshplan.planner.cost.pipeline import in_flight, p2p_per_microbatch_s
from meshplan.planner.rank.layer_cost import LayerCost, pinned_block_modes, recompute_policies, restrict
from meshplan.planner.rank.stages import RankModel, RankSolution
from meshplan.planner.rank.tail import last_bucket_params, tail_s
from meshplan.planner.search.recompute import modes_of, pareto_frontier, solve_frontier, solve_identical, undominated


class UniformSplit:
    """prefix (<= 1 layer, on rank 0) + L identical blocks + suffix (<= 1 layer, on the last rank)."""

    def __init__(self, ctx: Context, cand: Candidate, costs: list[LayerCost]):
        self.model = RankModel(ctx, cand, costs)
        self.ctx, self.cand, self.costs = ctx, cand, costs
        assert ctx.body is not None, "a uniform split needs identical blocks (Context.body)"
        self.start, self.end = ctx.body
        self.block = costs[self.start]
        self.options = [(m, mc.time_s, mc.act_bytes) for m, mc in self.block.modes.items()]
        self.p2p_s = p2p_per_microbatch_s(ctx, cand, ctx.layers[self.start].output_bytes)
        self._memo: dict[tuple[int, int], tuple[float, dict, list[int] | None] | None] = {}
        """(rank, blocks) -> (cost, {mode: blocks}, the chunk sizes pinned recompute chose or None), None: OOM."""
        self._terms: dict[int, tuple] = {}
        self._options_of: dict[frozenset, list] = {}
        self.static_block = self.block.weights_bytes + self.block.grads_bytes + self.block.optim_bytes

    def fixed(self, rank: int) -> list[int]:
        p, n = self.cand.pp, len(self.costs)
        out = [0] if self.start == 1 and rank == 0 else []
        return out + ([n - 1] if self.end == n - 1 and rank == p - 1 else [])

    def min_blocks(self, rank: int) -> int:
        v = self.cand.virtual_stages
        ends = (rank == 0 and self.start == 1) + (rank == self.cand.pp - 1 and self.end == len(self.costs) - 1)
        return max(v - ends, 0) if self.cand.pp > 1 else (0 if ends else 1)

    def cost(self, rank: int, n: int) -> float:
        hit = self._eval(rank, n)
        return math.inf if hit is None else hit[0]

    def _eval(self, rank: int, n: int):
        key = (rank, n)
        if key not in self._memo:
            self._memo[key] = self._solve_rank(rank, n)
        return self._memo[key]

    def _rank_terms(self, rank: int) -> tuple:
        """Per-rank constants: fixed layers' bytes, time, params, backward; buffers; in-flight."""
        if rank not in self._terms:
            fixed = self.fixed(rank)
            static, buf0, flight = self.model.base(rank, fixed)
            buf1 = self.model.base(rank, fixed + [self.start])[1]
            none = [self.costs[i].modes["none"] for i in fixed]
            self._terms[rank] = (
                sum(static),
                buf0,
                buf1,
                flight,
                sum(mc.act_bytes for mc in none),
                sum(mc.time_s for mc in none),
                sum(self.costs[i].local_params for i in fixed),
                sum(self.costs[i].backward_s for i in fixed),
                sum(self.costs[i].optimizer_s for i in fixed),
                sum(self.costs[i].payload_bytes for i in fixed),
                sum(self.costs[i].compress_s for i in fixed),
            )
        return self._terms[rank]

    def _phase_options(self, allowed: frozenset) -> list:
        """The block's undominated recompute options among the modes a phase allows, once per phase."""
        got = self._options_of.get(allowed)
        if got is None:
            got = self._options_of[allowed] = undominated([o for o in self.options if o[0] in allowed])
        return got

    def _solve_rank(self, rank: int, n: int):
        (
            static,
            buf0,
            buf1,
            flight,
            fixed_act,
            fixed_time,
            fixed_local,
            fixed_bwd,
            fixed_opt,
            fixed_payload,
            fixed_compress,
        ) = self._rank_terms(rank)
        blk = self.block
        base = static + n * self.static_block + (buf1 if n else buf0) + flight * fixed_act
        got, chunks = None, None
        layouts = self.pinned_layouts(rank, n) if self.ctx.request.recompute_blocks is not None else [None]
        for allowed, transient in self.model.phases([self.start]) if n else [(frozenset(blk.modes), 0.0)]:
            for layout in layouts:  # pinned: each chunk layout's blocks (the fastest that fits wins)
                if layout is not None:
                    hit = self._pinned(self.full_blocks(layout), n, allowed, base + transient, flight)
                else:
                    opts = self._phase_options(allowed)
                    hit = (
                        solve_identical(n, opts, base + transient, flight, self.model.capacity, True) if opts else None
                    )
                if hit is not None and (got is None or hit[0] < got[0]):
                    got, chunks = hit, layout
        if got is None:
            return None
        time = got[0] + fixed_time + self.p2p_s
        fixed = self.fixed(rank)
        first = 0 if fixed and fixed[0] == 0 and self.start == 1 else self.start
        last = last_bucket_params(self.ctx.layers[first].tp.kind, self.costs[first].local_params)
        sync, opt = tail_s(
            self.model.data,
            self.model.fixed_s,
            fixed_local + n * blk.local_params,
            fixed_payload + n * blk.payload_bytes,
            fixed_compress + n * blk.compress_s,
            fixed_bwd + n * blk.backward_s,
            last,
            fixed_opt + n * blk.optimizer_s,
        )
        return self.model.factor * time + sync + opt, got[1], chunks

    def chunk_need(self, rank: int) -> list[int]:
        """The fewest blocks each of the rank's chunks may hold: none in a chunk that holds the embedding or the
        head (it keeps a layer without them), one in every other (a stage is never empty)."""
        p, v, n = self.cand.pp, self.cand.virtual_stages, len(self.costs)
        return [
            0
            if (rank == 0 and k == 0 and self.start == 1) or (rank == p - 1 and k == v - 1 and self.end == n - 1)
            else 1
            for k in range(v)
        ]

    def chunk_blocks(self, rank: int, total: int) -> list[int]:
        """Blocks in each of the rank's chunks (virtual stages) when it holds `total`: spread evenly, every
        chunk keeping at least one layer (layout)."""
        v, need = self.cand.virtual_stages, self.chunk_need(rank)
        extra = total - sum(need)
        return [need[k] + extra // v + (1 if k < extra % v else 0) for k in range(v)]

    def pinned_layouts(self, rank: int, total: int) -> list[list[int]]:
        """Chunk sizes for the rank's `total` blocks under recompute_blocks k, one for each number of blocks they
        recompute fully (sum over chunks of min(size, k)), from the even spread's (the most) down to the fewest:
        each step moves one block out of the smallest chunk that can spare one into the largest chunk that must
        hold a block (a chunk left with the embedding or the head alone recomputes none), which lowers that
        number by one or keeps it. Under a runtime that splits its stages evenly, the even spread alone."""
        even, need = self.chunk_blocks(rank, total), self.chunk_need(rank)
        if self.ctx.spec.uniform_stages or 1 not in need:
            return [even]
        sizes, out = list(even), [list(even)]
        full = self.full_blocks(sizes)
        big = max((c for c in range(len(sizes)) if need[c]), key=lambda c: (sizes[c], -c))
        while True:
            donors = [c for c in range(len(sizes)) if c != big and sizes[c] > need[c]]
            if not donors:
                return out
            small = min(donors, key=lambda c: (sizes[c], c))
            sizes[small] -= 1
            sizes[big] += 1
            now = self.full_blocks(sizes)
            if now < full:
                full = now
                out.append(list(sizes))

    def full_blocks(self, chunks: list[int]) -> int:
        """Blocks recompute_blocks k recomputes fully on a rank whose chunks hold `chunks` blocks: the first k of
        each chunk (Megatron's --recompute-method block, per model chunk; layer_cost.pinned_block_modes)."""
        k = self.ctx.request.recompute_blocks or 0
        return sum(min(c, k) for c in chunks)

    def _pinned(self, full: int, n: int, allowed: frozenset, base: float, flight: float):
        """(time, {mode: count}) of n blocks, `full` of them fully recomputed and none on the rest, None where a
        mode is not allowed or they OOM."""
        counts = {m: c for m, c in (("full", full), ("none", n - full)) if c}
        if any(m not in allowed or m not in self.block.modes for m in counts):
            return None
        act = sum(c * self.block.modes[m].act_bytes for m, c in counts.items())
        if not fits(base + flight * act, self.model.capacity):
            return None
        return sum(c * self.block.modes[m].time_s for m, c in counts.items()), counts

    def solve(self) -> list[int] | None:
        """Block counts per rank minimising the max rank cost (heap merge, exact)."""
        p, total = self.cand.pp, self.end - self.start
        counts = [self.min_blocks(r) for r in range(p)]
        if sum(counts) > total or any(self.cost(r, counts[r]) == math.inf for r in range(p)):
            return None
        heap = [(self.cost(r, counts[r] + 1), r) for r in range(p)]
        heapq.heapify(heap)
        for _ in range(total - sum(counts)):
            value, r = heapq.heappop(heap)
            if value == math.inf:
                return None
            counts[r] += 1
            heapq.heappush(heap, (self.cost(r, counts[r] + 1), r))
        return counts

    def balanced_counts(self) -> list[int] | None:
        """Blocks per rank of the even split (balanced_stages), None if a rank OOMs."""
        p, v = self.cand.pp, self.cand.virtual_stages
        stages = balanced_stages(self.ctx, p * v)
        counts = [sum(1 for s in range(r, p * v, p) for i in stages[s] if self.start <= i < self.end) for r in range(p)]
        return counts if all(self.cost(r, n) < math.inf for r, n in enumerate(counts)) else None

    def layout(self, counts: list[int]) -> tuple[list[list[int]], list[list[int]]]:
        """(stages in model order as layer indices, block indices per rank). Stage s = chunk
        s // p of rank s % p (loop placement); a rank's blocks are spread evenly over its chunks,
        every chunk keeping at least one layer, or as its pinned recompute chose (_solve_rank)."""
        p, v, n = self.cand.pp, self.cand.virtual_stages, len(self.costs)
        per_chunk = [self._eval(r, total)[2] or self.chunk_blocks(r, total) for r, total in enumerate(counts)]
        stages: list[list[int]] = []
        ranks: list[list[int]] = [[] for _ in range(p)]
        nxt = self.start
        for s in range(p * v):
            r, k = s % p, s // p
            blocks = list(range(nxt, nxt + per_chunk[r][k]))
            nxt += per_chunk[r][k]
            ranks[r] += blocks
            stage = ([0] if s == 0 and self.start == 1 else []) + blocks
            stages.append(stage + ([n - 1] if s == p * v - 1 and self.end == n - 1 else []))
        return stages, ranks

    def rank_solutions(self, counts: list[int]) -> tuple[list[RankSolution], list[list[int]]]:
        stages, rank_blocks = self.layout(counts)
        pinned = pinned_block_modes(self.ctx, stages, self.costs)  # {} without recompute_blocks
        sols = []
        for r, blocks in enumerate(rank_blocks):
            mix = self._eval(r, len(blocks))[1]
            order = [m for m in ("full", "selective", "none") for _ in range(mix.get(m, 0))]
            modes = {i: pinned[i] for i in blocks} if pinned else dict(zip(blocks, order))
            fixed = self.fixed(r)
            modes.update({i: "none" for i in fixed})
            sols.append(self.model.finish(r, sorted(fixed + blocks), modes, self.p2p_s))
        return sols, stages

    def balanced_excess(self) -> float:
        """Bytes over capacity on the tightest rank: balanced split, leanest recompute."""
        p, total = self.cand.pp, self.end - self.start
        lean = min(self.options, key=lambda o: o[2])
        worst, self.tightest_rank = -math.inf, 0
        for r in range(p):
            n = total // p + (1 if r < total % p else 0)
            fixed = self.fixed(r)
            static, buf, flight = self.model.base(r, fixed + ([self.start] if n else []))
            blk = self.block
            mem = (
                sum(static)
                + n * (blk.weights_bytes + blk.grads_bytes + blk.optim_bytes)
                + buf
                + flight * (n * lean[2] + sum(self.costs[i].modes["none"].act_bytes for i in fixed))
                + (self.model.transients([self.start]).get(lean[0], 0.0) if n else 0.0)
            )
            if mem - self.model.capacity > worst:
                worst, self.tightest_rank = mem - self.model.capacity, r
        return worst


def solve_general(ctx: Context, cand: Candidate, costs: list[LayerCost], cache: dict | None = None):
    """DP over contiguous ranges for any chain (non-interleaved): best[r][e] = min over a of
    max(best[r-1][a], c_r([a, e))). Frontiers are memoised in `cache` across candidates that
    share layer costs (same Candidate.cost_key)."""
    model, n, p = RankModel(ctx, cand, costs), len(costs), cand.pp
    if p > n:
        return None
    cache = {} if cache is None else cache
    cost_key = cand.cost_key + (cand.schedule, cand.num_microbatches, cand.pp)
    max_act = model.capacity / min(in_flight(cand, r) for r in range(p))

    def frontier(a: int, e: int, allowed: frozenset):
        """Pareto frontier of layers [a, e) with modes in `allowed`, grown from [a, e-1)."""
        key = cost_key + (a, e, allowed)
        if key not in cache:
            prev = frontier(a, e - 1, allowed) if e - 1 > a else None
            opts = [(m, mc.time_s, mc.act_bytes) for m, mc in costs[e - 1].modes.items() if m in allowed]
            cache[key] = pareto_frontier([opts], start=prev, max_act=max_act) if opts else []
        return cache[key]

    def stage(r: int, a: int, e: int):
        layers = list(range(a, e))
        static, buf, flight = model.base(r, layers)
        point = None
        for allowed, transient in model.phases(layers):  # exact under the recompute transient
            hit = solve_frontier(frontier(a, e, allowed), sum(static) + buf + transient, flight, model.capacity)
            if hit is not None and (point is None or hit[1] < point[1]):
                point = hit
        if point is None:
            return math.inf, None
        sol = model.finish(r, layers, dict(zip(layers, modes_of(point))), model.p2p(r, layers))
        return sol.cost_s, sol

    fastest = [0.0]  # prefix sums of each layer's fastest mode: a stage-cost lower bound
    for c in costs:
        fastest.append(fastest[-1] + min(mc.time_s for mc in c.modes.values()))
    best: dict[tuple[int, int], tuple[float, list[RankSolution]]] = {(0, 0): (0.0, [])}
    for r in range(p):
        for e in range(r + 1, n - (p - 1 - r) + 1):
            choice: tuple[float, list[RankSolution] | None] = (math.inf, None)
            for a in range(e - 1, r - 1, -1):  # longer ranges cost more: stop once the bound loses
                if model.factor * (fastest[e] - fastest[a]) >= choice[0]:
                    break
                prev = best.get((r, a))
                if prev is None or prev[0] >= choice[0]:
                    continue
                c, sol = stage(r, a, e)
                value = max(prev[0], c)
                if value < choice[0]:
                    choice = (value, prev[1] + [sol])
            if choice[1] is not None:
                best[(r + 1, e)] = (choice[0], choice[1])
    final = best.get((p, n))
    return None if final is None or final[0] == math.inf else final[1]


def solve(ctx: Context, cand: Candidate, costs: list[LayerCost], cache: dict | None = None):
    """(rank solutions, stages as layer-index lists, 0.0), or (None, tightest rank, excess_bytes)
    where excess_bytes > 0 is the memory overflow of the leanest balanced split (-1 if unknown).
    Under a runtime that runs one recompute mode on every block, the best of the modes (layer_cost.
    recompute_policies): the one whose slowest rank is fastest, the objective of each solve; none fitting,
    the leanest mode's overflow."""
    policies = recompute_policies(ctx, cand.pp)
    if policies == (None,):
        return _solve(ctx, cand, costs, cache)
    best, best_cost, failed = None, math.inf, None
    for policy in policies:
        sub = None if cache is None else cache.setdefault(("recompute policy", policy), {})
        got = _solve(ctx, cand, restrict(ctx, costs, policy), sub)
        if got[0] is None:
            failed = got
            continue
        cost = max(sol.cost_s for sol in got[0])
        if cost < best_cost:
            best, best_cost = got, cost
    assert best is not None or failed is not None
    return best if best is not None else failed


def _solve(ctx: Context, cand: Candidate, costs: list[LayerCost], cache: dict | None = None):
    if ctx.body is not None:
        split = UniformSplit(ctx, cand, costs)
        counts = split.balanced_counts() if ctx.spec.uniform_stages else split.solve()
        if counts is None:
            excess = split.balanced_excess()
            return None, split.tightest_rank, excess
        sols, stages = split.rank_solutions(counts)
        return sols, stages, 0.0
    if ctx.request.recompute_blocks is not None:
        raise MeshplanError(
            f"--recompute-blocks {ctx.request.recompute_blocks}: the model's blocks are not all alike, so the first "
            "K of a stage are not one cost; use --recompute full (every block) or leave recompute to the search"
        )
    sols = solve_general(ctx, cand, costs, cache)
    if sols is None:
        return None, 0, -1.0
    return sols, [s.layers for s in sols], 0.0


def pinned_stages(ctx: Context, num_stages: int, counts: tuple[int, ...]) -> list[list[int]]:
    """The layers in consecutive stages of the given sizes, in model order (the request's stage_layers:
    the boundaries a config file pins, e.g. torchtitan's module_fqns_per_model_part); the embedding and
    the head count as one layer each."""
    n = len(ctx.layers)
    shown = ",".join(str(c) for c in counts)
    if len(counts) != num_stages:
        raise MeshplanError(
            f"--stage-layers {shown}: {len(counts)} stages, but pp x virtual stages is {num_stages}; "
            "give one count per stage"
        )
    if min(counts) < 1 or sum(counts) != n:
        raise MeshplanError(
            f"--stage-layers {shown}: each stage needs at least one layer and the counts must add up to the "
            f"model's {n} layers (the embedding and the head count as one each; `meshplan profile` lists them)"
        )
    stages, start = [], 0
    for count in counts:
        stages.append(list(range(start, start + count)))
        start += count
    return stages


def balanced_stages(ctx: Context, num_stages: int) -> list[list[int]]:
    """Blocks split as evenly as possible (extra blocks to the middle stages first)."""
    n = len(ctx.layers)
    start, end = ctx.body if ctx.body is not None else (0, n)
    blocks = end - start
    if num_stages > blocks + (start == 1) + (end == n - 1):
        raise MeshplanError(f"{num_stages} pipeline stages for {n} layers; use fewer (--pp x --virtual-stages)")
    sizes = [blocks // num_stages] * num_stages
    order = list(range(1, num_stages - 1)) + [0, num_stages - 1] if num_stages > 2 else list(range(num_stages))
    for k in range(blocks % num_stages):
        sizes[order[k % len(order)]] += 1
    stages, nxt = [], start
    for s, size in enumerate(sizes):
        stage = list(range(nxt, nxt + size))
        nxt += size
        stages.append(
            ([0] if s == 0 and start == 1 else []) + stage + ([n - 1] if s == num_stages - 1 and end == n - 1 else [])
        )
    if any(not st for st in stages):
        raise MeshplanError(f"{num_stages} stages leave one empty; use fewer (--pp x --virtual-stages)")
    return stages

"""The cost of one pipeline rank (a set of layers with their recompute modes); the boundary
search that minimises the slowest rank subject to every rank's memory is in planner/search/partition.py.

A rank's cost is `(m + bubble) x t_r + tail_r` (planner/cost/pipeline.py), monotone in the layers it holds.
- Identical blocks between at most one prefix layer (embedding, on rank 0) and one suffix layer
  (head, on the last rank): a rank's cost depends only on its block count n_r, so the min-max
  is the L-th smallest value of {c_r(n): n above each rank's minimum} — a heap merge of the
  ranks' nondecreasing cost sequences gives it exactly. This also covers interleaved schedules:
  a rank's cost depends on its block count, not on how its v chunks share them.
- Any other chain: dynamic programming over (rank, last layer) of contiguous ranges, O(p L^2).

Memory of a rank: static state + buffers + in-flight microbatches x the saved activations, plus the
recompute transient: a layer that recomputes re-materialises, during its backward, what it did not
keep (one microbatch of it: none - mode bytes) while every in-flight microbatch's saved
activations are still held. Charged once per rank, as the largest such gap among the rank's
layers offering the leanest mode the rank uses (full, else selective; none: nothing), an upper
bound that is exact for identical blocks. The solvers are exact under it (RankModel.phases).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan.planner.context import Candidate, Context
from meshplan.planner.cost.memory import activation_bytes, activation_scale, checkpoint_input_bytes, stage_buffer_bytes
from meshplan.planner.cost.optimizer import step_fixed_s
from meshplan.planner.cost.pipeline import boundary_bytes, bubble_factor, in_flight, p2p_per_microbatch_s
from meshplan.planner.rank.dp_cost import DataParallelCost
from meshplan.planner.rank.layer_cost import LayerCost
from meshplan.planner.rank.tail import last_bucket_params, tail_s

RECOMPUTE_ORDER = ("none", "selective", "full")
"""Recompute modes from the most bytes kept to the least."""


@dataclass
class RankSolution:
    rank: int
    layers: list[int]
    modes: dict[int, str]
    time_s: float
    """Forward+backward(+recompute) of one microbatch, p2p included."""
    act_bytes: float
    static: tuple[float, float, float]
    buffers_bytes: float
    in_flight: float
    sync_s: float
    optimizer_s: float
    p2p_s: float
    cost_s: float
    """(m + bubble) x time_s + sync_s + optimizer_s."""
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def memory_bytes(self) -> float:
        """Peak bytes of the rank: static state, buffers and its in-flight activations."""
        return sum(self.static) + self.buffers_bytes + self.in_flight * self.act_bytes


class RankModel:
    """Cost of a set of layers placed on one pipeline rank of one candidate."""

    def __init__(self, ctx: Context, cand: Candidate, costs: list[LayerCost]):
        self.ctx, self.cand, self.costs = ctx, cand, costs
        self.factor = cand.num_microbatches + bubble_factor(cand)
        self.capacity = ctx.capacity_bytes
        self.data = DataParallelCost(ctx, cand)
        self.fixed_s = step_fixed_s(ctx, cand)
        self._transients: dict[tuple[int, ...], dict[str, float]] = {}
        self._gaps: dict[tuple[int, str], float] = {}

    def base(self, rank: int, layers: list[int]) -> tuple[tuple[float, float, float], float, float]:
        """(static weights/grads/optimizer, buffers, in-flight microbatches) of a rank."""
        c = self.costs
        static = (
            sum(c[i].weights_bytes for i in layers),
            sum(c[i].grads_bytes for i in layers),
            sum(c[i].optim_bytes for i in layers),
        )
        lps = [self.ctx.layers[i] for i in layers]
        buf = stage_buffer_bytes(
            self.ctx,
            lps,
            self.cand.microbatch,
            lambda lp: self.ctx.tp_split(lp, self.cand.tp),
            self.cand.zero,
            self.cand.cp,
        )
        flight = in_flight(self.cand, rank)
        return static, buf + flight * self.held_output_bytes(rank, layers), flight

    def held_output_bytes(self, rank: int, layers: list[int]) -> float:
        """Stage outputs of one in-flight microbatch's worth that the rank holds until their
        backward (torch.distributed.pipelining's fwd_cache, DeepSpeed's pipe buffers; Megatron frees
        each once sent: PlanRequest.free_stage_outputs): one per chunk that sends forward — v on
        every rank but the last, whose final chunk ends in the loss — of the tensors crossing the
        chunk's end (a graph's skips too), sequence-sharded with sequence parallelism, at the
        run's activation dtype (memory.activation_scale)."""
        cand, lps = self.cand, self.ctx.layers
        sends = [i for i in layers if lps[i].tp.kind != "head"]
        chunks = cand.virtual_stages - (rank == cand.pp - 1)
        if cand.pp == 1 or not sends or chunks <= 0 or self.ctx.spec.free_stage_outputs:
            return 0.0
        last = max(sends)
        out = boundary_bytes(self.ctx, last) if self.ctx.profile.edges else lps[last].output_bytes
        split = cand.tp if cand.tp > 1 and cand.sequence_parallel else 1
        return activation_scale(self.ctx) * chunks * out * cand.microbatch / cand.cp / split

    def transients(self, layers: list[int]) -> dict[str, float]:
        """{mode: bytes} of the recompute transient (module docstring) per recompute mode offered
        on these layers: the largest (none - mode) gap of one microbatch among the layers that
        offer the mode."""
        key = tuple(layers)
        if key not in self._transients:
            out: dict[str, float] = {}
            for mode in RECOMPUTE_ORDER[1:]:
                gaps = [self._gap_of(i, mode) for i in layers if mode in self.costs[i].modes]
                if gaps:
                    out[mode] = max(gaps)
            self._transients[key] = out
        return self._transients[key]

    def _gap_of(self, i: int, mode: str) -> float:
        """_gap, once per layer signature (Context.signatures: equal layers, equal bytes)."""
        key = (self.ctx.signatures[i], mode)
        got = self._gaps.get(key)
        if got is None:
            got = self._gaps[key] = self._gap(i, mode)
        return got

    def _gap(self, i: int, mode: str) -> float:
        """Bytes one microbatch of layer i re-materialises when it recomputes in `mode`: what it
        would save without recompute less what it keeps."""
        ctx, cand, lp = self.ctx, self.cand, self.ctx.layers[i]
        split, b, sp = ctx.tp_split(lp, cand.tp), cand.microbatch, cand.sequence_parallel
        none = activation_bytes(ctx, lp, "none", b, split, cand.cp, sp)
        if mode == "full":  # what one block's re-run adds beside its own checkpointed input (a
            # uniform group's further blocks: memory.stage_buffer_bytes, uniform_transient_bytes)
            kept = checkpoint_input_bytes(ctx, lp, b, split, cand.cp, sp)
        else:
            kept = activation_bytes(ctx, lp, mode, b, split, cand.cp, sp)
        return max(0.0, none - kept)

    def transient_bytes(self, layers: list[int], modes: dict[int, str]) -> float:
        """The recompute transient a rank with these modes pays: the leanest mode used (full over
        selective) sets which of transients() is charged; none when no layer recomputes."""
        used = {modes[i] for i in layers}
        table = self.transients(layers)
        return next((table.get(m, 0.0) for m in reversed(RECOMPUTE_ORDER[1:]) if m in used), 0.0)

    def phases(self, layers: list[int]) -> list[tuple[frozenset, float]]:
        """(modes allowed, transient charged) of the exact recompute solve: the best plan with no
        recompute, the best with selective at most (paying the selective transient), the best with
        any mode (paying the full one). The least-time plan over the phases is the exact optimum
        under transient_bytes: a plan whose leanest mode is m pays exactly m's transient, which its
        own phase charges and the later phases charge at least."""
        table = self.transients(layers)
        out = [(frozenset(RECOMPUTE_ORDER[:1]), 0.0)]
        for k, mode in enumerate(RECOMPUTE_ORDER[1:], start=2):
            if mode in table:
                out.append((frozenset(RECOMPUTE_ORDER[:k]), table[mode]))
        return out

    def finish(self, rank: int, layers: list[int], modes: dict[int, str], p2p: float) -> RankSolution:
        static, buf, flight = self.base(rank, layers)
        buf += self.transient_bytes(layers, modes)
        chosen = [self.costs[i].modes[modes[i]] for i in layers]
        time = sum(mc.time_s for mc in chosen) + p2p
        local = sum(self.costs[i].local_params for i in layers)
        first = layers[0]
        last = last_bucket_params(self.ctx.layers[first].tp.kind, self.costs[first].local_params)
        sync, opt = tail_s(
            self.data,
            self.fixed_s,
            local,
            sum(self.costs[i].payload_bytes for i in layers),
            sum(self.costs[i].compress_s for i in layers),
            sum(self.costs[i].backward_s for i in layers),
            last,
            sum(self.costs[i].optimizer_s for i in layers),
        )
        parts = {k: sum(getattr(mc, k) for mc in chosen) for k in ("compute_s", "recompute_s", "tp_s", "dp_s", "cp_s")}
        return RankSolution(
            rank=rank,
            layers=layers,
            modes=modes,
            time_s=time,
            act_bytes=sum(mc.act_bytes for mc in chosen),
            static=static,
            buffers_bytes=buf,
            in_flight=flight,
            sync_s=sync,
            optimizer_s=opt,
            p2p_s=p2p,
            cost_s=self.factor * time + sync + opt,
            parts=parts,
        )

    def memory_bytes(self, sol: RankSolution) -> float:
        return sol.memory_bytes

    def p2p(self, rank: int, layers: list[int]) -> float:
        """Per-microbatch p2p of a contiguous stage (non-interleaved): the larger of the tensor it
        receives and the one it sends (send and receive run concurrently)."""
        if self.cand.pp == 1 or not layers:
            return 0.0
        lps, graph = self.ctx.layers, bool(self.ctx.profile.edges)  # graph: every tensor crossing
        out_b = boundary_bytes(self.ctx, layers[-1]) if graph else lps[layers[-1]].output_bytes
        in_b = boundary_bytes(self.ctx, layers[0] - 1) if graph else lps[layers[0]].input_bytes
        out_b, in_b = (out_b if rank < self.cand.pp - 1 else 0.0), (in_b if rank > 0 else 0.0)
        return p2p_per_microbatch_s(self.ctx, self.cand, max(out_b, in_b))

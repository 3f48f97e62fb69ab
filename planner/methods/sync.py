"""Replica-synchronisation cost objects (the sync axis of meshplan/dp_methods.py): how often and
with what each method exchanges, what it adds to memory and compute, and what of it is exposed.

DataParallelCost (planner/rank/dp_cost.py) delegates to the candidate's object: `AllReduce` keeps its own DDP
pricing; the others run on plain replicas (executor/methods/sync_*.py), so their exchange is not
overlapped with backward. S = 4 x the rank's parameters (one flat fp32 vector), N = replicas;
bytes are meshplan/comm_bytes.py's ring volumes, the executor's counting convention:
- master:    a worker sends S, the master S to each worker: (N-1) S on its link each way, the
             N-1 flows at once (Dean et al. 2012's parameter server without sharding); time two
             fan-ins, 2 gather(N, S): measured, or 2 (alpha + (N-1) S/B) through the root's link
- local-sgd: all-reduce of S every `period` steps (/ H); hierarchical: groups of g every
             group_period, all N every period, only the larger where both fall (torch's
             HierarchicalModelAverager): 2(N-1)/N S / H + 2(g-1)/g S (1/H1 - 1/H)
- crossbow:  all-reduce of Delta (S) every step; memory k replicas + z + Delta_prev + the round's
             flat vectors; k learners one after another at the microbatch / k, k optimizer steps
             and the SMA round's memory traffic (Koliousis et al. 2019 Sec 4); learners = 0:
             the planner picks k (search/tuning.py: the least step time that fits)
- dabmd:     S to each ring neighbour (two, one for N = 2) per consensus iteration, consensus_rounds
             a step (gradient_allreduce: one all-reduce of S + 4 bytes, the sample count); a budget
             only bounds the step where workers differ in speed, which this homogeneous model does
             not see (straggler_trade prices that)
- gossip:    S (low precision: P + 8 ceil(P / chunk)) to each ring neighbour every period steps
             (two neighbours, one for N = 2), and the round's memory-bound mixing (8-bit: the
             codec's passes too); low precision keeps three copies (+3 S)
- async:     all-reduce of S every period steps on a background thread: exposed only where the
             round outlasts the period's steps of work, plus the main thread's copies
             (async_exposed_s); a snapshot and its mean (+2 S)
"""

from __future__ import annotations

import math
from fractions import Fraction

from meshplan import dp_methods
from meshplan.comm_bytes import wire_bytes
from meshplan.model_profile import LayerProfile
from meshplan.planner.cost.comm import collective_s, group_tier
from meshplan.planner.cost.compute import layer_compute_s
from meshplan.planner.cost.optimizer import layer_optimizer_s, optimizer_call_s
from meshplan.planner.cost.state import state_bytes
from meshplan.planner.methods.axes import SyncCost
from meshplan.planner.methods.compression_quant import OP_S

FP32 = 4
MAX_LEARNERS = int(dp_methods.method("sync", "crossbow").param("learners", "crossbow").high or 1)


class AllReduce:
    """sync=allreduce: DDP's bucketed all-reduce, priced by DataParallelCost itself."""

    name = "allreduce"
    replaces_ddp = False
    ddp_buckets = True

    def __init__(self, data, **params):
        self.data, self.params = data, params
        self.ctx, self.group, self.tier = data.ctx, data.replicas, data.replica_tier

    def state_bytes(self, local: float) -> float:
        """Extra bytes per layer of `local` parameters (copies, buffers) on each rank."""
        return 0.0

    def extra_compute_s(self, layer: LayerProfile, split: int, b: int, m: int) -> float:
        return 0.0

    def sync_s(self, params: float, backward_window_s: float) -> float:
        """The fp32 gradients' all-reduce on its own, not overlapped. Not what the plan pays: DDP
        keeps it (replaces_ddp False) and DataParallelCost prices DDP's bucketed, overlapped sync;
        the methods below replace it with their own exchange."""
        return self._ar(FP32 * params)

    def bytes(self, params: int) -> Fraction:
        return wire_bytes("all_reduce", self.group, FP32 * params)

    def _ar(self, nbytes: float, group: int | None = None, tier=None) -> float:
        return collective_s(self.ctx.cluster, "all_reduce", group or self.group, nbytes, tier or self.tier)

    def _p2p(self, nbytes: float) -> float:
        return collective_s(self.ctx.cluster, "send_recv", 2, nbytes, self.tier)


class Master(AllReduce):
    """The workers' gradients go to the master at once (a fan-in of N - 1 flows into its link),
    then the parameters come back the same way (N - 1 sends from it): two gathers' time, from the
    measured "gather" fit where profile-links took one, else (N - 1) messages through the root's
    link. The flows overlap: a link that one TCP flow cannot fill (a rate-limited medium) is
    filled by several, which N - 1 transfers priced one after another missed."""

    name, replaces_ddp, ddp_buckets = "master", True, False

    def sync_s(self, params: float, backward_window_s: float) -> float:
        return 2 * collective_s(self.ctx.cluster, "gather", self.group, FP32 * params, self.tier)

    def bytes(self, params: int) -> Fraction:
        return (self.group - 1) * wire_bytes("send_recv", 2, FP32 * params)


class LocalSGD(AllReduce):
    name, replaces_ddp, ddp_buckets = "local-sgd", True, True  # DDP stays (warm-up all-reduce)

    def _levels(self) -> list[tuple[int, Fraction, str]]:
        """(group size, averagings per step, tier) of each level."""
        p, n = self.params, self.group
        g = p["group_size"]
        if not g or g >= n:
            return [(n, Fraction(1, p["period"]), self.tier)]
        inner = group_tier(self.ctx.cluster, self.data.cand.tp, g)
        return [
            (n, Fraction(1, p["period"]), self.tier),
            (g, Fraction(1, p["group_period"]) - Fraction(1, p["period"]), inner),
        ]

    def state_bytes(self, local: float) -> float:
        return FP32 * local  # average_parameters' flat copy

    def sync_s(self, params: float, backward_window_s: float) -> float:
        return sum(float(rate) * self._ar(FP32 * params, g, tier) for g, rate, tier in self._levels())

    def bytes(self, params: int) -> Fraction:
        return sum((rate * wire_bytes("all_reduce", g, FP32 * params) for g, rate, _ in self._levels()), Fraction(0))


class Crossbow(AllReduce):
    """What executor/methods/sync_crossbow.py does per step, one after another on the device: k
    learners each take the local batch's 1/k share (s = b m / k samples) as microbatches of
    c = ceil(s / m) (ceil(s / c) of them, the plan's m when k divides b), backward, clip and
    their own optimizer step; then SMA: flat copies of the k learners, their differences to z,
    the correction and the stacked sum (~15 S of memory traffic per learner, counted from
    sma_update and _average), one all-reduce of Delta. learners = 0 (auto) prices every
    k-dependent term at its least over the k the executor can run (a lower bound of each, so
    the search's bounds hold) until search/tuning.py picks k."""

    name, replaces_ddp, ddp_buckets = "crossbow", True, False
    SMA_TRAFFIC = 15
    """Bytes of memory traffic per parameter byte and learner in one SMA round."""

    @property
    def k(self) -> int:
        return self.params["learners"]

    def state_bytes(self, local: float) -> float:
        """k - 1 more learners (weights, grads, optimizer states: every learner keeps its own),
        z and Delta_prev, and the round's transient flat vectors (4 per learner: copy,
        difference, correction, stack)."""
        k = max(self.k, 1)  # auto: k = 1 holds the least
        w, g, o = state_bytes(self.ctx)
        return (k - 1) * local * (w + g + o) + (2 + 4 * k) * FP32 * local

    def learner_s(self, k: int) -> float:
        """Seconds per step that k learners add to one replica's step (may be negative where the
        profile says a smaller microbatch is cheaper per sample): their compute at microbatch c
        instead of m microbatches of b, k - 1 more clip + optimizer steps, the SMA round's
        memory traffic."""
        cand, ctx = self.data.cand, self.ctx
        b, m = cand.microbatch, cand.num_microbatches
        share = b * m // k
        c = -(-share // m)
        n = -(-share // c)
        extra = 0.0
        for layer in ctx.layers:  # sync methods run with pp = tp = 1: the rank holds every layer
            small_f, small_b, _ = layer_compute_s(ctx, layer, c, 1, cand.cp)
            fwd, bwd, _ = layer_compute_s(ctx, layer, b, 1, cand.cp)
            extra += k * n * (small_f + small_b) - m * (fwd + bwd)
            extra += (k - 1) * layer_optimizer_s(ctx, layer, layer.num_params, 1, 1)
        params = sum(layer.num_params for layer in ctx.layers)
        sma = self.SMA_TRAFFIC * k * FP32 * params / (ctx.cluster.device.hbm_gbps * 1e9)
        return extra + (k - 1) * optimizer_call_s(ctx) + sma

    def learner_counts(self) -> list[int]:
        """k the executor can run here: divisors of the local batch, up to the registry's bound."""
        local = self.data.cand.microbatch * self.data.cand.num_microbatches
        return [k for k in range(1, MAX_LEARNERS + 1) if local % k == 0]

    def sync_s(self, params: float, backward_window_s: float) -> float:
        learners = min(self.learner_s(k) for k in self.learner_counts()) if self.k == 0 else self.learner_s(self.k)
        return self._ar(FP32 * params) + learners

    def bytes(self, params: int) -> Fraction:
        return wire_bytes("all_reduce", self.group, FP32 * params)


class AnyBatch(AllReduce):
    name, replaces_ddp, ddp_buckets = "dabmd", True, False

    def _peers(self) -> int:
        return 1 if self.group == 2 else 2

    def sync_s(self, params: float, backward_window_s: float) -> float:
        if self.params["gradient_allreduce"]:
            return self._ar(FP32 * params + FP32)
        return self.params["consensus_rounds"] * self._peers() * self._p2p(FP32 * params)

    def bytes(self, params: int) -> Fraction:
        if self.params["gradient_allreduce"]:
            return wire_bytes("all_reduce", self.group, FP32 * params + FP32)
        return Fraction(
            self.params["consensus_rounds"] * self._peers() * wire_bytes("send_recv", self.group, FP32 * params)
        )


class Gossip(AllReduce):
    name, replaces_ddp, ddp_buckets = "gossip", True, False

    def _peers(self) -> int:
        return 1 if self.group == 2 else 2

    def _message(self, params: int) -> int:
        if self.params["low_precision"]:
            return params + 2 * FP32 * math.ceil(params / self.params["chunk"])
        return FP32 * params

    def state_bytes(self, local: float) -> float:
        """Low precision's three public copies, and a receive buffer per neighbour, taken as two
        whatever N: the per-layer cost table is shared by candidates that differ only in the
        replica count (Candidate.cost_key), so N = 2's single buffer is priced as two."""
        copies = 3 if self.params["low_precision"] else 0
        return (copies + 2) * FP32 * local

    def round_compute_s(self, params: float) -> float:
        """Memory-bound elementwise work of one round (executor/methods/sync_gossip.py), counted
        in fp32 passes over the P parameters (a pass reading k tensors and writing one is k + 1):
        flat and unflat (4); full precision: the neighbours' sum and the mix (3 per peer + 10);
        8-bit: encode x - x^ (pad, min/max, shift, scale, round, clamp, cast: 17 + 3 bytes),
        decode and add per copy, own and each peer's (9 + 1 byte), the mix over three copies
        (16); plus a fixed cost per op (planner/methods/compression_quant.py's OP_S)."""
        p = self._peers()
        if self.params["low_precision"]:
            passes, byte_passes, ops = 4 + 17 + 9 * (1 + p) + 16, 3 + (1 + p), 2 + 9 + 5 * (1 + p) + 7
        else:
            passes, byte_passes, ops = 4 + 3 * p + 10, 0, 2 + p + 4
        traffic = (passes * FP32 + byte_passes) * params
        return ops * OP_S + traffic / (self.ctx.cluster.device.hbm_gbps * 1e9)

    def sync_s(self, params: float, backward_window_s: float) -> float:
        wire = self._peers() * self._p2p(self._message(int(params)))
        return (wire + self.round_compute_s(params)) / self.params["period"]

    def bytes(self, params: int) -> Fraction:
        return Fraction(self._peers() * self._message(params), self.params["period"])


def async_exposed_s(allreduce_s: float, work_s: float, period: int, main_s: float) -> float:
    """Exposed seconds per step of asynchronous averaging (executor/methods/sync_async.py).

    The model: the snapshot is handed over at a period step and the main thread waits for its
    round at the next one, so the round's all-reduce (allreduce_s, on the averaging thread's own
    group) hides behind the `period` steps of the main thread's work between them (work_s per
    step: forward and backward of every microbatch and the optimizer step); only what outlasts
    them is exposed. The main thread's own part of a round (main_s: copying the snapshot out,
    applying the landed mean) is never hidden. Per step: the round's exposure / period.
    Assumes the exchange does not slow the compute (a GPU computes while the host's thread and
    NIC move bytes; on a CPU host whose cores are all busy computing it does, and the measured
    step shows the excess)."""
    return (max(0.0, allreduce_s - period * work_s) + main_s) / period


class AsyncAverage(AllReduce):
    name, replaces_ddp, ddp_buckets = "async", True, False
    MAIN_TRAFFIC = 12
    """Bytes of memory traffic per parameter byte of the main thread's part of a round: the
    snapshot (read, write: 2), then flat copy, mean - s, the sum and the copy back (10)."""

    def state_bytes(self, local: float) -> float:
        return 2 * FP32 * local

    def work_s(self) -> float:
        """The main thread's work per step: m microbatches' forward and backward, the optimizer
        step (pp = tp = 1: the rank holds every layer)."""
        cand, ctx = self.data.cand, self.ctx
        total = 0.0
        for layer in ctx.layers:
            fwd, bwd, _ = layer_compute_s(ctx, layer, cand.microbatch, 1, cand.cp)
            total += cand.num_microbatches * (fwd + bwd) + layer_optimizer_s(ctx, layer, layer.num_params, 1, 1)
        return total

    def sync_s(self, params: float, backward_window_s: float) -> float:
        main = self.MAIN_TRAFFIC * FP32 * params / (self.ctx.cluster.device.hbm_gbps * 1e9)
        return async_exposed_s(self._ar(FP32 * params), self.work_s(), self.params["period"], main)

    def bytes(self, params: int) -> Fraction:
        return wire_bytes("all_reduce", self.group, FP32 * params) / self.params["period"]


SYNCS = {c.name: c for c in (AllReduce, Master, LocalSGD, Crossbow, AnyBatch, Gossip, AsyncAverage)}


def sync_cost(data, name: str, params: dict) -> SyncCost:
    return SYNCS[name](data, **params)


def straggler_trade(
    compute_s: float,
    microbatches: int,
    samples_per_node: int,
    factor: float,
    budget_s: float,
    min_microbatches: int,
    ddp_sync_s: float,
    dabmd_sync_s: float,
    optimizer_s: float,
    nodes: int,
) -> dict:
    """DDP against DABMD when one of `nodes` computes `factor` x slower (the homogeneous model's
    compute_s per node for its whole local batch of `microbatches`): DDP's step waits for the slow
    node, factor x compute + its exposed sync + the optimizer step; a DABMD round lasts the budget
    plus the consensus whatever the slowest node does: each node starts microbatches while the
    budget lasts (at least min_microbatches, at most its batch), so a round is the longest node's
    last microbatch end, then the consensus and the mirror step; the slow node contributes fewer
    samples. budget 0: every node its whole batch (the slow node sets the round). Returns each
    one's step seconds and samples per second over all nodes."""
    per_mb = compute_s / microbatches
    samples_mb = samples_per_node / microbatches

    def node(slow: bool) -> tuple[float, int]:
        c = per_mb * (factor if slow else 1.0)
        if budget_s <= 0:
            return c * microbatches, microbatches
        started = min(microbatches, max(min_microbatches, math.ceil(budget_s / c) if c > 0 else microbatches))
        return started * c, started

    (fast_s, fast_n), (slow_s, slow_n) = node(False), node(True)
    ddp = factor * compute_s + ddp_sync_s + optimizer_s
    round_s = max(fast_s, slow_s) + dabmd_sync_s + optimizer_s
    dabmd_samples = samples_mb * ((nodes - 1) * fast_n + slow_n)
    return {
        "ddp_step_s": ddp,
        "ddp_samples_per_s": nodes * samples_per_node / ddp if ddp > 0 else 0.0,
        "dabmd_step_s": round_s,
        "dabmd_samples_per_s": dabmd_samples / round_s if round_s > 0 else 0.0,
        "dabmd_samples_per_round": dabmd_samples,
    }

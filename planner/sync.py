"""Replica-synchronisation cost objects (the sync axis of meshplan/dp_methods.py): how often and
with what each method exchanges, what it adds to memory and compute, and what of it is exposed.

DataParallelCost (dp_cost.py) delegates to the candidate's object: `AllReduce` keeps its own DDP
pricing; the others run on plain replicas (executor/methods/sync_*.py), so their exchange is not
overlapped with backward. S = 4 x the rank's parameters (one flat fp32 vector), N = replicas;
bytes are meshplan/comm_bytes.py's ring volumes, the executor's counting convention:
- master:    a worker sends S, the master S to each worker: (N-1) S on its link each way, serial
             (Dean et al. 2012's parameter server without sharding); time 2 (N-1) (alpha + S/B)
- local-sgd: all-reduce of S every `period` steps (/ H); hierarchical: groups of g every
             group_period, all N every period, only the larger where both fall (torch's
             HierarchicalModelAverager): 2(N-1)/N S / H + 2(g-1)/g S (1/H1 - 1/H)
- crossbow:  all-reduce of Delta (S) every step; memory k replicas + z + Delta_prev; compute k
             learners at the microbatch / k (Koliousis et al. 2019 Sec 4)
- dabmd:     all-reduce of S + 4 bytes (the sample count) every step; a budget only bounds the
             step where workers differ in speed, which this homogeneous model does not see
- gossip:    S (low precision: P + 8 ceil(P / chunk)) to each ring neighbour every period steps
             (two neighbours, one for N = 2); low precision keeps three copies (+3 S)
- async:     all-reduce of S every period steps on a background thread: exposed only where the
             round outlasts the period's compute; a snapshot and its mean (+2 S)
"""

from __future__ import annotations

import math
from fractions import Fraction

from meshplan.comm_bytes import wire_bytes
from meshplan.model_profile import LayerProfile
from meshplan.planner.comm import collective_s, group_tier

FP32 = 4


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

    def _ar(self, nbytes: float, group: int | None = None, tier=None) -> float:
        return collective_s(self.ctx.cluster, "all_reduce", group or self.group, nbytes, tier or self.tier)

    def _p2p(self, nbytes: float) -> float:
        return collective_s(self.ctx.cluster, "send_recv", 2, nbytes, self.tier)


class Master(AllReduce):
    name, replaces_ddp, ddp_buckets = "master", True, False

    def sync_s(self, params: float, backward_window_s: float) -> float:
        return 2 * (self.group - 1) * self._p2p(FP32 * params)

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
    name, replaces_ddp, ddp_buckets = "crossbow", True, False

    @property
    def k(self) -> int:
        return self.params["learners"]

    def state_bytes(self, local: float) -> float:
        """k - 1 more learners (weights, grads, optimizer states) + z, Delta_prev and the flat
        vectors of the round (~3 S)."""
        from meshplan.planner.dp_cost import state_bytes

        w, g, o = state_bytes(self.ctx)
        return (self.k - 1) * local * (w + g + o) + 3 * FP32 * local

    def extra_compute_s(self, layer: LayerProfile, split: int, b: int, m: int) -> float:
        """k learners at batch b / k instead of one at b, m microbatches each: the throughput a
        small batch loses (the profile's efficiency at that batch)."""
        from meshplan.planner.compute import layer_compute_s

        if self.k == 1:
            return 0.0
        small = max(1, b // self.k)
        fwd_s, bwd_s, _ = layer_compute_s(self.ctx, layer, small, split, self.data.cand.cp)
        fwd, bwd, _ = layer_compute_s(self.ctx, layer, b, split, self.data.cand.cp)
        return max(0.0, m * (self.k * (fwd_s + bwd_s) - (fwd + bwd)))

    def sync_s(self, params: float, backward_window_s: float) -> float:
        reduce = self.k * 2 * FP32 * params / (self.ctx.cluster.device.hbm_gbps * 1e9)  # k-way, in memory
        return self._ar(FP32 * params) + reduce

    def bytes(self, params: int) -> Fraction:
        return wire_bytes("all_reduce", self.group, FP32 * params)


class AnyBatch(AllReduce):
    name, replaces_ddp, ddp_buckets = "dabmd", True, False

    def sync_s(self, params: float, backward_window_s: float) -> float:
        return self._ar(FP32 * params + FP32)

    def bytes(self, params: int) -> Fraction:
        return wire_bytes("all_reduce", self.group, FP32 * params + FP32)


class Gossip(AllReduce):
    name, replaces_ddp, ddp_buckets = "gossip", True, False

    def _peers(self) -> int:
        return 1 if self.group == 2 else 2

    def _message(self, params: int) -> int:
        if self.params["low_precision"]:
            return params + 2 * FP32 * math.ceil(params / self.params["chunk"])
        return FP32 * params

    def state_bytes(self, local: float) -> float:
        copies = 3 if self.params["low_precision"] else 0
        return (copies + self._peers()) * FP32 * local

    def sync_s(self, params: float, backward_window_s: float) -> float:
        return self._peers() * self._p2p(self._message(int(params))) / self.params["period"]

    def bytes(self, params: int) -> Fraction:
        return Fraction(self._peers() * self._message(params), self.params["period"])


class AsyncAverage(AllReduce):
    name, replaces_ddp, ddp_buckets = "async", True, False

    def state_bytes(self, local: float) -> float:
        return 2 * FP32 * local

    def sync_s(self, params: float, backward_window_s: float) -> float:
        """The round runs behind `period` steps of compute (~3 x a microbatch's backward each,
        forward ~ half of backward); only the excess waits."""
        hidden = self.params["period"] * 1.5 * backward_window_s
        return max(0.0, self._ar(FP32 * params) - hidden)

    def bytes(self, params: int) -> Fraction:
        return wire_bytes("all_reduce", self.group, FP32 * params) / self.params["period"]


SYNCS = {c.name: c for c in (AllReduce, Master, LocalSGD, Crossbow, AnyBatch, Gossip, AsyncAverage)}


def sync_cost(data, name: str, params: dict) -> AllReduce:
    return SYNCS[name](data, **params)

"""Communication-scheduling cost objects (the comm_schedule axis of meshplan/dp_methods.py), and
the search's choice of ByteScheduler's chunk and credit per candidate.

DataParallelCost (planner/rank/dp_cost.py) delegates to the candidate's object: `Buckets` keeps DDP's own
bucket pricing there; `ByteScheduler` (Peng et al., SOSP 2019) replaces it (ZeRO-0, pp = tp = 1:
meshplan/feasibility.py), with the same bytes on the wire (the fp32 gradients, all-reduced).

ByteScheduler, as modelled (one rank, all layers, layer i = priority i, the input side first):
- Chunks: every gradient tensor cut into chunks of `chunk_mb` (the last one shorter), n_i chunks
  of mean size s_i for layer i. A chunk of s bytes costs a + beta s on the link (the all-reduce's
  latency and per-byte terms, from planner/cost/comm.py's ring model or the measured fit).
- Credit window (Sec 4.2, "credit-based preemption"): at most `credit_mb` of chunks in flight, so
  k_i = floor(credit / s_i) of them overlap their latency (a sliding window): the link is busy
  tau_i = max(beta s_i, (a + beta s_i) / k_i) per chunk, a chunk lands a + beta s_i - tau_i after
  its service ends. Chunks are committed to the link in priority order; what is committed is
  sent first-in first-out, so a more urgent layer that becomes ready waits for up to the credit
  already committed ahead of it (large credit: bandwidth, small credit: preemption).
- Timeline of the last microbatch: backward runs layers L-1 .. 0 (layer i's gradients ready
  when its backward ends), then the next step's first forward runs 0 .. L-1 and layer i may
  start once its chunks have landed (the dependency proxy, Sec 4.3). The exposed sync is the
  forward's total stall: what the next forward cannot overlap. Per-layer backward and forward
  times are the rank's backward window split by the layers' backward (and forward) FLOPs.
  Both windows are scaled by the calibration's dp_overlap, as DDP's bucket rule hides at most
  dp_overlap x backward (planner/rank/dp_cost.py); with overlap_dp_comm off nothing overlaps.
- meshplan's executor (executor/methods/bytescheduler.py) does not start a layer early: the
  optimizer step runs once every chunk has landed (global-norm clipping needs every gradient),
  so the next forward starts after the last chunk (EXECUTOR_EARLY_FORWARD). The exposed sync it
  is charged is then the last landing's time past the end of backward; the per-layer start above
  (`early_forward=True`) is ByteScheduler's own runtime, kept for the day the executor does it.
- Negotiation (NEGOTIATION): the executor's scheduler thread agrees with the other ranks which
  gradients are ready (a small all-reduce on a control group) before it queues their chunks;
  rounds while chunks fly overlap them, but the one that agrees on the last gradients starts
  only when backward has ended, so one all-reduce latency a (the link fit's, as measured by
  profile-links) is added to the exposed sync. With the next forward not started per layer,
  ByteScheduler's priority cannot shorten that sync, so the search keeps DDP unless chunking
  and the credit beat DDP's buckets by more than this overhead.
- Host message cost (HOST_MESSAGE_COST), CPU devices only: there the scheduler thread (which
  holds the interpreter lock while it issues and waits) and gloo's work for each message take
  the cores backward computes on, so each chunk's fixed cost a is paid in series with backward
  instead of behind it: n_chunks x a / k is added to the exposed sync, k the chunks the credit
  keeps in flight, at most GLOO_THREADS (DDP sends one message per 25 MiB bucket,
  ByteScheduler one per chunk, at least one per tensor). On GPUs NCCL's kernels and a host
  thread do not take the compute's cores, and the term is off. benchmarks/dp_paper_methods.py
  measures it: without the term the model put ByteScheduler level with DDP on gpt h256 x 4 (2
  gloo ranks) while it ran 11% (4 MiB chunks) and 37% (0.25 MiB) slower.
- Chunks in flight on gloo (GLOO_THREADS): ProcessGroupGloo runs asynchronous collectives on a
  pool of two worker threads (its Options' default), so however many chunks the credit admits,
  at most two progress at once and overlap their fixed costs: on CPU devices k is capped at 2,
  in the link's sliding window (_simulate) and in the host message cost. Measured on 4 gloo
  ranks of a 2-core host (32 all-reduces of 8 KiB, medians of 12 repeats): one at a time 5.0 ms
  each, with 2, 4, 8 or 32 in flight 3.9, 3.8, 3.6, 3.8 ms each (nothing gained past two); 16 of
  0.25 MiB: 6.0 ms each alone, 4.3 with 4 in flight. Without the cap the host message cost
  charged every chunk a whole a, and the offload section's ByteScheduler (69 tensors, 4 ranks)
  was priced 2.2-2.6x DDP's step against 1.45-1.5x measured.
- Memory: no DDP bucket copy (chunks are views of the gradients, all-reduced in place).
A fluid simulation over the layers (O(L) events, not per chunk); the optimizer step between
backward and forward is not counted as overlap (conservative).

The search prices ByteScheduler by default (it is exact) on every candidate where it composes,
on the split solved with DDP (planner/search/method_choice.py), with the (chunk, credit) of CHUNK_MB x
CREDIT_CHUNKS whose exposed sync is least; a candidate that does not fit with DDP's bucket copy
is tried with ByteScheduler instead (planner/search/branch_bound.py), so the search equals brute force over both.
"""

from __future__ import annotations

import heapq
import math
from collections import deque

from meshplan import dp_methods
from meshplan.planner.cost.comm import collective_s
from meshplan.planner.methods.axes import ScheduleCost

MIB = 2**20
CHUNK_MB = (0.25, 1.0, 4.0, 16.0, 64.0)
"""Partition units the search tries: ByteScheduler's defaults are 1M parameters (4 MiB of fp32)
for a parameter server and ~8M (32 MiB) for all-reduce (docs/scheduling.md); its Bayesian tuner
moves around them. 256 KiB for the small models of CPU clusters."""
CREDIT_CHUNKS = (1, 2, 4)
"""Credit in chunks: 1 = stop-and-wait (every latency exposed, finest preemption), 4 =
ByteScheduler's PS default (credit 4M = 4 partitions)."""
DEFAULT = dp_methods.defaults_of("comm_schedule", "bytescheduler")
"""The registry's default chunk and credit, {"chunk_mb": 4.0, "credit_mb": 16.0} (preferred on a tie)."""
DDP_BUCKET_MB: int = dp_methods.defaults_of("comm_schedule", "buckets")["bucket_mb"]
"""PyTorch DDP's default bucket_cap_mb, 25 (the registry's comm_schedule=buckets default)."""
NEGOTIATION = "one all-reduce latency after backward (module docstring)"
HOST_MESSAGE_COST = "one all-reduce latency per chunk on CPU devices (module docstring)"
GLOO_THREADS = 2
"""Collectives gloo progresses at once: ProcessGroupGloo's worker threads (module docstring)."""
EXECUTOR_EARLY_FORWARD = False
"""Whether the executor starts the next forward's layer i as soon as layer i's chunks land (module
docstring): not yet, so the planner charges the wait for the last chunk."""


class Buckets:
    """comm_schedule=buckets: DDP's bucketed all-reduce, priced by DataParallelCost itself."""

    name, replaces_ddp, ddp_buckets = "buckets", False, True

    def __init__(self, data, **params):
        self.data, self.params = data, params

    def sync_s(self, local_params: float, backward_window_s: float) -> float:
        """The fp32 gradients' all-reduce on its own, not overlapped. Not what the plan pays: DDP's
        buckets (replaces_ddp False) are priced, overlapped, by DataParallelCost."""
        data = self.data
        return collective_s(data.ctx.cluster, "all_reduce", data.replicas, 4 * local_params, data.replica_tier)


class ByteScheduler(Buckets):
    """comm_schedule=bytescheduler (module docstring)."""

    name, replaces_ddp, ddp_buckets = "bytescheduler", True, False

    def __init__(self, data, **params):
        super().__init__(data, **params)
        self.ctx, self.cand = data.ctx, data.cand
        ctx, group, tier = data.ctx, data.replicas, data.replica_tier
        one, two = (collective_s(ctx.cluster, "all_reduce", group, n * MIB, tier) for n in (1, 2))
        self.latency_s = max(0.0, 2 * one - two)
        """a: the all-reduce's time at zero bytes (its fit is affine)."""
        self.beta_s = max(0.0, (two - one) / MIB)
        """beta: seconds per byte."""
        self.hidden = ctx.cluster.calibration.dp_overlap if ctx.spec.overlap_dp_comm else 0.0
        self.host_messages = ctx.cluster.device.kind == "cpu"
        """HOST_MESSAGE_COST applies: the ranks compute on the cores gloo and the scheduler use."""
        layers = [(lp, ctx.tp_split(lp, data.cand.tp)) for lp in ctx.layers]
        self.sizes = [
            [4 * math.prod(s) / split for s in lp.param_shapes] if lp.param_shapes else [4 * lp.num_params / split]
            for lp, split in layers
        ]
        """fp32 gradient bytes of each tensor, per layer (forward order = priority)."""
        back = [lp.backward_flops for lp, _ in layers]
        total = sum(back)
        self.back_share = [b / total for b in back] if total else [1 / len(layers)] * len(layers)
        self.fwd_share = [lp.forward_flops / total for lp, _ in layers] if total else [0.5 * s for s in self.back_share]

    def sync_s(self, local_params: float, backward_window_s: float) -> float:
        return self.exposed_s(self.params["chunk_mb"], self.params["credit_mb"], backward_window_s)

    def chunks(self, chunk_mb: float) -> list[tuple[float, int]]:
        """(bytes, chunks) per layer: each tensor split into chunks of chunk_mb (the executor's
        flat.split(chunk elements))."""
        chunk = chunk_mb * MIB
        return [(sum(t), sum(max(1, math.ceil(x / chunk)) for x in t if x > 0)) for t in self.sizes]

    def exposed_s(
        self, chunk_mb: float, credit_mb: float, backward_window_s: float, early_forward: bool | None = None
    ) -> float:
        """The next forward's stall (module docstring); early_forward defaults to what the
        executor does (EXECUTOR_EARLY_FORWARD)."""
        h = self.hidden
        ready, t = [], h * backward_window_s
        for share in self.back_share:  # layer i ready when backward (L-1 .. 0) has run down to it
            ready.append(t)
            t -= h * backward_window_s * share
        credit = max(credit_mb, chunk_mb) * MIB
        chunks = self.chunks(chunk_mb)
        cap = GLOO_THREADS if self.host_messages else None
        landed = _simulate(chunks, ready, credit, self.latency_s, self.beta_s, cap)
        start = clock = h * backward_window_s
        agree = self.latency_s  # the round that agrees on the last gradients (NEGOTIATION)
        if self.host_messages:  # HOST_MESSAGE_COST: every chunk's fixed cost taken from backward
            agree += self.latency_s * sum(n / _in_flight(b / n, credit, cap) for b, n in chunks if b > 0)
        if not (EXECUTOR_EARLY_FORWARD if early_forward is None else early_forward):
            return max(0.0, max(landed, default=start) - start) + agree
        for share, arrival in zip(self.fwd_share, landed):
            clock = max(clock, arrival) + h * backward_window_s * share
        return max(0.0, clock - start - h * backward_window_s * sum(self.fwd_share)) + agree

    def tuned(self, backward_window_s: float) -> dict:
        """The (chunk_mb, credit_mb) of CHUNK_MB x CREDIT_CHUNKS with the least exposed sync;
        on a tie the registry default, then the larger chunk (fewer messages), then less credit."""
        options = [{"chunk_mb": c, "credit_mb": c * k} for c in CHUNK_MB for k in CREDIT_CHUNKS]
        return min(
            options,
            key=lambda o: (
                self.exposed_s(o["chunk_mb"], o["credit_mb"], backward_window_s),
                o != DEFAULT,
                -o["chunk_mb"],
                o["credit_mb"],
            ),
        )


def _in_flight(chunk_bytes: float, credit: float, cap: int | None) -> int:
    """Chunks of this size the credit keeps in flight, at most `cap` (GLOO_THREADS on gloo)."""
    k = max(1, math.floor(credit / chunk_bytes))
    return min(k, cap) if cap else k


def _simulate(
    layers: list[tuple[float, int]], ready: list[float], credit: float, a: float, beta: float, cap: int | None = None
) -> list[float]:
    """When each layer's last chunk lands: a fluid model of the committed FIFO (<= credit bytes)
    fed from a priority heap of ready, uncommitted bytes (module docstring); at most `cap`
    chunks overlap their latency (GLOO_THREADS), else as many as the credit holds."""
    num = len(layers)
    landed = [-math.inf] * num
    rate, tail, left = [0.0] * num, [0.0] * num, [0.0] * num
    for i, (nbytes, n) in enumerate(layers):
        if nbytes <= 0:
            continue
        s = nbytes / n
        k = _in_flight(s, credit, cap)
        tau = max(beta * s, (a + beta * s) / k)
        rate[i], tail[i], left[i] = (s / tau if tau > 0 else math.inf), a + beta * s - tau, nbytes
    order = sorted((r, i) for i, r in enumerate(ready) if left[i] > 0)  # ready order: L-1 first
    heap: list[list] = []
    fifo: deque = deque()
    committed, now, nxt = 0.0, 0.0, 0
    remaining = {i: left[i] for i in range(num) if left[i] > 0}
    while remaining:
        if not fifo and not heap:
            now = max(now, order[nxt][0])
        while nxt < len(order) and order[nxt][0] <= now:
            heapq.heappush(heap, [order[nxt][1], left[order[nxt][1]]])
            nxt += 1
        committed = _commit(heap, fifo, committed, credit)
        layer, amount = fifo[0]
        finish = amount / rate[layer]
        until = order[nxt][0] - now if nxt < len(order) else math.inf
        step = min(finish, until)
        served = amount if step == finish else step * rate[layer]
        now += step
        fifo[0][1] -= served
        committed -= served
        remaining[layer] -= served
        if fifo[0][1] <= 1e-9 * left[layer]:
            fifo.popleft()
        if remaining[layer] <= 1e-9 * left[layer]:
            del remaining[layer]
            landed[layer] = now + tail[layer]
            # rounding can leave a sliver of the finished layer committed or queued: drop it
            committed -= sum(e[1] for e in fifo if e[0] == layer)
            fifo = deque(e for e in fifo if e[0] != layer)
            heap[:] = [e for e in heap if e[0] != layer]
            heapq.heapify(heap)
    return landed


def _commit(heap: list, fifo: deque, committed: float, credit: float) -> float:
    """Move the most urgent ready bytes into the FIFO until the credit is used."""
    while heap and committed < credit:
        top = heap[0]
        amount = min(credit - committed, top[1])
        if fifo and fifo[-1][0] == top[0]:
            fifo[-1][1] += amount
        else:
            fifo.append([top[0], amount])
        committed += amount
        top[1] -= amount
        if top[1] <= 0:
            heapq.heappop(heap)
    return committed


SCHEDULES = {c.name: c for c in (Buckets, ByteScheduler)}


def comm_schedule_cost(data, name: str, params: dict) -> ScheduleCost:
    return SCHEDULES[name](data, **params)

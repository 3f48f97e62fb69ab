"""Pipeline schedule timeline: replay the plan's schedule with its predicted stage times.

Per pipeline rank, the schedule fixes the ORDER of forward (F) and backward (B) actions
(torch.distributed.pipelining's orders, re-derived here without importing torch); a small
discrete-event replay then places each action at the earliest time its rank is free and its
input has arrived: F of virtual stage s needs F of s-1 (plus one p2p hop), B of s needs B of
s+1 (plus one hop), B of the last stage needs its own F. Gaps are pipeline bubbles. After a
rank's last backward come its exposed data-parallel communication and the optimizer step.

Times come from the prediction: `stage_times_s[r]` is forward+backward of one microbatch on
pipeline rank r (all its virtual stages); backward = 2 x forward (Narayanan et al. 2021,
Sec. 3.5: "backward pass ... twice the forward"), plus the recompute share of the breakdown.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshplan.plan import INTERLEAVED, Plan


@dataclass(kw_only=True)
class Block:
    """One bar on the timeline."""

    rank: int
    kind: str
    """"F" forward, "B" backward (with recompute), "DP" exposed gradient communication, "OPT" optimizer."""
    start_s: float
    end_s: float
    microbatch: int = -1
    chunk: int = 0
    """Virtual stage (model chunk) index on this rank."""


@dataclass(kw_only=True)
class Timeline:
    num_ranks: int
    num_microbatches: int
    virtual_stages: int
    schedule: str
    forward_s: list[float]
    """Forward time of one microbatch through one chunk, per rank."""
    backward_s: list[float]
    hop_s: float
    """One p2p transfer of a boundary activation or its gradient."""
    blocks: list[Block] = field(default_factory=list)
    sends: list[tuple[Block, Block]] = field(default_factory=list)
    """(producer, consumer) pairs on different ranks: each is one p2p transfer."""

    @property
    def makespan_s(self) -> float:
        return max((b.end_s for b in self.blocks), default=0.0)

    def compute_end_s(self) -> float:
        return max((b.end_s for b in self.blocks if b.kind in "FB"), default=0.0)

    def busy_s(self, rank: int) -> float:
        return sum(b.end_s - b.start_s for b in self.blocks if b.rank == rank and b.kind in ("F", "B"))

    def bubble_fraction(self) -> float:
        """Idle share of the compute phase, averaged over ranks (the pipeline bubble)."""
        span_s = self.compute_end_s()
        if span_s <= 0:
            return 0.0
        idle_s = sum(span_s - self.busy_s(r) for r in range(self.num_ranks))
        return idle_s / (span_s * self.num_ranks)


def rank_order(schedule: str, rank: int, pp: int, m: int, v: int) -> list[tuple[str, int, int]]:
    """(kind, chunk, microbatch) in the order `rank` runs them under `schedule`."""
    if pp == 1:
        return [a for mb in range(m) for a in (("F", 0, mb), ("B", 0, mb))]
    if schedule == "GPipe":
        return [("F", 0, mb) for mb in range(m)] + [("B", 0, mb) for mb in range(m)]
    if schedule == "1F1B":
        return _one_f_one_b(rank, pp, m)
    if schedule == "LoopedBFS":
        fwd = [("F", c, mb) for c in range(v) for mb in range(m)]
        return fwd + [("B", c, mb) for c in reversed(range(v)) for mb in reversed(range(m))]
    return _interleaved(rank, pp, m, v)  # Interleaved1F1B; InterleavedZeroBubble drawn the same


def _one_f_one_b(rank: int, pp: int, m: int) -> list[tuple[str, int, int]]:
    warmup = min(pp - rank - 1, m)
    order = [("F", 0, mb) for mb in range(warmup)]
    for i in range(m - warmup):
        order += [("F", 0, warmup + i), ("B", 0, i)]
    return order + [("B", 0, mb) for mb in range(m - warmup, m)]


def _interleaved(rank: int, pp: int, m: int, v: int) -> list[tuple[str, int, int]]:
    """torch ScheduleInterleaved1F1B (Narayanan et al. 2021 Sec. 2.2.2): rounds of microbatches."""
    rounds = max(1, m // pp)
    if m % rounds:  # torch rejects this m; replay it as one round (all microbatches per chunk in turn)
        rounds = 1
    per_round = m // rounds
    total = m * v
    warmup = min((v - 1) * per_round + 2 * (pp - 1 - rank), total)
    next_mb_f = [0] * v
    next_mb_b = [0] * v
    order = []

    def forward(step: int) -> None:
        chunk = (step // per_round) % v
        order.append(("F", chunk, next_mb_f[chunk]))
        next_mb_f[chunk] += 1

    def backward(step: int) -> None:
        chunk = v - 1 - ((step - warmup) // per_round) % v
        order.append(("B", chunk, next_mb_b[chunk]))
        next_mb_b[chunk] += 1

    for step in range(warmup):
        forward(step)
    for step in range(warmup, total):
        forward(step)
        backward(step)
    for step in range(total, total + warmup):
        backward(step)
    return order


def _per_rank_times(plan: Plan) -> tuple[list[float], list[float]]:
    """(forward, backward) seconds of one microbatch through one chunk, per pipeline rank."""
    pred = plan.prediction
    pp, v, m = plan.pipeline_parallel_degree, plan.virtual_stages, plan.num_microbatches
    br = pred.breakdown if pred else {}
    if pred and len(pred.stage_times_s) == pp:
        totals = list(pred.stage_times_s)
    else:  # spread the compute terms of the breakdown evenly over ranks and microbatches
        work_s = sum(br.get(k, 0.0) for k in ("compute", "recompute", "tp_comm"))
        totals = [work_s / m] * pp
    work = br.get("compute", 0.0) + br.get("recompute", 0.0)
    recompute_share = br.get("recompute", 0.0) / work if work > 0 else 0.0
    fwd = [t * (1 - recompute_share) / 3 / v for t in totals]
    bwd = [t / v - f for t, f in zip(totals, fwd)]
    return fwd, bwd


def simulate(plan: Plan) -> Timeline:
    """Replay the plan's pipeline schedule with its predicted per-stage times."""
    pp, v, m = plan.pipeline_parallel_degree, plan.virtual_stages, plan.num_microbatches
    schedule = plan.pipeline_schedule if (v > 1 or plan.pipeline_schedule not in INTERLEAVED) else "1F1B"
    fwd, bwd = _per_rank_times(plan)
    br = plan.prediction.breakdown if plan.prediction else {}
    # pp_comm is the exposed p2p total of one rank: 2 transfers (activation, gradient) per microbatch per chunk
    hop_s = br.get("pp_comm", 0.0) / (2 * m * v) if pp > 1 else 0.0
    tl = Timeline(
        num_ranks=pp,
        num_microbatches=m,
        virtual_stages=v,
        schedule=schedule,
        forward_s=fwd,
        backward_s=bwd,
        hop_s=hop_s,
    )
    _replay(tl, [rank_order(schedule, r, pp, m, v) for r in range(pp)])
    for r in range(pp):
        t = max(b.end_s for b in tl.blocks if b.rank == r)
        for kind, key in (("DP", "dp_comm"), ("OPT", "optimizer")):
            if br.get(key, 0.0) > 0:
                tl.blocks.append(Block(rank=r, kind=kind, start_s=t, end_s=t + br[key]))
                t += br[key]
    return tl


def _replay(tl: Timeline, orders: list[list[tuple[str, int, int]]]) -> None:
    """Discrete-event replay: each action starts when its rank is free and its input arrived."""
    pp, v = tl.num_ranks, tl.virtual_stages
    last_stage = pp * v - 1
    done: dict[tuple[str, int, int], Block] = {}  # (kind, virtual stage, microbatch) -> block
    free_s = [0.0] * pp
    cursor = [0] * pp
    remaining = sum(len(o) for o in orders)
    while remaining:
        progressed = False
        for r in range(pp):
            while cursor[r] < len(orders[r]):
                kind, chunk, mb = orders[r][cursor[r]]
                stage = chunk * pp + r
                dep = _dependency(kind, stage, mb, last_stage)
                if dep is not None and dep not in done:
                    break
                producer = done.get(dep) if dep else None
                ready_s = 0.0
                if producer is not None:
                    ready_s = producer.end_s + (tl.hop_s if producer.rank != r else 0.0)
                dur_s = tl.forward_s[r] if kind == "F" else tl.backward_s[r]
                block = Block(rank=r, kind=kind, start_s=max(free_s[r], ready_s), end_s=0.0, microbatch=mb, chunk=chunk)
                block.end_s = block.start_s + dur_s
                tl.blocks.append(block)
                if producer is not None and producer.rank != r:
                    tl.sends.append((producer, block))
                done[(kind, stage, mb)] = block
                free_s[r] = block.end_s
                cursor[r] += 1
                remaining -= 1
                progressed = True
        assert progressed, f"schedule {tl.schedule} deadlocks in the replay (a bug in rank_order)"


def _dependency(kind: str, stage: int, mb: int, last_stage: int) -> tuple[str, int, int] | None:
    if kind == "F":
        return ("F", stage - 1, mb) if stage > 0 else None
    if stage == last_stage:
        return ("F", stage, mb)
    return ("B", stage + 1, mb)

"""Outer loop of the search: every valid (pp, dp, cp, tp) factorisation of the device count,
microbatch sizes dividing the per-replica batch, schedules and virtual stages, ZeRO stages,
sequence parallelism, and where the runtime leaves it to the plan whether ZeRO-2/3 reduce-scatters
every microbatch (Context.grad_sync_choices). Pinned request fields fix their axis. Invalid families are kept as
Rejections with their reason (calculon's "good and bad candidates").
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from meshplan import dp_methods, feasibility
from meshplan.errors import MeshplanError
from meshplan.plan import INTERLEAVED, schedule_name
from meshplan.planner.context import Candidate, Context
from meshplan.runtimes import unrun_axes

VIRTUAL_STAGES = (2, 3, 4, 6, 8)
"""Chunks per rank tried for Interleaved1F1B when --virtual-stages is not given."""
CP_MIN_SEQ = 32768
"""Context parallelism is searched (not only pinned) from this sequence length on."""


def divisors(n: int) -> list[int]:
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


class Rejects:
    """Rejected families: (family, reason) -> count."""

    def __init__(self):
        self.counts: Counter = Counter()
        self.infeasible: list[tuple[Candidate, str]] = []
        """Candidates meshplan/feasibility.py refused, with its first reason (tests read them)."""

    def add(self, family: str, reason: str, count: int = 1) -> None:
        self.counts[(family, reason)] += count

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def tp_reason(ctx: Context, tp: int) -> str:
    """Feasibility's TP rule, then the search's own: TP within a node unless allowed."""
    why = feasibility.tp_reason(tp, tp_divisors(ctx), tp_kinds(ctx))
    if why:
        return why
    if tp > ctx.cluster.devices_per_node and not ctx.request.allow_cross_node_tp:
        return f"tp={tp} > {ctx.cluster.devices_per_node} GPUs per node (allow_cross_node_tp is off)"
    return ""


def _pick(pinned, options):
    return [pinned] if pinned is not None else options


def degrees(ctx: Context, rej: Rejects) -> list[tuple[int, int, int, int]]:
    """Valid (pp, dp, cp, tp) with pp*dp*cp*tp = num_gpus."""
    req, n = ctx.request, ctx.request.num_gpus
    out = []
    cps = _pick(req.cp, [c for c in divisors(n) if ctx.seq % (2 * c) == 0] if ctx.seq >= CP_MIN_SEQ else [1])
    for tp in _pick(req.tp, divisors(n)):
        reason = tp_reason(ctx, tp) if tp > 1 else ""
        if n % tp or reason:
            rej.add(f"tp={tp}", reason or f"tp={tp} does not divide {n} GPUs")
            continue
        for cp in cps:
            for pp in _pick(req.pp, divisors(n // tp // cp) if n % (tp * cp) == 0 else []):
                dp = n // (tp * cp * pp) if n % (tp * cp * pp) == 0 else 0
                fam = f"pp={pp} cp={cp} tp={tp}"
                unrun = unrun_axes(ctx.spec.model_parallel, tp, pp, cp)
                if unrun:
                    rej.add(fam, f"runtime {req.runtime} runs no {unrun[0]} > 1 (behaviour model_parallel)")
                elif not dp:
                    rej.add(fam, f"pp x cp x tp = {pp * cp * tp} does not divide {n} GPUs")
                elif pp > len(ctx.layers):
                    rej.add(fam, f"pp={pp} > {len(ctx.layers)} layers")
                elif req.dp is not None and dp != req.dp:
                    rej.add(fam, f"dp would be {dp}, not the pinned {req.dp}")
                elif req.global_batch % dp:
                    rej.add(fam, f"global batch {req.global_batch} not divisible by dp={dp}")
                else:
                    out.append((pp, dp, cp, tp))
    return out


def _schedules(ctx: Context, pp: int, m: int, rej: Rejects, fam: str) -> list[tuple[str, int]]:
    """(schedule, virtual stages) options; the microbatch-count rules are feasibility's."""
    req = ctx.request
    if pp == 1:  # no pipeline: the schedule is moot; GPipe and 1F1B run the same single stage
        name = schedule_name(req.schedule) if req.schedule else "1F1B"
        return [("1F1B" if name not in ("GPipe", "1F1B") else name, 1)]
    names = [schedule_name(req.schedule)] if req.schedule else ["1F1B", "Interleaved1F1B", "GPipe"]
    runs = ctx.spec.pipeline_schedules
    if runs is not None and not req.schedule:  # a pinned schedule is priced as pinned (the CLI warns)
        for name in [n for n in names if n not in runs]:
            rej.add(fam, f"runtime {req.runtime} has no {name} schedule (behaviour pipeline_schedules)")
        names = [n for n in names if n in runs]
    out = []
    for name in names:
        if name in ("GPipe", "1F1B"):
            out.append((name, 1))
        else:  # Interleaved1F1B, or a pinned LoopedBFS / InterleavedZeroBubble
            out += [(name, v) for _, v in _interleaved(ctx, pp, m, rej, fam, name)]
    return out


def _interleaved(
    ctx: Context, pp: int, m: int, rej: Rejects, fam: str, name: str = "Interleaved1F1B"
) -> list[tuple[str, int]]:
    if ctx.body is None:
        rej.add(fam, f"{name} needs identical blocks (this model's layers differ)")
        return []
    blocks = ctx.body[1] - ctx.body[0]
    options = set(VIRTUAL_STAGES)
    if ctx.spec.uniform_stages and blocks % pp == 0:  # even splits: every v dividing blocks/pp
        options |= {v for v in divisors(blocks // pp) if v > 1}
    vs = _pick(ctx.request.virtual_stages, sorted(options))
    ok = [v for v in vs if v > 1 and pp * v <= blocks + 2 and not (ctx.spec.uniform_stages and blocks % (pp * v))]
    if len(ok) < len(vs):
        why = (
            f"blocks ({blocks}) not a multiple of pp x v (uniform_stages) or pp x v > {blocks + 2} layers"
            if ctx.spec.uniform_stages
            else f"virtual stages x pp > {blocks + 2} layers"
        )
        rej.add(fam, why, len(vs) - len(ok))
    return [("Interleaved1F1B", v) for v in ok]


def shard_degrees(ctx: Context, dp: int, cp: int, tp: int) -> list[int]:
    """FSDP2 shard degrees tried for ZeRO-2/3 over dp ranks: all of them (FSDP), and HSDP with a
    shard group that fills exactly one node (shard x cp x tp = devices per node): the per-microbatch
    gathers stay on the node's fast links while the shards are all-reduced across nodes once per
    step (torchtitan's HSDP advice). Larger shard groups only trade more cross-node gather traffic
    for memory, which FSDP over all dp ranks already offers. Two-node groups too cost a third more
    candidates for GPT-3 175B on 1024 A100 (7632 vs 5676) and did not change its plan.
    A pinned --dp-shard is tried as given; a runtime without HSDP (RuntimeSpec.hybrid_shard False:
    DeepSpeed) shards over all dp ranks only."""
    if ctx.request.dp_shard is not None:
        return [ctx.request.dp_shard]
    if not ctx.spec.hybrid_shard:
        return [dp]
    per_node, out = ctx.cluster.devices_per_node, [dp]
    for d in divisors(dp):
        span = d * cp * tp
        if 1 < d < dp and span == per_node:
            out.append(d)
    return sorted(set(out))


DDP_ONE_DIM = "ZeRO-0: the runtime runs DDP only on pure data parallelism (tp = pp = cp = 1); replicas are HSDP here"
"""The search's reason where the runtime's DDP takes a 1-D mesh only (RuntimeSpec.ddp_beside_model_parallel)."""


def _ddp_pinned_beside_model_parallel(req) -> bool:
    """--zero 0 pinned together with a --tp/--pp/--cp pin above 1: predicted as pinned (with the CLI's
    warning) even where the runtime refuses it; a --zero 0 pin alone keeps the model-parallel degrees
    the search picks to those the runtime runs."""
    return req.zero == 0 and (req.tp or 1) * (req.pp or 1) * (req.cp or 1) > 1


def _shards(ctx: Context, zero: int, dp: int, cp: int, tp: int) -> list[int]:
    """The shard degrees of one (zero, dp) candidate. A pinned --dp-shard is every candidate's,
    so a ZeRO-0/1 or dp=1 candidate carries it and feasibility refuses it with its reason
    (never a plan with data_parallel_shard_degree 1 for a pin of 2)."""
    if ctx.request.dp_shard is not None:
        return [ctx.request.dp_shard]
    return shard_degrees(ctx, dp, cp, tp) if zero >= 2 and dp > 1 else [1]


def base_methods(ctx: Context) -> tuple:
    """The pinned methods (--compression, --sync, ...) as Candidate.methods; unpinned axes keep
    the registry default here (the search prices the allowed alternatives per candidate)."""
    return tuple(
        sorted(
            (axis, name, tuple(sorted(params.items())))
            for axis, (name, params) in ctx.request.methods.items()
            if not (name == dp_methods.DEFAULTS[axis] and params == dp_methods.defaults_of(axis, name))
        )
    )


def tp_divisors(ctx: Context) -> dict[str, int]:
    return feasibility.merge_divisors(lp.tp.divisors for lp in ctx.layers)


def tp_kinds(ctx: Context) -> list[str]:
    """The profile's TPRule kinds (feasibility refuses TP where none is one the executor splits)."""
    return [lp.tp.kind for lp in ctx.layers]


def _sequence_parallels(ctx: Context, tp: int, rej: Rejects, fam: str) -> list[bool]:
    """Sequence parallelism off and on beside tensor parallelism, as the runtime runs them (behaviour
    sequence_parallel_modes; a pinned mode is priced as pinned, the CLI warns)."""
    if tp == 1:
        return [False]
    runs = ctx.spec.sequence_parallel_modes
    if runs is None:
        return [False, True]
    for mode in [m for m in (False, True) if m not in runs]:
        state = "on" if mode else "off"
        rej.add(
            fam, f"runtime {ctx.request.runtime} runs no sequence parallel {state} (behaviour sequence_parallel_modes)"
        )
    return [m for m in (False, True) if m in runs]


def candidates(ctx: Context, rej: Rejects) -> list[Candidate]:
    req, out = ctx.request, []
    methods, divs, kinds = base_methods(ctx), tp_divisors(ctx), tp_kinds(ctx)
    for pp, dp, cp, tp in degrees(ctx, rej):
        per_replica = req.global_batch // dp
        for b in _pick(req.microbatch, divisors(per_replica)):
            fam = f"pp={pp} dp={dp} cp={cp} tp={tp} b={b}"
            if per_replica % b:
                rej.add(fam, f"microbatch {b} does not divide the per-replica batch {per_replica}")
                continue
            m = per_replica // b
            zeros = _pick(req.zero, list(req.zero_stages or (0, 1, 2, 3)) if dp > 1 else [0])
            beside_pp = ctx.spec.pipeline_zero_stages
            if pp > 1 and beside_pp is not None and req.zero is None and any(z not in beside_pp for z in zeros):
                refused = "/".join(str(z) for z in zeros if z not in beside_pp)
                rej.add(
                    fam, f"runtime {req.runtime} runs no ZeRO-{refused} with pp > 1 (behaviour pipeline_zero_stages)"
                )
                zeros = [z for z in zeros if z in beside_pp]
            if (
                not ctx.spec.ddp_beside_model_parallel
                and 0 in zeros
                and dp > 1
                and pp * cp * tp > 1
                and not _ddp_pinned_beside_model_parallel(req)
            ):
                rej.add(fam, DDP_ONE_DIM)
                zeros = [z for z in zeros if z != 0]
            sps = (
                [bool(req.sequence_parallel) and tp > 1]
                if req.sequence_parallel is not None
                else _sequence_parallels(ctx, tp, rej, fam)
            )
            for sched, v in _schedules(ctx, pp, m, rej, f"pp={pp} dp={dp} cp={cp} tp={tp}"):
                for zero in zeros:
                    for shard in _shards(ctx, zero, dp, cp, tp):
                        if dp % shard:
                            rej.add(f"pp={pp} dp={dp} cp={cp} tp={tp}", f"dp_shard={shard} does not divide dp={dp}")
                            continue
                        for sp in sps:
                            cand = Candidate(
                                pp=pp,
                                dp_replicate=dp // shard,
                                dp_shard=shard,
                                cp=cp,
                                tp=tp,
                                microbatch=b,
                                num_microbatches=m,
                                schedule=sched,
                                virtual_stages=v,
                                zero=zero,
                                sequence_parallel=sp,
                                methods=methods,
                            )
                            why = feasibility.first(
                                cand.layout(ctx.seq),
                                num_layers=len(ctx.layers),
                                tp_divisors=divs,
                                tp_kinds=kinds,
                                also_runs=ctx.spec.also_runs,
                            )
                            if why:
                                rej.add(cand.family, why)
                                rej.infeasible.append((cand, why))
                                continue
                            for reduce_each in ctx.grad_sync_choices(zero, cand.state_shard, m, pp):
                                out.append(dataclasses.replace(cand, reduce_every_microbatch=reduce_each))
    return out


def pinned_candidate(ctx: Context) -> Candidate:
    """The layout the request pins, the rest at its simplest (tp, pp, cp 1, dp filling the devices,
    microbatch 1, ZeRO-0, 1F1B): what `estimate` predicts, and what an infeasible search names
    when every layout breaks a rule (planner/search/explain.py). MeshplanError where the pins
    do not multiply or divide."""
    req = ctx.request
    tp, pp, cp = req.tp or 1, req.pp or 1, req.cp or 1
    dp = req.dp or max(req.num_gpus // (tp * pp * cp), 1)  # the data-parallel degree fills the rest
    if tp * pp * dp * cp != req.num_gpus:
        raise MeshplanError(
            f"--tp {tp} x --pp {pp} x --dp {dp} x --cp {cp} = {tp * pp * dp * cp} "
            f"but --num-gpus is {req.num_gpus}; make the degrees multiply to it"
        )
    zero = req.zero or 0
    shard = req.dp_shard or (dp if zero >= 2 else 1)
    if dp % shard:
        raise MeshplanError(f"--dp-shard {shard} does not divide the data-parallel degree {dp}; use a divisor of it")
    b = req.microbatch or 1
    if req.global_batch % (dp * b):
        raise MeshplanError(
            f"--global-batch {req.global_batch} is not divisible by dp x microbatch = {dp * b}; pick a batch that is"
        )
    sched = schedule_name(req.schedule) if req.schedule else "1F1B"
    v = (req.virtual_stages or 2) if sched in INTERLEAVED else 1
    if pp == 1:
        sched, v = ("1F1B" if sched in INTERLEAVED else sched), 1
    return Candidate(
        pp=pp,
        dp_replicate=dp // shard,
        dp_shard=shard,
        cp=cp,
        tp=tp,
        microbatch=b,
        num_microbatches=req.global_batch // (dp * b),
        schedule=sched,
        virtual_stages=v,
        zero=zero,
        sequence_parallel=bool(req.sequence_parallel) and tp > 1,
        methods=base_methods(ctx),
    )

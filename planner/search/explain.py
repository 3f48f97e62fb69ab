"""Explanations: the one-line InfeasibleError message (what would fit) and rejection summaries."""

from __future__ import annotations

import dataclasses

from meshplan import feasibility
from meshplan.errors import MeshplanError
from meshplan.planner.context import Context
from meshplan.planner.cost.memory import GIB
from meshplan.planner.search.enumerate import pinned_candidate, tp_divisors, tp_kinds

PIN_FIELDS = (
    "tp",
    "pp",
    "dp",
    "cp",
    "microbatch",
    "schedule",
    "virtual_stages",
    "recompute",
    "zero",
    "sequence_parallel",
)
MAX_GPUS = 65536


def _fits(searcher_type, profile, cluster, request) -> bool:
    """A plan fits `request` (the same search, asked for one plan)."""
    sized = cluster.with_num_devices(request.num_gpus)
    return bool(searcher_type(profile, sized, dataclasses.replace(request, top_k=1)).run(1)[0])


def _closest(searcher) -> str:
    if searcher.oom:
        fam, (excess, _, stage) = min(searcher.oom.items(), key=lambda kv: kv[1][0])
        return f"the closest ({fam}) is OOM by {max(excess, 0) / GIB:.1f} GiB on {stage}"
    reasons = sorted(searcher.rejects.counts.items(), key=lambda kv: -kv[1])
    return "no valid split: " + "; ".join(f"{f}: {r}" for (f, r), _ in reasons[:2]) if reasons else "no candidates"


def _fewest_gpus(searcher_type, profile, cluster, request) -> int | None:
    unpinned = dataclasses.replace(request, **{f: None for f in PIN_FIELDS})
    n = request.num_gpus * 2
    while n <= MAX_GPUS:
        if _fits(searcher_type, profile, cluster, dataclasses.replace(unpinned, num_gpus=n)):
            return n
        n *= 2
    return None


def infeasible_message(searcher, profile, cluster, request) -> str:
    """One line: nothing fits, why (the closest family), and what would (unpinning, or GPUs)."""
    head = (
        f"no plan fits {profile.model_name} (batch {request.global_batch}, seq {searcher.ctx.seq}) "
        f"on {request.num_gpus} x {cluster.device.name}: {_closest(searcher)}"
    )
    pins = [f for f in PIN_FIELDS if getattr(request, f) is not None]
    if pins and _fits(type(searcher), profile, cluster, dataclasses.replace(request, **{f: None for f in pins})):
        return f"{head}; unpinning {', '.join('--' + p.replace('_', '-') for p in pins)} fits on these GPUs"
    fewest = _fewest_gpus(type(searcher), profile, cluster, request)
    if fewest:
        return f"{head}; fewest {cluster.device.name} that fit: {fewest} (try --num-gpus {fewest})"
    return f"{head}; no count up to {MAX_GPUS} GPUs fits: lower --seq or --global-batch, or a larger-memory device"


def rule_conflict(ctx: Context) -> str:
    """When no layout passes the rules: the rule the request's own layout breaks (the pins, the
    rest at its simplest: enumerate.pinned_candidate), or why the pins do not fit together;
    "" if that layout passes. Not the most frequent reason among all candidates, which names
    layouts the user never asked for ("dp=1: no replicas" for a pinned --compression)."""
    try:
        cand = pinned_candidate(ctx)
    except MeshplanError as exc:
        return str(exc)
    found = feasibility.reasons(
        cand.layout(ctx.seq),
        num_layers=len(ctx.layers),
        tp_divisors=tp_divisors(ctx),
        tp_kinds=tp_kinds(ctx),
        also_runs=ctx.spec.also_runs,
    )
    if not found:
        return ""
    return f"{found[0].text} (no layout on {ctx.request.num_gpus} devices runs; e.g. {cand.label()})"

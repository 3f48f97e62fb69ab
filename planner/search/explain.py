"""Explanations: the one-line InfeasibleError message (what would fit) and rejection summaries."""

from __future__ import annotations

import dataclasses

from meshplan.planner.cost.memory import GIB

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

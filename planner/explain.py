"""Explanations: the one-line InfeasibleError message (what would fit) and rejection summaries."""
from __future__ import annotations

import dataclasses

from meshplan.planner.memory import GIB

PIN_FIELDS = ("tp", "pp", "dp", "cp", "microbatch", "schedule", "virtual_stages", "recompute", "zero",
              "sequence_parallel")
MAX_GPUS = 65536


def _fits(profile, cluster, request) -> bool:
    from meshplan.planner.search import Searcher

    sized = cluster.with_num_devices(request.num_gpus)
    return bool(Searcher(profile, sized, dataclasses.replace(request, top_k=1)).run(1)[0])


def _closest(searcher) -> str:
    if searcher.oom:
        fam, (excess, _, stage) = min(searcher.oom.items(), key=lambda kv: kv[1][0])
        return f"the closest ({fam}) is OOM by {max(excess, 0) / GIB:.1f} GiB on {stage}"
    reasons = sorted(searcher.rejects.counts.items(), key=lambda kv: -kv[1])
    return "no valid split: " + "; ".join(f"{f}: {r}" for (f, r), _ in reasons[:2]) if reasons else "no candidates"


def _fewest_gpus(profile, cluster, request) -> int | None:
    unpinned = dataclasses.replace(request, **{f: None for f in PIN_FIELDS})
    n = request.num_gpus * 2
    while n <= MAX_GPUS:
        if _fits(profile, cluster, dataclasses.replace(unpinned, num_gpus=n)):
            return n
        n *= 2
    return None


def infeasible_message(searcher, profile, cluster, request) -> str:
    """One line: nothing fits, why (the closest family), and what would (unpinning, or GPUs)."""
    head = f"no plan fits {profile.model_name} (batch {request.global_batch}, seq {searcher.ctx.seq}) " \
           f"on {request.num_gpus} x {cluster.device.name}: {_closest(searcher)}"
    pins = [f for f in PIN_FIELDS if getattr(request, f) is not None]
    if pins and _fits(profile, cluster, dataclasses.replace(request, **{f: None for f in pins})):
        return f"{head}; unpinning {', '.join('--' + p.replace('_', '-') for p in pins)} fits on these GPUs"
    fewest = _fewest_gpus(profile, cluster, request)
    if fewest:
        return f"{head}; fewest {cluster.device.name} that fit: {fewest} (try --num-gpus {fewest})"
    return f"{head}; no count up to {MAX_GPUS} GPUs fits: lower --seq or --global-batch, or a larger-memory device"


def _figures(plan) -> dict:
    pr = plan.prediction
    return {"step_time_s": pr.step_time_s, "model_tflops_per_gpu": pr.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": pr.hardware_tflops_per_gpu, "mfu": pr.mfu, "hfu": pr.hfu,
            "tokens_per_s_per_gpu": pr.tokens_per_s_per_gpu, "peak_memory_bytes": pr.peak_memory_bytes,
            "breakdown": dict(pr.breakdown), "binding_constraint": pr.binding_constraint,
            "degrees": {"pp": plan.pipeline_parallel_degree, "dp_replicate": plan.data_parallel_replicate_degree,
                        "dp_shard": plan.data_parallel_shard_degree, "cp": plan.context_parallel_degree,
                        "tp": plan.tensor_parallel_degree},
            "zero_stage": plan.zero_stage, "sequence_parallel": plan.sequence_parallel,
            "microbatch": plan.microbatch_size, "num_microbatches": plan.num_microbatches,
            "schedule": plan.pipeline_schedule, "virtual_stages": plan.virtual_stages,
            "stages": plan.stages, "recompute": plan.recompute}


def plan_json(plan) -> dict:
    """The `meshplan plan/estimate --json` object (issue 4's keys): the plan's figures at the top
    level, `alternatives` (same keys) and the search summary beside them when searched."""
    out = _figures(plan)
    if plan.search is not None:
        s = plan.search
        out.update(search_time_s=s.search_time_s, num_candidates=s.num_candidates, num_evaluated=s.num_evaluated,
                   num_rejected=s.num_rejected, alternatives=[_figures(a) for a in s.alternatives],
                   rejected=[{"family": r.family, "reason": r.reason, "count": r.count} for r in s.rejected])
    return out

"""Planner speed: search time and candidates for GPT-3 175B (A100-80GB, global batch 1536, seq
2048) and Llama-3 405B (H100-80GB, global batch 2048, seq 8192) from 8 to 16384 GPUs.

    python -m benchmarks.planner_speed [--quick]

Targets (issue 4): 175B on 1024 A100 under 1 s, 405B on 16384 H100 under 5 s of CPU. Profiles
come from meshplan.profiler.profile_model on the meta device (not timed here; no weights), or the
closed forms of meshplan.planner.analytic without torch. search_time_s is CPU time of search(). Counts too small to
hold the model end in InfeasibleError; their time includes finding the fewest GPUs that fit.
"""
from __future__ import annotations

import argparse
import json
import time

from meshplan.errors import InfeasibleError
from meshplan.planner import PlanRequest, search
from meshplan.planner.analytic import GPT3_175B, LLAMA3_405B, gpt_profile, llama_profile
from meshplan.presets import cluster_preset

def _profile(zoo: str, overrides: dict, closed_form):
    """The profiler's meta-device profile (as `meshplan plan --model` builds it); the planner's
    closed form when the profiler (torch) is unavailable."""
    try:
        from meshplan.profiler import profile_model
    except ImportError:
        return closed_form()
    return profile_model(zoo, overrides, device="meta")


CASES = [("gpt3-175b", "a100-80g", 1536,
          lambda: _profile("gpt", {k: GPT3_175B[k] for k in ("layers", "hidden", "heads", "vocab", "seq")},
                           lambda: gpt_profile(**GPT3_175B))),
         ("llama3-405b", "h100-80g", 2048,
          lambda: _profile("llama3-405b", {"seq": 8192}, lambda: llama_profile(**LLAMA3_405B)))]
FULL_COUNTS = (8, 64, 256, 1024, 4096, 16384)
QUICK_COUNTS = {"gpt3-175b": (8, 1024), "llama3-405b": (16384,)}


def measure(model: str, preset: str, global_batch: int, profile, num_gpus: int) -> dict:
    start = time.process_time()
    wall = time.perf_counter()
    row = {"model": model, "cluster": preset, "num_gpus": num_gpus, "global_batch": global_batch}
    try:
        plan = search(profile, cluster_preset(preset, num_gpus), PlanRequest(num_gpus=num_gpus, global_batch=global_batch))
        s = plan.search
        row.update(candidates=s.num_candidates, evaluated=s.num_evaluated, rejected=s.num_rejected, feasible=True,
                   mfu=round(plan.prediction.mfu, 4), plan=f"pp={plan.pipeline_parallel_degree} "
                   f"dp={plan.data_parallel_degree} tp={plan.tensor_parallel_degree} b={plan.microbatch_size} "
                   f"{plan.pipeline_schedule} v={plan.virtual_stages} zero={plan.zero_stage}")
    except InfeasibleError as exc:
        row.update(candidates=0, evaluated=0, rejected=0, feasible=False, plan=str(exc)[:120])
    row["search_time_s"] = round(time.process_time() - start, 4)
    row["wall_time_s"] = round(time.perf_counter() - wall, 4)
    return row


def run(quick: bool) -> list[dict]:
    """One row per (model, GPU count): model, cluster, num_gpus, search_time_s (CPU), candidates, ..."""
    rows = []
    for model, preset, batch, make in CASES:
        profile = make()
        for n in (QUICK_COUNTS[model] if quick else FULL_COUNTS):
            rows.append(measure(model, preset, batch, profile, n))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rows = run(args.quick)
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    for r in rows:
        print(f"{r['model']:12s} {r['cluster']:9s} {r['num_gpus']:6d} GPUs  {r['search_time_s']:7.3f} s CPU  "
              f"{r['candidates']:6d} candidates  {r['evaluated']:5d} evaluated  {r['plan']}")


if __name__ == "__main__":
    main()

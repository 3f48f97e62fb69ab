"""Section 2: the planner's choice against the usual hand-picked plans, measured on the same grid.

- plain DDP: every rank a full replica (the grid's "ddp").
- ZeRO-3 everywhere: FSDP over all ranks (the grid's "zero3").
- Megatron heuristic (Narayanan et al. 2021, Sec. 3.3 takeaways): tensor parallel over the
  devices of a node (the largest degree <= devices per node the model's heads allow), then the
  smallest pipeline degree whose predicted memory fits, data parallel for the rest.
Speedup = measured step time of the baseline / measured step time of the planner's choice.
"""

from __future__ import annotations

from benchmarks.common import geomean

BASELINES = ("ddp", "zero3", "megatron")


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def megatron_pins(profile, cluster, num_ranks: int, global_batch: int, microbatch: int = 4) -> dict:
    """The Megatron heuristic's configuration, as estimate() pins."""
    from benchmarks.local_accuracy import request
    from meshplan.errors import MeshplanError
    from meshplan.executor import check_plan
    from meshplan.planner import estimate

    capacity = cluster.device.memory_bytes * (1 - cluster.device.memory_reserved_fraction)
    for tp in sorted(_divisors(min(cluster.devices_per_node, num_ranks)), reverse=True):
        for pp in _divisors(num_ranks // tp):
            dp = num_ranks // (tp * pp)
            mb = min(microbatch, global_batch // dp)
            pins = dict(tp=tp, pp=pp, dp=dp, microbatch=mb, schedule="1F1B")
            try:
                plan = estimate(profile, cluster, request(pins))
                check_plan(plan)
            except MeshplanError:
                continue  # heads (or KV heads) not divisible by tp, too few microbatches for pp, ...
            if plan.prediction.peak_memory_bytes <= capacity:
                return pins
    raise AssertionError("a 1-rank-per-replica DDP plan always exists")


def planner_choice(profile, cluster):
    """The planner's own search result for the same ranks and batch."""
    from benchmarks.local_accuracy import request
    from meshplan.planner.search import search

    return search(profile, cluster, request({}))


def speedups(rows: list[dict], choice: str) -> dict[str, float]:
    """{baseline: measured baseline / measured choice} for the baselines that were measured."""
    by_name = {r["name"]: r for r in rows if "measured_s" in r}
    if choice not in by_name:
        return {}
    return {b: by_name[b]["measured_s"] / by_name[choice]["measured_s"] for b in BASELINES if b in by_name}


def combine(per_model: dict[str, dict[str, float]]) -> dict[str, float]:
    """Geometric mean over models of each baseline's speedup."""
    names = {b for s in per_model.values() for b in s}
    return {b: geomean([s[b] for s in per_model.values() if b in s]) for b in BASELINES if b in names}

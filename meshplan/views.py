"""Views of the contracts for people (rich tables) and machines (the flat `--json` objects).

The flat plan view is what `meshplan plan --json` and `meshplan estimate --json` print: the best
plan's figures at the top level, the alternatives under "alternatives", "search_time_s" beside
them. Keys are part of the CLI contract (benchmarks and validation scripts read them).
"""

from __future__ import annotations

from typing import Any

from meshplan.plan import Plan
from meshplan.runtimes import grad_sync_matters
from meshplan.schema import to_dict

GIB = 1024**3


def plan_view(plan: Plan, with_search: bool = True) -> dict[str, Any]:
    pred = plan.prediction
    view: dict[str, Any] = {
        "model": plan.model_name,
        "cluster": plan.cluster_name,
        "num_gpus": plan.world_size,
    }
    if pred is not None:
        view.update(
            {
                "step_time_s": pred.step_time_s,
                "model_tflops_per_gpu": pred.model_tflops_per_gpu,
                "hardware_tflops_per_gpu": pred.hardware_tflops_per_gpu,
                "mfu": pred.mfu,
                "hfu": pred.hfu,
                "tokens_per_s_per_gpu": pred.tokens_per_s_per_gpu,
                "peak_memory_bytes": pred.peak_memory_bytes,
                "breakdown": dict(pred.breakdown),
                "binding_constraint": pred.binding_constraint,
                "stage_memory": to_dict(pred.stage_memory),
            }
        )
    view.update(
        {
            "tp": plan.tensor_parallel_degree,
            "pp": plan.pipeline_parallel_degree,
            "dp": plan.data_parallel_degree,
            "cp": plan.context_parallel_degree,
            "degrees": {
                "pp": plan.pipeline_parallel_degree,
                "dp_replicate": plan.data_parallel_replicate_degree,
                "dp_shard": plan.data_parallel_shard_degree,
                "cp": plan.context_parallel_degree,
                "tp": plan.tensor_parallel_degree,
            },
            "pipeline_parallel_degree": plan.pipeline_parallel_degree,
            "data_parallel_replicate_degree": plan.data_parallel_replicate_degree,
            "data_parallel_shard_degree": plan.data_parallel_shard_degree,
            "context_parallel_degree": plan.context_parallel_degree,
            "tensor_parallel_degree": plan.tensor_parallel_degree,
            "zero_stage": plan.zero_stage,
            "sequence_parallel": plan.sequence_parallel,
            "dp_methods": {axis: {"name": c.name, "params": dict(c.params)} for axis, c in plan.dp_methods.items()},
            "dp_methods_label": dp_methods_label(plan),
            "precision": plan.precision,
            "runtime": plan.runtime,
            "global_batch_size": plan.global_batch_size,
            "microbatch_size": plan.microbatch_size,
            "microbatch": plan.microbatch_size,
            "num_microbatches": plan.num_microbatches,
            "seq_len": plan.seq_len,
            "schedule": plan.pipeline_schedule,
            "virtual_stages": plan.virtual_stages,
            "stages": plan.stages,
            "recompute": recompute_summary(plan),
            "recompute_per_layer": dict(plan.recompute),
        }
    )
    if plan.warnings:  # only when there are some: the view of every other plan is unchanged
        view["warnings"] = list(plan.warnings)
    if with_search and plan.search is not None:
        s = plan.search
        view.update(
            {
                "search_time_s": s.search_time_s,
                "num_candidates": s.num_candidates,
                "candidates_evaluated": s.num_evaluated,
                "candidates_rejected": s.num_rejected,
                "num_evaluated": s.num_evaluated,
                "num_rejected": s.num_rejected,
                "alternatives": [plan_view(alt, with_search=False) for alt in s.alternatives],
                "rejected": to_dict(s.rejected),
            }
        )
    return view


def dp_methods_label(plan: Plan) -> str:
    """The non-default data-parallel methods with their parameters, e.g.
    "compression=powersgd(rank=2, start_iter=2, ...)"; the defaults' description when none is."""
    parts = []
    for axis, choice in plan.dp_methods.non_default():
        params = ", ".join(f"{k}={v}" for k, v in choice.params.items())
        parts.append(f"{axis}={choice.name}" + (f"({params})" if params else ""))
    return "; ".join(parts) or "defaults (full-precision all-reduce, buckets)"


def recompute_summary(plan: Plan) -> str:
    """ "none", "full", "selective" when uniform over the blocks, else "per-layer (k full, j selective)"."""
    modes = [plan.recompute.get(name, "none") for name in plan.layers]
    used = {m for m in modes if m != "none"}
    if not used:
        return "none"
    if len(used) == 1 and modes.count(next(iter(used))) >= len(modes) - 2:
        return next(iter(used))
    return f"per-layer ({modes.count('full')} full, {modes.count('selective')} selective)"


def reduces_each_microbatch(plan: Plan) -> bool:
    """ZeRO-2/3 gradient accumulation without a pipeline that reduce-scatters every microbatch (runtime
    behaviour fsdp_reduce_every_microbatch) rather than holding unsharded gradients to the last."""
    shard = plan.data_parallel_shard_degree * plan.context_parallel_degree
    return (
        grad_sync_matters(plan.zero_stage, shard, plan.num_microbatches, plan.pipeline_parallel_degree)
        and plan.runtime_behaviours.get("fsdp_reduce_every_microbatch") is True
    )


def describe(plan: Plan) -> str:
    """One line: the plan in torchtitan's terms."""
    return (
        f"pp={plan.pipeline_parallel_degree} dp={plan.data_parallel_degree} "
        f"(replicate {plan.data_parallel_replicate_degree}, shard {plan.data_parallel_shard_degree}) "
        f"{f'cp={plan.context_parallel_degree} ' if plan.context_parallel_degree > 1 else ''}"
        f"tp={plan.tensor_parallel_degree}{' +sp' if plan.sequence_parallel else ''} "
        f"zero={plan.zero_stage}{' (reduce-scatter every microbatch)' if reduces_each_microbatch(plan) else ''} "
        f"microbatch={plan.microbatch_size} x{plan.num_microbatches} "
        f"schedule={plan.pipeline_schedule}"
        f"{f' v={plan.virtual_stages}' if plan.virtual_stages > 1 else ''} "
        f"recompute={recompute_summary(plan)}"
        f"{f' runtime={plan.runtime}' if plan.runtime != 'meshplan' else ''}"
        f"{f' {dp_methods_label(plan)}' if plan.dp_methods.non_default() else ''}"
    )


def plan_table(plan: Plan):
    """A rich Table of the best plan and its alternatives."""
    from rich.table import Table

    table = Table(title=f"{plan.model_name} on {plan.world_size} x {plan.cluster_name}")
    for col in (
        "",
        "pp",
        "dp",
        "tp",
        "zero",
        "mb x m",
        "schedule",
        "recompute",
        "step s",
        "tok/s/gpu",
        "MFU",
        "peak GiB",
    ):
        table.add_column(col, justify="right" if col not in ("", "schedule", "recompute") else "left")
    rows = [("best", plan)] + [
        (f"#{i + 2}", alt) for i, alt in enumerate(plan.search.alternatives if plan.search else [])
    ]
    for label, p in rows:
        pred = p.prediction
        table.add_row(
            label,
            str(p.pipeline_parallel_degree),
            str(p.data_parallel_degree),
            f"{p.tensor_parallel_degree}{'+sp' if p.sequence_parallel else ''}",
            str(p.zero_stage),
            f"{p.microbatch_size} x {p.num_microbatches}",
            p.pipeline_schedule + (f" v{p.virtual_stages}" if p.virtual_stages > 1 else ""),
            recompute_summary(p),
            f"{pred.step_time_s:.4g}" if pred else "-",
            f"{pred.tokens_per_s_per_gpu:,.0f}" if pred else "-",
            f"{pred.mfu:.1%}" if pred else "-",
            f"{pred.peak_memory_bytes / GIB:.2f}" if pred else "-",
        )
    return table


def table_tsv(table) -> str:
    """A rich Table as tab-separated values: a header line, then one line per row (no markup)."""
    from rich.text import Text

    def plain(cell) -> str:
        text = cell.plain if isinstance(cell, Text) else Text.from_markup(str(cell)).plain
        return text.replace("\t", " ").replace("\n", " ")

    columns = table.columns
    lines = ["\t".join(plain(c.header) for c in columns)]
    cells = [list(c.cells) for c in columns]
    for i in range(table.row_count):
        lines.append("\t".join(plain(col[i]) for col in cells))
    return "\n".join(lines) + "\n"

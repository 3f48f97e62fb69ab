"""Plan facts in torchtitan's terms, the binding constraint, and short plan labels."""

from __future__ import annotations

from collections import Counter

from meshplan.plan import Plan, Prediction
from meshplan.report import fmt
from meshplan.views import dp_methods_label

TERMS = ("compute", "recompute", "bubble", "tp_comm", "pp_comm", "dp_comm", "optimizer")
TERM_LABELS = {
    "compute": "compute",
    "recompute": "recompute",
    "bubble": "pipeline bubble",
    "tp_comm": "TP communication",
    "pp_comm": "PP p2p",
    "dp_comm": "DP communication (exposed)",
    "optimizer": "optimizer step",
}


def short_label(plan: Plan) -> str:
    """ "pp4 dp2x1 tp2" style: degrees, then the knobs that differ between candidates."""
    parts = [
        f"pp{plan.pipeline_parallel_degree}",
        f"dp{plan.data_parallel_replicate_degree}x{plan.data_parallel_shard_degree}",
        f"tp{plan.tensor_parallel_degree}",
    ]
    if plan.context_parallel_degree > 1:
        parts.append(f"cp{plan.context_parallel_degree}")
    if plan.tensor_parallel_degree > 1 and plan.sequence_parallel:
        parts.append("sp")
    return " ".join(parts)


def recompute_summary(plan: Plan) -> str:
    """ "full on 8 of 10 layers, selective on 2" (layers absent from plan.recompute run without)."""
    counts = Counter(plan.recompute.get(fqn, "none") for fqn in plan.layers)
    total = len(plan.layers)
    used = [(mode, counts[mode]) for mode in ("full", "selective") if counts[mode]]
    if not used:
        return "none"
    if len(used) == 1 and used[0][1] == total:
        return f"{used[0][0]} on all {total} layers"
    return ", ".join(f"{mode} on {k} of {total} layers" for mode, k in used)


def zero_summary(plan: Plan) -> str:
    names = {
        0: "DDP (replicated params, grads, optimizer)",
        1: "ZeRO-1 (sharded optimizer states)",
        2: "ZeRO-2 (sharded optimizer states + gradients)",
        3: "ZeRO-3 / FSDP (all sharded)",
    }
    text = names[plan.zero_stage]
    return text + (", CPU offload" if plan.dp_methods.offload.name == "cpu" else "")


def schedule_summary(plan: Plan) -> str:
    if plan.pipeline_parallel_degree == 1:
        return "none (pp = 1)"
    v = f", {plan.virtual_stages} virtual stages per rank" if plan.virtual_stages > 1 else ""
    return plan.pipeline_schedule + v


def stage_sizes(plan: Plan) -> str:
    """Layers per stage in model order, runs compressed: "3 / 2 x6 / 3 / 2 x39"."""
    runs: list[list[int]] = []
    for stage in plan.stages:
        if runs and runs[-1][0] == len(stage):
            runs[-1][1] += 1
        else:
            runs.append([len(stage), 1])
    return " / ".join(f"{size} x{count}" if count > 1 else str(size) for size, count in runs)


def device_word(plan: Plan) -> str:
    """ "GPU", or "rank" when the plan's devices are CPU ranks (the local-cpu cluster)."""
    return "rank" if "cpu" in plan.cluster_name.lower() else "GPU"


def throughput_unit(plan: Plan) -> str:
    """ "tokens" for sequence models, "samples" when a sample is one item (seq_len 1: images)."""
    return "tokens" if plan.seq_len > 1 else "samples"


def plan_settings(plan: Plan) -> list[list[str]]:
    """(torchtitan setting, value, meaning) rows for the summary table."""
    return [
        ["parallelism.pipeline_parallel_degree", str(plan.pipeline_parallel_degree), "pipeline stages (pp)"],
        ["parallelism.data_parallel_replicate_degree", str(plan.data_parallel_replicate_degree), "DDP replicas"],
        ["parallelism.data_parallel_shard_degree", str(plan.data_parallel_shard_degree), "FSDP shards"],
        ["parallelism.context_parallel_degree", str(plan.context_parallel_degree), "sequence split (cp)"],
        ["parallelism.tensor_parallel_degree", str(plan.tensor_parallel_degree), "tensor parallel (tp)"],
        [
            "parallelism.enable_sequence_parallel",
            "true" if plan.sequence_parallel else "false",
            "norm/dropout activations split over tp",
        ],
        ["parallelism.pipeline_parallel_schedule", schedule_summary(plan), "pipeline schedule"],
        ["layers per stage", stage_sizes(plan), "stage boundaries (model order)"],
        ["parallelism.pipeline_parallel_microbatch_size", str(plan.microbatch_size), "samples per microbatch"],
        ["microbatches per step", str(plan.num_microbatches), "per data-parallel replica"],
        [
            "training.global_batch_size",
            str(plan.global_batch_size),
            f"= {plan.microbatch_size} x {plan.num_microbatches} x dp {plan.data_parallel_degree}",
        ],
        ["training.seq_len", str(plan.seq_len), "tokens per sample"],
        ["activation_checkpoint", recompute_summary(plan), "activation recompute"],
        ["data-parallel mode", zero_summary(plan), f"data-parallel methods: {dp_methods_label(plan)}"],
        ["precision", plan.precision, "training compute dtype"],
        ["runtime", plan.runtime, "software the prediction is for (README: Runtimes)"],
    ]


def capacity_bytes(pred: Prediction) -> float:
    return min((m.capacity_bytes for m in pred.stage_memory), default=0.0)


def memory_line(pred: Prediction) -> str:
    """ "61.50 GiB of 74.51 GiB (82.5%), 13.01 GiB headroom"."""
    cap = capacity_bytes(pred)
    if cap <= 0:
        return fmt.gib(pred.peak_memory_bytes)
    return (
        f"{fmt.gib(pred.peak_memory_bytes)} of {fmt.gib(cap)} ({fmt.pct(pred.peak_memory_bytes / cap)}), "
        f"{fmt.gib(cap - pred.peak_memory_bytes)} headroom"
    )


def binding_constraint(plan: Plan) -> str:
    """The prediction's sentence, or one derived from memory headroom and the largest overhead."""
    pred = plan.prediction
    if pred is None:
        return "no prediction in this plan; run meshplan estimate on it"
    if pred.binding_constraint:
        return pred.binding_constraint
    tightest = max(pred.stage_memory, key=lambda m: m.total_bytes / max(m.capacity_bytes, 1.0), default=None)
    if tightest is not None and tightest.total_bytes > 0.9 * tightest.capacity_bytes:
        return (
            f"memory on stage {tightest.stage}: {fmt.gib(tightest.total_bytes)} of "
            f"{fmt.gib(tightest.capacity_bytes)} ({fmt.pct(tightest.total_bytes / tightest.capacity_bytes)})"
        )
    overheads = {k: v for k, v in pred.breakdown.items() if k not in ("compute", "recompute") and v > 0}
    step_s = max(pred.step_time_s, 1e-12)
    if overheads:
        term, value = max(overheads.items(), key=lambda kv: kv[1])
        if value > 0.1 * step_s:
            return f"{TERM_LABELS.get(term, term)}: {fmt.pct(value / step_s)} of the step time"
    compute = pred.breakdown.get("compute", 0.0) + pred.breakdown.get("recompute", 0.0)
    return f"compute: {fmt.pct(compute / step_s)} of the step time is (re)computation"


def key_figures(plan: Plan) -> list[tuple[str, str]]:
    pred = plan.prediction
    if pred is None:
        return []
    return [
        ("predicted step time", fmt.seconds(pred.step_time_s)),
        (f"{throughput_unit(plan)}/s per {device_word(plan)}", fmt.rate(pred.tokens_per_s_per_gpu)),
        ("MFU / HFU", f"{fmt.pct(pred.mfu)} / {fmt.pct(pred.hfu)}"),
        (f"model TFLOP/s per {device_word(plan)}", fmt.tflops(pred.model_tflops_per_gpu)),
        (f"peak memory per {device_word(plan)}", memory_line(pred)),
    ]


def breakdown_rows(pred: Prediction) -> list[tuple[str, float]]:
    """Known terms in a fixed order, then any extra terms the planner added (sorted by name)."""
    known = [(t, pred.breakdown[t]) for t in TERMS if t in pred.breakdown]
    extra = sorted((k, v) for k, v in pred.breakdown.items() if k not in TERMS)
    return known + extra

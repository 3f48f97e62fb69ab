"""Section 1: cost-model accuracy and plan quality on 4 local gloo ranks.

For each model (gpt-tiny and llama-tiny: RMSNorm, SwiGLU, grouped-query attention) a grid of
plans spanning DP, ZeRO-3, TP, PP (GPipe and 1F1B), hybrids, microbatch sizes and recompute is
predicted by `meshplan.planner.estimate` with a cost model calibrated ONLY from
`profile_model(..., device="cpu", concurrent=4)` and `profile_links(4)`; nothing is fitted to
the grid. Every plan is run with the executor (torchrun, 4 gloo ranks, one thread each), twice
per launch in mirrored order (A B ... B A): the median of both runs' steps after warm-up. This repeats `repeats` times, each round as a user
would work: measure the links (profile-links), then per model profile it, predict, and run every
plan in one launch right after its profile (plan order rotated per round). The host is shared
and its speed moves by up to 2x over minutes, so a calibration taken once and used for a quarter
of an hour would compare measurements from different machines; a profile taken right before its
launch keeps each prediction beside its measurement.
Reported: medians over rounds of the predictions and of the measurements, and their spread.
The planner's own search result (re-run each round) is measured beside the grid.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import kendall_tau, mape, spread, top1_regret

NUM_RANKS = 4
GLOBAL_BATCH = 16
MICROBATCHES = [1, 2, 4, 8]
MODELS = ("gpt-tiny", "llama-tiny")

GRID: list[tuple[str, dict]] = [
    ("ddp", dict(dp=4, microbatch=4)),
    ("ddp-mb2", dict(dp=4, microbatch=2)),
    ("ddp-recompute", dict(dp=4, microbatch=4, recompute="full")),
    ("zero3", dict(dp=4, microbatch=4, zero=3)),
    ("zero3-mb2", dict(dp=4, microbatch=2, zero=3)),
    ("tp2-dp2", dict(tp=2, dp=2, microbatch=4)),
    ("tp2-dp2-sp", dict(tp=2, dp=2, microbatch=4, sequence_parallel=True)),
    ("tp2-zero3", dict(tp=2, dp=2, microbatch=4, zero=3)),
    ("tp2-dp2-selective", dict(tp=2, dp=2, microbatch=2, recompute="selective")),
    ("pp4-gpipe", dict(pp=4, dp=1, microbatch=2, schedule="GPipe")),
    ("pp4-1f1b", dict(pp=4, dp=1, microbatch=2, schedule="1F1B")),
    ("pp4-1f1b-mb1", dict(pp=4, dp=1, microbatch=1, schedule="1F1B")),
    ("pp2-dp2-1f1b", dict(pp=2, dp=2, microbatch=2, schedule="1F1B")),
    ("pp2-dp2-gpipe-recompute", dict(pp=2, dp=2, microbatch=2, schedule="GPipe", recompute="full")),
    ("pp2-tp2-1f1b", dict(pp=2, tp=2, dp=1, microbatch=4, schedule="1F1B")),
]
"""Named pinned configurations for 4 ranks and a global batch of 16; the Megatron heuristic's
plan and the planner's search result are added per model (benchmarks.baselines)."""
QUICK_GRID = ("ddp", "zero3", "tp2-dp2", "pp4-1f1b", "pp2-dp2-gpipe-recompute", "pp4-gpipe")


def calibrate_links(quick: bool, say) -> tuple[object, dict]:
    """The gloo links measured on NUM_RANKS ranks (profile-links), once per round."""
    from meshplan.profiler.links import profile_links

    start = time.perf_counter()
    links = dict(max_bytes=4 * 2**20, repeats=3) if quick else {}
    cluster = profile_links(NUM_RANKS, **links)
    info = {
        "profile_links_s": round(time.perf_counter() - start, 1),
        "profile_links_args": links or "defaults (1 KiB..64 MiB, 5 collectives, groups 2..4)",
        "links": [
            {
                "collective": f.collective,
                "group_size": f.group_size,
                "latency_s": f.latency_s,
                "bandwidth_gbps": f.bandwidth_gbps,
            }
            for f in cluster.collectives
        ],
        "load_average": list(os.getloadavg()),
        "layer_timings_s": {},
        "step_overhead_s": {},
    }
    say(f"  measured gloo links on {NUM_RANKS} ranks ({info['profile_links_s']} s)")
    return cluster, info


def _cpu_profile(model: str):
    """`model` profiled on the CPU at MICROBATCHES with NUM_RANKS ranks busy, in-place wrappers
    included: the one timing calibrate_model and retime_model share."""
    from meshplan.profiler import profile_model

    return profile_model(model, None, device="cpu", microbatch_sizes=MICROBATCHES, concurrent=NUM_RANKS)


def calibrate_model(model: str, calibration: dict, say, when: str = "before"):
    """One CPU profile of `model` with NUM_RANKS ranks busy, taken right before its launch (the
    host's speed drifts over minutes) or, `when="after"`, right after it (benchmarks/calibration.py
    combines the two); its timings are recorded in `calibration` (the after-launch ones under
    keys ending in "_after")."""
    suffix = "" if when == "before" else f"_{when}"
    start = time.perf_counter()
    profile = _cpu_profile(model)
    calibration[f"profile_{model}{suffix}_s"] = round(time.perf_counter() - start, 1)
    calibration.setdefault(f"layer_timings{suffix}_s", {})[model] = _timings(profile)
    calibration.setdefault(f"in_place{suffix}_s", {})[model] = _in_place(profile)
    calibration.setdefault(f"step_overhead{suffix}_s", {})[model] = dict(profile.step_overhead_s)
    say(
        f"  profiled {model} on the CPU {when} its launch ({calibration[f'profile_{model}{suffix}_s']} s, "
        f"{NUM_RANKS} ranks busy)"
    )
    return profile


def retime_model(model: str, calibration: dict, say):
    """The model profiled again in the middle of its launch (benchmarks/calibration.py): the
    same CPU profile as calibrate_model's, in-place wrappers included; its timings are appended to
    `calibration["layer_timings_mid_s"][model]`, `["in_place_mid_s"][model]` and
    `["step_overhead_mid_s"][model]`."""
    start = time.perf_counter()
    profile = _cpu_profile(model)
    calibration.setdefault("layer_timings_mid_s", {}).setdefault(model, []).append(_timings(profile))
    calibration.setdefault("in_place_mid_s", {}).setdefault(model, []).append(_in_place(profile))
    calibration.setdefault("step_overhead_mid_s", {}).setdefault(model, []).append(dict(profile.step_overhead_s))
    say(f"  profiled {model} again between its launch's chunks ({time.perf_counter() - start:.1f} s)")
    return profile


def _in_place(profile) -> dict:
    """{layer: framework_overhead_s} of the measured (not reused) layers: the in-place wrapper
    overheads and the one-rank wrapper timings."""
    return {
        layer.name: dict(layer.framework_overhead_s)
        for layer in profile.layers
        if layer.timings and not any(t.reused_from for t in layer.timings)
    }


def _timings(profile) -> dict:
    """{layer: {microbatch: [forward_s, backward_s]}} of the measured (not reused) layers."""
    return {
        layer.name: {str(t.microbatch_size): [t.forward_s, t.backward_s] for t in layer.timings}
        for layer in profile.layers
        if layer.timings and not any(t.reused_from for t in layer.timings)
    }


def request(pins: dict):
    from meshplan.planner import PlanRequest

    return PlanRequest(num_gpus=NUM_RANKS, global_batch=GLOBAL_BATCH, precision="fp32", **pins)


def pins_of(plan) -> dict:
    """The estimate() pins of a searched plan's configuration (degrees, microbatch, schedule,
    sequence parallelism, one recompute mode for every block, data-parallel methods), so that
    another calibration can price the plan that ran. A plan whose blocks recompute differently
    cannot be pinned that way: ValueError."""
    body = {mode for name, mode in plan.recompute.items() if name not in (plan.layers[0], plan.layers[-1])}
    if len(body) > 1:
        raise ValueError(f"plan recomputes its blocks differently ({sorted(body)}): not expressible as pins")
    pins: dict = dict(
        tp=plan.tensor_parallel_degree,
        pp=plan.pipeline_parallel_degree,
        dp=plan.data_parallel_degree,
        cp=plan.context_parallel_degree,
        zero=plan.zero_stage,
        microbatch=plan.microbatch_size,
        sequence_parallel=plan.sequence_parallel,
        recompute=body.pop() if body else "none",
        methods={axis: (choice.name, dict(choice.params)) for axis, choice in plan.dp_methods.items()},
    )
    if plan.data_parallel_shard_degree > 1 and plan.data_parallel_replicate_degree > 1:
        pins["dp_shard"] = plan.data_parallel_shard_degree
    if plan.pipeline_parallel_degree > 1:
        pins.update(schedule=plan.pipeline_schedule, virtual_stages=plan.virtual_stages)
    return pins


def predict_grid(profile, cluster, grid: list[tuple[str, dict]]) -> tuple[list[tuple[str, object]], list[str]]:
    """(name, estimated Plan) per valid grid point, and the reasons the others were skipped."""
    from meshplan.errors import MeshplanError
    from meshplan.executor import check_plan
    from meshplan.planner import estimate

    plans, skipped = [], []
    for name, pins in grid:
        try:
            plan = estimate(profile, cluster, request(pins))
            check_plan(plan)  # what the executor refuses (e.g. tp not dividing the KV heads)
            plans.append((name, plan))
        except MeshplanError as exc:
            skipped.append(f"{name}: {exc}")
    return plans, skipped


def describe(plan) -> str:
    """One line: the configuration a plan runs."""
    modes = sorted(set(plan.recompute.values()) - {"none"})
    text = (
        f"pp={plan.pipeline_parallel_degree} dp={plan.data_parallel_degree} tp={plan.tensor_parallel_degree} "
        f"zero={plan.zero_stage} mb={plan.microbatch_size}x{plan.num_microbatches}"
    )
    if plan.pipeline_parallel_degree > 1:
        text += f" {plan.pipeline_schedule}"
    if plan.sequence_parallel:
        text += " sp"
    return text + (f" recompute={'+'.join(modes)}" if modes else "")


def _run_batch(plans: list, steps: int, work: Path, say) -> list:
    """RunResults of plans in one launch; if the launch fails, one launch per plan (None = failed)."""
    from meshplan.errors import MeshplanError
    from meshplan.executor.launch import LaunchOptions, run_plans

    try:
        return run_plans(plans, LaunchOptions(steps=steps, out_dir=str(work), quiet=True, timeout_s=600))
    except MeshplanError as exc:
        say(f"  batch launch failed ({str(exc)[:120]}); running the plans one by one")
    results = []
    for i, plan in enumerate(plans):
        try:
            results += run_plans(
                [plan], LaunchOptions(steps=steps, out_dir=str(work / f"single{i}"), quiet=True, timeout_s=600)
            )
        except MeshplanError as exc:
            say(f"  plan {describe(plan)} failed: {str(exc)[:160]}")
            results.append(None)
    return results


def split_evenly(items: list, parts: int) -> list[list]:
    """`items` in `parts` consecutive pieces whose lengths differ by at most one (no empty piece)."""
    parts = max(1, min(parts, len(items)))
    size, extra = divmod(len(items), parts)
    out, start = [], 0
    for k in range(parts):
        end = start + size + (k < extra)
        out.append(items[start:end])
        start = end
    return out


def measure_round(
    model: str,
    plans: list[tuple[str, object]],
    rep: int,
    steps: int,
    work: Path,
    say,
    chunks: int = 1,
    between: Callable[[int], None] | None = None,
) -> tuple[list, dict]:
    """One launch running every plan of `model` twice, in mirrored passes (order rotated by
    `rep`, then the same order reversed: A B C ... C B A), `steps` steps each time. A plan's
    step time is the median of its timed steps of both passes (merge_passes), so every plan's
    measurement is centred on the middle of the launch, where the bracketing profiles' middle
    is too, and a host whose speed drifts during the launch moves all plans alike instead of
    the early plans one way and the late ones the other. (RunResult or None per plan in the
    given order, launch info with `pass_ratio`: the median over plans of second-pass over
    first-pass step time, how far the host moved within the launch.) With `chunks` > 1 the
    sequence runs as that many consecutive launches and `between(k)` is called after launch k
    but the last: benchmarks/run.py times the model's layers there, so that the calibration is
    also taken in the middle of the plans' runs."""
    k = rep * 5 % len(plans)
    order = list(range(k, len(plans))) + list(range(k))
    sequence = order + order[::-1]
    start = time.perf_counter()
    results = []
    for chunk, part in enumerate(split_evenly(sequence, chunks)):
        if chunk and between is not None:
            between(chunk)
        results += _run_batch([plans[i][1] for i in part], steps, work / f"{model}-{rep}-{chunk}", say)
    first, second = dict(zip(order, results[: len(order)])), dict(zip(order[::-1], results[len(order) :]))
    merged = [merge_passes(first[i], second[i]) for i in range(len(plans))]
    ratios = [second[i].step_time_s / first[i].step_time_s for i in order if first[i] and second[i]]
    info = {
        "model": model,
        "repetition": rep,
        "wall_s": round(time.perf_counter() - start, 1),
        "load_average": list(os.getloadavg()),
        "pass_ratio": statistics.median(ratios) if ratios else None,
        "chunks": chunks,
    }
    say(
        f"  repetition {rep + 1}: {model}, {len(plans)} plans x 2 passes ({info['wall_s']:.0f} s, "
        f"load {info['load_average'][0]:.1f})"
    )
    return merged, info


def merge_passes(first, second):
    """One RunResult of a plan run twice in a launch: the step time is the median of both runs'
    timed steps (each run's warm-up left out: executor/run_history.timed_steps), the peak memory
    the larger, the phases the mean; None if either run failed."""
    import dataclasses

    from meshplan.executor.run_history import timed_steps

    if first is None or second is None:
        return None
    timed = [t for r in (first, second) for t in r.step_times_s[timed_steps(len(r.step_times_s), r.device)]]
    phases = {
        name: (first.phase_times_s.get(name, 0.0) + second.phase_times_s.get(name, 0.0)) / 2
        for name in {**first.phase_times_s, **second.phase_times_s}
    }
    step = statistics.median(timed)
    return dataclasses.replace(
        first,
        step_time_s=step,
        step_times_s=first.step_times_s[: timed_steps(len(first.step_times_s), first.device).start] + timed,
        tokens_per_s=first.tokens_per_s * first.step_time_s / step,
        peak_memory_bytes=max(first.peak_memory_bytes, second.peak_memory_bytes),
        phase_times_s=phases,
    )


def plan_row(name: str, pairs: list[tuple]) -> dict:
    """Predicted beside measured for one named plan over the repetitions: each pair is (the plan
    as predicted by that repetition's calibration, its RunResult or None[, the plan as predicted
    from the profile before the launch alone]). Medians over pairs; the breakdowns are those of
    the round with the median prediction; `rounds` keeps each round's [predicted, measured or
    None] pair and `round_configs` the configuration each round ran (the planner's search may
    choose differently between rounds); `predicted_before_s` the one-profile prediction; seconds
    and bytes."""
    plan = sorted((p[0] for p in pairs), key=lambda p: p.prediction.step_time_s)[(len(pairs) - 1) // 2]
    runs = [p[1] for p in pairs if p[1] is not None]
    predicted = [p[0].prediction.step_time_s for p in pairs]
    before = [p[2].prediction.step_time_s for p in pairs if len(p) > 2]
    medians = [r.step_time_s for r in runs]
    steps = [t for r in runs for t in r.step_times_s[1:]]
    peak = max(plan.prediction.stage_memory, key=lambda m: m.total_bytes, default=None)
    row = {
        "name": name,
        "config": " | ".join(dict.fromkeys(describe(p[0]) for p in pairs)),
        "predicted_s": statistics.median(predicted),
        "predicted_runs_s": predicted,
        "rounds": [[p[0].prediction.step_time_s, p[1].step_time_s if p[1] is not None else None] for p in pairs],
        "round_configs": [describe(p[0]) for p in pairs],
        "breakdown_s": dict(plan.prediction.breakdown),
        "predicted_memory_bytes": statistics.median(p[0].prediction.peak_memory_bytes for p in pairs),
        "runs": len(runs),
        "predicted_memory_breakdown": {
            k: getattr(peak, k)
            for k in ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes")
        }
        if peak
        else {},
        "degrees": {
            "pp": plan.pipeline_parallel_degree,
            "dp": plan.data_parallel_degree,
            "tp": plan.tensor_parallel_degree,
            "zero": plan.zero_stage,
        },
        "recompute": sorted(set(plan.recompute.values()) - {"none"}),
    }
    if runs:
        measured = statistics.median(medians)
        row.update(
            measured_s=measured,
            measured_runs_s=medians,
            spread_runs=spread(medians),
            step_min_s=min(steps),
            step_max_s=max(steps),
            measured_memory_bytes=statistics.median(r.peak_memory_bytes for r in runs),
            error=row["predicted_s"] / measured - 1,
        )
    if before:
        row["predicted_before_s"] = statistics.median(before)
        if runs:
            row["error_before"] = row["predicted_before_s"] / row["measured_s"] - 1
    return row


PLANNER_ROW = "planner-search"
"""The row holding the planner's own search result (benchmarks/run.py adds it to the grid)."""


def measured_samples(row: dict) -> list[tuple[str, float]]:
    """(configuration, measured seconds) per measured round of a row: a round of the planner's
    row is a sample of the configuration the search chose in that round. Rows without per-round
    configurations (results written before they were kept) give their config with each run."""
    configs = row.get("round_configs")
    if configs and len(configs) == len(row.get("rounds", [])):
        return [(config, pair[1]) for config, pair in zip(configs, row["rounds"]) if pair[1] is not None]
    return [(row["config"], m) for m in row.get("measured_runs_s") or [row["measured_s"]]]


def pooled_measured_s(done: list[dict]) -> dict[str, float]:
    """configuration -> median over every launch's measurement of it: rows naming the same
    configuration (the planner's choice is often the grid's DDP plan) are samples of one plan,
    and two samples of one plan differ by 10-15% on this host. Pooled per round
    (measured_samples): a planner's row that chose DDP in two rounds and ZeRO-1 in three adds two
    samples to DDP and three to ZeRO-1, not five to a configuration that never ran."""
    runs: dict[str, list[float]] = {}
    for r in done:
        for config, seconds in measured_samples(r):
            runs.setdefault(config, []).append(seconds)
    return {config: statistics.median(values) for config, values in runs.items()}


def mape_before(rows: list[dict]) -> dict:
    """{"mape_before": the step-time MAPE of the measured rows priced from the profile before their
    launch alone}, or {} when no row has that price."""
    before = [r for r in rows if "predicted_before_s" in r and "measured_s" in r]
    if not before:
        return {}
    return {"mape_before": mape([r["predicted_before_s"] for r in before], [r["measured_s"] for r in before])}


def summarize(rows: list[dict]) -> dict:
    """MAPE, Kendall tau and top-1 regret over the measured rows of one model. Top-1 regret is
    the measured time of the planner's choice (its search result; else the grid plan it predicts
    fastest) over the best measured configuration, same configurations pooled; where the search
    chose differently between rounds, the median over its rounds of the pooled time of the
    configuration chosen in each."""
    done = [r for r in rows if "measured_s" in r]
    pred, meas = [r["predicted_s"] for r in done], [r["measured_s"] for r in done]
    choice = next((r for r in done if r["name"] == PLANNER_ROW), None) or min(done, key=lambda r: r["predicted_s"])
    best = min(done, key=lambda r: r["measured_s"])
    pooled = pooled_measured_s(done)
    return {
        "mape": mape(pred, meas),
        **mape_before(done),
        "kendall_tau": kendall_tau(pred, meas),
        "top1_regret": statistics.median(pooled[c] for c, _ in measured_samples(choice)) / min(pooled.values()),
        "top1_regret_unpooled": top1_regret(pred, meas),
        "num_plans": len(done),
        "choice": choice["name"],
        "best_measured": best["name"],
        "failed": [r["name"] for r in rows if "measured_s" not in r],
    }

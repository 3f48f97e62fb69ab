"""The pipeline plans of section 1 priced with and without the in-place pipeline measurement.

One calibration as section 1 takes it (profile-links on 4 ranks, quick; the model's CPU profile
with 4 ranks busy), the chosen grid plans priced twice from it — as profiled, and with the
step_overhead_s["pp@P:bB"] entries (profiler/insitu.py PipelineCase) removed, i.e. the link fit's
sends — then one launch running every plan twice in mirrored order (A B ... B A), so both
pricings face the same measurement. Each plan's row: both predictions, the measured step (the
mean of the two passes' medians, and each), both errors, the pp_comm term; with --phases, each
rank's measured phase seconds (executor/phases.py) beside the predicted breakdown.

    .venv/bin/python -m benchmarks.pipeline_check gpt-tiny pp4-1f1b-mb1,pp4-1f1b,ddp --phases
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from benchmarks.local_accuracy import GRID, _cpu_profile, _run_batch, calibrate_links, predict_grid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="zoo model, e.g. gpt-tiny")
    ap.add_argument("plans", help="comma-separated names from benchmarks.local_accuracy.GRID")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--phases", action="store_true", help="print each rank's measured phases")
    ap.add_argument("--out", default="build/pipeline_check")
    args = ap.parse_args()
    names = args.plans.split(",")
    cluster, _ = calibrate_links(True, print)
    profile = _cpu_profile(args.model)
    print({k: round(v * 1e3, 2) for k, v in profile.step_overhead_s.items() if k.startswith("pp@")}, "ms")
    fit_only = dataclasses.replace(
        profile, step_overhead_s={k: v for k, v in profile.step_overhead_s.items() if not k.startswith("pp@")}
    )
    grid = [g for g in GRID if g[0] in names]
    after, _ = predict_grid(profile, cluster, grid)
    before, _ = predict_grid(fit_only, cluster, grid)
    plans = [plan for _, plan in after]
    results = _run_batch(plans + plans[::-1], args.steps, Path(args.out) / args.model, print)
    print("| plan | link fit ms | in place ms | measured ms (pass 1 / 2) | error fit | error in place | pp_comm ms |")
    print("|---|---|---|---|---|---|---|")
    for i, ((name, plan), (_, fit)) in enumerate(zip(after, before)):
        first, second = results[i], results[2 * len(plans) - 1 - i]
        if first is None or second is None:
            print(f"| {name} | failed |")
            continue
        measured = (first.step_time_s + second.step_time_s) / 2
        b, a = fit.prediction.step_time_s, plan.prediction.step_time_s
        print(
            f"| {name} | {b * 1e3:.1f} | {a * 1e3:.1f} | {measured * 1e3:.1f} ({first.step_time_s * 1e3:.1f} / "
            f"{second.step_time_s * 1e3:.1f}) | {(b / measured - 1) * 100:+.1f}% | {(a / measured - 1) * 100:+.1f}% | "
            f"{fit.prediction.breakdown['pp_comm'] * 1e3:.1f} -> {plan.prediction.breakdown['pp_comm'] * 1e3:.1f} |"
        )
        if args.phases:
            print("    predicted", {k: round(v * 1e3, 1) for k, v in plan.prediction.breakdown.items() if v})
            for rank, phases in enumerate(first.phase_times_per_rank_s):
                print(f"    rank {rank}", {k: round(v * 1e3, 1) for k, v in phases.items() if v})


if __name__ == "__main__":  # profile_model(concurrent > 1) re-imports the main module in its workers
    main()

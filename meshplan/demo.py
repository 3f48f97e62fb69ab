"""`make demo`: the whole job on the built-in default, gpt-tiny on 4 local CPU ranks.

profile (measured on this CPU, 4 ranks busy) -> profile-links (measured gloo collectives) ->
plan (search) -> run (torchrun, 4 gloo ranks) -> report (predicted beside measured).
Everything lands in one folder (default build/demo/, which git ignores, so the demo leaves a clone
clean; `make reports` writes the checked-in reports/demo/): profile.json, cluster.json, plan.json,
run.json, report.md, report.html.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from meshplan import schema
from meshplan.errors import MeshplanError

MODEL = "gpt-tiny"
NUM_RANKS = 4
GLOBAL_BATCH = 16
MICROBATCHES = [1, 2, 4, 8, 16]


def run_demo(out: Path, steps: int = 8, quiet: bool = False):
    """Run the pipeline; returns (plan, run_result). Raises MeshplanError on failure."""
    from meshplan.executor import run_plan
    from meshplan.executor.check import run_warnings
    from meshplan.inputs import PlanOptions, build_request
    from meshplan.planner.search import search
    from meshplan.profiler import profile_model
    from meshplan.profiler.links import profile_links
    from meshplan.report import write_report

    say = (lambda *_: None) if quiet else (lambda text: print(text, flush=True))
    say(f"[1/5] profiling {MODEL} on the CPU with {NUM_RANKS} ranks busy")
    profile = profile_model(MODEL, None, device="cpu", microbatch_sizes=MICROBATCHES, concurrent=NUM_RANKS)
    schema.save(profile, out / "profile.json")
    say(f"[2/5] measuring gloo collectives on {NUM_RANKS} local ranks")
    cluster = profile_links(NUM_RANKS, max_bytes=4 * 2**20, repeats=3)
    schema.save(cluster, out / "cluster.json")
    say(f"[3/5] searching plans for {NUM_RANKS} ranks, global batch {GLOBAL_BATCH}")
    # the request `meshplan plan` builds: the meshplan runtime's own behaviours (eager elementwise
    # ops, one GEMM per projection), so that `meshplan run` of this plan has nothing to warn about
    options = PlanOptions(model=MODEL, num_gpus=NUM_RANKS, global_batch=GLOBAL_BATCH, precision="fp32", top=8)
    warnings: list[str] = []
    plan = search(profile, cluster, build_request(options, cluster, warnings))
    schema.save(plan, out / "plan.json")
    _print_plan(plan, say)
    for text in warnings + run_warnings(plan):
        say(f"      warning: {text}")
    say(f"[4/5] running the plan for {steps} steps with torchrun on {NUM_RANKS} gloo ranks")
    with tempfile.TemporaryDirectory(prefix="meshplan-demo-") as run_dir:  # rank status files stay out
        result = run_plan(plan, steps=steps, out_dir=run_dir, quiet=True)
    schema.save(result, out / "run.json")
    say(f"      losses {' '.join('nan' if x is None else f'{x:.3f}' for x in result.losses)}")
    pred = plan.prediction.step_time_s if plan.prediction is not None else float("nan")
    say(
        f"      step time: predicted {pred * 1e3:.1f} ms, measured {result.step_time_s * 1e3:.1f} ms "
        f"({result.step_time_s / pred - 1:+.0%})"
    )
    say(f"[5/5] writing the report to {out}/")
    write_report(plan, out, run=result, title=f"meshplan demo: {MODEL} on {NUM_RANKS} local CPU ranks")
    _print_summary(out, plan, result, say)
    return plan, result


def _print_summary(out: Path, plan, result, say) -> None:
    """What a newcomer reads at the end: the plan in words, predicted vs measured, where to look."""
    from meshplan.views import describe

    pred = plan.prediction
    err = result.step_time_s / pred.step_time_s - 1 if pred.step_time_s > 0 else 0.0
    say("")
    say("summary")
    say(f"  plan       {describe(plan)}")
    say("             (pp pipeline stages, dp data-parallel replicas, tp tensor-parallel ranks per layer)")
    say(
        f"  predicted  {pred.step_time_s * 1e3:.1f} ms per step, {pred.peak_memory_bytes / 2**20:.1f} MiB per rank; "
        f"{pred.binding_constraint}"
    )
    say(
        f"  measured   {result.step_time_s * 1e3:.1f} ms per step (median after warm-up, {err:+.0%} from the "
        f"prediction), peak {result.peak_memory_bytes / 2**20:.1f} MiB per rank"
    )
    if result.losses:
        first, last = (("not finite" if x is None else f"{x:.3f}") for x in (result.losses[0], result.losses[-1]))
        say(f"  loss       {first} -> {last} over {len(result.losses)} steps")
    say(f"  report     {out / 'report.html'} (open it in a browser; report.md beside it)")
    say(f"  next       meshplan plan --help; meshplan run {out / 'plan.json'}; meshplan report {out / 'plan.json'}")


def _print_plan(plan, say) -> None:
    from meshplan.views import describe

    pred = plan.prediction
    say(f"      recommended: {describe(plan)}")
    say(
        f"      predicted {pred.step_time_s * 1e3:.1f} ms/step, peak {pred.peak_memory_bytes / 2**20:.1f} MiB/rank; "
        f"{pred.binding_constraint}"
    )
    for alt in plan.search.alternatives[:4]:
        say(f"      alternative: {describe(alt)} -> {alt.prediction.step_time_s * 1e3:.1f} ms")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m meshplan.demo", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", default="build/demo")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args(argv)
    try:
        run_demo(Path(args.out), steps=args.steps)
    except MeshplanError as exc:
        print(f"meshplan demo: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())

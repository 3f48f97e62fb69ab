"""`meshplan plan` and `estimate`: options to inputs (meshplan/inputs.py), then the planner's search
or its estimate of one configuration, printed as a table, a line or JSON."""

from __future__ import annotations

import argparse
import dataclasses
import sys

from meshplan import schema
from meshplan.commands.output import print_json, print_table, progress, say, warn
from meshplan.errors import MeshplanError
from meshplan.plan import Plan


def cmd_plan(args: argparse.Namespace) -> int:
    options, inputs = _inputs(args)
    from meshplan.planner.search import search

    with progress(args, f"searching plans for {inputs.request.num_gpus} x {inputs.cluster.name}") as tick:
        plan = search(inputs.profile, inputs.cluster, inputs.request, on_progress=lambda d, t: tick(d, t, "candidates"))
    _emit_plan(args, options, plan)
    if getattr(args, "imported", None):
        _compare_imported(args, plan)
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    options, inputs = _inputs(args)
    from meshplan.planner import estimate

    plan = estimate(inputs.profile, inputs.cluster, inputs.request)
    _emit_plan(args, options, plan)
    return 0


def _inputs(args: argparse.Namespace):
    """(options, inputs) of plan/estimate; the warnings printed on stderr."""
    from meshplan.inputs import PlanOptions, resolve

    options = PlanOptions.of(args)
    inputs = resolve(options, progress=lambda message: progress(args, message))
    for text in inputs.warnings:
        warn(args, text)
    return options, inputs


def _emit_plan(args: argparse.Namespace, options, plan: Plan) -> None:
    from meshplan.inputs import dropped_pins
    from meshplan.views import describe, plan_table, plan_view

    for text in [*dropped_pins(options, plan), *plan.warnings]:
        print(f"meshplan {args.verb}: warning: {text}", file=sys.stderr)
    if getattr(args, "job_file", None):  # the plan records the job file it came from
        plan.provenance = dataclasses.replace(plan.provenance, config=dict(args.job_file))
    if args.output:
        schema.save(plan, args.output)
    if args.json:
        print_json(plan_view(plan))
        return
    if not args.quiet:
        print_table(args, plan_table(plan))
    pred = plan.prediction
    print(f"{'recommended' if plan.search is not None else 'configuration'}: {describe(plan)}")
    if pred is not None:
        print(
            f"predicted: {pred.step_time_s:.4g} s/step, {pred.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, "
            f"MFU {pred.mfu:.1%}, peak {pred.peak_memory_bytes / 2**30:.2f} GiB/GPU; {pred.binding_constraint}"
        )
    if plan.search is not None and not args.quiet:
        s = plan.search
        say(
            args,
            f"searched {s.num_candidates:,} candidates in {s.search_time_s:.3f} s "
            f"({s.num_evaluated:,} costed, {s.num_rejected:,} rejected)",
        )
        for rej in s.rejected[:8]:
            say(args, f"  rejected {rej.family}: {rej.reason}" + (f" (x{rej.count})" if rej.count > 1 else ""))
    if args.output:
        say(args, f"wrote {args.output}")


def _compare_imported(args: argparse.Namespace, best: Plan) -> None:
    """plan --import: the user's own configuration predicted beside the best plan, and the speed-up."""
    from meshplan.imports.common import Imported
    from meshplan.inputs import PlanOptions, resolve
    from meshplan.planner import estimate

    imported = args.imported
    knobs = {k: v for k, v in imported["values"].items() if k in Imported.KNOBS}
    options = PlanOptions.of({**vars(args), **knobs, "output": None})
    what = f"the imported {imported['format']} configuration ({imported['path']})"
    try:
        inputs = resolve(options)
        mine = estimate(inputs.profile, inputs.cluster, inputs.request)
    except MeshplanError as exc:
        line = f"{what} cannot run as given: {exc}"
    else:
        assert best.prediction is not None and mine.prediction is not None  # search and estimate predict
        ours, theirs = best.prediction.step_time_s, mine.prediction.step_time_s
        line = (
            f"{what}: predicted {theirs:.4g} s/step; the best plan {ours:.4g} s/step is {theirs / ours:.2f}x as fast"
            if ours < theirs
            else f"{what}: predicted {theirs:.4g} s/step, as fast as the best plan found ({ours:.4g} s/step)"
        )
    print(line, file=sys.stderr if args.json else sys.stdout)

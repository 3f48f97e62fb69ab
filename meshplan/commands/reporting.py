"""`meshplan report`, `export` and `validate`: a plan (and a run) to files, another framework's
settings, and the planner's predictions of published runs."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from meshplan import schema
from meshplan.commands.output import print_json, progress, say
from meshplan.errors import MeshplanError
from meshplan.plan import Plan


def cmd_report(args: argparse.Namespace) -> int:
    from meshplan.run_result import RunResult

    if args.trace:  # before any work, as -o is
        schema.check_output(args.trace, folder=False, inputs={"plan": args.plan, "--run": args.run})

    plan = schema.load(Plan, args.plan, "plan")
    run = schema.load(RunResult, args.run, "run") if args.run else None
    if run is not None:
        _check_run_matches(plan, run, args.run)
    from meshplan.report import write_report

    paths = write_report(plan, args.output, run=run)
    if args.trace:
        from meshplan.report.trace import trace_json

        schema.write_text_atomic(args.trace, trace_json(plan))
        paths.append(Path(args.trace))
    if args.json:
        print_json({"files": [str(p) for p in paths]})
    else:
        for path in paths:
            say(args, f"wrote {path}")
    return 0


def _check_run_matches(plan: Plan, run, path: str) -> None:
    """report --run: the run must be of this plan's model and world size; another plan of them is
    compared with a warning (the report says so too)."""
    if run.world_size != plan.world_size:
        raise MeshplanError(
            f"--run {path}: ran {run.world_size} ranks, the plan has world_size "
            f"{plan.world_size}; give the run.json of this plan"
        )
    if run.plan_hash and run.plan_hash != schema.content_hash(plan):
        print(
            f"meshplan report: warning: --run {path} was measured on another plan (hash {run.plan_hash}, "
            f"this plan {schema.content_hash(plan)}); its numbers are not this plan's",
            file=sys.stderr,
        )


def cmd_export(args: argparse.Namespace) -> int:
    plan = schema.load(Plan, args.plan, "plan")
    from meshplan.report import export_plan

    files = export_plan(plan, args.to, getattr(args, "target_version", None))
    if args.output:
        for name, text in files.items():
            schema.write_text_atomic(Path(args.output) / name, text)
    if args.json:
        print_json(files)
    elif not args.output:
        for name, text in files.items():
            print(f"# ---- {name}\n{text}")
    else:
        for name in files:
            say(args, f"wrote {Path(args.output) / name}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from meshplan.validation import validate_published, write_validation_report

    shipped = str(Path(__file__).parent.parent / "data" / "published-runs.csv")
    csv = args.csv or shipped
    if args.csv:
        _check_csv_header(args.csv, shipped)
    with progress(args, "predicting published runs") as tick:
        rows = validate_published(csv, on_row=lambda d, t: tick(d, t, "rows"))
    write_validation_report(rows, args.output)
    if args.json:
        print_json(rows)
    else:
        say(args, f"wrote {args.output} ({len(rows)} rows)")
    return 0


def _check_csv_header(path: str, shipped: str) -> None:
    """--csv: a UTF-8 CSV with at least the shipped table's columns and one row."""
    text = schema.read_text_file(path, "--csv")
    need = schema.read_text_file(shipped, "shipped").splitlines()[0].split(",")
    lines = [line for line in text.splitlines() if line.strip()]
    have = lines[0].split(",") if lines else []
    missing = [c for c in need if c not in have]
    if missing or len(lines) < 2:
        what = f"lacks the columns {', '.join(missing[:5])}" if missing else "has no rows"
        raise MeshplanError(f"--csv {path}: {what}; give a table with the columns of {shipped}")

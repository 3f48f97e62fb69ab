"""The CLI verbs: the only place that wires profiler, planner, executor and report together.

One module per concern: output.py (what is printed, and where), presets.py, profiling.py (profile,
profile-links), planning.py (plan, estimate), running.py (run) and reporting.py (report, export,
validate). Each verb takes the parsed options and returns an exit code."""

from __future__ import annotations

import argparse

from meshplan import schema
from meshplan.commands.planning import cmd_estimate, cmd_plan
from meshplan.commands.presets import cmd_presets
from meshplan.commands.profiling import cmd_profile, cmd_profile_links
from meshplan.commands.reporting import cmd_export, cmd_report, cmd_validate
from meshplan.commands.running import cmd_run


def dispatch(args: argparse.Namespace) -> int:
    handler = {
        "presets": cmd_presets,
        "profile": cmd_profile,
        "profile-links": cmd_profile_links,
        "plan": cmd_plan,
        "estimate": cmd_estimate,
        "run": cmd_run,
        "report": cmd_report,
        "export": cmd_export,
        "validate": cmd_validate,
    }[args.verb]
    if getattr(args, "output", None):  # before any work: writable, and not one of the inputs
        inputs = {f"--{k}" if k != "plan" else "plan": getattr(args, k, None) for k in _INPUT_FLAGS}
        schema.check_output(args.output, folder=args.verb in ("report", "export"), inputs=inputs)
    return handler(args)


_INPUT_FLAGS = ("profile", "cluster", "plan", "run", "csv")

"""The `meshplan` command line: a few verbs, each returning an exit code.

Verbs: presets, profile, profile-links, plan, estimate, run, report, export, validate. The
options of plan, estimate, run and report are declared in meshplan/options.py (shared with the
job file and meshplan/inputs.py); the verbs themselves live in meshplan/commands/. Every verb takes
--json (machine output on stdout) and --quiet (no progress); user mistakes are one line on stderr
and a non-zero exit, never a traceback (meshplan.errors.MeshplanError).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import sys
from typing import NoReturn

from meshplan import __version__, options

DESCRIPTION = "meshplan: how to split PyTorch training over GPUs, and then doing it."

EPILOG = """\
the usual path: meshplan plan ... -o plan.json; meshplan run plan.json; meshplan report plan.json --run
runs/latest/run.json. `meshplan VERB --help` lists a verb's options; plan, estimate, run and report
also read them from a job file (--config job.toml, docs/config.md)."""


def _common(p: argparse.ArgumentParser) -> None:
    options.output_group(p)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="meshplan", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"meshplan {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", title="verbs")

    for add_verb in (  # in the order `meshplan --help` lists them
        _presets_verb,
        _profile_verb,
        _profile_links_verb,
        _plan_verb,
        _estimate_verb,
        _run_verb,
        _report_verb,
        _export_verb,
        _validate_verb,
    ):
        add_verb(sub)
    return parser


def _presets_verb(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "presets",
        help="list built-in models and cluster presets",
        description="List the model zoo and the cluster presets (spec-sheet numbers).",
    )
    _common(p)


def _profile_verb(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile",
        help="profile a model layer by layer",
        description="Capture a model as a chain of layers with parameters, FLOPs, "
        "activation bytes and TP rules; with --device cpu|cuda also measure "
        "forward/backward time and peak memory per microbatch size.",
    )
    options.model_group(p)
    p.add_argument(
        "--device",
        choices=("meta", "cpu", "cuda"),
        default="meta",
        help="meta: analytic only, nothing allocated; cpu/cuda: also time each layer type",
    )
    p.add_argument("--microbatch", type=int, nargs="+", default=None, help="microbatch sizes to time")
    p.add_argument(
        "--concurrent",
        type=int,
        default=1,
        help="time with N processes busy at once, as N local ranks will run (default 1)",
    )
    p.add_argument(
        "--no-in-place",
        dest="in_place",
        action="store_false",
        help="with --device cpu --concurrent N: skip timing the TP/ZeRO-3 wrappers on N real "
        "gloo ranks (faster; the cost model then uses link fits and one-rank overheads)",
    )
    p.add_argument("-o", "--output", help="write the ModelProfile JSON here")
    _common(p)


def _profile_links_verb(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "profile-links",
        help="measure collective bandwidth on local devices",
        description="Run all_reduce, all_gather, reduce_scatter, all_to_all and send/recv "
        "over 1 KiB..64 MiB on 2..N local ranks, fit latency + bytes/bandwidth, measure "
        "host memory, host<->device copies and the disk (fsync'd write, cold read), "
        "and write a ClusterSpec the planner uses.",
    )
    p.add_argument("--nproc", type=int, default=4, help="local ranks (default 4)")
    p.add_argument("--max-bytes", type=int, default=64 * 2**20, help="largest message (default 64 MiB)")
    p.add_argument(
        "--disk-dir",
        help="where the disk probe (offload=nvme's tier) writes its temporary files (default: the system temp dir)",
    )
    p.add_argument("--disk-mib", type=int, default=64, help="disk probe file per rank, MiB (default 64; 0 skips it)")
    p.add_argument("-o", "--output", help="write the ClusterSpec JSON here")
    _common(p)


def _plan_verb(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "plan",
        help="search for the fastest plan that fits",
        description="Search every valid pp x dp x tp split, microbatch, schedule, ZeRO stage, "
        "sequence parallel, stage boundaries and per-layer recompute; print the "
        "best plan, the top-K alternatives and why the rest lost. Any knob flag "
        "pins that choice.",
    )
    options.add_plan_options(p, "plan")
    options.job_file_options(p)
    options.import_option(p, "search from it and say how much faster the best plan is than it")


def _estimate_verb(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "estimate",
        help="predict one given configuration",
        description="Predict step time, memory, MFU/HFU of one fully given configuration (no search over degrees).",
    )
    options.add_plan_options(p, "estimate")
    options.job_file_options(p)
    options.import_option(p, "predict it")


def _run_verb(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "run",
        help="execute a plan with torchrun",
        description="Launch torchrun with the plan's world size (gloo on CPU, nccl on CUDA), "
        "train for --steps with synthetic seeded data (or --data module:fn), and "
        "write run.json: per-step loss, step time, tokens/s, peak memory per rank.",
    )
    options.run_group(p)
    options.launch_group(p)
    _common(p)
    options.job_file_options(p)


def _report_verb(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "report",
        help="write the plan report",
        description="Write report.md and a self-contained report.html: summary, pipeline "
        "timeline, memory per stage, alternatives, rejected families, and the "
        "measured run beside the prediction when --run is given.",
    )
    options.report_group(p)
    options.output_group(p, write_help="output folder (default reports/latest)", write_default="reports/latest")
    options.job_file_options(p)


def _export_verb(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "export",
        help="export a plan to another framework's settings",
        description="Translate a plan to torchtitan (a Python config; 0.2: TOML), Megatron-LM flags, a "
        "DeepSpeed config or an accelerate YAML; what the target cannot express "
        "is stated in the output.",
    )
    p.add_argument("plan", help="plan.json from `meshplan plan -o` or `meshplan estimate -o`")
    p.add_argument(
        "--to",
        required=True,
        choices=("torchtitan", "megatron", "deepspeed", "accelerate"),
        help="the framework whose settings to write",
    )
    p.add_argument(
        "--target-version",
        choices=("0.3", "0.2"),
        help="torchtitan release to write for: 0.3 (default: a Python config for --module/--config) or 0.2 "
        "(the TOML job config of --job.config_file)",
    )
    p.add_argument("-o", "--output", help="folder to write the files into (default: print)")
    _common(p)


def _validate_verb(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "validate",
        help="check predictions against published runs",
        description="Predict every row of the published-runs table pinned to what the row "
        "states and report the per-row throughput error.",
    )
    p.add_argument("--csv", help="published-runs CSV (default: the shipped table)")
    p.add_argument("-o", "--output", default="reports/validation.md", help="the Markdown table to write")
    _common(p)


class UsageError(Exception):
    """An argparse usage error (unknown flag, bad value), raised so that main can print it as
    one line naming the flag, or as a JSON object under --json."""

    exit_code = 2

    def __init__(self, prog: str, usage: str, message: str):
        super().__init__(message)
        self.prog, self.usage = prog, usage
        hit = re.match(r"argument (\S+?)(?:/\S+)?: ", message) or re.search(r"required: (\S+?)[,]?(?: |$)", message)
        self.field = hit.group(1) if hit else None


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(self.prog, self.format_usage(), message)


def verb_parsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Verb name -> its subparser."""
    return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices


def verb_parser(parser: argparse.ArgumentParser, verb: str) -> argparse.ArgumentParser:
    """The subparser of `verb`."""
    return verb_parsers(parser)[verb]


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line, with a --config job file's values as defaults (flags override them)."""
    from meshplan import config

    parser = build_parser()
    verb = next((t for t in argv if not t.startswith("-")), None)
    path = config.option_value(argv, "--config") if verb in config.VERBS else None
    if verb not in config.VERBS:
        args = parser.parse_args(argv)
        args.job_file = None
        return args
    sub = verb_parser(parser, verb)
    defaults = {a.dest: a.default for a in sub._actions}
    table = None
    if path is not None:
        values, table = config.load(path, sub)
        config.apply(sub, values)
    imported = config.apply_import(sub, argv, verb) if verb in ("plan", "estimate") else None
    args = parser.parse_args(argv)
    args.imported = imported
    options.refuse_conflicts(sub, argv)
    if path is not None:
        config.merge_lists(args, sub, values)  # --set on the command line wins over the file's set
    for action in sub._actions:  # a positional neither given nor in the file
        if not action.option_strings and action.dest != "help" and getattr(args, action.dest, None) is None:
            raise UsageError(sub.prog, sub.format_usage(), f"the following arguments are required: {action.dest}")
    args.job_file = {"path": path, "table": table} if path is not None else None
    if args.save_config:
        from meshplan import schema

        schema.write_text_atomic(args.save_config, config.dump(args, sub, verb, defaults))
        if not args.quiet and not args.json:
            print(f"wrote {args.save_config}", file=sys.stderr)
    return args


def _print_error(verb: str | None, exc: Exception, as_json: bool) -> None:
    code = getattr(exc, "exit_code", 2)
    if as_json:
        obj = {"code": code, "type": type(exc).__name__, "message": str(exc), "field": getattr(exc, "field", None)}
        print(json.dumps({"error": obj}, indent=2))
    if isinstance(exc, UsageError):  # one line, as every other mistake (docs/errors.md); not argparse's usage block
        prog = exc.prog
        verbs = verb_parsers(build_parser())
        if prog == "meshplan" and verb in verbs:  # a verb's unknown flag is found by the top parser
            prog = verbs[verb].prog
        print(f"{prog}: error: {exc} ({prog} --help lists the flags)", file=sys.stderr)
    else:
        print(f"meshplan {verb}: error: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    from meshplan.errors import MeshplanError

    argv = sys.argv[1:] if argv is None else list(argv)
    as_json = "--json" in argv
    verb = None
    try:
        args = parse(argv)
        verb = args.verb
        if not args.verb:
            build_parser().print_help()
            return 0
        from meshplan.commands import dispatch, output

        if as_json and (sys.stdout is None or not _fd_open(1)):
            raise MeshplanError("--json: stdout is closed, so the JSON has nowhere to go; redirect it to a file")
        with output.json_stdout() if as_json else contextlib.nullcontext():
            code = dispatch(args)
        sys.stdout.flush()  # a full disk or a closed pipe is found here, not at interpreter exit
        return code
    except (MeshplanError, UsageError) as exc:
        _print_error(verb or next((t for t in argv if not t.startswith("-")), None), exc, as_json)
        return exc.exit_code
    except KeyboardInterrupt as exc:  # SIGINT; `run` also turns SIGTERM/SIGHUP into RunInterrupted
        print(f"meshplan {verb}: {str(exc) or 'interrupted (Ctrl-C)'}", file=sys.stderr)
        return getattr(exc, "exit_code", 130)
    except OSError as exc:  # writing to stdout: `presets > /dev/full`, `plan | head -1`
        if exc.errno not in (errno.EPIPE, errno.ENOSPC, errno.EDQUOT, errno.EIO):
            raise  # files meshplan writes fail as MeshplanError lines (schema.write_text_atomic)
        _stdout_broken()
        if exc.errno == errno.EPIPE:
            return 0  # the reader has what it wanted
        from meshplan.errors import os_error_text

        print(f"meshplan {verb}: error: cannot write to stdout: {os_error_text(exc)}", file=sys.stderr)
        return 2


def _fd_open(fd: int) -> bool:
    try:
        os.fstat(fd)
        return True
    except OSError:
        return False


def _stdout_broken() -> bool:
    """True if stdout cannot take what was printed; then fd 1 is pointed at /dev/null so the
    interpreter's own flush at exit does not print a second error."""
    try:
        if sys.stdout is not None:
            sys.stdout.flush()
        return False
    except OSError:
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        return True


if __name__ == "__main__":
    sys.exit(main())

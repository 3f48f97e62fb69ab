"""The `meshplan` command line: a few verbs, each returning an exit code.

Verbs: presets, profile, profile-links, plan, estimate, run, report, export, validate. The
options of plan and estimate are declared in meshplan/options.py (shared with the job file and
meshplan/inputs.py); the verbs themselves live in meshplan/commands.py. Every verb takes --json (machine output on stdout) and --quiet (no progress); user mistakes are
one line on stderr and a non-zero exit, never a traceback (meshplan.errors.MeshplanError).
"""

from __future__ import annotations

import argparse
import sys

from meshplan import __version__, options

DESCRIPTION = "meshplan: how to split PyTorch training over GPUs, and then doing it."

EPILOG = """\
the usual path: meshplan plan ... -o plan.json; meshplan run plan.json; meshplan report plan.json --run
runs/latest/run.json. `meshplan VERB --help` lists a verb's options; plan, estimate, run and report
also read them from a job file (--config job.toml, docs/config.md)."""


def _common(p: argparse.ArgumentParser) -> None:
    options.output_group(p)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshplan", description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"meshplan {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", title="verbs")

    p = sub.add_parser(
        "presets",
        help="list built-in models and cluster presets",
        description="List the model zoo and the cluster presets (spec-sheet numbers).",
    )
    _common(p)

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

    p = sub.add_parser(
        "plan",
        help="search for the fastest plan that fits",
        description="Search every valid pp x dp x tp split, microbatch, schedule, ZeRO stage, "
        "sequence parallel, stage boundaries and per-layer recompute; print the "
        "best plan, the top-K alternatives and why the rest lost. Any knob flag "
        "pins that choice.",
    )
    options.add_plan_options(p, "plan")

    p = sub.add_parser(
        "estimate",
        help="predict one given configuration",
        description="Predict step time, memory, MFU/HFU of one fully given configuration (no search over degrees).",
    )
    options.add_plan_options(p, "estimate")

    p = sub.add_parser(
        "run",
        help="execute a plan with torchrun",
        description="Launch torchrun with the plan's world size (gloo on CPU, nccl on CUDA), "
        "train for --steps with synthetic seeded data (or --data module:fn), and "
        "write run.json: per-step loss, step time, tokens/s, peak memory per rank.",
    )
    p.add_argument("plan", help="plan.json from `meshplan plan -o`")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps to train (default 5)")
    p.add_argument("--data", help="module:fn returning a torch Dataset of (input, target) pairs")
    p.add_argument("--out-dir", default="runs/latest", help="where run.json and checkpoints go")
    p.add_argument("--checkpoint-every", type=int, default=0, help="save a DCP checkpoint every K steps")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out-dir")
    p.add_argument(
        "--waves",
        choices=("1", "2"),
        help="2: run Wavelet's two waves (2N tasks of half the microbatch, the second half an iteration "
        "late, two ranks a device), then one wave for comparison, and write waves.json",
    )
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh in an --out-dir that holds an earlier run's checkpoint (deletes it)",
    )
    p.add_argument(
        "--nnodes", type=int, default=1, help="hosts the job spans; run the same command on each (default 1)"
    )
    p.add_argument("--node-rank", type=int, default=0, help="this host's index, 0..--nnodes-1 (default 0)")
    p.add_argument("--rdzv-endpoint", help="host:port for multi-node rendezvous")
    p.add_argument("--timeout", type=float, default=600, help="seconds before a hung job is ended")
    p.add_argument("--print-launch", action="store_true", help="print the torchrun command and exit")
    p.add_argument(
        "--optimizer",
        choices=("adamw", "sgd"),
        default="adamw",
        help="adamw (default) or sgd (momentum 0.9; none under DGC's momentum correction)",
    )
    p.add_argument(
        "--offload-dir",
        help="offload=nvme: folder for the optimizer-state files on local NVMe "
        "(default: <out-dir>/offload; removed at the end of the run)",
    )
    _common(p)

    p = sub.add_parser(
        "report",
        help="write the plan report",
        description="Write report.md and a self-contained report.html: summary, pipeline "
        "timeline, memory per stage, alternatives, rejected families, and the "
        "measured run beside the prediction when --run is given.",
    )
    p.add_argument("plan", help="plan.json from `meshplan plan -o` or `meshplan estimate -o`")
    p.add_argument("--run", help="run.json from `meshplan run`")
    p.add_argument("-o", "--output", default="reports/latest", help="output folder")
    _common(p)

    p = sub.add_parser(
        "export",
        help="export a plan to another framework's settings",
        description="Translate a plan to torchtitan (TOML + Python), Megatron-LM flags, a "
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
    p.add_argument("-o", "--output", help="folder to write the files into (default: print)")
    _common(p)

    p = sub.add_parser(
        "validate",
        help="check predictions against published runs",
        description="Predict every row of the published-runs table pinned to what the row "
        "states and report the per-row throughput error.",
    )
    p.add_argument("--csv", help="published-runs CSV (default: the shipped table)")
    p.add_argument("-o", "--output", default="reports/validation.md", help="the Markdown table to write")
    _common(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    from meshplan.errors import MeshplanError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.verb:
        parser.print_help()
        return 0
    from meshplan import commands

    try:
        return commands.dispatch(args)
    except MeshplanError as exc:
        print(f"meshplan {args.verb}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt as exc:  # SIGINT; `run` also turns SIGTERM/SIGHUP into RunInterrupted
        print(f"meshplan {args.verb}: {exc or 'interrupted'}", file=sys.stderr)
        return getattr(exc, "exit_code", 130)


if __name__ == "__main__":
    sys.exit(main())

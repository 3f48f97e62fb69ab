"""The `meshplan` command line: a few verbs, each returning an exit code.

Verbs: presets, profile, profile-links, plan, estimate, run, report, export, validate.
Every verb takes --json (machine output on stdout) and --quiet (no progress); user mistakes are
one line on stderr and a non-zero exit, never a traceback (meshplan.errors.MeshplanError).
"""

from __future__ import annotations

import argparse
import sys

from meshplan import __version__, dp_methods
from meshplan.presets import CLUSTER_PRESETS

DESCRIPTION = """\
meshplan: how to split PyTorch training over GPUs, and then doing it.

  profile        measure a model as a chain of layers (params, FLOPs, activations, time)
  profile-links  measure collective bandwidth/latency on local devices -> cluster.json
  plan           search data/tensor/pipeline splits, ZeRO, microbatching, schedule, recompute
  estimate       predict one given configuration without searching
  run            execute a plan with torchrun (gloo on CPU, nccl on GPU) -> run.json
  report         write a Markdown + self-contained HTML report for a plan (and its run)
  export         translate a plan to torchtitan, Megatron-LM, DeepSpeed or accelerate settings
  validate       predict every published run in the reference table and report the error
  presets        list the built-in models and cluster presets
"""


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print machine-readable JSON on stdout")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress output")


def _model_args(p: argparse.ArgumentParser, required: bool = False) -> None:
    p.add_argument(
        "--model",
        default=None if required else "gpt-tiny",
        required=required,
        help="zoo name (see `meshplan presets`), gpt/llama with --set, file.py:factory, "
        "module:factory or hf:NAME (default: gpt-tiny)",
    )
    p.add_argument(
        "--set",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        dest="overrides",
        help="model shape overrides, e.g. --set layers=96 hidden=12288 heads=96 seq=2048 "
        "(repeatable: --set layers=96 --set hidden=12288)",
    )


def _plan_knobs(p: argparse.ArgumentParser, required: bool) -> None:
    need = " (required)" if required else " (pins it; default: searched)"
    p.add_argument("--tp", type=int, required=required, help="tensor-parallel degree" + need)
    p.add_argument("--pp", type=int, required=required, help="pipeline-parallel degree" + need)
    p.add_argument("--dp", type=int, required=required, help="data-parallel degree" + need)
    p.add_argument("--cp", type=int, default=None, help="context-parallel degree (default 1)")
    p.add_argument("--microbatch", type=int, required=required, help="microbatch size" + need)
    p.add_argument("--schedule", required=required, help="gpipe, 1f1b or interleaved" + need)
    p.add_argument("--virtual-stages", type=int, help="model chunks per pipeline rank (interleaved)")
    p.add_argument(
        "--recompute",
        choices=("none", "selective", "full"),
        required=required,
        help="activation recompute for every block" + need,
    )
    p.add_argument(
        "--recompute-num-layers",
        type=int,
        default=None,
        metavar="N",
        help="with --recompute full: checkpoint the blocks in groups of N layers, Megatron's "
        "--recompute-method uniform --recompute-num-layers N (default 1)",
    )
    p.add_argument("--zero", type=int, choices=(0, 1, 2, 3), help="ZeRO stage" + need)
    p.add_argument(
        "--sequence-parallel",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Megatron sequence parallelism with TP" + need,
    )
    p.add_argument("--dp-shard", type=int, help="FSDP2 shard degree for ZeRO-2/3 (HSDP when < --dp)" + need)
    _method_args(p)


def _method_args(p: argparse.ArgumentParser) -> None:
    """Data-parallel methods (meshplan/dp_methods.py): a pin per axis, and what-ifs to price."""
    g = p.add_argument_group("data-parallel methods (`meshplan presets` lists them)")
    g.add_argument(
        "--compression",
        metavar="NAME[:k=v,...]",
        help="pin gradient compression: " + ", ".join(dp_methods.names("compression")),
    )
    g.add_argument(
        "--sync", metavar="NAME[:k=v,...]", help="pin replica synchronisation: " + ", ".join(dp_methods.names("sync"))
    )
    g.add_argument(
        "--comm-schedule",
        metavar="NAME[:k=v,...]",
        help="pin communication scheduling: " + ", ".join(dp_methods.names("comm_schedule")),
    )
    g.add_argument(
        "--offload",
        metavar="NAME[:k=v,...]",
        help="pin state placement: "
        + ", ".join(dp_methods.names("offload"))
        + " (cpu:delayed_update=true is approximate)",
    )
    g.add_argument("--waves", choices=dp_methods.names("waves"), help="pin wave scheduling")
    g.add_argument(
        "--allow-compression",
        metavar="NAME,...|all",
        help="let the search price these approximate compressors as what-ifs",
    )
    g.add_argument(
        "--allow-sync",
        metavar="NAME,...|all",
        help="let the search price these approximate synchronisation methods as what-ifs",
    )


def _cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cluster",
        default="local-cpu",
        help=f"preset ({', '.join(CLUSTER_PRESETS)}) or a cluster.json from `meshplan profile-links` "
        "(default: local-cpu)",
    )
    p.add_argument("--num-gpus", type=int, default=4, help="devices (local-cpu: ranks) (default: 4)")
    p.add_argument("--global-batch", type=int, default=16, help="samples per optimizer step (default: 16)")
    p.add_argument("--seq", type=int, help="sequence length (default: the model's)")
    p.add_argument("--profile", help="a profile.json from `meshplan profile` instead of building one")
    p.add_argument(
        "--precision",
        choices=("bf16", "fp8", "fp32"),
        default=None,
        help="training precision (default: bf16 on GPUs, fp32 on local-cpu); fp8: GEMMs at the "
        "device's fp8 peak and curve (H100/H200/B200; bf16 elsewhere), the rest bf16",
    )


def _runtime_args(p: argparse.ArgumentParser) -> None:
    """The software that will run the plan (meshplan/runtimes.py) and each of its behaviours."""
    from meshplan import runtimes

    g = p.add_argument_group("runtime (each behaviour flag overrides the runtime's default; README table)")
    g.add_argument(
        "--runtime",
        choices=runtimes.NAMES,
        default=runtimes.DEFAULT,
        help="software that will execute the plan (default: meshplan)",
    )
    g.add_argument(
        "--state-layout",
        choices=("torch", "megatron", "zero"),
        default=None,
        help="training state per parameter: torch 4+4+8 B, megatron 2+4+12 B, zero 2+2+12 B",
    )
    g.add_argument(
        "--overlap-dp-comm",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="overlap the gradient reduction with backward",
    )
    g.add_argument(
        "--overlap-tp-comm",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="overlap tensor-parallel collectives with GEMMs (Megatron-Core --tp-comm-overlap)",
    )
    g.add_argument(
        "--attention",
        choices=("flash", "materialized"),
        default=None,
        help="attention kernel: flash keeps the log-sum-exp, materialized the s x s scores",
    )
    g.add_argument(
        "--dropout",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="dropout masks kept for backward (closed-form --model analytic:gpt only)",
    )
    g.add_argument(
        "--uniform-stages",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="split blocks evenly over pipeline stages (Megatron) instead of searching boundaries",
    )
    g.add_argument(
        "--free-stage-outputs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="a pipeline stage frees each microbatch's output once sent (Megatron) instead of holding it "
        "until its backward (torch pipelining, DeepSpeed)",
    )
    g.add_argument(
        "--elementwise",
        choices=("fused", "compiled", "eager"),
        default=None,
        help="how norms, rotary, SwiGLU and the GQA repeat run: fused kernels (Megatron, Transformer Engine), "
        "torch.compile, or eager torch ops, which move more bytes (closed-form models)",
    )
    g.add_argument(
        "--fused-projections",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Q, K, V as one GEMM and the MLP's gate and up as one (Megatron), instead of one GEMM per "
        "projection (torchtitan, torch models): smaller GEMMs run less efficiently (closed-form models)",
    )
    g.add_argument(
        "--compile",
        dest="elementwise",
        action="store_const",
        const="compiled",
        help="the runtime compiles the model (torchtitan training.compile): same as --elementwise compiled",
    )
    g.add_argument(
        "--fsdp-gather-dtype",
        choices=("bf16", "fp32"),
        default=None,
        help="dtype of ZeRO-3/FSDP parameter all-gathers and gradient reduce-scatters",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="meshplan", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--version", action="version", version=f"meshplan {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")

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
    _model_args(p)
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
    _model_args(p)
    _cluster_args(p)
    _plan_knobs(p, required=False)
    _runtime_args(p)
    p.add_argument("--top", type=int, default=5, help="alternatives to keep (default 5)")
    p.add_argument("--allow-cross-node-tp", action="store_true", help="allow TP groups to span nodes")
    p.add_argument("-o", "--output", help="write the Plan JSON here (input of run/report/export)")
    _common(p)

    p = sub.add_parser(
        "estimate",
        help="predict one given configuration",
        description="Predict step time, memory, MFU/HFU of one fully given configuration (no search over degrees).",
    )
    _model_args(p)
    _cluster_args(p)
    _plan_knobs(p, required=True)
    _runtime_args(p)
    p.add_argument("-o", "--output", help="write the Plan JSON here")
    _common(p)

    p = sub.add_parser(
        "run",
        help="execute a plan with torchrun",
        description="Launch torchrun with the plan's world size (gloo on CPU, nccl on CUDA), "
        "train for --steps with synthetic seeded data (or --data module:fn), and "
        "write run.json: per-step loss, step time, tokens/s, peak memory per rank.",
    )
    p.add_argument("plan", help="plan.json from `meshplan plan -o`")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--data", help="module:fn returning a torch Dataset of (input, target) pairs")
    p.add_argument("--out-dir", default="runs/latest", help="where run.json and checkpoints go")
    p.add_argument("--checkpoint-every", type=int, default=0, help="save a DCP checkpoint every K steps")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out-dir")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh in an --out-dir that holds an earlier run's checkpoint (deletes it)",
    )
    p.add_argument("--nnodes", type=int, default=1)
    p.add_argument("--node-rank", type=int, default=0)
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
    p.add_argument("plan")
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
    p.add_argument("plan")
    p.add_argument("--to", required=True, choices=("torchtitan", "megatron", "deepspeed", "accelerate"))
    p.add_argument("-o", "--output", help="folder to write the files into (default: print)")
    _common(p)

    p = sub.add_parser(
        "validate",
        help="check predictions against published runs",
        description="Predict every row of the published-runs table pinned to what the row "
        "states and report the per-row throughput error.",
    )
    p.add_argument("--csv", help="published-runs CSV (default: the shipped table)")
    p.add_argument("-o", "--output", default="reports/validation.md")
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

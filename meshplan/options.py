"""The options of the verbs that read a job file, in the argument groups that are also the sections
of a job file (meshplan/config.py): `meshplan plan` and `estimate` (model, cluster, batch,
parallelism, methods, runtime, output), `run` (run, launch) and `report` (report), with --config,
--save-config and --import. One table: the CLI (meshplan/cli.py) adds these groups to its verbs,
meshplan/inputs.py parses a plan command line with them (validation and benchmarks go through it),
and the job file's sections and keys are read off the same groups.

Nothing here imports torch or the planner.
"""

from __future__ import annotations

import argparse
from typing import Any

from meshplan import dp_methods, runtimes
from meshplan.errors import MeshplanError
from meshplan.presets import CLUSTER_PRESETS

PLAN_VERBS = ("plan", "estimate")


def model_group(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model", "what to train (a job file's [model] section)")
    g.add_argument(
        "--model",
        default="gpt-tiny",
        help="zoo name (see `meshplan presets`), gpt/llama with --set, file.py:factory, "
        "module:factory or hf:NAME (default: gpt-tiny)",
    )
    g.add_argument(
        "--set",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        dest="overrides",
        help="model shape overrides, e.g. --set layers=96 hidden=12288 heads=96 seq=2048 "
        "(repeatable: --set layers=96 --set hidden=12288)",
    )
    g.add_argument("--profile", help="a profile.json from `meshplan profile` instead of building one")


def cluster_group(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cluster", "where it trains ([cluster])")
    g.add_argument(
        "--cluster",
        default="local-cpu",
        help=f"preset ({', '.join(CLUSTER_PRESETS)}) or a cluster.json from `meshplan profile-links` "
        "(default: local-cpu)",
    )
    g.add_argument("--num-gpus", type=int, default=4, help="devices (local-cpu: ranks) (default: 4)")


def batch_group(p: argparse.ArgumentParser, required: bool) -> None:
    need = " (required)" if required else " (pins it; default: searched)"
    g = p.add_argument_group("batch", "samples and tokens per step ([batch])")
    g.add_argument("--global-batch", type=int, default=16, help="samples per optimizer step (default: 16)")
    g.add_argument("--seq", type=int, help="sequence length (default: the model's)")
    g.add_argument("--microbatch", type=int, required=required, help="microbatch size" + need)


def stage_counts(text: str) -> tuple[int, ...]:
    """--stage-layers: whole numbers separated by commas (argparse names the flag on a bad value)."""
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: give layer counts separated by commas, e.g. 3,3,2") from None
    return counts


def parallelism_group(p: argparse.ArgumentParser, required: bool, verb: str) -> None:
    need = " (required)" if required else " (pins it; default: searched)"
    g = p.add_argument_group("parallelism", "degrees, schedule, ZeRO and recompute ([parallelism])")
    g.add_argument("--tp", type=int, required=required, help="tensor-parallel degree" + need)
    g.add_argument("--pp", type=int, required=required, help="pipeline-parallel degree" + need)
    g.add_argument("--dp", type=int, required=required, help="data-parallel degree" + need)
    g.add_argument("--cp", type=int, default=None, help="context-parallel degree (default 1)")
    g.add_argument("--schedule", required=required, help="gpipe, 1f1b or interleaved" + need)
    g.add_argument("--virtual-stages", type=int, help="model chunks per pipeline rank (interleaved)")
    if verb == "estimate":
        g.add_argument(
            "--stage-layers",
            type=stage_counts,
            metavar="N,N,...",
            help="layers per pipeline stage in model order, pp x virtual-stages counts (the embedding and the "
            "head count as one layer each; `meshplan profile` lists the layers); default: a balanced split",
        )
    g.add_argument(
        "--recompute",
        choices=("none", "selective", "full"),
        required=required,
        help="activation recompute for every block" + need,
    )
    g.add_argument(
        "--recompute-num-layers",
        type=int,
        default=None,
        metavar="N",
        help="with --recompute full: checkpoint the blocks in groups of N layers, Megatron's "
        "--recompute-method uniform --recompute-num-layers N (default 1)",
    )
    g.add_argument(
        "--recompute-blocks",
        type=int,
        default=None,
        metavar="K",
        help="with --recompute full: recompute only the first K blocks of each pipeline stage (none on the "
        "rest), Megatron's --recompute-method block --recompute-num-layers K",
    )
    g.add_argument("--zero", type=int, choices=(0, 1, 2, 3), help="ZeRO stage" + need)
    g.add_argument(
        "--sequence-parallel",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="Megatron sequence parallelism with TP" + need,
    )
    g.add_argument("--dp-shard", type=int, help="FSDP2 shard degree for ZeRO-2/3 (HSDP when < --dp)" + need)
    if verb == "plan":
        g.add_argument("--allow-cross-node-tp", action="store_true", help="allow TP groups to span nodes")


def methods_group(p: argparse.ArgumentParser) -> None:
    """Data-parallel methods (meshplan/dp_methods.py): a pin per axis, and what-ifs to price."""
    g = p.add_argument_group("methods", "data-parallel methods, `meshplan presets` lists them ([methods])")
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


def runtime_group(p: argparse.ArgumentParser) -> None:
    """The software that will run the plan (meshplan/runtimes.py) and each of its behaviours."""
    g = p.add_argument_group(
        "runtime", "the software that runs the plan; each behaviour flag overrides its default ([runtime])"
    )
    g.add_argument(
        "--runtime",
        choices=runtimes.NAMES,
        default=runtimes.DEFAULT,
        help="software that will execute the plan (default: meshplan)",
    )
    g.add_argument(
        "--precision",
        choices=("bf16", "fp8", "fp32"),
        default=None,
        help="training precision (default: bf16 on GPUs, fp32 on local-cpu); fp8: GEMMs at the "
        "device's fp8 peak and curve (H100/H200/B200; bf16 elsewhere), the rest bf16",
    )
    for flag in runtimes.BEHAVIOUR_FLAGS:  # one per behaviour row with a flag (meshplan/runtimes.py ROWS)
        g.add_argument(flag.name, **flag.argparse_kwargs())
    g.add_argument(
        "--compile",
        dest="elementwise",
        action="store_const",
        const="compiled",
        help="the runtime compiles the model (torchtitan [compile] enable): same as --elementwise compiled",
    )


def output_group(
    p: argparse.ArgumentParser, *, write_help: str | None = None, write_default: str | None = None, top: bool = False
):
    """--json, --plain, --quiet (every verb), -o and --top where the verb has them."""
    g = p.add_argument_group("output", "what is printed and written ([output])")
    if top:
        g.add_argument("--top", type=int, default=5, help="alternatives to keep (default 5)")
    if write_help:
        g.add_argument("-o", "--output", default=write_default, help=write_help)
    g.add_argument(
        "--json", action="store_true", help="print machine-readable JSON on stdout (errors too: a JSON object)"
    )
    g.add_argument(
        "--plain",
        action="store_true",
        help="tables as tab-separated values, no boxes or colour (piped output is full width without it)",
    )
    g.add_argument("--quiet", "-q", action="store_true", help="no progress output (warnings still print)")
    return g


def add_plan_options(p: argparse.ArgumentParser, verb: str) -> None:
    """Every option of `meshplan plan` (verb "plan") or `meshplan estimate` ("estimate")."""
    required = verb == "estimate"
    model_group(p)
    cluster_group(p)
    batch_group(p, required)
    parallelism_group(p, required, verb)
    methods_group(p)
    runtime_group(p)
    what = "the Plan JSON (input of run/report/export)" if verb == "plan" else "the Plan JSON"
    output_group(p, write_help=f"write {what} here", top=verb == "plan")


def run_group(p: argparse.ArgumentParser) -> None:
    """`meshplan run`: the plan, what to train and where it writes."""
    g = p.add_argument_group("run", "what to train and where it writes ([run])")
    g.add_argument("plan", help="plan.json from `meshplan plan -o`")
    g.add_argument("--steps", type=int, default=5, help="optimizer steps to train (default 5)")
    g.add_argument("--data", help="module:fn returning a torch Dataset of (input, target) pairs")
    g.add_argument("--out-dir", default="runs/latest", help="where run.json and checkpoints go")
    g.add_argument("--checkpoint-every", type=int, default=0, help="save a DCP checkpoint every K steps")
    g.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --out-dir")
    g.add_argument(
        "--waves",
        choices=("1", "2"),
        help="2: run Wavelet's two waves (2N tasks of half the microbatch, the second half an iteration "
        "late, two ranks a device), then one wave for comparison, and write waves.json",
    )
    g.add_argument(
        "--overwrite",
        action="store_true",
        help="start afresh in an --out-dir that holds an earlier run's checkpoint (deletes it)",
    )
    g.add_argument(
        "--optimizer",
        choices=("adamw", "sgd"),
        default="adamw",
        help="adamw (default) or sgd (momentum 0.9; none under DGC's momentum correction)",
    )
    g.add_argument(
        "--offload-dir",
        help="offload=nvme: folder for the optimizer-state files on local NVMe "
        "(default: <out-dir>/offload; removed at the end of the run)",
    )


def launch_group(p: argparse.ArgumentParser) -> None:
    """`meshplan run`: hosts, rendezvous and the watchdog."""
    g = p.add_argument_group("launch", "hosts, rendezvous and the watchdog ([launch])")
    g.add_argument(
        "--nnodes", type=int, default=1, help="hosts the job spans; run the same command on each (default 1)"
    )
    g.add_argument("--node-rank", type=int, default=0, help="this host's index, 0..--nnodes-1 (default 0)")
    g.add_argument("--rdzv-endpoint", help="host:port for multi-node rendezvous")
    g.add_argument("--timeout", type=float, default=600, help="seconds before a hung job is ended")
    g.add_argument(
        "--print-launch",
        action="store_true",
        help="print the torchrun command (with --json: a JSON object per node) and exit",
    )


def report_group(p: argparse.ArgumentParser) -> None:
    """`meshplan report`: the plan, the run beside it and the trace."""
    g = p.add_argument_group("report", "what to report on ([report])")
    g.add_argument("plan", help="plan.json from `meshplan plan -o` or `meshplan estimate -o`")
    g.add_argument("--run", help="run.json from `meshplan run`")
    g.add_argument(
        "--trace",
        metavar="TRACE.json",
        help="also write the predicted step as a Chrome/Perfetto trace (chrome://tracing, ui.perfetto.dev): "
        "one track per pipeline rank, one slice per forward, backward and transfer",
    )


def job_file_options(p: argparse.ArgumentParser) -> None:
    """--config and --save-config, of the verbs that read a job file (meshplan/config.py)."""
    p.add_argument(
        "--config",
        metavar="JOB.toml",
        help="read the options from a job file (its sections follow the groups below; flags override it)",
    )
    p.add_argument(
        "--save-config",
        metavar="JOB.toml",
        help="write this command line's options to a job file, then run the command",
    )


def import_option(p: argparse.ArgumentParser, what: str) -> None:
    """--import of plan and estimate: another tool's configuration as the options; `what` says what the verb
    does with it."""
    p.add_argument(
        "--import",
        dest="import_path",
        metavar="PATH",
        help="an existing DeepSpeed JSON, accelerate YAML, torchtitan config or Megatron script: its model, degrees, "
        f"batch, recompute, precision and ZeRO are the options (flags override them); {what} (docs/exports.md)",
    )


def plan_parser(verb: str) -> argparse.ArgumentParser:
    """A parser of `meshplan <verb>`'s options alone (no verb): what meshplan/inputs.py reads."""
    if verb not in PLAN_VERBS:
        raise ValueError(f"plan_parser: {verb!r} is not one of {PLAN_VERBS}")
    p = argparse.ArgumentParser(prog=f"meshplan {verb}")
    add_plan_options(p, verb)
    return p


def refuse_conflicts(sub: argparse.ArgumentParser, argv: list[str]) -> None:
    """Two flags that set one value differently (--compile and --elementwise fused,
    --fused-projections and --no-fused-projections): one line, not 'the last one wins'."""
    given: dict[str, dict[str, str]] = {}
    for i, token in enumerate(argv):
        flag, eq, inline = token.partition("=")
        action = sub._option_string_actions.get(flag) if flag.startswith("--") else None
        if action is not None and action.dest == "overrides":  # --set K=V ...: each key once
            items = argv[i + 1 :]
            for item in items[: next((j for j, t in enumerate(items) if t.startswith("-")), len(items))]:
                key = item.partition("=")[0].strip()
                given.setdefault(f"--set {key}", {})[item] = f"--set {item}"
            continue
        if action is None or action.nargs not in (None, 0):
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            value = str(not flag.startswith("--no-"))
        elif action.nargs == 0:
            value = str(action.const)
        else:
            value = inline if eq else (argv[i + 1] if i + 1 < len(argv) else "")
        given.setdefault(action.dest, {})[value] = flag if action.nargs == 0 else f"{flag} {value}"
    for flags in given.values():
        if len(flags) > 1:
            raise MeshplanError(f"{' and '.join(flags.values())} contradict each other; give one of them")


def parse_overrides(items) -> dict[str, Any]:
    """--set KEY=VALUE ... -> {key: int|float|bool|str}."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise MeshplanError(f"--set {item!r}: expected KEY=VALUE, e.g. --set layers=96")
        out[key.strip()] = parse_value(raw.strip())
    return out


def parse_value(raw: str) -> Any:
    if len(raw) > 100 and raw.lstrip("+-").isdigit():  # int() would ask for sys.set_int_max_str_digits()
        raise MeshplanError(f"--set value {raw[:20]}...: a {len(raw)}-digit number; give a realistic size")
    for kind in (int, float):
        try:
            value = kind(raw)
        except ValueError:
            continue
        if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
            raise MeshplanError(f"--set value {raw}: not a finite number")
        return value
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    return raw

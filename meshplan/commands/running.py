"""`meshplan run`: check a plan and its flags, then launch it with torchrun (or print the line),
or run Wavelet's two waves beside one."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from meshplan import schema
from meshplan.commands.output import json_file, print_json, progress, say, warn
from meshplan.errors import MeshplanError
from meshplan.plan import Plan

if TYPE_CHECKING:  # the executor imports torch: loaded only when a run starts
    from meshplan.executor import LaunchOptions


def cmd_run(args: argparse.Namespace) -> int:
    from meshplan.inputs import check_positive

    check_positive(steps=args.steps, nnodes=args.nnodes)
    _check_run_flags(args)
    plan = schema.load(Plan, args.plan, "plan")
    from meshplan.executor import check_plan, launch_command, run_plan
    from meshplan.executor.check import check_model_file

    check_model_file(plan, args.plan)

    if getattr(args, "waves", None):  # --waves overrides the plan's wave scheduling
        from meshplan.plan import MethodChoice

        plan.dp_methods.waves = MethodChoice(name=args.waves, params={})
    if plan.dp_methods.waves.name == "2":
        return _run_waves(args, plan)
    check_plan(plan, nnodes=args.nnodes)
    from meshplan.executor.check import check_run_options, run_warnings

    check_run_options(plan, args.optimizer, args.checkpoint_every)
    for text in run_warnings(plan):
        print(f"meshplan run: warning: {text}", file=sys.stderr)
    if args.offload_dir:  # offload=nvme's state files; the ranks read it (executor/train.py)
        os.environ["MESHPLAN_OFFLOAD_DIR"] = os.path.abspath(args.offload_dir)
    opts = _launch_options(args)
    if args.print_launch:
        return _print_launch(args, plan, launch_command(plan, opts, plan_path=args.plan))
    with progress(args, f"running {args.steps} steps on {plan.world_size} ranks"):
        result = run_plan(plan, opts)
    if args.json:
        print_json(result)
        return 0
    print(f"losses: {' '.join(f'{x:.4f}' for x in result.losses)}")
    print(
        f"step time {result.step_time_s:.4g} s (median after warm-up), {result.tokens_per_s:,.0f} tokens/s, "
        f"peak memory {result.peak_memory_bytes / 2**20:.1f} MiB/rank"
    )
    if plan.prediction is not None and plan.prediction.step_time_s > 0:
        err = result.step_time_s / plan.prediction.step_time_s - 1
        print(f"predicted {plan.prediction.step_time_s:.4g} s/step: measured is {err:+.1%} off")
    from meshplan.executor.multinode import node_file

    say(args, f"wrote {Path(args.out_dir) / node_file('run.json', args.node_rank, args.nnodes)}")
    return 0


def _launch_options(args: argparse.Namespace) -> LaunchOptions:
    """The launcher's options from `meshplan run`'s flags (one record for run_plan, launch_command
    and the waves launcher)."""
    from meshplan.executor import LaunchOptions

    return LaunchOptions(
        steps=args.steps,
        data=args.data,
        out_dir=args.out_dir,
        checkpoint_every=args.checkpoint_every,
        resume=args.resume,
        overwrite=args.overwrite,
        nnodes=args.nnodes,
        node_rank=args.node_rank,
        rdzv_endpoint=args.rdzv_endpoint,
        optimizer=args.optimizer,
        timeout_s=args.timeout,
        quiet=args.quiet or args.json,
    )


def _check_run_flags(args: argparse.Namespace) -> None:
    if args.checkpoint_every < 0:
        raise MeshplanError(f"--checkpoint-every {args.checkpoint_every}: must be >= 0 (0: no checkpoints)")
    if not args.timeout > 0:
        raise MeshplanError(f"--timeout {args.timeout:g}: must be > 0 seconds")
    if not 0 <= args.node_rank < args.nnodes:
        raise MeshplanError(f"--node-rank {args.node_rank}: must be in 0..{args.nnodes - 1} (--nnodes {args.nnodes})")
    host, _, port = (args.rdzv_endpoint or "").rpartition(":")
    if args.nnodes > 1 and not (host and port.isdigit() and 0 < int(port) < 65536):
        raise MeshplanError(
            f"--rdzv-endpoint {args.rdzv_endpoint}: --nnodes {args.nnodes} needs HOST:PORT of "
            "node 0 (the same on every node), e.g. 10.0.0.1:29500"
        )


def _run_waves(args: argparse.Namespace, plan: Plan) -> int:
    """meshplan run --waves 2 (executor/waves.py): both waves, then one wave; waves.json."""
    from meshplan.executor import check_plan
    from meshplan.executor import waves_launch as waves

    if args.nnodes > 1 or args.resume or args.checkpoint_every or args.print_launch:
        raise MeshplanError(
            "--waves 2 runs on one node without checkpoints: drop --nnodes/--resume/--checkpoint-every/--print-launch"
        )
    waves.check(plan)
    check_plan(waves.wave_plan(plan))
    opts = _launch_options(args)
    with progress(args, f"running {args.steps} steps of two waves on {plan.world_size} devices"):
        report = waves.run(plan, opts)
    if args.json:
        print(json.dumps({k: v for k, v in report.items()}, indent=1), file=json_file())
        return 0
    one = report["one_wave"]
    for d in report["devices"]:
        print(
            f"device {d['device']} (cores {d['cores']}): two waves {d['samples_per_s']:.1f} samples/s, summed "
            f"memory peak {d['summed_dynamic_peak_bytes'] / 2**20:.1f} MiB above baseline (waves alone "
            f"{', '.join(f'{b / 2**20:.1f}' for b in d['wave_dynamic_peaks_bytes'])} MiB); tock offset "
            f"{d['tock_offset_s']:.2f} of a step"
        )
    print(
        f"one wave: {one['samples_per_s_per_device']:.1f} samples/s per device, memory peak "
        f"{max(x['dynamic_peak_bytes'] for x in one['devices']) / 2**20:.1f} MiB above baseline"
    )
    if plan.prediction is not None and plan.prediction.step_time_s > 0:
        print(
            f"the plan's prediction ({plan.dp_methods.waves.name} wave(s) as planned): "
            f"{plan.prediction.step_time_s:.4g} s/step, peak {plan.prediction.peak_memory_bytes / 2**20:.1f} MiB/rank"
        )
    say(args, f"wrote {Path(args.out_dir) / 'waves.json'}")
    return 0


def _print_launch(args: argparse.Namespace, plan: Plan, cmd: list[str]) -> int:
    import shlex

    from meshplan.executor.launch import LAUNCH_ENV

    warning = _host_warning(plan, args.nnodes)
    if warning:
        warn(args, warning)
    if args.json:
        view = {
            "argv": cmd,
            "command": shlex.join(cmd),
            "env": dict(LAUNCH_ENV),
            "world_size": plan.world_size,
            "nnodes": args.nnodes,
            "node_rank": args.node_rank,
            "nproc_per_node": plan.world_size // args.nnodes,
            "rdzv_endpoint": args.rdzv_endpoint,
            "warnings": [warning] if warning else [],
        }
        print_json(view)
    else:
        print(shlex.join(cmd))
    return 0


def _host_warning(plan: Plan, nnodes: int) -> str | None:
    """A launch line starts world_size / nnodes processes on this host: more than the plan's
    cluster has devices per node (a GPU preset) is said, with the flags that spread it."""
    from meshplan.presets import CLUSTER_PRESETS, cluster_preset

    if plan.cluster_name not in CLUSTER_PRESETS or plan.cluster_name == "local-cpu":
        return None
    per_node = cluster_preset(plan.cluster_name, plan.world_size).devices_per_node
    here = plan.world_size // nnodes
    if here <= per_node:
        return None
    hosts = -(-plan.world_size // per_node)
    return (
        f"this line starts {here} ranks on one host, but one {plan.cluster_name} node has {per_node} devices: "
        f"run it on {hosts} hosts with --nnodes {hosts} --node-rank K --rdzv-endpoint HOST:PORT (K = 0..{hosts - 1})"
    )

"""The CLI verbs: the only place that wires profiler, planner, executor and report together."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

from meshplan import schema
from meshplan.commands.output import json_file, print_json, print_table, progress, say, warn
from meshplan.errors import MeshplanError
from meshplan.plan import Plan


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


# ---------------------------------------------------------------- verbs


def cmd_presets(args: argparse.Namespace) -> int:
    from meshplan.models.catalog import FAMILY_NAMES as FAMILIES
    from meshplan.models.catalog import ZOO
    from meshplan.presets import CLUSTER_PRESETS, cluster_preset, peak_table

    models: dict[str, dict[str, Any]] = {name: {"family": fam, **cfg} for name, (fam, cfg) in sorted(ZOO.items())}
    clusters: dict[str, dict[str, Any]] = {}
    peaks = peak_table()
    for name in CLUSTER_PRESETS:
        spec = cluster_preset(name, 8 if name != "local-cpu" else 4)
        (bf16, bf16_source), (fp8, fp8_source) = peaks[name]["bf16"], peaks[name]["fp8"]
        clusters[name] = {
            "device": spec.device.name,
            "peak_tflops": bf16,  # dense bf16, the peak MFU is measured against
            "bf16_dense_tflops": bf16,
            "fp8_dense_tflops": fp8,
            "peak_sources": {"bf16": bf16_source, "fp8": fp8_source},
            "memory_gib": spec.device.memory_bytes / 2**30,
            "devices_per_node": spec.devices_per_node,
            "intra_node_gbps": spec.intra_node.bandwidth_gbps,
            "inter_node_gbps": spec.inter_node.bandwidth_gbps,
        }
    if args.json:
        print_json({"models": models, "families": sorted(FAMILIES), "clusters": clusters})
        return 0
    from rich.table import Table

    table = Table(title="models (use --model NAME; families take --set)")
    for col in ("name", "family", "shape"):
        table.add_column(col)
    for name, cfg in models.items():
        table.add_row(name, cfg["family"], " ".join(f"{k}={v}" for k, v in cfg.items() if k != "family"))
    table.add_row("[dim]" + ", ".join(sorted(FAMILIES)), "family", "--set keys of the family config")
    ctable = Table(title="clusters (use --cluster NAME --num-gpus N)")
    cols = ("name", "device", "bf16 dense TFLOP/s", "fp8 dense TFLOP/s", "memory GiB", "per node", "NVLink GB/s")
    for col in (*cols, "inter-node GB/s"):
        ctable.add_column(col)
    for name, c in clusters.items():
        ctable.add_row(
            name,
            c["device"],
            f"{c['bf16_dense_tflops']:.4g}",
            f"{c['fp8_dense_tflops']:.4g}" if c["fp8_dense_tflops"] else "–",
            f"{c['memory_gib']:.0f}",
            str(c["devices_per_node"]),
            f"{c['intra_node_gbps']:g}",
            f"{c['inter_node_gbps']:g}",
        )
    print_table(args, table)
    print_table(args, ctable)
    sources = Table(title="peak sources (meshplan/data/hardware.csv)", show_lines=True)
    for col in ("name", "bf16 dense", "fp8 dense"):
        sources.add_column(col)
    for name, c in clusters.items():
        sources.add_row(name, c["peak_sources"]["bf16"], c["peak_sources"]["fp8"])
    print_table(args, sources)
    return 0


def _check_local_procs(flag: str, count: int | None) -> None:
    """Processes started on this machine: a few per CPU at most (512 would start 512 torch processes)."""
    cpus = os.cpu_count() or 1
    limit = max(8, 4 * cpus)
    if count is not None and count > limit:
        raise MeshplanError(f"{flag} {count}: at most {limit} local processes on this machine ({cpus} CPUs)")


def cmd_profile(args: argparse.Namespace) -> int:
    from meshplan.inputs import build_profile, check_positive

    check_positive(concurrent=args.concurrent)
    _check_local_procs("--concurrent", args.concurrent)
    if args.device == "meta" and args.concurrent > 1:  # nothing is timed on meta
        print(
            f"meshplan profile: warning: ignored --concurrent {args.concurrent}: --device meta times "
            "nothing; add --device cpu (or cuda) to time with that many processes busy",
            file=sys.stderr,
        )
    for b in args.microbatch or []:
        check_positive(microbatch=b)
    profile = build_profile(
        args.model,
        args.overrides,
        device=args.device,
        microbatches=args.microbatch,
        concurrent=args.concurrent,
        in_place=args.in_place,
        progress=lambda message: progress(args, message),
    )
    if args.output:
        schema.save(profile, args.output)
    if args.json:
        print_json(profile)
        return 0
    say(
        args,
        f"[bold]{profile.model_name}[/]: {profile.num_params:,} parameters, "
        f"{profile.forward_flops_per_sample:.3g} forward FLOPs/sample, {profile.num_layers} blocks, "
        f"{len(profile.layers)} graph nodes, timed on {profile.device}",
    )
    for note in profile.notes:
        say(args, f"  note: {note}")
    if args.output:
        say(args, f"wrote {args.output}")
    return 0


def cmd_profile_links(args: argparse.Namespace) -> int:
    from meshplan.profiler.links import profile_links

    if args.nproc < 2:
        raise MeshplanError(f"--nproc {args.nproc}: link profiling needs at least 2 ranks")
    _check_local_procs("--nproc", args.nproc)
    if args.disk_mib < 0:
        raise MeshplanError(f"--disk-mib {args.disk_mib}: must be >= 0 (0 skips the disk probe)")
    with progress(args, f"measuring collectives, host memory and disk on {args.nproc} local ranks") as tick:
        spec = profile_links(
            args.nproc,
            max_bytes=args.max_bytes,
            progress=tick,  # collectives measured
            disk_dir=args.disk_dir or "",
            disk_bytes=args.disk_mib * 2**20,
        )
    if args.output:
        schema.save(spec, args.output)
    if args.json:
        print_json(spec)
        return 0
    for fit in spec.collectives:
        say(
            args,
            f"{fit.collective:15s} n={fit.group_size}: latency {fit.latency_s * 1e6:8.1f} us, "
            f"bandwidth {fit.bandwidth_gbps:7.3f} GB/s",
        )
    from meshplan.profiler.host_links import describe

    for line in describe(spec):
        say(args, line)
    if args.output:
        say(args, f"wrote {args.output}")
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


def cmd_plan(args: argparse.Namespace) -> int:
    options, inputs = _inputs(args)
    from meshplan.planner.search import search

    with progress(args, f"searching plans for {inputs.request.num_gpus} x {inputs.cluster.name}") as tick:
        plan = search(inputs.profile, inputs.cluster, inputs.request, on_progress=lambda d, t: tick(d, t, "candidates"))
    _emit_plan(args, options, plan)
    if getattr(args, "imported", None):
        _compare_imported(args, plan)
    return 0


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


def cmd_estimate(args: argparse.Namespace) -> int:
    options, inputs = _inputs(args)
    from meshplan.planner import estimate

    plan = estimate(inputs.profile, inputs.cluster, inputs.request)
    _emit_plan(args, options, plan)
    return 0


def _load_plan(path: str) -> Plan:
    return schema.load(Plan, path, "plan")


def cmd_run(args: argparse.Namespace) -> int:
    from meshplan.inputs import check_positive

    check_positive(steps=args.steps, nnodes=args.nnodes)
    _check_run_flags(args)
    plan = _load_plan(args.plan)
    from meshplan.executor import LaunchOptions, check_plan, launch_command, run_plan
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
    opts = LaunchOptions(
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


def _run_waves(args: argparse.Namespace, plan: Plan) -> int:
    """meshplan run --waves 2 (executor/waves.py): both waves, then one wave; waves.json."""
    from meshplan.executor import LaunchOptions, check_plan
    from meshplan.executor import waves_launch as waves

    if args.nnodes > 1 or args.resume or args.checkpoint_every or args.print_launch:
        raise MeshplanError(
            "--waves 2 runs on one node without checkpoints: drop --nnodes/--resume/--checkpoint-every/--print-launch"
        )
    waves.check(plan)
    check_plan(waves.wave_plan(plan))
    opts = LaunchOptions(
        steps=args.steps,
        data=args.data,
        out_dir=args.out_dir,
        overwrite=args.overwrite,
        optimizer=args.optimizer,
        timeout_s=args.timeout,
        quiet=args.quiet or args.json,
    )
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


def cmd_report(args: argparse.Namespace) -> int:
    from meshplan.run_result import RunResult

    if args.trace:  # before any work, as -o is
        schema.check_output(args.trace, folder=False, inputs={"plan": args.plan, "--run": args.run})

    plan = _load_plan(args.plan)
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


def cmd_export(args: argparse.Namespace) -> int:
    plan = _load_plan(args.plan)
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

"""The CLI verbs: the only place that wires profiler, planner, executor and report together."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from meshplan import dp_methods, schema
from meshplan.errors import MeshplanError
from meshplan.plan import Plan, schedule_name


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


# ---------------------------------------------------------------- helpers


def _console():
    from rich.console import Console

    return Console(stderr=True)


@contextlib.contextmanager
def _progress(args: argparse.Namespace, message: str) -> Iterator[None]:
    """A rich spinner on stderr for people; nothing with --quiet or --json."""
    if args.quiet or args.json:
        yield
        return
    with _console().status(message):
        yield


def _print_json(obj: Any) -> None:
    print(json.dumps(schema.to_dict(obj), indent=2, allow_nan=False))


def _say(args: argparse.Namespace, text: str) -> None:
    if not args.json and not args.quiet:
        _console().print(text, highlight=False)


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """--set KEY=VALUE ... -> {key: int|float|bool|str}."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise MeshplanError(f"--set {item!r}: expected KEY=VALUE, e.g. --set layers=96")
        out[key.strip()] = _parse_value(raw.strip())
    return out


def _parse_value(raw: str) -> Any:
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    if raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    return raw


def _check_positive(**values: int | None) -> None:
    for name, value in values.items():
        if value is not None and value < 1:
            raise MeshplanError(f"--{name.replace('_', '-')} {value}: must be >= 1")


# ---------------------------------------------------------------- verbs


def cmd_presets(args: argparse.Namespace) -> int:
    from meshplan.models.zoo import FAMILIES, ZOO
    from meshplan.presets import CLUSTER_PRESETS, cluster_preset

    models = {name: {"family": fam, **cfg} for name, (fam, cfg) in sorted(ZOO.items())}
    clusters = {}
    for name in CLUSTER_PRESETS:
        spec = cluster_preset(name, 8 if name != "local-cpu" else 4)
        clusters[name] = {
            "device": spec.device.name,
            "peak_tflops": max(spec.device.peak_flops.values()) / 1e12,
            "memory_gib": spec.device.memory_bytes / 2**30,
            "devices_per_node": spec.devices_per_node,
            "intra_node_gbps": spec.intra_node.bandwidth_gbps,
            "inter_node_gbps": spec.inter_node.bandwidth_gbps,
        }
    if args.json:
        _print_json({"models": models, "families": sorted(FAMILIES), "clusters": clusters})
        return 0
    from rich.table import Table

    table = Table(title="models (use --model NAME; families take --set)")
    for col in ("name", "family", "shape"):
        table.add_column(col)
    for name, cfg in models.items():
        table.add_row(name, cfg["family"], " ".join(f"{k}={v}" for k, v in cfg.items() if k != "family"))
    table.add_row("[dim]" + ", ".join(sorted(FAMILIES)), "family", "--set keys of the family config")
    ctable = Table(title="clusters (use --cluster NAME --num-gpus N)")
    for col in ("name", "device", "peak TFLOP/s", "memory GiB", "per node", "NVLink GB/s", "inter-node GB/s"):
        ctable.add_column(col)
    for name, c in clusters.items():
        ctable.add_row(
            name,
            c["device"],
            f"{c['peak_tflops']:.0f}",
            f"{c['memory_gib']:.0f}",
            str(c["devices_per_node"]),
            f"{c['intra_node_gbps']:g}",
            f"{c['inter_node_gbps']:g}",
        )
    from rich.console import Console

    Console().print(table)
    Console().print(ctable)
    return 0


def _build_profile(
    args: argparse.Namespace, device: str = "meta", microbatches=None, concurrent: int = 1, in_place: bool = True
):
    overrides = parse_overrides(args.overrides)
    from meshplan.profiler import profile_model

    with _progress(args, f"profiling {args.model} on {device}"):
        return profile_model(
            args.model,
            overrides,
            device=device,
            microbatch_sizes=microbatches,
            concurrent=concurrent,
            in_place=in_place,
            progress=False,
        )


def cmd_profile(args: argparse.Namespace) -> int:
    _check_positive(concurrent=args.concurrent)
    for b in args.microbatch or []:
        _check_positive(microbatch=b)
    profile = _build_profile(args, args.device, args.microbatch, args.concurrent, args.in_place)
    if args.output:
        schema.save(profile, args.output)
    if args.json:
        _print_json(profile)
        return 0
    _say(
        args,
        f"[bold]{profile.model_name}[/]: {profile.num_params:,} parameters, "
        f"{profile.forward_flops_per_sample:.3g} forward FLOPs/sample, {profile.num_layers} blocks, "
        f"{len(profile.layers)} graph nodes, timed on {profile.device}",
    )
    for note in profile.notes:
        _say(args, f"  note: {note}")
    if args.output:
        _say(args, f"wrote {args.output}")
    return 0


def cmd_profile_links(args: argparse.Namespace) -> int:
    from meshplan.profiler.links import profile_links

    if args.nproc < 2:
        raise MeshplanError(f"--nproc {args.nproc}: link profiling needs at least 2 ranks")
    if args.disk_mib < 0:
        raise MeshplanError(f"--disk-mib {args.disk_mib}: must be >= 0 (0 skips the disk probe)")
    with _progress(args, f"measuring collectives, host memory and disk on {args.nproc} local ranks"):
        spec = profile_links(
            args.nproc,
            max_bytes=args.max_bytes,
            progress=False,
            disk_dir=args.disk_dir or "",
            disk_bytes=args.disk_mib * 2**20,
        )
    if args.output:
        schema.save(spec, args.output)
    if args.json:
        _print_json(spec)
        return 0
    for fit in spec.collectives:
        _say(
            args,
            f"{fit.collective:15s} n={fit.group_size}: latency {fit.latency_s * 1e6:8.1f} us, "
            f"bandwidth {fit.bandwidth_gbps:7.3f} GB/s",
        )
    from meshplan.profiler.host_links import describe

    for line in describe(spec):
        _say(args, line)
    if args.output:
        _say(args, f"wrote {args.output}")
    return 0


def _request(args: argparse.Namespace, cluster):
    from meshplan.planner.request import PlanRequest

    _check_positive(
        num_gpus=args.num_gpus,
        global_batch=args.global_batch,
        seq=args.seq,
        tp=args.tp,
        pp=args.pp,
        dp=args.dp,
        cp=args.cp,
        dp_shard=args.dp_shard,
        microbatch=args.microbatch,
        virtual_stages=args.virtual_stages,
        top=getattr(args, "top", None),
    )
    precision = args.precision or ("fp32" if cluster.device.kind == "cpu" else "bf16")
    behaviours = runtime_behaviours(args, cluster, precision)
    return PlanRequest(
        **behaviours,
        num_gpus=args.num_gpus,
        global_batch=args.global_batch,
        seq=args.seq,
        top_k=getattr(args, "top", 5),
        tp=args.tp,
        pp=args.pp,
        dp=args.dp,
        cp=args.cp,
        microbatch=args.microbatch,
        schedule=schedule_name(args.schedule) if args.schedule else None,
        virtual_stages=args.virtual_stages,
        recompute=args.recompute,
        recompute_num_layers=_recompute_num_layers(args),
        zero=args.zero,
        sequence_parallel=args.sequence_parallel,
        dp_shard=args.dp_shard,
        methods=_pinned_methods(args),
        allow=_allowed_methods(args),
        allow_cross_node_tp=_cross_node_tp(args, cluster),
        precision=precision,
        runtime=args.runtime,
    )


def _recompute_num_layers(args: argparse.Namespace) -> int:
    """--recompute-num-layers N (Megatron's uniform groups) needs every block on full recompute."""
    n = getattr(args, "recompute_num_layers", None)
    if n is None:
        return 1
    if n < 1 or (n > 1 and args.recompute != "full"):
        raise MeshplanError(
            f"--recompute-num-layers {n}: groups of N >= 1 layers are checkpointed only with --recompute full; "
            "add --recompute full or drop the flag"
        )
    return n


def _cross_node_tp(args: argparse.Namespace, cluster) -> bool:
    """A --tp pin wider than a node is a decision: planned across nodes, with a warning line."""
    allowed = getattr(args, "allow_cross_node_tp", False)
    if args.tp and args.tp > cluster.devices_per_node and not allowed:
        _warn(
            args,
            f"--tp {args.tp} > {cluster.devices_per_node} devices per node: planned as cross-node "
            "tensor parallelism (its collectives run on the inter-node links)",
        )
        return True
    return allowed


def runtime_behaviours(args: argparse.Namespace, cluster, precision: str) -> dict:
    """PlanRequest behaviour fields: --runtime's table row (meshplan/runtimes.py), each overridden
    by its own flag; warns (stderr) where the model does not know a behaviour, a pin leaves the
    runtime's range, or a knob is ignored."""
    from meshplan import runtimes

    rt = runtimes.runtime(args.runtime)
    flags = {
        "state_layout": args.state_layout,
        "overlap_dp_comm": args.overlap_dp_comm,
        "overlap_tp_comm": args.overlap_tp_comm,
        "attention": args.attention,
        "uniform_stages": args.uniform_stages,
        "free_stage_outputs": args.free_stage_outputs,
        "elementwise": args.elementwise,
        "fused_projections": args.fused_projections,
        "fsdp_gather_bytes": {"bf16": 2, "fp32": 4}.get(args.fsdp_gather_dtype),
    }
    out = runtimes.request_behaviours(rt.name, flags)
    unknown = [k for k in rt.unknown() if k in (*runtimes.REQUEST_FIELDS, "dropout") and flags.get(k) is None]
    if getattr(args, "recompute", None) != "selective":  # said only when the user asks for it
        unknown = [k for k in unknown if k != "selective_recompute"]
    if getattr(args, "pp", None) == 1:  # no pipeline: its stages' behaviours do not apply
        unknown = [k for k in unknown if k not in ("free_stage_outputs", "uniform_stages")]
    if unknown:
        _warn(
            args,
            f"runtime {rt.name}: the model does not know its {', '.join(unknown)} "
            "(README runtime table); the values in brackets there are used",
        )
    if args.zero is not None and args.zero not in rt.value("zero_stages"):
        _warn(
            args,
            f"--zero {args.zero}: runtime {rt.name} implements ZeRO {rt.value('zero_stages')}; predicted as pinned",
        )
    if rt.name == "torchtitan" and args.zero == 3 and (getattr(args, "pp", None) or 1) > 1:
        _warn(
            args,
            "--zero 3 with --pp under torchtitan: its default fsdp_reshard_after_forward keeps parameters "
            "gathered under PP (ZeRO-2); predicted as ZeRO-3, which the export writes as 'always' "
            "(--zero 2 predicts a default torchtitan run)",
        )
    if precision == "fp8":
        if not rt.value("fp8"):
            raise MeshplanError(
                f"--precision fp8: runtime {rt.name} has no fp8 path the model knows "
                f"({rt.behaviours['fp8'].source}); use --runtime torchtitan or megatron-core"
            )
        if "fp8" not in cluster.device.peak_flops:
            _warn(args, f"--precision fp8: {cluster.device.name} has no fp8 tensor cores; GEMMs stay bf16")
    if args.dropout is not None and not args.model.startswith("analytic:") and not args.profile:
        _warn(args, "--dropout applies to closed-form profiles (--model analytic:gpt); ignored")
    return out


def _warn(args: argparse.Namespace, text: str) -> None:
    import sys

    if not args.quiet:
        print(f"meshplan {args.verb}: warning: {text}", file=sys.stderr)


METHOD_FLAGS = {
    "compression": "--compression",
    "sync": "--sync",
    "comm_schedule": "--comm-schedule",
    "offload": "--offload",
    "waves": "--waves",
}


RUNTIME_METHOD_AXES = ("compression", "sync", "offload")
"""Axes whose methods a runtime may not implement (meshplan/runtimes.py `<axis>_methods`)."""


def _implemented(args: argparse.Namespace, axis: str) -> tuple[str, ...]:
    from meshplan import runtimes

    return runtimes.runtime(args.runtime).value(f"{axis}_methods")


def _pinned_methods(args: argparse.Namespace) -> dict:
    """--compression NAME[:k=v,...] etc. -> {axis: (name, resolved params)}; a pin the runtime does
    not implement is predicted as pinned, with a warning line."""
    out = {}
    for axis, flag in METHOD_FLAGS.items():
        text = getattr(args, axis)
        if text is not None:
            out[axis] = dp_methods.parse_spec(axis, text, flag)
            if axis in RUNTIME_METHOD_AXES and out[axis][0] not in _implemented(args, axis):
                _warn(
                    args,
                    f"{flag} {out[axis][0]}: runtime {args.runtime} implements {axis} "
                    f"{', '.join(_implemented(args, axis))}; predicted as pinned",
                )
    return out


def _allowed_methods(args: argparse.Namespace) -> dict:
    """--allow-compression / --allow-sync, less what the runtime does not implement (said)."""
    out = {}
    for axis in ("compression", "sync"):
        text = getattr(args, f"allow_{axis}")
        if text is None:
            continue
        names = dp_methods.parse_allow(axis, text, f"--allow-{axis}")
        kept = tuple(n for n in names if n in _implemented(args, axis))
        if len(kept) < len(names):
            dropped = ", ".join(n for n in names if n not in kept)
            _warn(args, f"--allow-{axis}: runtime {args.runtime} does not implement {dropped}; not searched")
        if kept:
            out[axis] = kept
    return out


def _inputs(args: argparse.Namespace):
    """(profile, cluster, request) for plan/estimate; cheap flag checks run before any profiling."""
    from meshplan.model_profile import ModelProfile
    from meshplan.presets import load_cluster

    _check_positive(num_gpus=args.num_gpus)
    cluster = load_cluster(args.cluster, args.num_gpus)
    request = _request(args, cluster)
    if args.profile:
        profile = schema.load(ModelProfile, args.profile, "profile")
        if args.overrides:
            raise MeshplanError("--set cannot change a saved --profile; re-run meshplan profile with --set")
    elif args.model.startswith("analytic:"):
        from meshplan import runtimes
        from meshplan.models.analytic import from_spec

        dropout = args.dropout if args.dropout is not None else runtimes.runtime(args.runtime).value("dropout")
        profile = from_spec(
            args.model,
            parse_overrides(args.overrides),
            flash=request.attention != "materialized",
            dropout=bool(dropout),
        )
    else:
        profile = _build_profile(args)
    _check_seq(args, profile)
    return profile, cluster, request


def _check_seq(args: argparse.Namespace, profile) -> None:
    """--seq beyond the model's context is priced, but such a plan cannot run: -o refuses it."""
    if not args.seq or args.seq <= profile.seq_len:
        return
    text = (
        f"--seq {args.seq}: {profile.model_name} handles at most {profile.seq_len} tokens; "
        f"build the model for it with --set seq={args.seq}"
    )
    if args.output:
        raise MeshplanError(text + " (a plan written with -o must be runnable)")
    import sys

    print(f"meshplan {args.verb}: warning: {text}; this plan is a what-if `meshplan run` refuses", file=sys.stderr)


def _emit_plan(args: argparse.Namespace, plan: Plan) -> None:
    from meshplan.views import describe, plan_table, plan_view

    _warn_dropped_pins(args, plan)
    if args.output:
        schema.save(plan, args.output)
    if args.json:
        _print_json(plan_view(plan))
        return
    if not args.quiet:
        from rich.console import Console

        Console().print(plan_table(plan))
    pred = plan.prediction
    print(f"{'recommended' if plan.search is not None else 'configuration'}: {describe(plan)}")
    if pred is not None:
        print(
            f"predicted: {pred.step_time_s:.4g} s/step, {pred.tokens_per_s_per_gpu:,.0f} tokens/s/GPU, "
            f"MFU {pred.mfu:.1%}, peak {pred.peak_memory_bytes / 2**30:.2f} GiB/GPU; {pred.binding_constraint}"
        )
    if plan.search is not None and not args.quiet:
        s = plan.search
        _say(
            args,
            f"searched {s.num_candidates:,} candidates in {s.search_time_s:.3f} s "
            f"({s.num_evaluated:,} costed, {s.num_rejected:,} rejected)",
        )
        for rej in s.rejected[:8]:
            _say(args, f"  rejected {rej.family}: {rej.reason}" + (f" (x{rej.count})" if rej.count > 1 else ""))
    if args.output:
        _say(args, f"wrote {args.output}")


def _warn_dropped_pins(args: argparse.Namespace, plan: Plan) -> None:
    """A pinned knob the chosen plan cannot use is said, not silently dropped."""
    import sys

    dropped = []
    if args.virtual_stages and args.virtual_stages > 1 and plan.virtual_stages != args.virtual_stages:
        dropped.append(
            f"--virtual-stages {args.virtual_stages} (the plan has pp={plan.pipeline_parallel_degree}, "
            f"{plan.virtual_stages} stage(s) per rank)"
        )
    if args.sequence_parallel and not plan.sequence_parallel:
        dropped.append(f"--sequence-parallel (the plan has tp={plan.tensor_parallel_degree}; it needs tp >= 2)")
    pinned = getattr(args, "recompute", None)
    if pinned in ("selective", "full") and pinned not in plan.recompute.values():
        dropped.append(
            f"--recompute {pinned} (no layer keeps less with it than without under runtime {plan.runtime}, "
            "e.g. the attention core of flash attention: planned as none)"
        )
    for what in dropped:
        print(f"meshplan {args.verb}: warning: ignored {what}", file=sys.stderr)


def cmd_plan(args: argparse.Namespace) -> int:
    profile, cluster, request = _inputs(args)
    from meshplan.planner import search

    with _progress(args, f"searching plans for {request.num_gpus} x {cluster.name}"):
        plan = search(profile, cluster, request)
    _emit_plan(args, plan)
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    profile, cluster, request = _inputs(args)
    from meshplan.planner import estimate

    plan = estimate(profile, cluster, request)
    _emit_plan(args, plan)
    return 0


def _load_plan(path: str) -> Plan:
    return schema.load(Plan, path, "plan")


def cmd_run(args: argparse.Namespace) -> int:
    _check_positive(steps=args.steps, nnodes=args.nnodes)
    _check_run_flags(args)
    plan = _load_plan(args.plan)
    from meshplan.executor import check_plan, launch_command, run_plan

    check_plan(plan, nnodes=args.nnodes)
    import sys

    from meshplan.executor.check import check_optimizer, run_warnings

    check_optimizer(plan, args.optimizer)

    for text in run_warnings(plan):
        print(f"meshplan run: warning: {text}", file=sys.stderr)
    if args.offload_dir:  # offload=nvme's state files; the ranks read it (executor/train.py)
        os.environ["MESHPLAN_OFFLOAD_DIR"] = os.path.abspath(args.offload_dir)
    if args.print_launch:
        cmd = launch_command(
            plan,
            nnodes=args.nnodes,
            node_rank=args.node_rank,
            rdzv_endpoint=args.rdzv_endpoint,
            steps=args.steps,
            plan_path=args.plan,
            out_dir=args.out_dir,
            data=args.data,
            checkpoint_every=args.checkpoint_every,
            resume=args.resume,
            optimizer=args.optimizer,
            timeout_s=args.timeout,
        )
        import shlex

        print(shlex.join(cmd))
        return 0
    with _progress(args, f"running {args.steps} steps on {plan.world_size} ranks"):
        result = run_plan(
            plan,
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
    if args.json:
        _print_json(result)
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

    _say(args, f"wrote {Path(args.out_dir) / node_file('run.json', args.node_rank, args.nnodes)}")
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
        import sys

        print(
            f"meshplan report: warning: --run {path} was measured on another plan (hash {run.plan_hash}, "
            f"this plan {schema.content_hash(plan)}); its numbers are not this plan's",
            file=sys.stderr,
        )


def cmd_report(args: argparse.Namespace) -> int:
    from meshplan.run_result import RunResult

    plan = _load_plan(args.plan)
    run = schema.load(RunResult, args.run, "run") if args.run else None
    if run is not None:
        _check_run_matches(plan, run, args.run)
    from meshplan.report import write_report

    paths = write_report(plan, args.output, run=run)
    if args.json:
        _print_json({"files": [str(p) for p in paths]})
    else:
        for path in paths:
            _say(args, f"wrote {path}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    plan = _load_plan(args.plan)
    from meshplan.report import export_plan

    files = export_plan(plan, args.to)
    if args.output:
        for name, text in files.items():
            schema.write_text_atomic(Path(args.output) / name, text)
    if args.json:
        _print_json(files)
    elif not args.output:
        for name, text in files.items():
            print(f"# ---- {name}\n{text}")
    else:
        for name in files:
            _say(args, f"wrote {Path(args.output) / name}")
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from meshplan.validation import validate_published, write_validation_report

    shipped = str(Path(__file__).parent / "data" / "published-runs.csv")
    csv = args.csv or shipped
    if args.csv:
        _check_csv_header(args.csv, shipped)
    with _progress(args, "predicting published runs"):
        rows = validate_published(csv)
    write_validation_report(rows, args.output)
    if args.json:
        _print_json(rows)
    else:
        _say(args, f"wrote {args.output} ({len(rows)} rows)")
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

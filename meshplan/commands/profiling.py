"""`meshplan profile` and `profile-links`: a model's layers and a machine's links, measured here."""

from __future__ import annotations

import argparse
import os
import sys

from meshplan import schema
from meshplan.commands.output import print_json, progress, say
from meshplan.errors import MeshplanError


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


def _check_local_procs(flag: str, count: int | None) -> None:
    """Processes started on this machine: a few per CPU at most (512 would start 512 torch processes)."""
    cpus = os.cpu_count() or 1
    limit = max(8, 4 * cpus)
    if count is not None and count > limit:
        raise MeshplanError(f"{flag} {count}: at most {limit} local processes on this machine ({cpus} CPUs)")

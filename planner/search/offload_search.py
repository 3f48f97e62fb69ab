"""Offload as the search's fallback: offload=cpu / nvme only add time on a split that already fits
(the host step, PCIe, disk), so the planner considers them exactly when nothing fits on the
device (ZeRO-Offload's own use case): after an empty search it searches again with offload=cpu,
then offload=nvme, and keeps the first that fits on the device and, for cpu, in host memory
(cluster.host_memory_bytes). With offload pinned (e.g. --offload none) it only says whether
offload would make the model fit, in the infeasibility message.
"""

from __future__ import annotations

import dataclasses

from meshplan import dp_methods

OFFLOAD_ORDER = ("cpu", "nvme")


HOST_BYTES_PER_PARAM = 16
"""What offload=cpu keeps on the host per parameter of a rank's share, whatever the device layout:
the host steps in fp32 — FSDP2's CPUOffloadPolicy holds the fp32 weight, gradient and Adam m, v
shards there; meshplan's HostOptimizer (executor/methods/host_optimizer.py) an fp32 master, the
gradients it copies down and m, v (4 + 4 + 8 bytes)."""


def host_bytes_per_rank(ctx, cand) -> float:
    """Host bytes offload=cpu needs for one rank (its TP/PP share, its ZeRO-1 partition or FSDP
    shard): ~ the busiest rank's, layers spread evenly over pp."""
    local = ctx.profile.num_params / (cand.pp * cand.tp)
    share = cand.state_shard
    return local / share * HOST_BYTES_PER_PARAM


def with_offload(request, name: str):
    """The request with offload method `name` pinned (its registry defaults)."""
    row = dp_methods.method("offload", name)
    return dataclasses.replace(request, methods={**request.methods, "offload": (row.name, row.resolve({}, "offload"))})


def implemented(request) -> tuple[str, ...]:
    """The fallback's offload methods the request's runtime implements (PlanRequest.offload_methods)."""
    allowed = request.offload_methods
    return tuple(name for name in OFFLOAD_ORDER if allowed is None or name in allowed)


def host_overflow(ctx, cluster, name: str, cand) -> str:
    """Why offload method `name` cannot take candidate `cand` although it fits on the device (its
    host states overflow the cluster's host memory), or ''."""
    host = cluster.host_memory_bytes
    if name != "cpu" or not host or host_bytes_per_rank(ctx, cand) <= host:
        return ""
    return (
        f"offload=cpu fits on the device but its states need "
        f"{host_bytes_per_rank(ctx, cand) / 2**30:.1f} GiB of host memory per rank (> {host / 2**30:.1f} GiB)"
    )


def first_fit(request, cluster, attempt):
    """The first offload method, in OFFLOAD_ORDER among those implemented, under which
    `attempt(offloaded request)` -> (result, ctx, best candidate or None where nothing fits on
    the device) finds a plan that fits the device and, for cpu, the host: (its result, notes on
    the methods passed over), or (None, notes). search() and the brute force share it."""
    notes = [] if implemented(request) else [f"runtime {request.runtime} implements no offload"]
    for name in implemented(request):
        result, ctx, best = attempt(with_offload(request, name))
        overflow = host_overflow(ctx, cluster, name, best) if best is not None else ""
        if overflow:
            notes.append(overflow)
            continue
        if best is not None:
            return result, notes
        notes.append(f"offload={name} does not fit either")
    return None, notes


def fallback(searcher_cls, profile, cluster, request, top_k: int):
    """(searcher, ranked, num_candidates, notes) of the first offload method that fits, or
    (None, None, 0, notes)."""

    def attempt(offloaded):
        s = searcher_cls(profile, cluster, offloaded)
        ranked, count = s.run(top_k)
        return (s, ranked, count), s.ctx, ranked[0][1] if ranked else None

    found, notes = first_fit(request, cluster, attempt)
    return (*found, notes) if found is not None else (None, None, 0, notes)


def pinned_hint(searcher_cls, profile, cluster, request) -> str:
    """For a pinned offload method that found nothing: whether offload=cpu/nvme would fit."""
    current = request.methods.get("offload", ("none",))[0]
    for name in implemented(request):
        if name == current:
            continue
        ranked, _ = searcher_cls(profile, cluster, with_offload(request, name)).run(1)
        if ranked:
            return (
                f" offload={name} would make it fit ({ranked[0][0]:.3g} s per step): pass --offload {name} "
                "or leave --offload unpinned."
            )
    tried = [name for name in implemented(request) if name != current]
    if not tried:
        return ""
    return f" Offload ({', '.join(tried)}) would not make it fit either."

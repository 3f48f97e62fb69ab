"""Which layouts can run: one torch-free set of rules, returning reasons with their numbers.

The search (planner/enumerate.py), `estimate`, `Plan.validate` and the executor's `check_plan`
all ask `reasons()`, so a plan `meshplan plan` writes is one `meshplan run` runs, and a layout the
search rejects is rejected by `check_plan` with the same words. A reason is either *invalid*
(no software could run it: the numbers do not fit together) or *not runnable* (a valid
description this executor does not run yet, e.g. context parallelism): `Plan.validate` refuses
only the first kind, so such plans can still be exported; the search and `check_plan` refuse both.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from meshplan import dp_methods

SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble")
INTERLEAVED = ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble")
SPLIT_BACKWARD = ("InterleavedZeroBubble",)
"""Schedules that split backward into input- and weight-gradient passes (zero bubble)."""


WAVES_NOT_RUN = (
    "waves=2: meshplan's executor runs Wavelet's two waves on data-parallel layouts only (tensor, "
    "pipeline and context parallel degree 1: executor/waves.py); the planner prices the others "
    "(estimate --waves 2); use waves=1 or a data-parallel layout"
)


@dataclass(frozen=True, kw_only=True)
class Layout:
    """What the rules read: a search Candidate or a Plan, seen the same way."""

    pp: int
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    zero: int
    microbatch: int
    num_microbatches: int
    schedule: str
    virtual_stages: int
    sequence_parallel: bool
    seq_len: int
    methods: tuple[tuple[str, str], ...] = ()
    """(axis, name) of every axis's method (defaults may be left out)."""
    method_params: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    """(axis, ((param, value), ...)) of the methods' parameters (defaults may be left out)."""

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard


@dataclass(frozen=True)
class Reason:
    text: str
    runnable_only: bool = False
    """True: a valid layout that meshplan's executor does not run."""
    limit: str = ""
    """A runnable-only reason's missing capability (LIMITS): another runtime that has it runs the
    layout (meshplan/runtimes.py `also_runs`), so the search offers it for that runtime."""


LIMITS = {
    "context_parallel": "context parallelism (ring attention over the sequence)",
    "1f1b_microbatches": "1F1B with a microbatch count that is not a multiple of pp",
    "waves": "Wavelet's two waves",
}
"""What meshplan's executor does not run though the layout is valid, by Reason.limit."""


def reasons(
    lay: Layout,
    *,
    num_layers: int | None = None,
    tp_divisors: dict[str, int] | None = None,
    tp_kinds: Iterable[str] | None = None,
    also_runs: Iterable[str] = (),
) -> list[Reason]:
    """Every rule `lay` breaks, in a fixed order (the first is the one to show). `tp_kinds`: the
    layers' TPRule kinds (None: not known, not checked). `also_runs`: LIMITS of meshplan's
    executor that the runtime the layout is planned for does not share (meshplan/runtimes.py
    `also_runs`): their runnable-only reasons are left out."""
    out = [
        Reason(t)
        for t in _data_parallel(lay) + _schedule(lay, num_layers) + _tensor_parallel(lay, tp_divisors, tp_kinds)
    ]
    if lay.pp > 1 and lay.schedule == "1F1B" and lay.num_microbatches % lay.pp:
        text = _microbatches_not_a_multiple(lay, " in meshplan's executor (torch.distributed.pipelining)")
        out.append(Reason(text, runnable_only=True, limit="1f1b_microbatches"))
    out += [Reason(t) for t in _methods(lay)]
    if ("waves", "2") in lay.methods:
        if lay.tp * lay.pp * lay.cp > 1:
            out.append(Reason(WAVES_NOT_RUN, runnable_only=True, limit="waves"))
        if lay.microbatch % 2:  # after the runnable-only reason: estimate and Plan.validate refuse this one
            out.append(
                Reason(
                    f"waves=2 with microbatch_size {lay.microbatch}: Wavelet runs each microbatch as two "
                    "half waves; use an even microbatch size or waves=1"
                )
            )
    if lay.cp > 1:
        out.append(
            Reason(
                f"context_parallel_degree {lay.cp}: the executor does not run context parallelism; use 1, or "
                "plan for a runtime that does (--runtime torchtitan or megatron-core)",
                runnable_only=True,
                limit="context_parallel",
            )
        )
    skip = set(also_runs)
    return [r for r in out if not (r.runnable_only and r.limit in skip)]


def merge_divisors(per_layer: Iterable[dict[str, int]]) -> dict[str, int]:
    """One {name: size} over all layers' TP divisors (the gcd where layers differ: the TP degree
    must divide every layer's size), from the profile's or the model's TP rules alike."""
    out: dict[str, int] = {}
    for divs in per_layer:
        for name, size in divs.items():
            out[name] = math.gcd(out.get(name, 0), int(size))
    return out


TP_APPLIED_KINDS = ("block", "embedding", "head")
"""TPRule kinds the executor splits (executor/tensor_parallel.py); "none" and "conv" run whole."""


def tp_reason(tp: int, divisors: dict[str, int], kinds: Iterable[str] | None = None) -> str:
    """Why tensor parallelism of degree `tp` cannot split the model (no layer the executor
    splits, or the first size `tp` does not divide), or ""."""
    kinds = None if kinds is None else sorted(set(kinds))
    if tp > 1 and kinds is not None and not set(kinds) & set(TP_APPLIED_KINDS):
        return (
            f"tensor_parallel_degree {tp}: no layer has tensor-parallel rules the executor applies "
            f"(layer kinds: {', '.join(kinds) or 'none'}), so TP would only duplicate compute; use 1"
        )
    for name, size in sorted(divisors.items()):
        if tp > 1 and size % tp:
            return f"{name} {size} not divisible by tp={tp}"
    return ""


def first(lay: Layout, **kwargs) -> str:
    """The first reason (invalid or not runnable), or "" when the layout runs."""
    found = reasons(lay, **kwargs)
    return found[0].text if found else ""


def _data_parallel(lay: Layout) -> list[str]:
    out = []
    if not 0 <= lay.zero <= 3:
        out.append(f"zero_stage {lay.zero}: use 0, 1, 2 or 3")
    elif lay.zero <= 1 and lay.dp_shard > 1:
        out.append(
            f"zero_stage {lay.zero} with data_parallel_shard_degree {lay.dp_shard}: ZeRO-0/1 replicate; "
            "put the data-parallel degree in data_parallel_replicate_degree or use zero_stage 2/3"
        )
    elif lay.zero >= 2 and lay.dp_replicate > 1 and lay.dp_shard == 1:
        out.append(
            f"zero_stage {lay.zero} with data_parallel_shard_degree 1: ZeRO-2/3 shard over "
            "data_parallel_shard_degree; set it > 1"
        )
    return out


def _microbatches_not_a_multiple(lay: Layout, where: str = "") -> str:
    """The schedule needs the microbatch count to be a multiple of pp: the rule and the nearest fix."""
    pp, m = lay.pp, lay.num_microbatches
    fix = f"use {m - m % pp} or {m + pp - m % pp}" if m > pp else f"use {pp}"
    return (
        f"{lay.schedule} needs the microbatch count ({m}) to be a multiple of pp = {pp}{where}; "
        f"{fix} microbatches, or GPipe"
    )


def _schedule(lay: Layout, num_layers: int | None) -> list[str]:
    pp, m, v, name = lay.pp, lay.num_microbatches, lay.virtual_stages, lay.schedule
    if name not in SCHEDULES:
        return [f"pipeline_schedule {name!r}: use one of {', '.join(SCHEDULES)}"]
    out = []
    if v < 1 or (v > 1 and name not in INTERLEAVED):
        out.append(f"virtual_stages {v}: {name} runs one stage per rank; use 1 or Interleaved1F1B")
    if num_layers is not None and pp * v > num_layers:
        out.append(f"pp x virtual_stages = {pp * v} stages for {num_layers} layers; use fewer")
    if pp > 1 and name in INTERLEAVED and m % pp:  # 1F1B's own rule is meshplan's executor's (reasons())
        out.append(_microbatches_not_a_multiple(lay))
    if pp > 1 and name in SPLIT_BACKWARD and lay.dp > 1 and lay.zero >= 2:
        out.append(
            f"{name} with zero_stage {lay.zero}: FSDP2 misses the split weight-gradient pass; "
            "use Interleaved1F1B or zero_stage 0/1"
        )
    return out


def _tensor_parallel(lay: Layout, divisors: dict[str, int] | None, kinds: Iterable[str] | None) -> list[str]:
    tp, out = lay.tp, []
    if lay.sequence_parallel and tp == 1:
        out.append(
            "sequence_parallel with tensor_parallel_degree 1: sequence parallelism splits over the "
            "TP group; set tensor_parallel_degree > 1 or turn it off"
        )
    if lay.sequence_parallel and tp > 1 and lay.seq_len <= 1:
        out.append(
            "sequence_parallel with seq_len 1: the model's activations have no sequence dim to split; turn it off"
        )
    elif lay.sequence_parallel and tp > 1 and lay.seq_len % tp:
        out.append(f"sequence parallelism needs seq_len {lay.seq_len} divisible by tensor_parallel_degree {tp}")
    why = tp_reason(tp, divisors or {}, kinds)
    return out + ([why] if why else [])


def param_stage_reasons(axis: str, name: str, params: dict[str, Any], zero: int) -> list[str]:
    """A method parameter set off its default on a ZeRO stage it does not run with
    (Param.zero_stages): the search's reason, and the CLI's refusal of a pinned --zero."""
    row = dp_methods.method(axis, name)
    out = []
    for p in row.params:
        value = params.get(p.name, p.default)
        if value != p.default and zero not in p.zero_stages:
            stages = "/".join(map(str, p.zero_stages))
            why = f" ({p.zero_stages_why})" if p.zero_stages_why else ""
            out.append(
                f"{row.label} {p.name}={_text(value)} with zero_stage {zero}: runs with zero_stage {stages} "
                f"only{why}; use --zero {stages} or {p.name}={_text(p.default)}"
            )
    return out


def _text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _methods(lay: Layout) -> list[str]:
    out = []
    for axis, name in lay.methods:
        if name == dp_methods.DEFAULTS[axis]:
            continue
        row = dp_methods.method(axis, name)
        if lay.dp == 1 and axis in ("compression", "sync", "comm_schedule"):
            out.append(
                f"{row.label} with data-parallel degree 1: there are no replicas to exchange gradients; "
                f"use {axis}={dp_methods.DEFAULTS[axis]}"
            )
        if lay.zero not in row.zero_stages:
            out.append(
                f"{row.label} with zero_stage {lay.zero}: runs with zero_stage "
                f"{'/'.join(map(str, row.zero_stages))} only"
            )
        params = {**dp_methods.defaults_of(axis, name), **dict(dict(lay.method_params).get(axis, ()))}
        out += param_stage_reasons(axis, name, params, lay.zero)
        out += _param_layout_reasons(name, params, lay)
        if lay.tp > 1 and not row.tensor_parallel:
            out.append(
                f"{row.label} with tensor_parallel_degree {lay.tp}: needs DDP, which cannot hold "
                "tensor-parallel parameters; use tensor_parallel_degree 1"
            )
        if (
            axis == "comm_schedule"
            and name == "bytescheduler"
            and dict(lay.methods).get("compression", "none") != "none"
        ):
            out.append(
                f"{row.label} with compression={dict(lay.methods)['compression']}: it sends the fp32 "
                "gradients itself, without DDP's comm hooks; use compression=none or comm_schedule=buckets"
            )
        if lay.pp > 1 and axis == "comm_schedule" and name == "bytescheduler":
            out.append(
                f"{row.label} with pipeline_parallel_degree {lay.pp}: its per-layer scheduler sends once "
                "per step after the last microbatch, which pipeline schedules do not expose; use "
                "comm_schedule=buckets or pipeline_parallel_degree 1"
            )
        if lay.pp > 1 and axis == "sync":
            out.append(
                f"{row.label} with pipeline_parallel_degree {lay.pp}: it runs its own step on whole "
                "replicas (executor/methods/sync_*.py); use pipeline_parallel_degree 1 or sync=allreduce"
            )
        others = [f"{a}={n}" for a, n in lay.methods if a != "sync" and n != dp_methods.DEFAULTS[a]]
        if axis == "sync" and others:
            out.append(
                f"{row.label} with {', '.join(others)}: those run inside DDP's gradient exchange, which "
                f"{row.name} replaces; use the defaults on the other axes or sync=allreduce"
            )
        if lay.pp > 1 and lay.schedule in SPLIT_BACKWARD and lay.dp > 1 and not row.split_backward:
            out.append(
                f"{row.label} with {lay.schedule}: its hooks miss the split weight-gradient pass; use Interleaved1F1B"
            )
    return out


def _param_layout_reasons(name: str, p: dict[str, Any], lay: Layout) -> list[str]:
    """A method's parameters that the layout (its replicas, its local batch) or each other rule
    out: the executor's own refusals (executor/methods/sync_localsgd.py, sync_crossbow.py,
    sync_dabmd.py), found here so the search never writes such a plan."""
    out = []
    if name == "local-sgd" and 0 < p["group_size"] < lay.dp:
        g, gp, period = p["group_size"], p["group_period"], p["period"]
        if lay.dp % g:
            fits = ", ".join(str(d) for d in range(2, lay.dp) if lay.dp % d == 0)
            out.append(
                f"sync=local-sgd group_size={g} with data-parallel degree {lay.dp}: groups of consecutive "
                f"replicas must divide the {lay.dp} replicas; use group_size={fits + ' or ' if fits else ''}0 (flat)"
            )
        if period % gp or gp >= period:
            out.append(
                f"sync=local-sgd group_period={gp} with period={period}: a group averages every group_period "
                "steps, which must divide period and be smaller; use group_period=1 or a larger period"
            )
    local = lay.microbatch * lay.num_microbatches
    if name == "crossbow" and p["learners"] and local % p["learners"]:
        fits = ", ".join(str(k) for k in range(1, min(local, 8) + 1) if local % k == 0)
        out.append(
            f"sync=crossbow learners={p['learners']} with a local batch of {local} samples: each learner "
            f"takes an equal share; use learners={fits} (dividing global batch / data-parallel degree) "
            "or learners=0 (auto)"
        )
    if name == "dabmd" and p["entropy"] and p["gradient_allreduce"]:
        out.append(
            "sync=dabmd entropy=true with gradient_allreduce=true: the exact variant steps the plan's "
            "optimizer (Euclidean); drop one of them"
        )
    return out

"""What `meshplan plan` and `meshplan estimate` plan from: options -> (profile, cluster, request),
with the warnings as data.

`PlanOptions` is the typed record of the options (meshplan/options.py declares them as flags);
`resolve(options)` checks them, loads the cluster, builds the PlanRequest (the runtime's behaviours
resolved, meshplan/runtimes.py) and the model profile, and returns them with every warning as a
line of text. Nothing here prints or reads an argparse namespace beyond `PlanOptions.of`; the CLI,
the validation against published runs and the benchmarks all call `resolve` (or `from_argv`, a
`meshplan plan` command line without the verb), so they build exactly what a user's command builds.

torch is imported only to profile a torch model (not for analytic:* models or a --profile JSON).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from meshplan import dp_methods, feasibility, runtimes, schema
from meshplan.cluster import ClusterSpec
from meshplan.errors import MeshplanError
from meshplan.model_profile import ModelProfile
from meshplan.options import parse_overrides
from meshplan.plan import Plan, schedule_name
from meshplan.planner.request import PlanRequest

Progress = Callable[[str], AbstractContextManager[Any]]
"""A context manager factory that shows a message while long work runs (the CLI's spinner); what
it yields, if callable, is told the work's count: tick(done, total, label) (the CLI's bar)."""


def _no_progress(message: str) -> AbstractContextManager[Any]:
    return contextlib.nullcontext()


@dataclass(frozen=True, kw_only=True)
class PlanOptions:
    """Every input of a plan or an estimate; field names are the flags' (--num-gpus: num_gpus)."""

    # model
    model: str = "gpt-tiny"
    overrides: tuple[str, ...] = ()
    """--set KEY=VALUE items."""
    profile: str | None = None
    # cluster
    cluster: str = "local-cpu"
    num_gpus: int = 4
    # batch
    global_batch: int = 16
    seq: int | None = None
    microbatch: int | None = None
    # parallelism pins
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    cp: int | None = None
    schedule: str | None = None
    virtual_stages: int | None = None
    stage_layers: tuple[int, ...] | None = None
    """--stage-layers (estimate): layers per pipeline stage."""
    recompute: str | None = None
    recompute_num_layers: int | None = None
    recompute_blocks: int | None = None
    zero: int | None = None
    sequence_parallel: bool | None = None
    dp_shard: int | None = None
    allow_cross_node_tp: bool = False
    # methods
    compression: str | None = None
    sync: str | None = None
    comm_schedule: str | None = None
    offload: str | None = None
    waves: str | None = None
    allow_compression: str | None = None
    allow_sync: str | None = None
    # runtime
    runtime: str = runtimes.DEFAULT
    precision: str | None = None
    behaviours: Mapping[str, Any] = field(default_factory=dict)
    """The runtime behaviour flags given, by their dest (--state-layout: state_layout; one per
    flag of meshplan/runtimes.py BEHAVIOUR_FLAGS); a behaviour not here is the runtime's."""
    # output
    top: int = 5
    runnable: bool = False
    """The plan will be written (-o) to be run: a --seq beyond the model's context is an error."""

    @classmethod
    def of(cls, values: Mapping[str, Any] | Any) -> PlanOptions:
        """From a mapping (or an argparse namespace) of option values: the known names are taken,
        `output` sets `runnable`, the rest (json, quiet, config) are not inputs."""
        if not isinstance(values, Mapping):
            values = vars(values)
        names = {f.name for f in dataclasses.fields(cls)} - {"behaviours"}
        kw: dict[str, Any] = {k: v for k, v in values.items() if k in names and v is not None}
        kw["behaviours"] = {d: values[d] for d in runtimes.BEHAVIOUR_DESTS if values.get(d) is not None}
        if "overrides" in kw:
            kw["overrides"] = tuple(kw["overrides"])
        if values.get("output"):
            kw["runnable"] = True
        return cls(**kw)


NOT_INPUTS = frozenset({"output", "json", "plain", "quiet", "config", "save_config", "import_path"})
"""Option names of plan/estimate that are not PlanOptions fields (what is printed or written)."""


@dataclass(frozen=True)
class Inputs:
    profile: ModelProfile
    cluster: ClusterSpec
    request: PlanRequest
    warnings: list[str] = field(default_factory=list)


def from_argv(argv: list[str], verb: str = "plan") -> PlanOptions:
    """PlanOptions of a `meshplan <verb>` command line given without `meshplan <verb>`."""
    from meshplan.options import plan_parser

    return PlanOptions.of(plan_parser(verb).parse_args(argv))


def resolve(options: PlanOptions, progress: Progress = _no_progress) -> Inputs:
    """(profile, cluster, request) and the warnings; cheap checks run before any profiling."""
    from meshplan.presets import load_cluster

    warnings: list[str] = []
    check_positive(num_gpus=options.num_gpus)
    cluster = load_cluster(options.cluster, options.num_gpus)
    request = build_request(options, cluster, warnings)
    profile = build_profile_for(options, request, progress)
    warnings += seq_warnings(options, profile)
    return Inputs(profile, cluster, request, warnings)


def _check_overrides_match(profile: ModelProfile, overrides: dict) -> None:
    """--set beside --profile is accepted where it restates the profile (seq = its seq_len, a key
    of its model_config with the same value); a change needs a new profile."""
    for key, value in overrides.items():
        have = profile.seq_len if key == "seq" else profile.model_config.get(key)
        if have is None or str(have) != str(value):
            raise MeshplanError(
                f"--set {key}={value}: the saved --profile has {key} = {have}; --set cannot change a saved "
                "profile: re-run meshplan profile with --set, or drop it"
            )


def build_profile_for(options: PlanOptions, request: PlanRequest, progress: Progress = _no_progress) -> ModelProfile:
    """The profile a plan is priced on: closed-form, saved or captured. Under a runtime that builds
    its own model of the shape (behaviour model_source), a built profile's standard blocks are
    priced as that runtime runs them (models/analytic.as_runtime_builds; docs/validation.md)."""
    from meshplan.models.analytic import as_runtime_builds, from_spec

    rt = runtimes.runtime(options.runtime)
    given = options.behaviours.get("dropout")
    dropout = bool(given if given is not None else rt.value("dropout"))
    flash = request.attention != "materialized"
    if options.model.startswith("analytic:") and not options.profile:
        return from_spec(options.model, parse_overrides(options.overrides), flash=flash, dropout=dropout)
    if options.profile:
        profile = schema.load(ModelProfile, options.profile, "profile")
        if options.overrides:
            _check_overrides_match(profile, parse_overrides(options.overrides))
        if options.model not in ("gpt-tiny", profile.model_name):  # gpt-tiny: the flag's default
            raise MeshplanError(
                f"--model {options.model}: --profile {options.profile} is a profile of {profile.model_name}; "
                "drop --model (the profile names the model) or profile that model"
            )
    else:
        profile = build_profile(options.model, options.overrides, progress=progress)
    if rt.value("model_source") == "runtime":  # Megatron, torchtitan: their own model of this shape
        profile = as_runtime_builds(profile, dropout=dropout, flash=flash)
    return profile


def build_profile(
    model: str,
    overrides: tuple[str, ...] | list[str] = (),
    *,
    device: str = "meta",
    microbatches: list[int] | None = None,
    concurrent: int = 1,
    in_place: bool = True,
    progress: Progress = _no_progress,
) -> ModelProfile:
    """`meshplan profile`'s ModelProfile of a torch model (imports torch, unless a meta-device
    profile of the same model and code is cached: meshplan/profile_cache.py)."""
    from meshplan import profile_cache

    values = parse_overrides(overrides)
    cacheable = device == "meta"  # nothing timed: the profile is a function of the model and the code
    hit = profile_cache.load(model, values) if cacheable else None
    if hit is not None:
        return hit
    from meshplan.profiler import profile_model

    with progress(f"profiling {model} on {device}") as tick:  # tick(done, total, label): layers
        profile = profile_model(
            model,
            values,
            device=device,
            microbatch_sizes=microbatches,
            concurrent=concurrent,
            in_place=in_place,
            progress=tick if callable(tick) else False,
        )
    if cacheable:
        profile_cache.store(model, values, profile)
    return profile


def check_positive(**values: int | None) -> None:
    for name, value in values.items():
        if value is not None and value < 1:
            raise MeshplanError(f"--{name.replace('_', '-')} {value}: must be >= 1")
        limit = UPPER_BOUNDS.get(name)
        if value is not None and limit is not None and value > limit:
            raise MeshplanError(
                f"--{name.replace('_', '-')} {value}: at most {limit:,} (a search over more would not end); "
                "give a realistic size"
            )


UPPER_BOUNDS = {
    "num_gpus": 2**20,
    "global_batch": 2**24,
    "seq": 2**24,
    "microbatch": 2**24,
    "tp": 2**20,
    "pp": 2**20,
    "dp": 2**20,
    "cp": 2**20,
    "dp_shard": 2**20,
    "virtual_stages": 2**10,
    "top": 10**4,
}
"""Sizes no job has (a million GPUs, 16M samples a step, 16M tokens a sequence): beyond them the
search's loops over divisors and microbatches would run for hours, or floats overflow."""


def build_request(options: PlanOptions, cluster: ClusterSpec, warnings: list[str]) -> PlanRequest:
    o = options
    check_positive(
        num_gpus=o.num_gpus,
        global_batch=o.global_batch,
        seq=o.seq,
        tp=o.tp,
        pp=o.pp,
        dp=o.dp,
        cp=o.cp,
        dp_shard=o.dp_shard,
        microbatch=o.microbatch,
        virtual_stages=o.virtual_stages,
        top=o.top,
    )
    precision = o.precision or ("fp32" if cluster.device.kind == "cpu" else "bf16")
    behaviours = runtime_behaviours(o, cluster, precision, warnings)
    methods = _pinned_methods(o, warnings)
    for axis, (name, params) in methods.items():  # a pinned --zero a pinned method's parameter refuses
        refused = feasibility.param_stage_reasons(axis, name, params, o.zero) if o.zero is not None else []
        if refused:
            raise MeshplanError(refused[0])
    return PlanRequest(
        **behaviours,
        num_gpus=o.num_gpus,
        global_batch=o.global_batch,
        seq=o.seq,
        top_k=o.top,
        tp=o.tp,
        pp=o.pp,
        dp=o.dp,
        cp=o.cp,
        microbatch=o.microbatch,
        schedule=schedule_name(o.schedule) if o.schedule else None,
        virtual_stages=o.virtual_stages,
        stage_layers=o.stage_layers,
        recompute=o.recompute,
        recompute_num_layers=_recompute_num_layers(o),
        recompute_blocks=_recompute_blocks(o),
        zero=o.zero,
        sequence_parallel=o.sequence_parallel,
        dp_shard=o.dp_shard,
        methods=methods,
        allow=_allowed_methods(o, warnings),
        allow_cross_node_tp=_cross_node_tp(o, cluster, warnings),
        precision=precision,
        runtime=o.runtime,
    )


def _recompute_num_layers(o: PlanOptions) -> int:
    """--recompute-num-layers N (Megatron's uniform groups) needs every block on full recompute."""
    n = o.recompute_num_layers
    if n is None:
        return 1
    if n < 1 or (n > 1 and o.recompute != "full"):
        raise MeshplanError(
            f"--recompute-num-layers {n}: groups of N >= 1 layers are checkpointed only with --recompute full; "
            "add --recompute full or drop the flag"
        )
    return n


def _recompute_blocks(o: PlanOptions) -> int | None:
    """--recompute-blocks K (Megatron's block method): full recompute on K blocks of each stage."""
    k = o.recompute_blocks
    if k is None:
        return None
    if k < 1 or o.recompute != "full":
        raise MeshplanError(
            f"--recompute-blocks {k}: the first K >= 1 blocks of each stage are recomputed only with --recompute "
            "full; add --recompute full or drop the flag"
        )
    if (o.recompute_num_layers or 1) > 1:
        raise MeshplanError(
            f"--recompute-blocks {k} with --recompute-num-layers {o.recompute_num_layers}: Megatron checkpoints "
            "either K blocks of each stage (block) or every block in groups of N (uniform); give one of them"
        )
    return k


def _cross_node_tp(o: PlanOptions, cluster: ClusterSpec, warnings: list[str]) -> bool:
    """A --tp pin wider than a node is a decision: planned across nodes, with a warning line."""
    if o.tp and o.tp > cluster.devices_per_node and not o.allow_cross_node_tp:
        warnings.append(
            f"--tp {o.tp} > {cluster.devices_per_node} devices per node: planned as cross-node "
            "tensor parallelism (its collectives run on the inter-node links)"
        )
        return True
    return o.allow_cross_node_tp


def runtime_behaviours(o: PlanOptions, cluster: ClusterSpec, precision: str, warnings: list[str]) -> dict:
    """PlanRequest behaviour fields: --runtime's table row (meshplan/runtimes.py), each overridden
    by its own flag; a warning where the model does not know a behaviour, a pin leaves the
    runtime's range, or a knob is ignored."""
    rt = runtimes.runtime(o.runtime)
    flags = runtimes.flag_overrides(o.behaviours)  # each behaviour row's own flag (meshplan/runtimes.py ROWS)
    out = runtimes.request_behaviours(rt.name, flags)
    unknown = [k for k in rt.unknown() if k in (*runtimes.REQUEST_FIELDS, "dropout") and flags.get(k) is None]
    if o.recompute != "selective":  # said only when the user asks for it
        unknown = [k for k in unknown if k != "selective_recompute"]
    if o.pp == 1:  # no pipeline: its stages' behaviours do not apply
        unknown = [k for k in unknown if k not in ("free_stage_outputs", "uniform_stages")]
    if unknown:
        warnings.append(
            f"runtime {rt.name}: the model does not know its {', '.join(unknown)} "
            "(docs/runtimes.md); the values in brackets there are used"
        )
    unrun = runtimes.unrun_axes(out["model_parallel"], o.tp, o.pp, o.cp)
    if unrun:
        warnings.append(
            f"--{unrun[0]} {getattr(o, unrun[0])}: runtime {rt.name} runs no such parallelism "
            f"({rt.behaviours['model_parallel'].source}); predicted as pinned"
        )
    if o.zero is not None and o.zero not in rt.value("zero_stages"):
        warnings.append(
            f"--zero {o.zero}: runtime {rt.name} implements ZeRO {rt.value('zero_stages')}; predicted as pinned"
        )
    beside_pp = out["pipeline_zero_stages"]
    if o.zero is not None and (o.pp or 1) > 1 and beside_pp is not None and o.zero not in beside_pp:
        warnings.append(
            f"--zero {o.zero} with --pp {o.pp}: runtime {rt.name} runs ZeRO {'/'.join(map(str, beside_pp))} only "
            f"beside pipeline parallelism ({rt.behaviours['pipeline_zero_stages'].source}); predicted as pinned, but "
            f"it will not run there: use --zero {max(beside_pp)} or --pp 1"
        )
    schedules = out["pipeline_schedules"]
    if o.schedule and (o.pp or 1) > 1 and schedules is not None and schedule_name(o.schedule) not in schedules:
        warnings.append(
            f"--schedule {o.schedule}: runtime {rt.name} runs {', '.join(schedules)} only "
            f"({rt.behaviours['pipeline_schedules'].source}); predicted as pinned, but it will not run there"
        )
    sp_modes = out["sequence_parallel_modes"]
    if (
        o.sequence_parallel is not None
        and (o.tp or 1) > 1
        and sp_modes is not None
        and o.sequence_parallel not in sp_modes
    ):
        flag = "--sequence-parallel" if o.sequence_parallel else "--no-sequence-parallel"
        warnings.append(
            f"{flag}: runtime {rt.name} runs no sequence parallel {'on' if o.sequence_parallel else 'off'} beside "
            f"tensor parallelism ({rt.behaviours['sequence_parallel_modes'].source}); predicted as pinned"
        )
    if o.zero == 0 and (o.tp or 1) * (o.pp or 1) * (o.cp or 1) > 1 and not out["ddp_beside_model_parallel"]:
        warnings.append(
            f"--zero 0 with --tp/--pp/--cp: runtime {rt.name} runs DDP only on pure data parallelism "
            f"({rt.behaviours['ddp_beside_model_parallel'].source}); predicted as pinned, but it will not run "
            "there: use --zero 2 or 3 (FSDP2; HSDP with --dp-shard)"
        )
    if rt.name == "torchtitan" and o.zero == 3 and (o.pp or 1) > 1:
        warnings.append(
            "--zero 3 with --pp under torchtitan: its default fsdp_reshard_after_forward keeps parameters "
            "gathered under PP (ZeRO-2); predicted as ZeRO-3, which the export writes as 'always' "
            "(--zero 2 predicts a default torchtitan run)"
        )
    if precision == "fp8":
        if not rt.value("fp8"):
            raise MeshplanError(
                f"--precision fp8: runtime {rt.name} has no fp8 path the model knows "
                f"({rt.behaviours['fp8'].source}); use --runtime torchtitan or megatron-core"
            )
        if "fp8" not in cluster.device.peak_flops:
            warnings.append(f"--precision fp8: {cluster.device.name} has no fp8 tensor cores; GEMMs stay bf16")
    if (
        o.behaviours.get("dropout") is not None
        and rt.value("model_source") == "user"
        and not o.model.startswith("analytic:")
    ):
        warnings.append(f"--dropout: runtime {rt.name} runs the profiled module, whose dropout it keeps; ignored")
    return out


METHOD_FLAGS = {
    "compression": "--compression",
    "sync": "--sync",
    "comm_schedule": "--comm-schedule",
    "offload": "--offload",
    "waves": "--waves",
}

RUNTIME_METHOD_AXES = ("compression", "sync", "offload")
"""Axes whose methods a runtime may not implement (meshplan/runtimes.py `<axis>_methods`)."""


def _implemented(o: PlanOptions, axis: str) -> tuple[str, ...]:
    return runtimes.runtime(o.runtime).value(f"{axis}_methods")


def _pinned_methods(o: PlanOptions, warnings: list[str]) -> dict:
    """--compression NAME[:k=v,...] etc. -> {axis: (name, resolved params)}; a pin the runtime does
    not implement is predicted as pinned, with a warning line."""
    out = {}
    for axis, flag in METHOD_FLAGS.items():
        text = getattr(o, axis)
        if text is not None:
            out[axis] = dp_methods.parse_spec(axis, text, flag)
            if axis in RUNTIME_METHOD_AXES and out[axis][0] not in _implemented(o, axis):
                warnings.append(
                    f"{flag} {out[axis][0]}: runtime {o.runtime} implements {axis} "
                    f"{', '.join(_implemented(o, axis))}; predicted as pinned"
                )
    return out


def _allowed_methods(o: PlanOptions, warnings: list[str]) -> dict:
    """--allow-compression / --allow-sync, less what the runtime does not implement (said)."""
    out = {}
    for axis in ("compression", "sync"):
        text = getattr(o, f"allow_{axis}")
        if text is None:
            continue
        names = dp_methods.parse_allow(axis, text, f"--allow-{axis}")
        kept = tuple(n for n in names if n in _implemented(o, axis))
        if len(kept) < len(names):
            dropped = ", ".join(n for n in names if n not in kept)
            warnings.append(f"--allow-{axis}: runtime {o.runtime} does not implement {dropped}; not searched")
        if kept:
            out[axis] = kept
    return out


def seq_warnings(o: PlanOptions, profile: ModelProfile) -> list[str]:
    """--seq beyond the model's context is priced, but such a plan cannot run: -o refuses it."""
    if not o.seq or o.seq <= profile.seq_len:
        return []
    text = (
        f"--seq {o.seq}: {profile.model_name} handles at most {profile.seq_len} tokens; "
        f"build the model for it with --set seq={o.seq}"
    )
    if o.runnable:
        raise MeshplanError(text + " (a plan written with -o must be runnable)")
    return [f"{text}; this plan is a what-if `meshplan run` refuses"]


def dropped_pins(o: PlanOptions, plan: Plan) -> list[str]:
    """A pinned knob the chosen plan cannot use is said, not silently dropped."""
    dropped = []
    if o.virtual_stages and o.virtual_stages > 1 and plan.virtual_stages != o.virtual_stages:
        dropped.append(
            f"--virtual-stages {o.virtual_stages} (the plan has pp={plan.pipeline_parallel_degree}, "
            f"{plan.virtual_stages} stage(s) per rank)"
        )
    if o.sequence_parallel and not plan.sequence_parallel:
        dropped.append(f"--sequence-parallel (the plan has tp={plan.tensor_parallel_degree}; it needs tp >= 2)")
    if o.recompute in ("selective", "full") and o.recompute not in plan.recompute.values():
        dropped.append(
            f"--recompute {o.recompute} (no layer keeps less with it than without under runtime {plan.runtime}, "
            "e.g. the attention core of flash attention: planned as none)"
        )
    return [f"ignored {what}" for what in dropped]

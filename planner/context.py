"""The planning context: the (sequence-rescaled) profile, the cluster, the request, and the
derived constants every cost function needs; and `Candidate`, one outer-loop configuration."""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass, field
from typing import Any

from meshplan import dp_methods, feasibility
from meshplan.cluster import ClusterSpec
from meshplan.errors import MeshplanError
from meshplan.model_profile import LayerProfile, ModelProfile
from meshplan.planner.attention import is_materialized, with_attention
from meshplan.planner.request import ATTENTION, PlanRequest
from meshplan.planner.runtime_spec import RuntimeSpec, state_layout
from meshplan.planner.sac import with_selective
from meshplan.planner.seqscale import with_seq_len
from meshplan.runtimes import PLANNED, grad_sync_matters

SPLIT_KINDS = ("block", "embedding", "head")
"""TPRule kinds whose parameters, FLOPs and activations tensor parallelism divides by t."""


@dataclass(frozen=True, order=True)
class Candidate:
    """One outer configuration; stage boundaries and recompute are solved per candidate.
    Degrees in the mesh order pp, dp_replicate, dp_shard, cp, tp (HSDP: both dp degrees > 1)."""

    pp: int
    dp_replicate: int
    dp_shard: int
    cp: int
    tp: int
    microbatch: int
    num_microbatches: int
    schedule: str
    virtual_stages: int
    zero: int
    sequence_parallel: bool
    methods: tuple = ()
    """((axis, name, ((param, value), ...)), ...) for every axis of meshplan/dp_methods.py;
    axes left out take the registry default."""
    reduce_every_microbatch: bool = False
    """ZeRO-2/3 without a pipeline where the runtime leaves it to the plan (runtimes.PLANNED,
    meshplan's executor): each microbatch's backward reduce-scatters into the shards (True) or
    unsharded fp32 gradients accumulate until the last one (False)."""

    @property
    def dp(self) -> int:
        return self.dp_replicate * self.dp_shard

    @property
    def state_shard(self) -> int:
        """Ranks one parameter's training state is partitioned over: ZeRO-2/3's FSDP group, which
        takes in the context-parallel ranks (they hold the same weights: torchtitan shards over
        the flattened dp_shard x cp mesh, Megatron-Core's distributed optimizer over its
        data-parallel-with-context-parallel group), ZeRO-1's optimizer partition (dp x cp), else 1."""
        if self.zero >= 2:
            return self.dp_shard * self.cp
        return self.dp * self.cp if self.zero == 1 else 1

    def method(self, axis: str) -> tuple[str, dict]:
        """(name, resolved parameters) of this candidate's method on `axis` (a fresh dict)."""
        name, params = self._methods_by_axis.get(axis) or (dp_methods.DEFAULTS[axis], None)
        return name, dict(params) if params is not None else dp_methods.default_params(axis)

    @functools.cached_property
    def _methods_by_axis(self) -> dict[str, tuple[str, tuple]]:
        return {a: (name, params) for a, name, params in self.methods}

    def with_method(self, axis: str, name: str, params: dict) -> Candidate:
        rest = tuple(m for m in self.methods if m[0] != axis)
        default = name == dp_methods.DEFAULTS[axis] and params == dp_methods.default_params(axis)
        entry = () if default else ((axis, name, tuple(sorted(params.items()))),)
        return dataclasses.replace(self, methods=tuple(sorted(rest + entry)))

    @functools.cached_property
    def cost_key(self) -> tuple:
        """What per-layer costs depend on (CostTable memoisation, partition frontiers): DDP's
        layers only see whether there are replicas, ZeRO-1's the optimizer shard, ZeRO-2/3's the
        shard and replica groups and the microbatch count (the reduce-scatter is paid 1/m per
        microbatch). A data-parallel method other than the defaults also sees the replica group
        and the microbatch count at ZeRO-0/1 (an all-gather compressor decodes and holds one
        payload per replica; a sync method's per-microbatch work)."""
        data: tuple[int | bool, ...]
        if self.zero <= 1 and self.methods:
            data = (self.zero, self.dp_replicate, self.num_microbatches)
        elif self.zero == 0:
            data = (0, self.dp > 1)
        elif self.zero == 1:
            data = (1, self.dp)
        else:
            data = (self.zero, self.dp_shard, self.dp_replicate, self.num_microbatches, self.reduce_every_microbatch)
        return (self.microbatch, self.tp, self.sequence_parallel, self.cp) + data + (self.methods,)

    def layout(self, seq_len: int) -> feasibility.Layout:
        return feasibility.Layout(
            pp=self.pp,
            dp_replicate=self.dp_replicate,
            dp_shard=self.dp_shard,
            cp=self.cp,
            tp=self.tp,
            zero=self.zero,
            microbatch=self.microbatch,
            num_microbatches=self.num_microbatches,
            schedule=self.schedule,
            virtual_stages=self.virtual_stages,
            sequence_parallel=self.sequence_parallel,
            seq_len=seq_len,
            methods=tuple((a, n) for a, n, _ in self.methods),
            method_params=tuple((a, tuple(params)) for a, _, params in self.methods),
        )

    @functools.cached_property
    def family(self) -> str:
        dp = (
            f"dp={self.dp}"
            if self.dp_replicate == 1 or self.dp_shard == 1
            else f"dp={self.dp_replicate}x{self.dp_shard}"
        )
        return f"pp={self.pp} {dp} cp={self.cp} tp={self.tp}"

    def label(self) -> str:
        sched = self.schedule + (f"(v={self.virtual_stages})" if self.virtual_stages > 1 else "")
        methods = "".join(f" {a}={n}" for a, n, _ in self.methods)
        return (
            f"{self.family} b={self.microbatch} m={self.num_microbatches} {sched} "
            f"zero={self.zero}{' sp' if self.sequence_parallel else ''}"
            f"{' reduce-each-microbatch' if self.reduce_every_microbatch else ''}{methods}"
        )


def _gpu_model(name: str) -> str:
    """ "A100", "H100", "H200", "B200", ... from a device name ("cuda:NVIDIA H200", "H200-141G")."""
    hit = re.search(r"\b([ABHLV]\d{2,3})", name.upper().replace("-", " ").replace("_", " "))
    return hit.group(1) if hit else ""


def _signature(layer: LayerProfile) -> tuple:
    """Everything the cost model reads from a layer; equal signatures cost the same."""
    return (
        layer.kind,
        layer.num_params,
        layer.num_frozen_params,  # frozen weights have no gradient or optimizer state (dp_cost.trainable)
        layer.forward_flops,
        layer.backward_flops,
        layer.activation_bytes,
        layer.selective_activation_bytes,
        layer.recompute_flops_selective,
        layer.tp_replicated_activation_bytes,
        layer.input_bytes,
        layer.output_bytes,
        layer.tp.kind,
        layer.tp.num_allreduce_fwd,
        tuple(map(tuple, layer.gemm_shapes)),
        tuple((t.microbatch_size, t.forward_s, t.backward_s) for t in layer.timings),
        layer.optimizer_step_s,
        tuple(sorted(layer.framework_overhead_s.items())),
    )


def optimizer_call_measured_s(layers: list[LayerProfile]) -> float:
    """The one-rank fixed cost of one optimizer step call (framework_overhead_s["optimizer_call"],
    the largest over the layers' measurements); 0 when not measured."""
    return max((lp.framework_overhead_s.get("optimizer_call", 0.0) for lp in layers), default=0.0)


def optimizer_scale(profile: ModelProfile) -> float:
    """The whole model's optimizer step measured in place on all ranks at once
    (step_overhead_s["optimizer@1"], profiler/insitu.py) over what the one-rank per-layer timings
    add up to for a rank holding the whole model (sum of LayerProfile.optimizer_step_s plus one
    call's fixed cost). The per-layer timings say how a rank's share splits over the layers; the
    in-place measurement, spread over many passes like the other in-place cases, sets the scale.
    1.0 when either is missing."""
    measured = profile.step_overhead_s.get("optimizer@1", 0.0)
    one_rank = sum(lp.optimizer_step_s for lp in profile.layers) + optimizer_call_measured_s(profile.layers)
    return measured / one_rank if measured > 0 and one_rank > 0 else 1.0


def timing_scale_points(profile: ModelProfile) -> tuple[tuple[int, float], ...]:
    """((microbatch, ratio), ...): the plain whole model's forward + loss + backward measured in
    place on all ranks at once (step_overhead_s["model@1:bB"], profiler/insitu.py) over the sum of
    the layers' timings at the same microbatch. Each layer is timed alone, its share of the cores
    inferred from CPU time x wall / CPU over the timed passes (profiler/step_timing.HostShare); the
    in-place pass runs the whole model the way a rank does, beside the other ranks doing the same.
    The layer timings say how a pass splits over the layers, the in-place pass what it costs.
    Empty when not measured (GPU profiles, --concurrent 1, profiles written before it)."""
    points = []
    for key, measured in profile.step_overhead_s.items():
        if not key.startswith("model@1:b") or measured <= 0:
            continue
        b = int(key.removeprefix("model@1:b"))
        times = [next((t for t in lp.timings if t.microbatch_size == b), None) for lp in profile.layers]
        layers = sum(t.forward_s + t.backward_s for t in times if t is not None)
        if layers > 0 and all(t is not None for t in times):
            points.append((b, measured / layers))
    return tuple(sorted(points))


@dataclass
class Context:
    profile: ModelProfile
    cluster: ClusterSpec
    request: PlanRequest
    signatures: list[int] = field(default_factory=list)
    """Index of the first layer with the same signature, per layer (memoisation key)."""
    body: tuple[int, int] | None = None
    """[start, end) of identical blocks when the model is prefix(<=1) + identical blocks + suffix(<=1)."""
    optimizer_scale: float = 1.0
    """Factor on the profile's one-rank optimizer timings (optimizer_scale())."""
    timing_scale: tuple[tuple[int, float], ...] = ()
    """Factor on the profile's layer timings by microbatch (timing_scale_points(), read before any
    sequence rescaling; planner/cost/compute.timing_scale interpolates it)."""
    score_keepers: frozenset[str] = frozenset()
    """Blocks whose attention core materialises the s x s scores (attention.is_materialized), read
    before the selective-recompute policy re-targets the selective fields: torchtitan's op policy
    frees matmul outputs, which that test would take for a core of scores."""

    @classmethod
    def build(cls, profile: ModelProfile, cluster: ClusterSpec, request: PlanRequest) -> Context:
        if request.precision not in ("bf16", "fp32", "fp8"):
            raise MeshplanError(f"precision {request.precision!r} is unknown; use bf16, fp8 or fp32")
        if request.attention not in (None, *ATTENTION):
            raise MeshplanError(f"attention {request.attention!r} is unknown; use {' or '.join(ATTENTION)}")
        state_layout(request.state_layout)  # a clear error for an unknown layout
        profile = with_attention(with_seq_len(profile, request.seq), request.attention)
        ctx = cls(profile=with_selective(profile, request.selective_recompute), cluster=cluster, request=request)
        if profile.heads:
            keep = (lp.name for lp in profile.layers if is_materialized(lp, profile.heads, profile.seq_len))
            ctx.score_keepers = frozenset(keep)
        seen: dict[tuple, int] = {}
        ctx.signatures = [seen.setdefault(_signature(lp), i) for i, lp in enumerate(ctx.profile.layers)]
        ctx.body = ctx._find_body()
        ctx.optimizer_scale = optimizer_scale(ctx.profile)
        ctx.timing_scale = timing_scale_points(profile)
        return ctx

    def _find_body(self) -> tuple[int, int] | None:
        sig, n = self.signatures, len(self.signatures)
        for start in (0, 1):
            for end in (n, n - 1):
                if end - start >= 1 and len(set(sig[start:end])) == 1 and end - start >= n - 2:
                    return start, end
        return None

    @functools.cached_property
    def spec(self) -> RuntimeSpec:
        """The request's runtime behaviours, resolved once into typed fields: each RuntimeSpec field
        is the request's field of the same name, but the state layout (its STATE_LAYOUTS row) and
        the FSDP gather and reduce widths (the runtime's, else by precision and state layout; an
        fp32 run moves fp32: a 16-bit runtime default names its bf16 runs, e.g. Composer's PURE
        mixed precision is the run's own dtype)."""
        r = self.request
        state = state_layout(r.state_layout)
        floor = 4 if r.precision == "fp32" else 0
        gather = max(r.fsdp_gather_bytes or (2 if r.precision in ("bf16", "fp8") else 4), floor)
        resolved: dict[str, Any] = {
            "state": state,
            "fsdp_gather_bytes": gather,
            "fsdp_reduce_bytes": max(r.fsdp_reduce_bytes or state.fsdp_reduce_bytes or gather, floor),
            "fsdp_unit_buffers": r.fsdp_unit_buffers or "fsdp2",
        }
        same: dict[str, Any] = {
            f.name: getattr(r, f.name) for f in dataclasses.fields(RuntimeSpec) if f.name not in resolved
        }
        return RuntimeSpec(**same, **resolved)

    @property
    def layers(self) -> list[LayerProfile]:
        return self.profile.layers

    @property
    def seq(self) -> int:
        return self.profile.seq_len

    @property
    def peak_flops(self) -> float:
        """The compute dtype's peak: MFU/HFU are against it; fp8 runs count against bf16 (the
        attention core and every non-GEMM kernel stay bf16)."""
        peaks = self.cluster.device.peak_flops
        dtype = "bf16" if self.request.precision == "fp8" else self.request.precision
        return peaks.get(dtype) or max(peaks.values())

    @property
    def fp8_gemms(self) -> bool:
        """fp8 GEMMs: asked for and the device has an fp8 peak (else they stay bf16)."""
        return self.request.precision == "fp8" and "fp8" in self.cluster.device.peak_flops

    @property
    def gemm_peak_flops(self) -> float:
        return self.cluster.device.peak_flops["fp8"] if self.fp8_gemms else self.peak_flops

    @property
    def gemm_curve(self) -> list[list[float]]:
        """The GEMM efficiency curve of the GEMMs' dtype (fp8: the device's fp8 curve if it has one)."""
        dev = self.cluster.device
        return (dev.fp8_gemm_efficiency or dev.gemm_efficiency) if self.fp8_gemms else dev.gemm_efficiency

    @property
    def capacity_bytes(self) -> float:
        dev = self.cluster.device
        return dev.memory_bytes * (1.0 - dev.memory_reserved_fraction)

    @functools.cached_property
    def measured(self) -> bool:
        """Use measured LayerTimings: profiled on this kind of device (docs/design.md, "Cost model") —
        the CPU for a CPU cluster, or the same GPU model (A100, H100, H200, B200...) for a GPU one."""
        dev, kind = self.profile.device, self.cluster.device.kind
        if dev == "cpu" or kind == "cpu":
            return dev == "cpu" and kind == "cpu"
        model = _gpu_model(dev)
        return (
            dev.startswith("cuda") and kind == "cuda" and bool(model) and model == _gpu_model(self.cluster.device.name)
        )

    def keeps_scores(self, layer: LayerProfile) -> bool:
        """The layer's attention core materialises its scores (Megatron-LM's baddbmm, not a flash kernel)."""
        return layer.name in self.score_keepers

    def tp_split(self, layer: LayerProfile, tp: int) -> int:
        return tp if layer.tp.kind in SPLIT_KINDS else 1

    def reduces_every_microbatch(self, cand: Candidate) -> bool:
        """Whether ZeRO-2/3 reduce-scatters every microbatch's gradients (runtime behaviour
        fsdp_reduce_every_microbatch; a planned one is the candidate's choice)."""
        value = self.spec.fsdp_reduce_every_microbatch
        return cand.reduce_every_microbatch if value == PLANNED else bool(value)

    def grad_sync_choices(self, zero: int, state_shard: int, num_microbatches: int, pp: int) -> tuple[bool, ...]:
        """Candidate.reduce_every_microbatch values to search: both where the runtime leaves it to
        the plan and it matters (ZeRO-2/3 sharded over more than one rank, gradient accumulation, no
        pipeline: torch pipelining always defers), else the default."""
        planned = self.spec.fsdp_reduce_every_microbatch == PLANNED
        return (False, True) if planned and grad_sync_matters(zero, state_shard, num_microbatches, pp) else (False,)

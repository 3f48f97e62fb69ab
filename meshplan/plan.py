"""Plan: how to split training over the devices, and what the cost model predicts for it.

Mesh axes are ordered `pp, dp_replicate, dp_shard, cp, tp` and named as torchtitan names them
(`pipeline_parallel_degree`, `data_parallel_shard_degree`, ...). Stage boundaries are explicit
lists of layer FQNs (one list per pipeline stage, `pp * virtual_stages` lists, in model order;
stage s runs on pipeline rank s % pp, the "loop" placement of torch.distributed.pipelining).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from meshplan import dp_methods, feasibility
from meshplan.model_profile import ModelArchitecture
from meshplan.schema import check

PLAN_SCHEMA_VERSION = 2
"""2: the data-parallel methods moved into `dp_methods` (schema 1 had `gradient_comm`, `offload`)."""
SCHEDULES, INTERLEAVED = feasibility.SCHEDULES, feasibility.INTERLEAVED
SCHEDULE_ALIASES = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved": "Interleaved1F1B",
    "interleaved1f1b": "Interleaved1F1B",
    "loopedbfs": "LoopedBFS",
    "zerobubble": "InterleavedZeroBubble",
    "interleavedzerobubble": "InterleavedZeroBubble",
}
RECOMPUTE = ("none", "selective", "full")
MESH_AXES = ("pp", "dp_replicate", "dp_shard", "cp", "tp")


def check_schema_version(version: object, p: str = "") -> None:
    """Refuse a Plan of another schema with the way out (checked before the fields are read, so an
    old file gets this line rather than 'unknown field gradient_comm')."""
    if version is None:
        from meshplan.errors import MeshplanError

        raise MeshplanError(
            f"{p}schema_version: missing; every plan meshplan writes has it, so this is not a plan.json "
            "from meshplan plan -o (re-plan with meshplan plan)"
        )
    check(
        isinstance(version, int) and not isinstance(version, bool),
        f"{p}schema_version",
        version,
        f"expected the integer {PLAN_SCHEMA_VERSION}, not a {type(version).__name__}; re-plan the file with meshplan plan",
    )
    check(
        version == PLAN_SCHEMA_VERSION,
        f"{p}schema_version",
        version,
        f"this meshplan reads Plan schema {PLAN_SCHEMA_VERSION} (data-parallel methods in dp_methods); "
        "re-plan the file with meshplan plan (or estimate) using the same flags",
    )


def schedule_name(text: str) -> str:
    """Normalise a CLI spelling (gpipe, 1f1b, interleaved) to torch.distributed.pipelining's name."""
    key = text.replace("-", "").replace("_", "").lower()
    if text in SCHEDULES:
        return text
    if key in SCHEDULE_ALIASES:
        return SCHEDULE_ALIASES[key]
    from meshplan.errors import MeshplanError

    raise MeshplanError(f"schedule {text!r} is unknown; use one of gpipe, 1f1b, interleaved")


@dataclass(kw_only=True)
class MethodChoice:
    """One data-parallel method on one axis: its registry name and its parameters (all of them,
    defaults filled in: the file says exactly what runs)."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)


def _default(axis: str):
    return lambda: MethodChoice(name=dp_methods.DEFAULTS[axis], params=dp_methods.default_params(axis))


@dataclass(kw_only=True)
class DataParallelMethods:
    """How replicas exchange gradients and parameters, one registry method per axis
    (meshplan/dp_methods.py)."""

    compression: MethodChoice = field(default_factory=_default("compression"))
    """Gradient compression: none, fp16, powersgd."""
    sync: MethodChoice = field(default_factory=_default("sync"))
    """Replica synchronisation: allreduce."""
    comm_schedule: MethodChoice = field(default_factory=_default("comm_schedule"))
    """Communication scheduling: buckets (DDP bucket_cap_mb)."""
    offload: MethodChoice = field(default_factory=_default("offload"))
    """State placement: none (on the device), cpu (FSDP2 CPUOffloadPolicy)."""
    waves: MethodChoice = field(default_factory=_default("waves"))
    """Wave scheduling: 1."""

    def items(self) -> list[tuple[str, MethodChoice]]:
        return [(axis, getattr(self, axis)) for axis in dp_methods.AXES]

    def non_default(self) -> list[tuple[str, MethodChoice]]:
        """Axes whose method or parameters differ from plain data parallelism."""
        out = []
        for axis, c in self.items():
            default = dp_methods.DEFAULTS[axis]
            if c.name != default or c.params != dp_methods.default_params(axis):
                out.append((axis, c))
        return out

    def approximate(self) -> list[str]:
        """Labels ("compression=powersgd") of the chosen methods that change the mathematics."""
        return [
            dp_methods.method(a, c.name).label
            for a, c in self.items()
            if not dp_methods.method(a, c.name).exact_with(c.params)
        ]

    def validate(self, path: str = "") -> None:
        p = f"{path}." if path else ""
        for axis, choice in self.items():
            row = dp_methods.method(axis, choice.name, f"{p}{axis}.name")
            resolved = row.resolve(choice.params, f"{p}{axis}.params")
            missing = sorted(set(resolved) - set(choice.params))
            check(
                not missing,
                f"{p}{axis}.params",
                choice.params,
                f"missing {', '.join(missing)}; write every parameter of {row.name} (re-plan to fill them)",
            )
            choice.params = resolved


@dataclass(kw_only=True)
class StageMemory:
    """Predicted bytes per device of one pipeline rank (all its virtual stages together)."""

    stage: int
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    buffers_bytes: float
    """Temporary buffers: communication buckets, gathered ZeRO-3 layers, logits."""
    total_bytes: float
    capacity_bytes: float


@dataclass(kw_only=True)
class MethodOption:
    """The plan re-priced with one data-parallel method (same stages and recompute)."""

    axis: str
    name: str
    params: dict[str, Any] = field(default_factory=dict)
    exact: bool = True
    feasible: bool = True
    """False: it does not compose with this layout, or it does not fit in memory."""
    step_time_s: float = 0.0
    peak_memory_bytes: float = 0.0
    comm_bytes_per_step: dict[str, int] = field(default_factory=dict)
    chosen: bool = False
    note: str = ""
    """Why it cannot run here, or the convergence caveat of an approximate method."""


@dataclass(kw_only=True)
class Prediction:
    step_time_s: float
    breakdown: dict[str, float] = field(default_factory=dict)
    """Seconds per term: compute, recompute, bubble, tp_comm, pp_comm, dp_comm (exposed), optimizer."""
    stage_memory: list[StageMemory] = field(default_factory=list)
    peak_memory_bytes: float = 0.0
    """Max over ranks."""
    mfu: float = 0.0
    """Model FLOPs utilisation (Korthikanti et al. 2022 Eq. 7 FLOPs; no recompute)."""
    hfu: float = 0.0
    """Hardware FLOPs utilisation (recompute FLOPs counted)."""
    model_tflops_per_gpu: float = 0.0
    hardware_tflops_per_gpu: float = 0.0
    tokens_per_s_per_gpu: float = 0.0
    binding_constraint: str = ""
    """One sentence: what limits this plan (memory on stage 0, pipeline bubble, inter-node TP...)."""
    stage_times_s: list[float] = field(default_factory=list)
    """Forward+backward time of one microbatch per pipeline rank."""
    comm_bytes_per_step: dict[str, int] = field(default_factory=dict)
    """Data-parallel bytes on the wire per step and rank (ring volumes, meshplan/comm_bytes.py) by
    mesh axis ("dp_replicate", "dp_shard"), max over the ranks; `run --json` measures the same."""
    comm_bytes_band: dict[str, list[int]] = field(default_factory=dict)
    """Where a method's bytes vary between steps (Accordion): [low, high] per mesh axis, every step
    at the high-compression setting to every step at the low-compression one; a run's bytes per
    step land inside it, comm_bytes_per_step is the expected value within it."""
    dp_method_options: list[MethodOption] = field(default_factory=list)
    """Each pinned or allowed data-parallel method (and the default) priced on this plan's split."""


@dataclass(kw_only=True)
class Provenance:
    profile_hash: str = ""
    cluster_hash: str = ""
    meshplan_version: str = ""
    config: dict[str, Any] = field(default_factory=dict, metadata={"omit_empty": True})
    """The job file the plan's options came from (`--config`): {"path": ..., "table": its
    sections and keys as read}; absent when every option came from flags (meshplan/config.py)."""


@dataclass(kw_only=True)
class Rejection:
    """A family of candidates the search threw away, with the reason and its numbers."""

    family: str
    """E.g. "tp=16", "pp=2 tp=8 zero=0", "microbatch=8"."""
    reason: str
    """E.g. "OOM by 12.3 GiB on stage 0", "heads 12 not divisible by tp=8"."""
    count: int = 1
    """Candidates in this family rejected for this reason."""


@dataclass(kw_only=True)
class SearchSummary:
    """What the search looked at: attached to the best plan written by `meshplan plan -o`."""

    search_time_s: float
    num_candidates: int
    """Configurations enumerated (outer loop: degrees x microbatch x schedule x ZeRO x sp)."""
    num_evaluated: int
    """Candidates whose stage boundaries and recompute were solved and costed."""
    num_rejected: int
    alternatives: list[Plan] = field(default_factory=list)
    """The next-best plans (top-K), each with its full prediction; no nested search."""
    rejected: list[Rejection] = field(default_factory=list)


@dataclass(kw_only=True)
class Plan:
    schema_version: int = PLAN_SCHEMA_VERSION
    model_name: str
    """What the executor rebuilds: zoo name, file.py:factory, module:factory or hf:NAME."""
    model_config: dict[str, Any] = field(default_factory=dict)
    """Shape overrides the model was built with (the --set values, resolved)."""
    model_family: str = ""
    """The profile's model family (gpt, llama, bert, vit, moe, resnet, user, hf): exports take the
    architecture (norm, activation, position embedding, biases) from it; "" in plans written before it."""
    model_architecture: ModelArchitecture | None = field(default=None, metadata={"omit_empty": True})
    """The profile's architecture (kv heads, ffn, norm, activation, positions, biases, tied output), which
    the exports write (Megatron's flags, torchtitan's flavour); absent where the profile has none (then the
    exports take it from model_family, or say it is not recorded)."""
    model_num_params: int = 0
    """Unique parameters of the profiled model (tied weights once); `meshplan run` rebuilds the
    model from model_name + model_config and refuses it if the count differs (0: not checked)."""
    model_structure_hash: str = ""
    """The profile's structure_hash, checked like model_num_params before any rank starts ("": not checked)."""
    cluster_name: str
    world_size: int
    pipeline_parallel_degree: int = 1
    data_parallel_replicate_degree: int = 1
    """DDP / ZeRO-1 replicas (gradients all-reduced)."""
    data_parallel_shard_degree: int = 1
    """FSDP2 shards (ZeRO-2/3)."""
    context_parallel_degree: int = 1
    tensor_parallel_degree: int = 1
    zero_stage: int = 0
    """0 = DDP, 1 = sharded optimizer states, 2 = + sharded gradients, 3 = + sharded parameters."""
    dp_methods: DataParallelMethods = field(default_factory=DataParallelMethods)
    """Data-parallel methods per axis (gradient compression, sync, scheduling, offload, waves)."""
    sequence_parallel: bool = False
    precision: str = "bf16"
    """Training compute dtype: "bf16" (mixed precision, fp32 master weights), "fp8" (fp8 GEMMs,
    the rest bf16; not runnable by meshplan's executor) or "fp32"."""
    runtime: str = "meshplan"
    """The software the prediction is for (meshplan/runtimes.py): meshplan, torchtitan,
    megatron-lm, megatron-core, deepspeed or llm-foundry. Exports to another framework warn when it differs."""
    runtime_behaviours: dict[str, Any] = field(default_factory=dict)
    """The behaviours the prediction used: the runtime's defaults with any per-behaviour flag
    (state_layout, overlap_dp_comm, overlap_tp_comm, attention, uniform_stages, ...); exports turn
    them into the target's flags."""
    global_batch_size: int
    microbatch_size: int
    num_microbatches: int
    """Microbatches per optimizer step on each data-parallel replica (gradient accumulation)."""
    seq_len: int
    pipeline_schedule: str = "1F1B"
    virtual_stages: int = 1
    """Model chunks per pipeline rank (> 1 only for interleaved schedules)."""
    layers: list[str]
    """All layer FQNs of the model in execution order; stages must cover them exactly."""
    stages: list[list[str]]
    recompute: dict[str, str] = field(default_factory=dict)
    """Layer FQN -> "none" | "selective" | "full" (absent means "none")."""
    recompute_num_layers: int = 1
    """Megatron's `--recompute-method uniform --recompute-num-layers N` (--recompute full): blocks
    checkpointed in chunks of N consecutive layers (planner/uniform_recompute.py); 1 = each block."""
    rank_placement: str = "pp,dp_replicate,dp_shard,cp,tp"
    """Mesh axis order, outermost first: tp is innermost, so TP groups are consecutive ranks."""
    prediction: Prediction | None = None
    provenance: Provenance = field(default_factory=Provenance)
    search: SearchSummary | None = None
    """Present on plans chosen by `meshplan plan`; absent on `estimate` and on alternatives."""
    warnings: list[str] = field(default_factory=list, metadata={"omit_empty": True})
    """What the layout leaves undone that its degrees suggest, one line each (blocks without a
    tensor-parallel rule run whole on every TP rank); absent when there is none, so plans written
    before this field load unchanged."""

    @property
    def predicted(self) -> Prediction:
        """`prediction`, where only a predicted plan can be (the report's sections, validation)."""
        if self.prediction is None:
            raise ValueError("the plan has no prediction: make it with `meshplan plan` or `meshplan estimate`")
        return self.prediction

    @property
    def searched(self) -> SearchSummary:
        """`search`, where only a searched plan can be (the report's search sections)."""
        if self.search is None:
            raise ValueError("the plan has no search summary: make it with `meshplan plan`")
        return self.search

    @property
    def data_parallel_degree(self) -> int:
        return self.data_parallel_replicate_degree * self.data_parallel_shard_degree

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return (
            self.pipeline_parallel_degree,
            self.data_parallel_replicate_degree,
            self.data_parallel_shard_degree,
            self.context_parallel_degree,
            self.tensor_parallel_degree,
        )

    @staticmethod
    def precheck(data: dict, path: str = "") -> None:
        check_schema_version(data.get("schema_version"), f"{path}." if path else "")

    def validate(self, path: str = "") -> None:
        p = f"{path}." if path else ""
        check_schema_version(self.schema_version, p)
        degrees = dict(
            zip(
                (
                    "pipeline_parallel_degree",
                    "data_parallel_replicate_degree",
                    "data_parallel_shard_degree",
                    "context_parallel_degree",
                    "tensor_parallel_degree",
                ),
                self.mesh_shape,
            )
        )
        for name, value in degrees.items():
            check(value >= 1, f"{p}{name}", value, "degrees must be >= 1")
        check(self.world_size >= 1, f"{p}world_size", self.world_size, "must be >= 1")
        axes = [a.strip() for a in self.rank_placement.split(",")]
        check(
            sorted(axes) == sorted(MESH_AXES),
            f"{p}rank_placement",
            self.rank_placement,
            f"must order all of {','.join(MESH_AXES)} exactly once (outermost first)",
        )
        product = 1
        for value in self.mesh_shape:
            product *= value
        check(
            product == self.world_size,
            f"{p}world_size",
            self.world_size,
            f"the degrees multiply to {product} (pp x dp_replicate x dp_shard x cp x tp); "
            "make them multiply to the world size",
        )
        self._validate_training(p)
        self._validate_stages(p)

    def _validate_training(self, p: str) -> None:
        check(self.precision in ("bf16", "fp8", "fp32"), f"{p}precision", self.precision, 'use "bf16", "fp8" or "fp32"')
        from meshplan.runtimes import NAMES

        check(self.runtime in NAMES, f"{p}runtime", self.runtime, f"use one of {', '.join(NAMES)}")
        for name in ("global_batch_size", "microbatch_size", "num_microbatches", "seq_len", "virtual_stages"):
            check(getattr(self, name) >= 1, f"{p}{name}", getattr(self, name), "must be >= 1")
        expected = self.microbatch_size * self.num_microbatches * self.data_parallel_degree
        check(
            expected == self.global_batch_size,
            f"{p}global_batch_size",
            self.global_batch_size,
            f"must equal microbatch_size x num_microbatches x data-parallel degree = {expected}",
        )
        self.dp_methods.validate(f"{p}dp_methods")
        invalid = [
            r.text for r in feasibility.reasons(self.layout(), num_layers=len(self.layers)) if not r.runnable_only
        ]
        check(not invalid, f"{p}layout", self.layout_label(), invalid[0] if invalid else "")
        for layer, mode in self.recompute.items():
            check(mode in RECOMPUTE, f"{p}recompute.{layer}", mode, "use none, selective or full")
        check(self.recompute_num_layers >= 1, f"{p}recompute_num_layers", self.recompute_num_layers, "must be >= 1")

    def layout(self) -> feasibility.Layout:
        """The plan as the feasibility rules read it (meshplan/feasibility.py)."""
        return feasibility.Layout(
            pp=self.pipeline_parallel_degree,
            dp_replicate=self.data_parallel_replicate_degree,
            dp_shard=self.data_parallel_shard_degree,
            cp=self.context_parallel_degree,
            tp=self.tensor_parallel_degree,
            zero=self.zero_stage,
            microbatch=self.microbatch_size,
            num_microbatches=self.num_microbatches,
            schedule=self.pipeline_schedule,
            virtual_stages=self.virtual_stages,
            sequence_parallel=self.sequence_parallel,
            seq_len=self.seq_len,
            methods=tuple((axis, c.name) for axis, c in self.dp_methods.items()),
            method_params=tuple((axis, tuple(sorted(c.params.items()))) for axis, c in self.dp_methods.items()),
        )

    def layout_label(self) -> str:
        methods = " ".join(f"{a}={c.name}" for a, c in self.dp_methods.non_default())
        return (
            f"pp={self.pipeline_parallel_degree} dp_replicate={self.data_parallel_replicate_degree} "
            f"dp_shard={self.data_parallel_shard_degree} cp={self.context_parallel_degree} "
            f"tp={self.tensor_parallel_degree} zero={self.zero_stage} m={self.num_microbatches} "
            f"{self.pipeline_schedule}" + (f" {methods}" if methods else "")
        )

    def _validate_stages(self, p: str) -> None:
        want = self.pipeline_parallel_degree * self.virtual_stages
        check(
            len(self.stages) == want,
            f"{p}stages",
            f"{len(self.stages)} stages",
            f"need pipeline_parallel_degree x virtual_stages = {want} stage lists",
        )
        known = set(self.layers)
        flat = [fqn for stage in self.stages for fqn in stage]
        for i, stage in enumerate(self.stages):
            check(len(stage) >= 1, f"{p}stages[{i}]", stage, "every stage needs at least one layer")
            for fqn in stage:
                check(fqn in known, f"{p}stages[{i}]", fqn, "is not a layer of the model; see plan.layers")
        seen = set()
        for fqn in flat:
            check(fqn not in seen, f"{p}stages", fqn, "this layer is in two stages; list each layer once")
            seen.add(fqn)
        missing = [fqn for fqn in self.layers if fqn not in seen]
        check(not missing, f"{p}stages", missing[:1], "this layer is in no stage; every layer needs one")
        check(
            flat == self.layers,
            f"{p}stages",
            next((a for a, b in zip(flat, self.layers) if a != b), ""),
            "stages must hold contiguous layers in model order",
        )
        for layer in self.recompute:
            check(layer in known, f"{p}recompute", layer, "is not a layer of the model; see plan.layers")

    def stage_ranks(self) -> list[int]:
        """Pipeline rank that runs each stage (loop placement)."""
        return [s % self.pipeline_parallel_degree for s in range(len(self.stages))]

"""Runtimes: the software that will execute a plan, as the cost model prices it (docs/runtimes.md).

A runtime is a documented set of behaviours, one row per runtime, each behaviour with its value
and where the value comes from (a paper section, the framework's code or docs). Never a fitted
factor. Every behaviour is also a CLI flag of its own (`FLAGS`) that overrides the runtime's
default. A behaviour the model does not know for a runtime has `known=False`: the planner then
keeps its generic default and the CLI says so.

Torch-free: the planner, the CLI, the report and the exports read it.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from meshplan import dp_methods

NAMES = ("meshplan", "torchtitan", "megatron-lm", "megatron-core", "deepspeed", "llm-foundry")
DEFAULT = "meshplan"
PLANNED = "planned"
"""A behaviour value the search chooses per plan (fsdp_reduce_every_microbatch of meshplan's own
executor); the plan's runtime_behaviours record the choice."""


def grad_sync_matters(zero: int, state_shard: int, num_microbatches: int, pp: int) -> bool:
    """Whether ZeRO-2/3 reduce-scattering every microbatch differs from accumulating unsharded
    gradients to the last: sharded over more than one rank, gradient accumulation, no pipeline
    (torch pipelining always defers). The search's choice (Context.grad_sync_choices) and the plan's
    summary line (views.describe) read it."""
    return zero >= 2 and state_shard > 1 and num_microbatches > 1 and pp == 1


def unrun_axes(model_parallel, tp: int | None, pp: int | None, cp: int | None) -> list[str]:
    """The model-parallel axes of degree > 1 (None: 1) that a runtime whose behaviour
    `model_parallel` lists `model_parallel` does not run: the search rejects them, a pin warns."""
    return [a for a, d in (("tp", tp), ("pp", pp), ("cp", cp)) if (d or 1) > 1 and a not in model_parallel]


@dataclass(frozen=True, kw_only=True)
class Behaviour:
    value: object
    """What the cost model uses for this runtime (None: the generic default, see `known`)."""
    source: str
    """Where the value comes from: paper section, framework code path or documentation."""
    known: bool = True
    """False: the model does not know this runtime's behaviour; `value` is what it assumes (the generic
    default, unless `source` says why another)."""


@dataclass(frozen=True, kw_only=True)
class Runtime:
    name: str
    description: str
    behaviours: dict[str, Behaviour] = field(default_factory=dict)

    def value(self, behaviour: str):
        return self.behaviours[behaviour].value

    def unknown(self) -> list[str]:
        return [k for k, b in self.behaviours.items() if not b.known]


@dataclass(frozen=True, kw_only=True)
class StateLayout:
    """How a runtime keeps the training state and runs the loss: the `state_layout` behaviour's
    value names one of STATE_LAYOUTS, and the cost model reads these typed fields (through
    meshplan.planner.runtime_spec.RuntimeSpec), never the layout's name."""

    name: str
    weight_bytes: int
    """Bytes per parameter of the weights, unsharded."""
    grad_bytes: int
    """Bytes per parameter of the gradients, unsharded."""
    optimizer_bytes: int
    """Bytes per parameter of the optimizer states (and an fp32 master copy), unsharded."""
    optimizer_step_bytes: int
    """HBM bytes the optimizer step moves per parameter. Fused Adam reads weights, grads, m, v (16)
    and writes weights, m, v (12): 28. Megatron-LM also reads the fp32 main grads for the global-norm
    clip (4), zeroes them (4) and copies the fp32 master weights to the bf16 model (4 + 2): 42.
    torch's AdamW as meshplan's executor and torchtitan at 9dec370 build it (no fused=True, so the
    foreach implementation, torch/optim/adam.py _multi_tensor_adam) runs eight fp32 passes:
    weight decay on the weights (8), m lerp (12), v scale (8), v addcmul of the grad squared (16),
    sqrt, divide and eps add into a temporary (8 + 8 + 8), the weight addcdiv (16): 84, and the
    foreach global-norm clip reads the grads (4) and rescales them (8): 96. DeepSpeed's FusedAdam
    (reads 16-bit grads, writes 16-bit weights beside the fp32 master) is counted as fused: 28."""
    loss_passes: tuple[float, float]
    """(forward, backward) times the loss moves the head's fp32 logits through HBM, in fp32-logit
    sizes. Megatron-LM's vocab-parallel cross-entropy: cast from bf16 (read 1/2, write 1), max (1),
    subtract in place (2), exp in place (2), sum (1), divide in place (2); backward scales the saved
    softmax in place (2) and casts back (1.5). torch F.cross_entropy (meshplan's executor, and a
    DeepSpeed user's loss): cast (1.5), log_softmax's max, sum and write passes (4), nll (1);
    backward a dense nll gradient (1), log_softmax backward (2.5) and the cast back (1.5). With a
    128k vocabulary these passes are a tenth of a small model's step."""
    loss_transients: int
    """fp32 logit-sized tensors alive at the loss's peak besides the saved one (counted in a
    closed-form head's activation bytes; added for a captured head). Megatron-LM's vocab-parallel
    cross-entropy works in place on one fp32 copy: 1. torch F.cross_entropy(logits.float())
    (torchtitan, meshplan's executor, a DeepSpeed user's loss): backward of log_softmax holds its
    saved output, the incoming dense nll gradient and the gradient it writes: 2 beyond the saved one."""
    zero1_param_bytes: int
    """Bytes per parameter ZeRO-1 sends back to the replicas after the step: the weights as the
    replicas keep them (weight_bytes). bf16 under Megatron's distributed optimizer and DeepSpeed,
    whose step all-gathers the 16-bit partitions (zero/stage_1_and_2.py step and bf16_optimizer.py
    update_lp_params: all_gather_dp_groups of the bit16 groups); fp32 under
    ZeroRedundancyOptimizer's broadcast. An fp32 run sends fp32 (RuntimeSpec.zero1_param_bytes)."""
    fsdp_reduce_bytes: int
    """Bytes per element of the ZeRO-2/3 gradient reduce-scatter (and HSDP's all-reduce of the
    shards) where the runtime's fsdp_reduce_bytes behaviour does not give one; 0: the gather width.
    FSDP2 reduces in fp32 (torch: torchtitan's MixedPrecisionPolicy reduce_dtype =
    training.mixed_precision_reduce, whose only choice is "float32" in its config; meshplan's
    executor trains fp32 parameters); DeepSpeed reduces its 16-bit gradients (communication_data_type
    unset)."""
    replica_reduce_bytes: int
    """Bytes per element of the ZeRO-0/1 gradient all-reduce over the replicas (ZeRO-1's reduce-scatter
    under Megatron's distributed optimizer), uncompressed: each runtime reduces the gradients in the
    dtype it keeps them (grad_bytes). torch DDP reduces the fp32 parameters' gradients (meshplan's
    executor, torchtitan, Composer under autocast): 4; Megatron its fp32 main_grad buffer
    (--grad-reduce-in-bf16 off by default): 4; DeepSpeed casts every bucket to
    communication_data_type, unset = the model's fp16/bf16 (deepspeed/runtime/engine.py
    communication_data_type, allreduce_bucket; zero/stage_1_and_2.py allreduce_bucket), also where
    BF16_Optimizer or data_types.grad_accum_dtype keep fp32 gradients: 2. An fp32 run reduces fp32
    (grad_reduce_bytes)."""

    @property
    def state_bytes(self) -> tuple[int, int, int]:
        """(weights, grads, optimizer) bytes per parameter, unsharded."""
        return self.weight_bytes, self.grad_bytes, self.optimizer_bytes


TORCH_SCHEDULES = ("GPipe", "1F1B", "Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble")
"""torch.distributed.pipelining's schedules meshplan knows (meshplan/feasibility.py SCHEDULES)."""

DEEPSPEED_REDUCE_BUCKET_ELEMS = 500_000_000
"""DeepSpeed's default zero_optimization.reduce_bucket_size (deepspeed/runtime/zero/config.py)."""


def _layout(
    name: str,
    weights: int,
    grads: int,
    optimizer: int,
    step: int,
    *,
    megatron: bool = False,
    fp32_fsdp_reduce: bool = True,
) -> StateLayout:
    """One state layout (the field docs above say where each number comes from): `megatron` for
    Megatron-LM's vocab-parallel loss, torch F.cross_entropy's otherwise; `fp32_fsdp_reduce` for
    FSDP2's fp32 gradient reduce-scatter (False: the gather width, Megatron's and DeepSpeed's). How
    the engine exchanges ZeRO-1's gradients, regathers under sequence parallelism and sends a pipeline
    boundary is the runtime's (zero1_grad_collective, sp_regather, pp_scatter_gather), not the layout's."""
    return StateLayout(
        name=name,
        weight_bytes=weights,
        grad_bytes=grads,
        optimizer_bytes=optimizer,
        optimizer_step_bytes=step,
        loss_passes=(9.5, 3.5) if megatron else (6.5, 5.0),
        loss_transients=1 if megatron else 2,
        zero1_param_bytes=weights,
        fsdp_reduce_bytes=4 if fp32_fsdp_reduce else 0,
        replica_reduce_bytes=grads,
    )


STATE_LAYOUTS: dict[str, StateLayout] = {
    "torch": _layout("torch", 4, 4, 8, 96),
    "megatron": _layout("megatron", 2, 4, 12, 42, megatron=True, fp32_fsdp_reduce=False),
    "zero": _layout("zero", 2, 2, 12, 28, fp32_fsdp_reduce=False),
}
"""The state layouts (--state-layout): torch = fp32 weights, fp32 grads, Adam m, v (4 + 4 + 8 B;
AMP / FSDP2 mixed precision); megatron = bf16 weights, fp32 main grads, fp32 master + Adam
(2 + 4 + 12 B, Megatron-LM); zero = 16-bit weights and grads, fp32 master + Adam (2 + 2 + 12 B,
Rajbhandari et al. 2020 Sec 3.1, DeepSpeed). How a runtime's engine reduces them is its own
behaviour (zero0_reduce_after_backward, reduce_bucket_elems, zero1_gather_overlaps,
zero2_grad_collective, fsdp_full_grad_accumulation, ddp_bucket_copy, replica_sync_after_backward,
zero1_grad_collective), as are how its tensor-parallel layers regather under sequence parallelism
(sp_regather) and how it sends a pipeline boundary (pp_scatter_gather), whatever layout keeps them."""


def grad_reduce_bytes(behaviours: Mapping[str, object], precision: str, zero: int) -> int:
    """Bytes per element of the uncompressed gradient reduction that a plan's runtime behaviours and
    precision price at ZeRO stage `zero`, as the planner resolves them (RuntimeSpec.replica_reduce_bytes,
    RuntimeSpec.fsdp_reduce_bytes): ZeRO-0/1 the state layout's replica_reduce_bytes; ZeRO-2/3 the
    fsdp_reduce_bytes behaviour, else the layout's, else the gather width (fsdp_gather_bytes, else 2 in
    16 bits); 4 in an fp32 run. The DeepSpeed export writes communication_data_type from it."""
    floor = 4 if precision == "fp32" else 0
    layout = STATE_LAYOUTS[str(behaviours["state_layout"])]
    if zero <= 1:
        return max(layout.replica_reduce_bytes, floor)

    def given(key: str) -> int:  # a width the behaviours set; 0: none (not applicable)
        value = behaviours.get(key)
        return value if isinstance(value, int) else 0

    gather = max(given("fsdp_gather_bytes") or (2 if precision in ("bf16", "fp8") else 4), floor)
    return max(given("fsdp_reduce_bytes") or layout.fsdp_reduce_bytes or gather, floor)


LOSSES = ("cross_entropy", "fused")
"""The `loss` behaviour's values: cross_entropy runs the loss as the state layout says
(StateLayout.loss_passes and loss_transients: torch F.cross_entropy over fp32 logits, Megatron's
vocab-parallel cross-entropy); fused is a fused cross-entropy kernel over the head's bf16 logits
(flash-attn's Triton CrossEntropyLoss, which llm-foundry's MPT uses by default): no fp32 copy."""
FUSED_LOSS_PASSES = (0.5, 1.0)
"""(forward, backward) fp32-logit-sized HBM passes of a fused cross-entropy over bf16 logits:
forward reads them once (the row's log-sum-exp and loss), backward reads them again and writes
the bf16 gradient."""
FUSED_LOSS_HELD = 0.5
"""fp32-logit-sized bytes a fused cross-entropy holds at its peak beyond a captured head's saved
output: the bf16 gradient it writes (a closed-form head's saved fp32 logits already cover the
saved bf16 logits and that gradient)."""


def _count(text: str) -> int:
    """An element count a number flag takes: a whole number, 0 or more (argparse names the flag)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of elements") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is negative; give 0 or more elements")
    return value


@dataclass(frozen=True, kw_only=True)
class Flag:
    """A behaviour's own CLI flag (meshplan/options.py adds one argument per Flag of ROWS)."""

    name: str
    """The option string, e.g. "--state-layout"."""
    help: str
    choices: tuple[str, ...] = ()
    """Its values; () for an on/off flag (--x / --no-x)."""
    to_request: dict[str, object] | None = None
    """Flag value -> the PlanRequest field's value, where they differ (a dtype name -> its bytes)."""
    number: bool = False
    """The flag takes an integer (e.g. --zero3-prefetch-elems 50000000)."""

    @property
    def dest(self) -> str:
        """The parsed option's attribute name (argparse's)."""
        return self.name.lstrip("-").replace("-", "_")

    def argparse_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ArgumentParser.add_argument; default None: the runtime's value."""
        if self.choices:
            return {"choices": self.choices, "default": None, "help": self.help}
        if self.number:
            return {"type": _count, "default": None, "metavar": "N", "help": self.help}
        return {"action": argparse.BooleanOptionalAction, "default": None, "help": self.help}

    def request_value(self, given: object) -> object:
        """The PlanRequest value of a parsed flag value (None: not given)."""
        if given is None or self.to_request is None:
            return given
        return self.to_request.get(str(given))

    def cli_words(self, value: object) -> list[str]:
        """The command-line words that set the PlanRequest `value` (request_value's inverse)."""
        if isinstance(value, bool):
            return [self.name if value else f"--no-{self.name[2:]}"]
        if self.to_request is not None:
            value = next((given for given, v in self.to_request.items() if v == value), value)
        return [self.name, str(value)]


@dataclass(frozen=True, kw_only=True)
class Row:
    """One behaviour: what it means, how the CLI sets it, whether the PlanRequest carries it. Each
    runtime of RUNTIMES gives its value and source; the planner reads it through its RuntimeSpec."""

    name: str
    meaning: str
    flags: str
    """How the CLI sets it (the table's flag column)."""
    request: bool = True
    """A PlanRequest field of the same name (dropout builds the profile, fp8 is a check and the
    method lists narrow the search's axes)."""
    flag: Flag | None = None
    """The behaviour's own flag, if it has one."""


def _bool_flag(name: str, help: str) -> Flag:
    return Flag(name=name, help=help)


ROWS: tuple[Row, ...] = (
    Row(
        name="state_layout",
        meaning="training state bytes per parameter, unsharded (weights + grads + optimizer)",
        flags="--state-layout",
        flag=Flag(
            name="--state-layout",
            choices=tuple(STATE_LAYOUTS),
            help="training state per parameter: "
            + ", ".join(
                f"{s.name} {s.weight_bytes}+{s.grad_bytes}+{s.optimizer_bytes} B" for s in STATE_LAYOUTS.values()
            ),
        ),
    ),
    Row(
        name="overlap_dp_comm",
        meaning="gradient reduction overlapped with backward (all but the last bucket)",
        flags="--overlap-dp-comm / --no-overlap-dp-comm",
        flag=_bool_flag("--overlap-dp-comm", "overlap the gradient reduction with backward"),
    ),
    Row(
        name="overlap_tp_comm",
        meaning="tensor-parallel collectives overlapped with GEMMs",
        flags="--overlap-tp-comm / --no-overlap-tp-comm",
        flag=_bool_flag(
            "--overlap-tp-comm", "overlap tensor-parallel collectives with GEMMs (Megatron-Core --tp-comm-overlap)"
        ),
    ),
    Row(
        name="attention",
        meaning="attention kernel: flash (keeps the log-sum-exp) or materialized (keeps the s x s scores)",
        flags="--attention",
        flag=Flag(
            name="--attention",
            choices=("flash", "materialized"),
            help="attention kernel: flash keeps the log-sum-exp, materialized the s x s scores",
        ),
    ),
    Row(
        name="dropout",
        meaning="dropout masks kept for backward (GPT blocks, closed-form or captured)",
        flags="--dropout / --no-dropout",
        request=False,
        flag=_bool_flag(
            "--dropout",
            "dropout masks kept for backward (GPT blocks; default: the runtime's, e.g. on under megatron-lm)",
        ),
    ),
    Row(
        name="uniform_stages",
        meaning="blocks split evenly over the pipeline stages (else boundaries are searched)",
        flags="--uniform-stages / --no-uniform-stages",
        flag=_bool_flag(
            "--uniform-stages", "split blocks evenly over pipeline stages (Megatron) instead of searching boundaries"
        ),
    ),
    Row(
        name="zero_stages",
        meaning="ZeRO / FSDP stages the runtime implements (the search tries only these)",
        flags="--zero (pins one)",
    ),
    Row(
        name="pipeline_zero_stages",
        meaning="ZeRO / FSDP stages the runtime runs beside pipeline parallelism (the search tries only these "
        "with pp > 1)",
        flags="--zero (pins one; a warning where the runtime refuses it)",
    ),
    Row(
        name="pipeline_schedules",
        meaning="pipeline schedules the runtime runs (the search tries only these)",
        flags="--schedule (pins one; a warning where the runtime has no such schedule)",
    ),
    Row(
        name="sequence_parallel_modes",
        meaning="sequence parallelism beside tensor parallelism the runtime runs, off and on (the search tries "
        "only these)",
        flags="--sequence-parallel / --no-sequence-parallel (pins one; a warning where the runtime has no such mode)",
    ),
    Row(
        name="ddp_beside_model_parallel",
        meaning="ZeRO-0 replicas (DDP) run beside tensor, pipeline or context parallelism (else the search "
        "tries ZeRO-0 on pure data parallelism only)",
        flags="--zero 0 (pins it; a warning where the runtime refuses it)",
    ),
    Row(
        name="hybrid_shard",
        meaning="ZeRO-2/3 sharded over part of the data-parallel group and replicated over the rest (HSDP: "
        "dp_replicate x dp_shard); else the search shards over every data-parallel rank",
        flags="--dp-shard (pins it)",
    ),
    Row(
        name="fsdp_gather_bytes",
        meaning="bytes per element of the ZeRO-2/3 parameter all-gather (and of the gradient reduce-scatter "
        "where fsdp_reduce_bytes does not say otherwise)",
        flags="--fsdp-gather-dtype",
        flag=Flag(
            name="--fsdp-gather-dtype",
            choices=("bf16", "fp32"),
            help="dtype of ZeRO-3/FSDP parameter all-gathers (FSDP MixedPrecision param_dtype)",
            to_request={"bf16": 2, "fp32": 4},
        ),
    ),
    Row(
        name="fsdp_reduce_bytes",
        meaning="bytes per element of the ZeRO-2/3 gradient reduce-scatter and HSDP's replica all-reduce "
        "(FSDP MixedPrecision reduce_dtype)",
        flags="--fsdp-reduce-dtype",
        flag=Flag(
            name="--fsdp-reduce-dtype",
            choices=("bf16", "fp32"),
            help="dtype of ZeRO-2/3/FSDP gradient reduce-scatters (FSDP MixedPrecision reduce_dtype; "
            "Composer's mixed_precision PURE: bf16, DEFAULT: fp32)",
            to_request={"bf16": 2, "fp32": 4},
        ),
    ),
    Row(
        name="fsdp_unit_buffers",
        meaning="what a ZeRO-3 unit holds at its backward peak: fsdp2 = its parameters and gradients, the "
        "next unit's prefetched parameters and a reduce-scatter input copy; backward_pre = FSDP1 "
        "BACKWARD_PRE (the same, the copy only where the reduce dtype differs); backward_post = FSDP1 "
        "BACKWARD_POST (the unit's parameters freed before the next unit is gathered)",
        flags="--fsdp-unit-buffers",
        flag=Flag(
            name="--fsdp-unit-buffers",
            choices=("fsdp2", "backward_pre", "backward_post"),
            help="ZeRO-3 buffers live at a unit's backward peak: fsdp2 (FSDP2 fully_shard), backward_pre or "
            "backward_post (FSDP1's backward_prefetch, e.g. Composer's default BACKWARD_POST)",
        ),
    ),
    Row(name="fp8", meaning="fp8 GEMMs available (--precision fp8)", flags="--precision fp8", request=False),
    Row(
        name="sp_regather",
        meaning="sequence parallel re-gathers the layer input in backward (else keeps it gathered)",
        flags="--sp-regather / --no-sp-regather",
        flag=_bool_flag(
            "--sp-regather",
            "sequence parallelism all-gathers each column-parallel linear's input again in backward (Megatron's "
            "linears, also a Megatron-DeepSpeed model's) instead of keeping it gathered (DTensor SP)",
        ),
    ),
    Row(
        name="selective_recompute",
        meaning="what --recompute selective recomputes",
        flags="(--runtime; --recompute selective)",
    ),
    Row(
        name="recompute_assignments",
        meaning="which recompute assignments over the blocks the runtime runs: any mode per block, one mode on "
        "every block, one granularity (selective on every block, or full on some and none on the rest), or any "
        "mode per block without a pipeline and one mode on every block with one",
        flags="--recompute-assignments",
        flag=Flag(
            name="--recompute-assignments",
            choices=("per-layer", "uniform", "granularity", "interval"),
            help="per-layer: the search picks none/selective/full per layer; uniform: one mode on every block "
            "(and none elsewhere), as torchtitan's activation checkpointing runs; granularity: selective on every "
            "block or full on some of them, as Megatron's --recompute-granularity runs; interval: per-layer with "
            "pp 1, uniform with pp > 1, as DeepSpeed's PipelineModule checkpoints every layer "
            "(activation_checkpoint_interval)",
            to_request={
                "per-layer": "per_layer",
                "uniform": "uniform",
                "granularity": "granularity",
                "interval": "interval",
            },
        ),
    ),
    Row(
        name="elementwise",
        meaning="memory-bound ops (norms, rotary, SwiGLU, GQA repeat): fused kernels, torch.compile, or eager ops",
        flags="--elementwise, --compile",
        flag=Flag(
            name="--elementwise",
            choices=("fused", "compiled", "eager"),
            help="how norms, rotary, SwiGLU and the GQA repeat run: fused kernels (Megatron, Transformer Engine), "
            "torch.compile, or eager torch ops, which move more bytes (closed-form models)",
        ),
    ),
    Row(
        name="loss",
        meaning="the loss kernel: cross_entropy as the state layout runs it (torch's over fp32 logits, "
        "Megatron's vocab-parallel), or a fused cross-entropy over the bf16 logits (no fp32 copy)",
        flags="--loss",
        flag=Flag(
            name="--loss",
            choices=LOSSES,
            help="cross_entropy: the runtime's cross-entropy over fp32 logits (three fp32 logit-sized "
            "tensors at its peak under torch); fused: a fused kernel over the bf16 logits (flash-attn's "
            "CrossEntropyLoss, llm-foundry's MPT default), no fp32 copy",
        ),
    ),
    Row(
        name="fused_projections",
        meaning="Q, K, V in one GEMM and the MLP's gate and up in one (else one GEMM per projection)",
        flags="--fused-projections / --no-fused-projections",
        flag=_bool_flag(
            "--fused-projections",
            "Q, K, V as one GEMM and the MLP's gate and up as one (Megatron), instead of one GEMM per "
            "projection (torchtitan, torch models): smaller GEMMs run less efficiently (closed-form models)",
        ),
    ),
    Row(
        name="zero3_prefetch_elems",
        meaning="ZeRO-3 parameter elements fetched ahead of use (0: the next layer whole); a layer's gathers "
        "beyond it are not hidden",
        flags="--zero3-prefetch-elems",
        flag=Flag(
            name="--zero3-prefetch-elems",
            number=True,
            help="ZeRO-3 parameter elements fetched ahead of use (DeepSpeed's stage3_prefetch_bucket_size, "
            "default 5e7); a layer's gathers beyond it wait on the critical path. 0: the next layer whole (FSDP2)",
        ),
    ),
    Row(
        name="zero3_gather",
        meaning="ZeRO-3 parameter all-gathers: one per layer, reused by its recompute (layer), or one per "
        "submodule holding parameters, again for the recompute (module)",
        flags="--zero3-gather",
        flag=Flag(
            name="--zero3-gather",
            choices=("layer", "module"),
            help="ZeRO-3 parameter all-gathers: layer = one per wrapped layer, the recompute reuses it (FSDP2); "
            "module = one per submodule with parameters, in forward, recompute and backward (DeepSpeed)",
        ),
    ),
    Row(
        name="zero0_reduce_after_backward",
        meaning="without ZeRO the gradients are all-reduced once backward is over, none of it overlapped, "
        "whatever overlap_dp_comm says (else DDP-style buckets reduce while backward runs)",
        flags="(--runtime)",
    ),
    Row(
        name="pipeline_reduce_after_backward",
        meaning="under pipeline parallelism the ZeRO-0/1 gradients are all-reduced once the schedule's last "
        "backward is over, none of it overlapped (else they reduce during the last microbatch's backward)",
        flags="(--runtime)",
    ),
    Row(
        name="reduce_bucket_elems",
        meaning="gradient elements the ZeRO optimizer collects before it reduces them: at ZeRO-1 and ZeRO-2 what "
        "has not filled a bucket when backward ends is reduced after it, exposed; ZeRO-3 holds one bucket of "
        "16-bit gradients (0: DDP's bucket cap, FSDP2's per-layer reduce-scatter)",
        flags="--reduce-bucket-elems",
        flag=Flag(
            name="--reduce-bucket-elems",
            number=True,
            help="gradient elements the ZeRO optimizer reduces at a time (DeepSpeed's "
            "zero_optimization.reduce_bucket_size, default 5e8; the DeepSpeed export writes another value): "
            "at ZeRO-1/2 the unfilled remainder waits for backward's end, ZeRO-3 holds one bucket. 0: DDP's bucket "
            "cap",
        ),
    ),
    Row(
        name="zero1_grad_collective",
        meaning="ZeRO-1's gradient exchange over the replicas: all_reduce (each rank then steps its partition), "
        "or reduce_scatter (each rank receives its partition's sum; the updated weights all-gathered after)",
        flags="--zero1-grad-collective",
        flag=Flag(
            name="--zero1-grad-collective",
            choices=("all_reduce", "reduce_scatter"),
            help="ZeRO-1's gradient exchange: all_reduce (torch ZeroRedundancyOptimizer, DeepSpeed) or "
            "reduce_scatter (Megatron's distributed optimizer, which all-gathers the updated weights)",
        ),
    ),
    Row(
        name="zero1_gather_overlaps",
        meaning="ZeRO-1's updated weights go back to the replicas under the next forward (else synchronously "
        "after the optimizer step, exposed whole)",
        flags="(--runtime)",
    ),
    Row(
        name="zero2_shards_weights",
        meaning="ZeRO-2 shards the weights too, the gathered copy kept from forward to backward (FSDP2's "
        "reshard_after_forward false); else each rank keeps the whole 16-bit weights and gathers the updated "
        "partitions once after the step",
        flags="(--runtime)",
    ),
    Row(
        name="zero2_grad_collective",
        meaning="ZeRO-2's gradient collective over the shard group: reduce_scatter, or all_reduce of whole "
        "buckets, each rank keeping its partition (twice a reduce-scatter's bytes); ZeRO-3 reduce-scatters",
        flags="--zero2-grad-collective",
        flag=Flag(
            name="--zero2-grad-collective",
            choices=("reduce_scatter", "all_reduce"),
            help="ZeRO-2's gradient collective: reduce_scatter (FSDP2; DeepSpeed with "
            "use_multi_rank_bucket_allreduce false, which the DeepSpeed export then writes) or all_reduce of "
            "whole buckets (DeepSpeed's default)",
        ),
    ),
    Row(
        name="fsdp_reduce_every_microbatch",
        meaning="ZeRO-2/3 reduce-scatter each microbatch's gradients into the shards (else unsharded fp32 "
        "gradients accumulate until the last microbatch, then one reduce-scatter; planned: the search picks "
        "per plan); under torch pipelining always the latter",
        flags="(--runtime)",
    ),
    Row(
        name="fsdp_full_grad_accumulation",
        meaning="ZeRO-2/3 gradients of all microbatches but the last may accumulate unsharded in fp32 before one "
        "reduce-scatter (FSDP2's set_requires_gradient_sync(False); where fsdp_reduce_every_microbatch is off, "
        "and under torch pipelining); else the engine reduce-scatters every microbatch into the shards",
        flags="(--runtime)",
    ),
    Row(
        name="ddp_bucket_copy",
        meaning="ZeRO-0/1 replicas keep a second fp32 copy of the gradients in DDP's buckets (4 B per parameter); "
        "else the engine's gradient buffer is the gradients",
        flags="(--runtime)",
    ),
    Row(
        name="replica_sync_after_backward",
        meaning="ZeRO-0/1 replicas DDP cannot wrap (tensor-parallel DTensors, a split-backward schedule's stages) "
        "all-reduce their gradients after backward, none of it hidden; else they reduce during backward as "
        "any replica",
        flags="(--runtime)",
    ),
    Row(
        name="cp_kv_exchange",
        meaning="how context parallelism moves K and V: ring = each step's block sent on while that step "
        "computes, at the model's kv_heads; all_gather = every rank's K and V gathered at the first step, "
        "waited for at the second, at the width the attention kernel takes them",
        flags="--cp-kv-exchange",
        flag=Flag(
            name="--cp-kv-exchange",
            choices=("ring", "all_gather"),
            help="context parallel K/V exchange: ring (p2p per step, GQA K/V as they are; Megatron-Core / "
            "Transformer Engine) or all_gather (torch context_parallel's default rotate method: gathered at the "
            "first step, overlapping only it, at the width SDPA gets them)",
        ),
    ),
    Row(
        name="model_source",
        meaning="runtime: the runtime builds its own model of the profiled shape (a standard block is priced as "
        "its closed form); user: the profiled module runs",
        flags="(--runtime)",
        request=False,
    ),
    Row(
        name="pp_scatter_gather",
        meaning="without sequence parallelism a pipeline boundary goes as 1/t from each tensor-parallel rank and "
        "is all-gathered on the receiving stage's node (else every tensor-parallel rank sends the whole replica)",
        flags="--pp-scatter-gather / --no-pp-scatter-gather",
        flag=_bool_flag(
            "--pp-scatter-gather",
            "without sequence parallelism a pipeline boundary goes as 1/t from each tensor-parallel rank and is "
            "all-gathered by the receiver (Megatron-LM; DeepSpeed's pipe_partitioned, its default) instead of "
            "the whole replica from every tensor-parallel rank (torch pipelining)",
        ),
    ),
    Row(
        name="free_stage_outputs",
        meaning="a pipeline stage frees each microbatch's output once sent (else holds it until its backward)",
        flags="--free-stage-outputs / --no-free-stage-outputs",
        flag=_bool_flag(
            "--free-stage-outputs",
            "a pipeline stage frees each microbatch's output once sent (Megatron) instead of holding it "
            "until its backward (torch pipelining, DeepSpeed)",
        ),
    ),
    Row(
        name="offload_methods",
        meaning="state offload the runtime implements (the search falls back only to these when nothing fits)",
        flags="--offload (pins one)",
    ),
    Row(
        name="compression_methods",
        meaning="gradient compression the runtime implements (--allow-compression keeps only these)",
        flags="--compression (pins one), --allow-compression",
        request=False,
    ),
    Row(
        name="sync_methods",
        meaning="replica synchronisation the runtime implements (--allow-sync keeps only these)",
        flags="--sync (pins one), --allow-sync",
        request=False,
    ),
    Row(
        name="model_parallel",
        meaning="the model-parallel axes the runtime runs beside data parallelism (tp, pp, cp); the search "
        "offers no other",
        flags="(--runtime)",
    ),
    Row(
        name="also_runs",
        meaning="valid layouts meshplan's executor refuses that this runtime runs (the search offers them)",
        flags="(--runtime; --cp, --schedule 1f1b)",
    ),
)
"""Every behaviour, in the table's order: BEHAVIOURS, FLAGS, REQUEST_FIELDS and the CLI's behaviour
flags are read from here."""

BEHAVIOURS = {row.name: row.meaning for row in ROWS}
"""Behaviour name -> what it means (the runtime table's rows, docs/runtimes.md)."""
FLAGS = {row.name: row.flags for row in ROWS}
"""Behaviour name -> how the CLI sets it."""
BEHAVIOUR_FLAGS = tuple(row.flag for row in ROWS if row.flag is not None)
"""The behaviours' own flags, in the table's order (meshplan/options.py adds them)."""
BEHAVIOUR_DESTS = tuple(flag.dest for flag in BEHAVIOUR_FLAGS)
"""Their parsed values' names (--state-layout: state_layout; --compile sets elementwise too)."""


def flag_overrides(given: Mapping[str, object]) -> dict[str, object]:
    """PlanRequest behaviour values the parsed flags give (their values by dest, as
    inputs.PlanOptions.behaviours holds them); None where a flag is not given."""
    return {
        row.name: row.flag.request_value(given.get(row.flag.dest))
        for row in ROWS
        if row.request and row.flag is not None
    }


_KORTH = "Korthikanti et al. 2022"
_SP = Behaviour(value=True, source=f"{_KORTH} Sec 4.2.2 (Megatron's LinearWithGradAccumulationAndAsyncCommunication)")
_SP_DTENSOR = Behaviour(
    value=False,
    source=(
        "DTensor SP (SequenceParallel and ColwiseParallel's input layouts) keeps the gathered input that "
        "autograd saved for backward: no second gather (the kept input's memory is not counted)"
    ),
)
_TORCH_PP_SENDS = Behaviour(
    value=False,
    source="torch.distributed.pipelining: each tensor-parallel rank of a stage sends its whole output to its "
    "peer of the next stage (_PipelineStageBase get_fwd_send_ops), no split and no gather",
)
_FSDP2_PREFETCH = Behaviour(
    value=0, source="FSDP2 fully_shard: the next layer's all-gather issued ahead (implicit prefetch)"
)
_FSDP2_BUFFERS = Behaviour(
    value="fsdp2",
    source="FSDP2 fully_shard: pre_backward prefetches the next unit; foreach_reduce copies the gradients "
    "into a reduce-scatter input (torch/distributed/fsdp/_fully_shard)",
)
_FSDP2_GATHER = Behaviour(
    value="layer",
    source="FSDP2 fully_shard per block: one all-gather per block; under activation checkpointing the "
    "pre-backward unshard already holds it when the recompute runs",
)
_SEL = Behaviour(value="attention core", source=f"{_KORTH} Sec 5 (selective activation recomputation)")
_ALLREDUCE_ONLY = Behaviour(value=("allreduce",), source="synchronous data parallelism only")
_HOLD_OUTPUTS = Behaviour(
    value=False,
    source=(
        "torch.distributed.pipelining: _PipelineStageBase.forward_one_chunk keeps each microbatch's stage "
        "outputs (and inputs) in fwd_cache until backward_one_chunk"
    ),
)

RUNTIMES: dict[str, Runtime] = {
    "meshplan": Runtime(
        name="meshplan",
        description=(
            "this project's executor on stock torch: DDP/FSDP2 overlap, SDPA (flash) attention, DTensor "
            "TP/SP, torch.distributed.pipelining stages from the plan's FQN lists"
        ),
        behaviours={
            "state_layout": Behaviour(
                value="torch",
                source="executor: bf16 autocast over fp32 parameters, fp32 grads, AdamW m, v (4 + 4 + 8 B)",
            ),
            "overlap_dp_comm": Behaviour(
                value=True, source="torch DDP bucketed all-reduce during backward; FSDP2 prefetch"
            ),
            "overlap_tp_comm": Behaviour(value=False, source="executor: DTensor parallelize_module, no async TP"),
            "attention": Behaviour(value="flash", source="models/zoo: F.scaled_dot_product_attention"),
            "dropout": Behaviour(value=False, source="models/zoo/gpt.py: no dropout"),
            "uniform_stages": Behaviour(value=False, source="executor: stage boundaries are the plan's FQN lists"),
            "recompute_assignments": Behaviour(
                value="per_layer", source="executor: checkpoint_wrapper per layer, from the plan's recompute map"
            ),
            "zero_stages": Behaviour(
                value=(0, 1, 2, 3), source="executor: DDP, ZeroRedundancyOptimizer, FSDP2 fully_shard"
            ),
            "pipeline_zero_stages": Behaviour(
                value=(0, 1, 2, 3),
                source="executor: DDP, ZeroRedundancyOptimizer or FSDP2 on each pipeline stage's module",
            ),
            "pipeline_schedules": Behaviour(value=TORCH_SCHEDULES, source="executor: torch.distributed.pipelining"),
            "sequence_parallel_modes": Behaviour(
                value=(False, True), source="executor: DTensor SequenceParallel on the norms, or replicated norms"
            ),
            "ddp_beside_model_parallel": Behaviour(
                value=True,
                source="executor: DDP on each pipeline stage; tensor-parallel replicas through ReplicaGradReducer",
            ),
            "hybrid_shard": Behaviour(
                value=True,
                source="executor: fully_shard on a 2-D (dp_replicate, dp_shard) mesh, HSDP (executor/parallelize.py)",
            ),
            "fsdp_gather_bytes": Behaviour(
                value=4, source="executor: autocast without an FSDP2 MixedPrecisionPolicy gathers the fp32 parameters"
            ),
            "fsdp_reduce_bytes": Behaviour(
                value=4, source="executor: no FSDP2 MixedPrecisionPolicy, the fp32 gradients reduce-scattered"
            ),
            "fsdp_unit_buffers": _FSDP2_BUFFERS,
            "fp8": Behaviour(value=False, source="executor: no fp8 path"),
            "sp_regather": _SP_DTENSOR,
            "selective_recompute": Behaviour(
                value="attention core",
                known=False,
                source=("executor: checkpoint of the attention core; with SDPA it frees only the log-sum-exp"),
            ),
            "elementwise": Behaviour(
                value="eager",
                source="models/zoo: nn.RMSNorm, rotary, SwiGLU and repeat_interleave as torch ops; no torch.compile",
            ),
            "loss": Behaviour(
                value="cross_entropy",
                source="models/zoo/base.py loss: nn.functional.cross_entropy on the head's logits; autocast runs it in fp32",
            ),
            "fused_projections": Behaviour(
                value=False, source="models/zoo: wq, wk, wv and w1, w3 are separate nn.Linear"
            ),
            "zero3_prefetch_elems": _FSDP2_PREFETCH,
            "fsdp_reduce_every_microbatch": Behaviour(
                value=PLANNED,
                source="executor/parallelize.py: chosen per plan without a pipeline: set_requires_gradient_sync(False) "
                "on every microbatch but the last (unsharded fp32 gradients, one reduce-scatter) where that fits, "
                "else sync on (each backward reduce-scatters into the shards); under PP always the former",
            ),
            "zero3_gather": _FSDP2_GATHER,
            "zero0_reduce_after_backward": Behaviour(
                value=False, source="executor: DDP's buckets all-reduce as backward fills them (overlap_dp_comm)"
            ),
            "pipeline_reduce_after_backward": Behaviour(
                value=False,
                source="executor: torch.distributed.pipelining runs the last microbatch's backward with DDP's sync "
                "on (stage.py backward_maybe_with_nosync), its buckets reducing during it",
            ),
            "reduce_bucket_elems": Behaviour(
                value=0, source="executor: ZeRO-1 reduces through DDP's buckets (bucket_cap_mb; the buckets method)"
            ),
            "zero1_grad_collective": Behaviour(
                value="all_reduce",
                source="executor: ZeroRedundancyOptimizer under DDP: the buckets all-reduce every gradient, then each "
                "rank steps its own partition and broadcasts it (torch/distributed/optim/zero_redundancy_optimizer.py)",
            ),
            "zero1_gather_overlaps": Behaviour(
                value=False,
                source="executor: ZeroRedundancyOptimizer.step broadcasts each rank's updated partition before it "
                "returns (_sync_params; no overlap_with_ddp), after backward and before the next forward",
            ),
            "zero2_shards_weights": Behaviour(
                value=True,
                source="executor: fully_shard(reshard_after_forward=False): sharded parameters, gathered per microbatch",
            ),
            "fsdp_full_grad_accumulation": Behaviour(
                value=True,
                source="executor: FSDP2 set_requires_gradient_sync(False) until the last microbatch where the plan accumulates (and always under torch pipelining)",
            ),
            "ddp_bucket_copy": Behaviour(
                value=True,
                source="executor: torch DDP (gradient_as_bucket_view false) allocates buckets for every gradient (Reducer::initialize_buckets)",
            ),
            "replica_sync_after_backward": Behaviour(
                value=True,
                source="executor: ReplicaGradReducer reduces TP (DTensor) replicas and split-backward stages once backward is over (executor/methods/allreduce.py)",
            ),
            "zero2_grad_collective": Behaviour(
                value="reduce_scatter", source="executor: FSDP2 (reshard_after_forward=False) reduce_scatter_tensor"
            ),
            "cp_kv_exchange": Behaviour(
                value="all_gather",
                source="torch.distributed.tensor.experimental context_parallel: _cp_options.rotate_method = "
                "ALL_GATHER (the default); the model repeats K and V to every head before SDPA (models/zoo Llama: repeat_interleave)",
            ),
            "model_source": Behaviour(value="user", source="executor: the profiled module itself, as built"),
            "pp_scatter_gather": _TORCH_PP_SENDS,
            "free_stage_outputs": _HOLD_OUTPUTS,
            "offload_methods": Behaviour(
                value=("none", "cpu", "nvme"),
                source="executor/methods/offload.py: host-resident states and step (ZeRO-Offload), NVMe spill",
            ),
            "compression_methods": Behaviour(
                value=tuple(dp_methods.names("compression")), source="executor/methods: every registry compressor"
            ),
            "sync_methods": Behaviour(
                value=tuple(dp_methods.names("sync")), source="executor/methods: every registry sync method"
            ),
            "model_parallel": Behaviour(
                value=("tp", "pp", "cp"),
                source="executor: DTensor TP/SP, torch.distributed.pipelining, torch context_parallel",
            ),
            "also_runs": Behaviour(value=(), source="meshplan/feasibility.py LIMITS: what this executor refuses"),
        },
    ),
    "torchtitan": Runtime(
        name="torchtitan",
        description=(
            "pytorch/torchtitan: FSDP2 + DTensor TP (async TP opt-in), SDPA/flex attention, float8 via torchao"
        ),
        behaviours={
            "state_layout": Behaviour(
                value="torch",
                source="torchtitan parallelize_llama: fp32 sharded parameters, "
                "MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)",
            ),
            "overlap_dp_comm": Behaviour(value=True, source="FSDP2 prefetch and reduce-scatter during backward"),
            "overlap_tp_comm": Behaviour(
                value=False,
                source="torchtitan JobConfig parallelism.enable_async_tensor_parallel "
                "defaults to false (needs torch.compile)",
            ),
            "attention": Behaviour(value="flash", source="torchtitan models: SDPA or flex attention"),
            "dropout": Behaviour(value=False, source="torchtitan Llama: no dropout"),
            "uniform_stages": Behaviour(
                value=False,
                source="torchtitan parallelism.pipeline_parallel_split_points (the export writes the plan's)",
            ),
            "recompute_assignments": Behaviour(
                value="uniform",
                source="torchtitan 0.3 activation_checkpoint: one mode (none, full, selective op) applied to every "
                "transformer block; 0.2's selective k (every k-th block full) is not searched",
            ),
            "zero_stages": Behaviour(
                value=(0, 2, 3),
                source="DDP (data_parallel_replicate) or FSDP2 (reshard_after_forward false / true); no ZeRO-1. "
                "Under PP its default fsdp_reshard_after_forward keeps parameters gathered: a default torchtitan "
                "PP run is --zero 2 (a ZeRO-3 plan exports 'always')",
            ),
            "pipeline_zero_stages": Behaviour(
                value=(0, 2, 3), source="parallelize_llama applies DDP or FSDP2 to each pipeline stage's model part"
            ),
            "pipeline_schedules": Behaviour(
                value=TORCH_SCHEDULES,
                source="parallelism.pipeline_parallel_schedule: a torch.distributed.pipelining schedule by name",
            ),
            "sequence_parallel_modes": Behaviour(
                value=(False, True),
                source="parallelism.enable_sequence_parallel (0.3; 0.2 always applies it with tensor parallelism)",
            ),
            "ddp_beside_model_parallel": Behaviour(
                value=False,
                source="torchtitan parallelize_llama: apply_ddp only on a 1-D mesh (it raises 'DDP has not "
                "supported > 1D parallelism' when TP, PP or CP is on); replicas beside them are HSDP (FSDP2)",
            ),
            "hybrid_shard": Behaviour(
                value=True,
                source="data_parallel_replicate_degree x data_parallel_shard_degree: FSDP2 on a 2-D mesh (HSDP)",
            ),
            "fsdp_gather_bytes": Behaviour(
                value=2, source="MixedPrecisionPolicy param_dtype=bfloat16 (training.mixed_precision_param)"
            ),
            "fsdp_reduce_bytes": Behaviour(
                value=4,
                source="MixedPrecisionPolicy reduce_dtype = training.mixed_precision_reduce, whose only choice is "
                "float32 (torchtitan config)",
            ),
            "fsdp_unit_buffers": _FSDP2_BUFFERS,
            "fp8": Behaviour(value=True, source="torchtitan docs/float8.md (model.converters = float8, torchao)"),
            "sp_regather": _SP_DTENSOR,
            "selective_recompute": Behaviour(
                value="op",
                source=(
                    "torchtitan activation_checkpoint mode=selective, selective_ac_option=op: _save_list (mm, SDPA) "
                    "saves every other matmul output and SDPA's, recomputes the rest (planner/sac.py); option k "
                    "(every k-th block fully) is per-layer full/none, planned by the recompute solver"
                ),
            ),
            "elementwise": Behaviour(
                value="eager",
                source="compile.enable defaults to false (torchtitan CompileConfig): RMSNorm, rotary, SwiGLU, "
                "repeat_kv run as torch ops; --compile for a compiled run (the export writes [compile] enable)",
            ),
            "loss": Behaviour(
                value="cross_entropy",
                source="train.py (9dec370) loss_fn: cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1))",
            ),
            "fused_projections": Behaviour(
                value=False, source="torchtitan models/llama3/model.py: Attention wq, wk, wv; FeedForward w1, w2, w3"
            ),
            "zero3_prefetch_elems": _FSDP2_PREFETCH,
            "fsdp_reduce_every_microbatch": Behaviour(
                value=True,
                source="train.py: gradient accumulation runs forward_backward_step per microbatch and leaves FSDP2's "
                "gradient sync on (only the chunked loss toggles it, for the lm_head), so every backward "
                "reduce-scatters; under PP, pipelining's backward_maybe_with_nosync defers to the last",
            ),
            "zero3_gather": _FSDP2_GATHER,
            "zero0_reduce_after_backward": Behaviour(
                value=False, source="replicate (DDP) buckets all-reduce as backward fills them"
            ),
            "pipeline_reduce_after_backward": Behaviour(
                value=False, source="not applicable: no DDP beside pipeline parallelism (FSDP2 or HSDP)"
            ),
            "reduce_bucket_elems": Behaviour(value=0, source="not applicable: no ZeRO-1; DDP's bucket cap"),
            "zero1_grad_collective": Behaviour(
                value="all_reduce", source="not applicable: no ZeRO-1 (replicate all-reduces, FSDP2 reduce-scatters)"
            ),
            "zero1_gather_overlaps": Behaviour(value=False, source="not applicable: no ZeRO-1"),
            "zero2_shards_weights": Behaviour(
                value=True,
                source="FSDP2 with reshard_after_forward false (fsdp_reshard_after_forward never / default under PP)",
            ),
            "fsdp_full_grad_accumulation": Behaviour(
                value=True,
                source="torch pipelining defers FSDP2's reduce-scatter to each stage's last backward; without PP fsdp_reduce_every_microbatch decides",
            ),
            "ddp_bucket_copy": Behaviour(
                value=True, source="torch DDP (replicate) buckets: Reducer::initialize_buckets"
            ),
            "replica_sync_after_backward": Behaviour(
                value=True, source="not applicable: DDP only on a 1-D mesh (apply_ddp), so no TP or pipelined replicas"
            ),
            "zero2_grad_collective": Behaviour(
                value="reduce_scatter", source="FSDP2 (reshard_after_forward false) reduce_scatter_tensor"
            ),
            "cp_kv_exchange": Behaviour(
                value="all_gather",
                source="torch.distributed.tensor.experimental context_parallel: _cp_options.rotate_method = "
                "ALL_GATHER (the default); the model repeats K and V to every head before SDPA (torchtitan models/llama3/model.py: repeat_kv)",
            ),
            "model_source": Behaviour(
                value="runtime",
                source="torchtitan builds its own model from the config (train_spec, models/llama3/model.py Transformer)",
            ),
            "pp_scatter_gather": _TORCH_PP_SENDS,
            "free_stage_outputs": _HOLD_OUTPUTS,
            "offload_methods": Behaviour(
                value=("none", "cpu"),
                source="training.enable_cpu_offload: FSDP2 CPUOffloadPolicy (states on the host, the step there)",
            ),
            "compression_methods": Behaviour(
                value=("none",), source="no gradient compression: FSDP2 reduce-scatter / replicate all-reduce"
            ),
            "sync_methods": _ALLREDUCE_ONLY,
            "model_parallel": Behaviour(
                value=("tp", "pp", "cp"),
                source="parallelism.tensor_parallel_degree, pipeline_parallel_degree, context_parallel_degree",
            ),
            "also_runs": Behaviour(
                value=("context_parallel",),
                source="parallelism.context_parallel_degree (torch context_parallel, ring attention); "
                "its pipeline schedules are torch.distributed.pipelining's, as meshplan's",
            ),
        },
    ),
    "megatron-lm": Runtime(
        name="megatron-lm",
        description=("Megatron-LM before Megatron-Core, as Narayanan et al. SC21 and Korthikanti et al. 2022 ran it"),
        behaviours={
            "state_layout": Behaviour(
                value="megatron",
                source=f"bf16 weights, fp32 main grads, fp32 master + Adam (2 + 4 + 12 B; {_KORTH} Fig. 1 memory)",
            ),
            "overlap_dp_comm": Behaviour(
                value=False, source=f"{_KORTH} Sec 6.3: no overlap of the gradient all-reduce"
            ),
            "overlap_tp_comm": Behaviour(
                value=False, source="Narayanan et al. 2021 Sec 4: TP all-reduces on the critical path"
            ),
            "attention": Behaviour(
                value="materialized", source=f"{_KORTH} Eq. 1: softmax output and its dropout stored"
            ),
            "dropout": Behaviour(
                value=True, source="megatron/arguments.py --attention-dropout 0.1 --hidden-dropout 0.1"
            ),
            "uniform_stages": Behaviour(value=True, source="Megatron-LM: num_layers divisible by pp x v, equal chunks"),
            "recompute_assignments": Behaviour(
                value="granularity",
                source="--recompute-granularity is one mode: selective recomputes every block's attention core, "
                "full the blocks --recompute-method picks (block: the first --recompute-num-layers of each stage); "
                "a mix of full blocks per rank the export cannot write as one N says so",
            ),
            "zero_stages": Behaviour(value=(0,), source="no distributed optimizer before 2022 (Narayanan 2021 Sec 5)"),
            "pipeline_zero_stages": Behaviour(value=(0,), source="no distributed optimizer before 2022"),
            "pipeline_schedules": Behaviour(
                value=("1F1B", "Interleaved1F1B"),
                source="megatron/schedules.py: forward_backward_pipelining_without_interleaving (1F1B) and "
                "_with_interleaving (virtual stages); no GPipe",
            ),
            "sequence_parallel_modes": Behaviour(
                value=(False, True), source="--sequence-parallel (Korthikanti et al. 2022 Sec 4.2.2), off by default"
            ),
            "ddp_beside_model_parallel": Behaviour(
                value=True, source="Megatron's DistributedDataParallel over the data-parallel group of any layout"
            ),
            "hybrid_shard": Behaviour(value=False, source="not applicable: no ZeRO-2/3"),
            "fsdp_gather_bytes": Behaviour(value=None, source="not applicable: no ZeRO-2/3"),
            "fsdp_reduce_bytes": Behaviour(value=None, source="not applicable: no ZeRO-2/3"),
            "fsdp_unit_buffers": Behaviour(value=None, source="not applicable: no ZeRO-2/3"),
            "fp8": Behaviour(value=False, source="no Transformer Engine before Megatron-Core"),
            "sp_regather": _SP,
            "selective_recompute": _SEL,
            "elementwise": Behaviour(
                value="fused",
                source="megatron/arguments.py --masked-softmax-fusion, --bias-gelu-fusion, --bias-dropout-fusion "
                "(on by default), apex FusedLayerNorm",
            ),
            "loss": Behaviour(
                value="cross_entropy",
                source="megatron/core/tensor_parallel/cross_entropy.py: vocab-parallel cross-entropy in fp32, in place",
            ),
            "fused_projections": Behaviour(
                value=True,
                source="megatron/model/transformer.py: ParallelAttention query_key_value, one ColumnParallelLinear",
            ),
            "zero3_prefetch_elems": Behaviour(value=0, source="not applicable: no ZeRO-3"),
            "fsdp_reduce_every_microbatch": Behaviour(value=None, source="not applicable: no ZeRO-2/3"),
            "zero3_gather": Behaviour(value="layer", source="not applicable: no ZeRO-3"),
            "zero0_reduce_after_backward": Behaviour(
                value=False, source="overlap_dp_comm says it: the 2021 all-reduce follows backward (no overlap)"
            ),
            "pipeline_reduce_after_backward": Behaviour(
                value=False, source="overlap_dp_comm says it: the 2021 all-reduce follows backward (no overlap)"
            ),
            "reduce_bucket_elems": Behaviour(value=0, source="not applicable: no ZeRO-1"),
            "zero1_grad_collective": Behaviour(
                value="reduce_scatter",
                source="not applicable to the 2021-22 runs (no distributed optimizer); the later "
                "--use-distributed-optimizer reduce-scatters the grad buffer to the optimizer shards and all-gathers "
                "the updated params (megatron/optimizer/distrib_optimizer.py reduce_model_grads, gather_model_params)",
            ),
            "zero1_gather_overlaps": Behaviour(value=False, source="not applicable: no ZeRO-1"),
            "zero2_shards_weights": Behaviour(
                value=True,
                source="not applicable: no ZeRO-2",
            ),
            "fsdp_full_grad_accumulation": Behaviour(value=False, source="not applicable: no ZeRO-2/3"),
            "ddp_bucket_copy": Behaviour(
                value=False, source="the contiguous grad buffer is the main grads (param_and_grad_buffer.py)"
            ),
            "replica_sync_after_backward": Behaviour(
                value=False, source="Megatron's DDP reduces TP parameters' grad buffer like any other (no DTensors)"
            ),
            "zero2_grad_collective": Behaviour(value="reduce_scatter", source="not applicable: no ZeRO-2"),
            "cp_kv_exchange": Behaviour(value="ring", source="not applicable: no context parallelism"),
            "model_source": Behaviour(
                value="runtime",
                source="pretrain_gpt.py model_provider: megatron.model.GPTModel from --num-layers, --hidden-size",
            ),
            "pp_scatter_gather": Behaviour(
                value=True,
                source="megatron/p2p_communication.py _communicate: with scatter_gather_tensors_in_pipeline (on unless "
                "--no-scatter-gather-tensors-in-pipeline) each TP rank sends a 1/t chunk "
                "(split_tensor_into_1d_equal_chunks), gathered on receipt (Narayanan et al. 2021 Sec 4.1)",
            ),
            "free_stage_outputs": Behaviour(
                value=True,
                known=False,
                source=(
                    "not known for the 2021-22 runs: megatron/schedules.py frees an output once sent only under "
                    "--deallocate-pipeline-outputs (2022, store_true, default False); taken as freed because the "
                    "SC21 1T run (pp 64, 1 layer per chunk) does not fit with its outputs held"
                ),
            ),
            "offload_methods": Behaviour(value=("none",), source="no optimizer offload in Megatron-LM"),
            "compression_methods": Behaviour(value=("none",), source="no gradient compression"),
            "sync_methods": _ALLREDUCE_ONLY,
            "model_parallel": Behaviour(
                value=("tp", "pp", "cp"),
                source="--tensor-model-parallel-size, --pipeline-model-parallel-size, --context-parallel-size (2023 on)",
            ),
            "also_runs": Behaviour(
                value=("1f1b_microbatches",),
                source="schedules.py forward_backward_pipelining_without_interleaving: min(p - rank - 1, m) "
                "warm-up microbatches, any m (the interleaved schedule asserts m % p == 0)",
            ),
        },
    ),
    "megatron-core": Runtime(
        name="megatron-core",
        description=(
            "Megatron-Core 2023+: distributed optimizer, --overlap-grad-reduce/--overlap-param-gather, "
            "Transformer Engine flash attention, --tp-comm-overlap"
        ),
        behaviours={
            "state_layout": Behaviour(
                value="megatron",
                source="megatron/core/distributed: bf16 params, fp32 grad "
                "buffer, fp32 main params + Adam in the (distributed) optimizer",
            ),
            "overlap_dp_comm": Behaviour(
                value=True,
                source="--overlap-grad-reduce --overlap-param-gather, as the "
                "Megatron-LM README's 2024 table runs (off by default in arguments.py)",
            ),
            "overlap_tp_comm": Behaviour(
                value=True,
                source="--tp-comm-overlap (Transformer Engine userbuffers), as the "
                "README's 2024 table runs; hides calibration.tp_overlap of TP time",
            ),
            "attention": Behaviour(
                value="flash", source="Transformer Engine fused/flash attention (--attention-backend)"
            ),
            "dropout": Behaviour(
                value=True, source="megatron/training/arguments.py --attention-dropout 0.1 --hidden-dropout 0.1"
            ),
            "uniform_stages": Behaviour(value=True, source="even split by default (uneven first/last stage is opt-in)"),
            "recompute_assignments": Behaviour(
                value="granularity",
                source="--recompute-granularity is one mode: selective recomputes every block's attention core, "
                "full the blocks --recompute-method picks (block: the first --recompute-num-layers of each stage); "
                "a mix of full blocks per rank the export cannot write as one N says so",
            ),
            "zero_stages": Behaviour(value=(0, 1), source="DDP or --use-distributed-optimizer (ZeRO-1 style)"),
            "pipeline_zero_stages": Behaviour(
                value=(0, 1), source="DDP or the distributed optimizer on every pipeline rank"
            ),
            "pipeline_schedules": Behaviour(
                value=("1F1B", "Interleaved1F1B"),
                source="megatron/core/pipeline_parallel/schedules.py get_forward_backward_func: 1F1B without, "
                "interleaved with virtual pipeline stages; no GPipe",
            ),
            "sequence_parallel_modes": Behaviour(
                value=(False, True), source="--sequence-parallel (TransformerConfig.sequence_parallel)"
            ),
            "ddp_beside_model_parallel": Behaviour(
                value=True, source="Megatron-Core's DistributedDataParallel over the data-parallel group of any layout"
            ),
            "hybrid_shard": Behaviour(value=False, source="not applicable: the search tries ZeRO-0/1 only"),
            "fsdp_gather_bytes": Behaviour(value=None, source="not applicable: the search tries ZeRO-0/1 only"),
            "fsdp_reduce_bytes": Behaviour(value=None, source="not applicable: the search tries ZeRO-0/1 only"),
            "fsdp_unit_buffers": Behaviour(value=None, source="not applicable: the search tries ZeRO-0/1 only"),
            "fp8": Behaviour(value=True, source="--fp8-format hybrid (Transformer Engine)"),
            "sp_regather": _SP,
            "selective_recompute": Behaviour(
                value="attention core", source="--recompute-granularity selective (core attention; Korthikanti Sec 5)"
            ),
            "elementwise": Behaviour(
                value="fused",
                source="Transformer Engine fused norms; --apply-rope-fusion, --bias-swiglu-fusion; GQA read "
                "natively by TE attention",
            ),
            "loss": Behaviour(
                value="cross_entropy",
                source="megatron/core/tensor_parallel/cross_entropy.py (--cross-entropy-loss-fusion off by default)",
            ),
            "fused_projections": Behaviour(
                value=True,
                source="megatron/core/transformer: linear_qkv; linear_fc1 holds gate and up (gated linear unit)",
            ),
            "zero3_prefetch_elems": Behaviour(value=0, source="not applicable: distributed optimizer (ZeRO-1) only"),
            "fsdp_reduce_every_microbatch": Behaviour(value=None, source="not applicable: no ZeRO-2/3"),
            "zero3_gather": Behaviour(value="layer", source="not applicable: no ZeRO-3"),
            "zero0_reduce_after_backward": Behaviour(
                value=False, source="--overlap-grad-reduce: the grad buffer's buckets reduce during backward"
            ),
            "pipeline_reduce_after_backward": Behaviour(
                value=False,
                source="--overlap-grad-reduce: each model chunk's buckets reduce during its last microbatch's "
                "backward (megatron/core/pipeline_parallel/schedules.py enables grad sync there)",
            ),
            "reduce_bucket_elems": Behaviour(value=0, source="--ddp-bucket-size (the buckets method); else DDP's cap"),
            "zero1_grad_collective": Behaviour(
                value="reduce_scatter",
                source="--use-distributed-optimizer: each grad-buffer bucket is reduce-scattered to the optimizer "
                "shards (megatron/core/distributed/param_and_grad_buffer.py start_grad_sync), the updated bf16 "
                "params all-gathered after",
            ),
            "zero1_gather_overlaps": Behaviour(
                value=True,
                source="--overlap-param-gather: the distributed optimizer's bf16 all-gather runs under the next "
                "forward (megatron/core/distributed/param_and_grad_buffer.py)",
            ),
            "zero2_shards_weights": Behaviour(
                value=True,
                source="not applicable: ZeRO-0/1 only",
            ),
            "fsdp_full_grad_accumulation": Behaviour(value=False, source="not applicable: no ZeRO-2/3"),
            "ddp_bucket_copy": Behaviour(
                value=False, source="the contiguous grad buffer is the main grads (param_and_grad_buffer.py)"
            ),
            "replica_sync_after_backward": Behaviour(
                value=False,
                source="the grad buffer's buckets reduce during backward for TP parameters too (--overlap-grad-reduce)",
            ),
            "zero2_grad_collective": Behaviour(value="reduce_scatter", source="not applicable: ZeRO-0/1 only"),
            "cp_kv_exchange": Behaviour(
                value="ring",
                source="Transformer Engine attention with --context-parallel-size: K/V blocks sent round the ring "
                "by p2p each step, overlapped with that step's attention, at num_query_groups",
            ),
            "model_source": Behaviour(
                value="runtime",
                source="pretrain_gpt.py model_provider: megatron.core.models.gpt.GPTModel with its transformer layer spec",
            ),
            "pp_scatter_gather": Behaviour(
                value=True,
                source="Megatron-LM's scatter/gather of the boundary (Narayanan et al. 2021 Sec 4.1), as the "
                "megatron-lm row; its runs take --sequence-parallel, whose boundary is split over t anyway",
            ),
            "free_stage_outputs": Behaviour(
                value=True,
                source=(
                    "megatron/core/pipeline_parallel/schedules.py deallocate_output_tensor; "
                    "core_transformer_config_from_args sets deallocate_pipeline_outputs = True"
                ),
            ),
            "offload_methods": Behaviour(
                value=("none", "cpu"),
                source="--optimizer-cpu-offload (HybridDeviceOptimizer: optimizer states and step on the host)",
            ),
            "compression_methods": Behaviour(
                value=("none",),
                source="no gradient compression (--grad-reduce-in-bf16 reduces in bf16; not priced as a compressor)",
            ),
            "sync_methods": _ALLREDUCE_ONLY,
            "model_parallel": Behaviour(
                value=("tp", "pp", "cp"),
                source="--tensor-model-parallel-size, --pipeline-model-parallel-size, --context-parallel-size",
            ),
            "also_runs": Behaviour(
                value=("context_parallel", "1f1b_microbatches"),
                source="--context-parallel-size (ring attention); the non-interleaved 1F1B runs any m",
            ),
        },
    ),
    "deepspeed": Runtime(
        name="deepspeed",
        description=("DeepSpeed: ZeRO-1/2/3 as DeepSpeed runs them, DeepSpeed pipeline engine"),
        behaviours={
            "state_layout": Behaviour(
                value="zero",
                source="Rajbhandari et al. 2020 Sec 3.1: fp16/bf16 weights and "
                "grads, fp32 master + Adam (2 + 2 + 12 B); ZeRO-0/1 all-reduce the gradients in that 16-bit "
                "dtype (deepspeed/runtime/engine.py communication_data_type unset: the model's; allreduce_bucket, "
                "zero/stage_1_and_2.py allreduce_bucket)",
            ),
            "overlap_dp_comm": Behaviour(
                value=True, source="zero_optimization.overlap_comm (the export writes the plan's value)"
            ),
            "overlap_tp_comm": Behaviour(value=False, source="DeepSpeed has no TP overlap of its own"),
            "attention": Behaviour(
                value="flash",
                known=False,
                source=("not known: DeepSpeed runs the user's module; the model's attention (SDPA: flash) is kept"),
            ),
            "dropout": Behaviour(value=False, known=False, source="not known: the user's module decides"),
            "uniform_stages": Behaviour(
                value=False,
                source="the export's pipeline_module() builds the PipelineModule on the plan's boundaries "
                "(its partition_method options balance layer or parameter counts, not time)",
            ),
            "recompute_assignments": Behaviour(
                value="interval",
                source="pp 1: deepspeed.checkpointing.checkpoint on the blocks the user's module wraps (the export's "
                "checkpoint_blocks wraps the plan's); pp > 1: PipelineModule's activation_checkpoint_interval "
                "checkpoints every layer (runtime/pipe/module.py forward)",
            ),
            "zero_stages": Behaviour(value=(0, 1, 2, 3), source="zero_optimization.stage 0-3"),
            "pipeline_zero_stages": Behaviour(
                value=(0, 1),
                source="runtime/pipe/engine.py PipelineEngine.__init__ asserts the ZeRO stage is below "
                "ZeroStageEnum.gradients ('ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism')",
            ),
            "pipeline_schedules": Behaviour(
                value=("1F1B",),
                source="runtime/pipe/schedule.py TrainSchedule: one forward and one backward in the steady state, "
                "one PipelineModule stage per rank",
            ),
            "sequence_parallel_modes": Behaviour(
                value=(False,),
                source="AutoTP (tensor_parallel.autotp_size) keeps norm and residual activations replicated: no "
                "sequence parallelism; a Megatron-DeepSpeed model's own --sequence-parallel: pin --sequence-parallel",
            ),
            "ddp_beside_model_parallel": Behaviour(
                value=True, source="engine's data-parallel group beside Megatron-DeepSpeed's TP and its pipeline engine"
            ),
            "hybrid_shard": Behaviour(
                value=False,
                source="ZeRO-2/3 partition over the whole data-parallel group: MiCS (mics_shard_size) is gone from the config, which refuses the key; ZeRO++ hpZ shards only a secondary weight copy",
            ),
            "fsdp_gather_bytes": Behaviour(value=2, source="ZeRO-3 gathers the bf16/fp16 parameters"),
            "fsdp_reduce_bytes": Behaviour(
                value=2,
                source="ZeRO-2/3 reduce the 16-bit gradients (communication_data_type unset: the model's dtype; "
                "zero/stage_1_and_2.py average_tensor, zero/stage3.py __avg_scatter_grads)",
            ),
            "fsdp_unit_buffers": Behaviour(
                value=None,
                source="not applicable: ZeRO-3's per-submodule fetch and reduce buckets (zero3_prefetch_elems)",
            ),
            "fp8": Behaviour(
                value=False, known=False, source="not known: fp8 only through Transformer Engine in user code"
            ),
            "sp_regather": Behaviour(
                value=False,
                source="AutoTP has no sequence parallelism (DeepSpeed's own is Ulysses' all-to-all): priced as a "
                "gathered input kept for backward; a Megatron-DeepSpeed model's layers are Megatron's, which "
                "regather, and are not priced so",
            ),
            "selective_recompute": Behaviour(
                value="attention core",
                known=False,
                source=("not known: activation_checkpointing checkpoints whole blocks; selective is the model's"),
            ),
            "elementwise": Behaviour(
                value="eager",
                known=False,
                source="not known: DeepSpeed runs the user's module; an HF model's norms, rotary and SwiGLU run "
                "as torch ops (Megatron-DeepSpeed's fused kernels: --elementwise fused)",
            ),
            "loss": Behaviour(
                value="cross_entropy", known=False, source="not known: the user's loss; a torch F.cross_entropy assumed"
            ),
            "fused_projections": Behaviour(
                value=False,
                known=False,
                source="not known: an HF Llama has q_proj, k_proj, v_proj, gate_proj, up_proj (Megatron-DeepSpeed "
                "fuses them: --fused-projections)",
            ),
            "zero3_prefetch_elems": Behaviour(
                value=50_000_000,
                source="deepspeed/runtime/zero/config.py prefetch_bucket_size = 5e7 (stage3_prefetch_bucket_size: "
                "'Maximum number of parameter elements to fetch ahead of use')",
            ),
            "fsdp_reduce_every_microbatch": Behaviour(
                value=True,
                source="ZeRO-2/3 reduce each micro-step's gradients into the fp32 partition during its backward "
                "(engine.no_sync refuses gradient partitioning)",
            ),
            "zero3_gather": Behaviour(
                value="module",
                source="deepspeed/runtime/zero/partitioned_param_coordinator.py fetch_sub_module: each submodule's "
                "parameters gathered in its pre-forward and pre-backward hooks and released after; "
                "checkpointing's recompute runs the forward hooks again",
            ),
            "zero0_reduce_after_backward": Behaviour(
                value=True,
                source="engine.backward calls allreduce_gradients at the accumulation boundary: at stage 0 "
                "buffered_allreduce_fallback on the finished gradients (engine.py); overlap_comm reaches only the "
                "ZeRO-1/2 optimizer's hooks",
            ),
            "pipeline_reduce_after_backward": Behaviour(
                value=True,
                source="pipe/engine.py: the schedule's ReduceGrads instruction (_exec_reduce_grads) follows every "
                "backward pass: buffered_allreduce_fallback (bf16) or allreduce_gradients on the finished gradients",
            ),
            "reduce_bucket_elems": Behaviour(
                value=DEEPSPEED_REDUCE_BUCKET_ELEMS,
                source="zero_optimization.reduce_bucket_size, 5e8 by default (zero/config.py): the ipg bucket is "
                "reduced when the next gradient would overflow it, the rest in the epilogue (zero/stage_1_and_2.py)",
            ),
            "zero1_grad_collective": Behaviour(
                value="all_reduce",
                source="zero/stage_1_and_2.py average_tensor under the default use_multi_rank_bucket_allreduce, at "
                "stage 1 as at stage 2: each bucket is all-reduced whole and every rank keeps its partition's slice",
            ),
            "zero1_gather_overlaps": Behaviour(
                value=False,
                source="zero/stage_1_and_2.py step: all_gather_dp_groups of the bit16 partitions, synchronously "
                "after the step",
            ),
            "zero2_shards_weights": Behaviour(
                value=False,
                source="zero/stage_1_and_2.py: ZeRO-2 partitions gradients and optimizer states; every rank keeps the whole bit16 weights",
            ),
            "fsdp_full_grad_accumulation": Behaviour(
                value=False,
                source="zero/stage3.py and stage_1_and_2.py reduce each micro-step's gradients into the partitions (no unsharded accumulation)",
            ),
            "ddp_bucket_copy": Behaviour(
                value=False, source="DeepSpeed's engine reduces its own ipg buckets (reduce_bucket_elems), no DDP"
            ),
            "replica_sync_after_backward": Behaviour(
                value=False,
                source="the engine's gradient hooks reduce any parameter during backward, AutoTP's too (overlap_comm)",
            ),
            "zero2_grad_collective": Behaviour(
                value="all_reduce",
                source="zero/stage_1_and_2.py average_tensor under the default use_multi_rank_bucket_allreduce: "
                "each bucket's slices under one allreduce key, allreduce_and_scatter all-reduces the whole bucket",
            ),
            "cp_kv_exchange": Behaviour(
                value="ring", known=False, source="not known: DeepSpeed's sequence parallelism (Ulysses) is all-to-all"
            ),
            "model_source": Behaviour(
                value="user",
                known=False,
                source="not known: deepspeed.initialize wraps the user's module (Megatron-DeepSpeed builds its own GPT)",
            ),
            "pp_scatter_gather": Behaviour(
                value=True,
                source="deepspeed/runtime/pipe/engine.py: is_pipe_partitioned = is_model_parallel and "
                "pipeline.pipe_partitioned (True by default, runtime/config.py get_pipeline_config): a stage sends "
                "its output as a PartitionedTensor over the slice-parallel (tensor-parallel) group and the next "
                "stage rebuilds it whole (PartitionedTensor.full); gradients likewise (grad_partitioned)",
            ),
            "free_stage_outputs": Behaviour(
                value=False,
                source=(
                    "deepspeed/runtime/pipe/engine.py: _exec_backward_pass frees pipe_buffers['outputs'] only after "
                    "that microbatch's backward"
                ),
            ),
            "offload_methods": Behaviour(
                value=("none", "cpu", "nvme"),
                source="zero_optimization.offload_optimizer.device cpu / nvme (ZeRO-Offload, ZeRO-Infinity)",
            ),
            "compression_methods": Behaviour(
                value=("none", "fp16"),
                source="communication_data_type fp16 (its 1-bit Adam and 0/1 Adam are not in meshplan's registry)",
            ),
            "sync_methods": _ALLREDUCE_ONLY,
            "model_parallel": Behaviour(
                value=("tp", "pp", "cp"),
                source="PipelineEngine; tensor and sequence parallelism through Megatron-DeepSpeed or AutoTP",
            ),
            "also_runs": Behaviour(
                value=("1f1b_microbatches",),
                source="PipelineEngine TrainSchedule: any gradient_accumulation_steps (its CP-like Ulysses is "
                "a head split, not the ring attention the model prices)",
            ),
        },
    ),
    "llm-foundry": Runtime(
        name="llm-foundry",
        description=(
            "mosaicml/llm-foundry on Composer: MPT models under FSDP (FULL_SHARD, SHARD_GRAD_OP, HYBRID_SHARD) or "
            "DDP, flash attention, flash-attn's fused cross-entropy, activation checkpointing per block"
        ),
        behaviours={
            "state_layout": Behaviour(
                value="torch",
                source="Composer FSDP: fp32 sharded flat parameters and gradients, bf16 gathered "
                "(fsdp_config.mixed_precision PURE / DEFAULT); DecoupledAdamW m, v in fp32",
            ),
            "overlap_dp_comm": Behaviour(
                value=True, source="FSDP backward_prefetch BACKWARD_POST, limit_all_gathers (llm-foundry yamls)"
            ),
            "overlap_tp_comm": Behaviour(value=False, source="no tensor parallelism"),
            "attention": Behaviour(
                value="flash", source="MPT attn_config.attn_impl: triton / flash (FlashAttention kernels)"
            ),
            "dropout": Behaviour(
                value=False, source="MPTConfig attn_pdrop, resid_pdrop, emb_pdrop default 0.0 (pretrain yamls)"
            ),
            "uniform_stages": Behaviour(value=False, source="no pipeline parallelism"),
            "recompute_assignments": Behaviour(
                value="uniform",
                source="fsdp_config.activation_checkpointing: a checkpoint wrapper on every MPTBlock",
            ),
            "zero_stages": Behaviour(
                value=(0, 2, 3),
                source="Composer: DDP without fsdp_config, FSDP SHARD_GRAD_OP (2), FULL_SHARD / HYBRID_SHARD (3)",
            ),
            "pipeline_zero_stages": Behaviour(value=(0, 2, 3), source="no pipeline parallelism"),
            "pipeline_schedules": Behaviour(value=("1F1B",), source="no pipeline parallelism"),
            "sequence_parallel_modes": Behaviour(value=(False,), source="no tensor parallelism"),
            "ddp_beside_model_parallel": Behaviour(value=False, source="no model parallelism"),
            "hybrid_shard": Behaviour(value=True, source="fsdp_config.sharding_strategy HYBRID_SHARD (Composer FSDP)"),
            "fsdp_gather_bytes": Behaviour(
                value=2, source="fsdp_config.mixed_precision PURE / DEFAULT: param_dtype bf16"
            ),
            "fsdp_reduce_bytes": Behaviour(
                value=2,
                source="fsdp_config.mixed_precision PURE (its pretrain yamls, benchmarking/submit_benchmarks.py): "
                "reduce_dtype bf16; DEFAULT reduces in fp32 (composer/distributed/mosaic_parallelism.py)",
            ),
            "fsdp_unit_buffers": Behaviour(
                value="backward_post",
                source="Composer FSDP (FSDP1) fsdp_config.backward_prefetch default BACKWARD_POST "
                "(composer/utils/parallelism.py FSDPConfig)",
            ),
            "fp8": Behaviour(
                value=True, source="Composer precision amp_fp8: Transformer Engine fp8_autocast (its H100 FP8 table)"
            ),
            "sp_regather": Behaviour(value=False, source="no tensor parallelism"),
            "selective_recompute": Behaviour(
                value="attention core",
                known=False,
                source="not known: activation_checkpointing_target names modules to wrap; no attention-core policy",
            ),
            "elementwise": Behaviour(
                value="eager",
                source="MPT low_precision_layernorm, GELU and residual adds as torch ops; no torch.compile by default",
            ),
            "loss": Behaviour(
                value="fused",
                source="llm-foundry ComposerMPTCausalLM loss_fn default fused_crossentropy: flash_attn.losses."
                "cross_entropy.CrossEntropyLoss over the bf16 logits",
            ),
            "fused_projections": Behaviour(
                value=True, source="MPT attention Wqkv: one GEMM for Q, K, V (its MLP has no gate)"
            ),
            "zero3_prefetch_elems": Behaviour(
                value=0, source="FSDP backward_prefetch: the next wrapped MPTBlock gathered ahead"
            ),
            "fsdp_reduce_every_microbatch": Behaviour(
                value=True,
                source="composer/trainer/trainer.py _train_microbatch: the DDP sync strategies (no_sync) apply to "
                "DistributedDataParallel only; FSDP reduce-scatters every microbatch",
            ),
            "zero3_gather": Behaviour(
                value="layer", source="FSDP auto-wrap per MPTBlock: one all-gather per block, reused by its recompute"
            ),
            "zero0_reduce_after_backward": Behaviour(
                value=False, source="Composer DDP: buckets all-reduce as backward fills them"
            ),
            "pipeline_reduce_after_backward": Behaviour(value=False, source="not applicable: no pipeline parallelism"),
            "reduce_bucket_elems": Behaviour(value=0, source="not applicable: no ZeRO-1; DDP's bucket cap"),
            "zero1_grad_collective": Behaviour(
                value="all_reduce", source="not applicable: no ZeRO-1 (Composer: DDP all-reduce or FSDP)"
            ),
            "zero1_gather_overlaps": Behaviour(value=False, source="not applicable: no ZeRO-1"),
            "zero2_shards_weights": Behaviour(
                value=True,
                source="FSDP SHARD_GRAD_OP: flat parameters sharded, kept gathered from forward to backward",
            ),
            "fsdp_full_grad_accumulation": Behaviour(
                value=False,
                source="Composer's FSDP reduce-scatters every microbatch (fsdp_reduce_every_microbatch); no pipeline",
            ),
            "ddp_bucket_copy": Behaviour(
                value=True, source="Composer wraps DDP (torch DistributedDataParallel buckets)"
            ),
            "replica_sync_after_backward": Behaviour(
                value=True, source="not applicable: no tensor or pipeline parallelism"
            ),
            "zero2_grad_collective": Behaviour(
                value="reduce_scatter", source="FSDP SHARD_GRAD_OP reduce-scatters the gradients (FlatParamHandle)"
            ),
            "cp_kv_exchange": Behaviour(value="all_gather", source="no context parallelism"),
            "model_source": Behaviour(
                value="runtime", source="llm-foundry builds MPT from its yaml (model.name: mpt_causal_lm)"
            ),
            "pp_scatter_gather": Behaviour(value=False, source="no pipeline parallelism"),
            "free_stage_outputs": Behaviour(value=False, source="no pipeline parallelism"),
            "offload_methods": Behaviour(
                value=("none", "cpu"), source="fsdp_config.cpu_offload: FSDP CPUOffload(offload_params=True)"
            ),
            "compression_methods": Behaviour(
                value=("none",), source="no gradient compression: FSDP reduce-scatter / DDP all-reduce"
            ),
            "sync_methods": _ALLREDUCE_ONLY,
            "model_parallel": Behaviour(
                value=(),
                source="data parallelism only: Composer FSDP / DDP; its MPT has no tensor, pipeline or context "
                "parallel path",
            ),
            "also_runs": Behaviour(value=(), source="no layout beyond what meshplan's executor runs"),
        },
    ),
}


def runtime(name: str) -> Runtime:
    from meshplan.errors import MeshplanError

    if name not in RUNTIMES:
        raise MeshplanError(f"--runtime {name!r} is unknown; use one of {', '.join(NAMES)}")
    return RUNTIMES[name]


REQUEST_FIELDS = tuple(row.name for row in ROWS if row.request)
"""Behaviours the PlanRequest carries, each a field of the same name (Row.request)."""


def request_behaviours(name: str, overrides: dict) -> dict:
    """PlanRequest fields for runtime `name`: each behaviour's runtime value, unless `overrides`
    (the per-behaviour flags) gives one (None = not given). Unknown behaviours keep the value
    the table gives (the generic default)."""
    rt = runtime(name)
    out = {}
    for key in REQUEST_FIELDS:
        given = overrides.get(key)
        out[key] = given if given is not None else rt.value(key)
    return out


def markdown_table() -> str:
    """docs/runtimes.md's table: one row per behaviour, one column per runtime (value; source)."""
    head = "| behaviour (flag) | " + " | ".join(NAMES) + " |"
    lines = [head, "|---|" + "---|" * len(NAMES)]
    for key, what in BEHAVIOURS.items():
        cells = []
        for name in NAMES:
            b = RUNTIMES[name].behaviours[key]
            val = (
                "n/a"
                if b.value is None
                else ", ".join(map(str, b.value))
                if isinstance(b.value, tuple)
                else str(b.value)
            )
            cells.append(("**not known** (" + val + ")" if not b.known else f"`{val}`") + f": {b.source}")
        lines.append(f"| {key} — {what} ({FLAGS[key]}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)

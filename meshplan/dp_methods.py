"""The data-parallel method registry: one torch-free table of every way replicas exchange
gradients or parameters (docs/design.md, "Data-parallel methods").

A method sits on one of five axes; the Plan stores one choice per axis (`MethodChoice`: name +
parameters). Each row says whether the method leaves the training mathematics unchanged
(`exact`: the search may pick it on speed) or changes it (approximate: priced only when the user
allows it, never chosen silently), its parameters with defaults, ranges and units, and what it
composes with. The CLI, the planner's enumeration, Plan validation, the executor's check
(meshplan/feasibility.py) and the exports all read this table.

Adding a method: its row here, a cost object in planner/dp_cost.py, an executor module in
executor/methods/, and its tests (CONTRIBUTING.md).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from meshplan.errors import MeshplanError

AXES = {
    "compression": "gradient compression",
    "sync": "replica synchronisation",
    "comm_schedule": "communication scheduling",
    "offload": "state placement / offload",
    "waves": "wave scheduling",
}
"""Axis key (the Plan's `dp_methods` field and the CLI flag stem) -> what it decides."""

EXPORT_TARGETS = ("torchtitan", "megatron", "deepspeed", "accelerate")


@dataclass(frozen=True, kw_only=True)
class Param:
    """One parameter of a method, as `--compression NAME:key=value` spells it."""

    name: str
    kind: type
    """int, float or bool."""
    default: Any
    low: float | None = None
    """Smallest allowed value (inclusive); None = unbounded."""
    high: float | None = None
    """Largest allowed value (inclusive); None = unbounded."""
    unit: str = ""
    doc: str = ""
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    """ZeRO stages the method runs with when this parameter is set off its default (offload=nvme
    params=true pages fully sharded parameters: ZeRO-3 only); meshplan/feasibility.py refuses the rest."""
    zero_stages_why: str = ""
    """Why the other stages cannot run it, for the refusal's line."""

    def coerce(self, value: Any, where: str) -> Any:
        """`value` (a CLI string or a JSON value) as this parameter's type, range-checked; None
        stays None for a parameter whose default is None (not set)."""
        if value is None and self.default is None:
            return None
        if isinstance(value, str):
            value = _parse_scalar(value, self.kind, where)
        if self.kind is bool:
            if not isinstance(value, bool):
                raise MeshplanError(f"{where} = {value!r}: expected true or false")
        elif self.kind is int:
            if isinstance(value, bool) or not isinstance(value, int):
                raise MeshplanError(f"{where} = {value!r}: expected an integer")
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise MeshplanError(f"{where} = {value!r}: expected a number")
        else:
            value = float(value)
        if self.kind is not bool and (
            (self.low is not None and value < self.low) or (self.high is not None and value > self.high)
        ):
            raise MeshplanError(f"{where} = {value!r}: out of range; use {self.range_text()}")
        return value

    def range_text(self) -> str:
        if self.kind is bool:
            return "true or false"
        low = "" if self.low is None else f"{self.low:g} <= "
        high = "" if self.high is None else f" <= {self.high:g}"
        return f"{low}{self.name}{high}" + (f" ({self.unit})" if self.unit else "")


def _parse_scalar(text: str, kind: type, where: str) -> Any:
    if kind is bool:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise MeshplanError(f"{where} = {text!r}: expected true or false")
    try:
        return int(text) if kind is int else float(text)
    except ValueError:
        raise MeshplanError(f"{where} = {text!r}: expected {'an integer' if kind is int else 'a number'}") from None


@dataclass(frozen=True, kw_only=True)
class Method:
    """One registry row."""

    name: str
    axis: str
    exact: bool
    """True when training computes the same updates as plain synchronous data parallelism."""
    summary: str
    source: str
    """Paper / framework the mechanism and its cost come from."""
    params: tuple[Param, ...] = ()
    zero_stages: tuple[int, ...] = (0, 1, 2, 3)
    """ZeRO stages the executor composes it with."""
    tensor_parallel: bool = True
    """Runs with tensor-parallel (DTensor) replicas."""
    split_backward: bool = True
    """Runs under schedules that split backward into input and weight passes (zero bubble)."""
    exports: dict[str, str] = field(default_factory=dict)
    """Export target -> how the target expresses it ("" = natively, nothing to add). A target
    that is absent cannot express the method: the export prints `unsupported` as its WARNING."""
    unsupported: str = ""
    """The WARNING an export prints for a target absent from `exports`."""
    inexact_params: tuple[str, ...] = ()
    """Boolean parameters that, when true, change the training mathematics (the row is then
    approximate: e.g. offload=cpu's delayed_update); the search only uses the defaults."""

    def exact_with(self, params: dict[str, Any]) -> bool:
        """Whether the method with these (resolved) parameters keeps the mathematics unchanged."""
        return self.exact and not any(params.get(name) for name in self.inexact_params)

    @property
    def label(self) -> str:
        return f"{self.axis}={self.name}"

    def param(self, key: str, where: str) -> Param:
        for p in self.params:
            if p.name == key:
                return p
        known = ", ".join(p.name for p in self.params) or "none"
        raise MeshplanError(f"{where}: {self.name} has no parameter {key!r}; its parameters are {known}")

    def resolve(self, params: dict[str, Any], where: str) -> dict[str, Any]:
        """Every parameter with its default filled in, each value checked against its range."""
        out = {p.name: p.default for p in self.params}
        for key, value in params.items():
            out[key] = self.param(key, where).coerce(value, f"{where}.{key}")
        return out


_ALL = ("torchtitan", "megatron", "deepspeed", "accelerate")


def _native(*targets: str) -> dict[str, str]:
    return {t: "" for t in targets}


METHODS: tuple[Method, ...] = (
    # --- gradient compression -----------------------------------------------------------------
    Method(
        name="none",
        axis="compression",
        exact=True,
        exports=_native(*_ALL),
        summary="full-precision gradients (the training dtype's fp32 grads)",
        source="PyTorch DDP / FSDP2",
    ),
    Method(
        name="fp16",
        axis="compression",
        exact=False,
        zero_stages=(0, 1),
        summary="gradients cast to fp16 for the all-reduce (half the bytes; rounding error)",
        source="torch default_hooks.fp16_compress_hook",
        exports={
            "megatron": "--grad-reduce-in-bf16 (Megatron reduces in bf16, not fp16)",
            "deepspeed": "communication_data_type fp16",
            "accelerate": "DDP comm hook fp16",
        },
        unsupported="fp16 gradient compression is not expressible; gradients are reduced in full precision",
    ),
    Method(
        name="powersgd",
        axis="compression",
        exact=False,
        zero_stages=(0, 1),
        tensor_parallel=False,
        split_backward=False,
        summary="rank-r low-rank gradient approximation with error feedback (two small all-reduces)",
        source="Vogels et al., NeurIPS 2019; torch powerSGD_hook",
        params=(
            Param(
                name="rank",
                kind=int,
                default=2,
                low=1,
                high=1024,
                doc="matrix_approximation_rank r: P is n x r, Q is m x r",
            ),
            Param(
                name="start_iter",
                kind=int,
                default=2,
                low=2,
                high=10**9,
                unit="steps",
                doc="plain all-reduce before this step (torch needs >= 2 with error feedback)",
            ),
            Param(
                name="min_compression_rate",
                kind=float,
                default=2.0,
                low=1.0,
                unit="x",
                doc="a matrix is compressed only when (n m) / ((n + m) r) >= this; else sent dense",
            ),
            Param(name="error_feedback", kind=bool, default=True, doc="add the last step's residual"),
            Param(name="warm_start", kind=bool, default=True, doc="reuse last step's Q"),
        ),
        exports={"accelerate": "DDP comm hook powersgd (DDPCommunicationHookType.POWER_SGD)"},
        unsupported="PowerSGD is not expressible; gradients are reduced dense",
    ),
    # all-gather compressors, Accordion; DDP comm hooks (ZeRO-0/1) and, for TP replicas,
    # the same codecs in a replica reducer (executor/methods/compressed.py); not FSDP2 ZeRO-2/3,
    # whose reduce-scatter sums what a non-linear payload cannot
    Method(
        name="topk",
        axis="compression",
        exact=False,
        zero_stages=(0, 1),
        split_backward=False,
        summary="top-k sparsification with error feedback: k fp32 values + int32 indices per tensor, "
        "all-gathered (pays below density ~1/N); DGC's extras as parameters",
        source="Lin et al., Deep Gradient Compression, ICLR 2018; Stich et al., NeurIPS 2018",
        params=(
            Param(
                name="density",
                kind=float,
                default=0.01,
                low=1e-6,
                high=1.0,
                doc="fraction of each tensor's elements sent (k = ceil(density n)); 1 = everything",
            ),
            Param(name="error_feedback", kind=bool, default=True, doc="keep what was not sent, add it next step"),
            Param(
                name="momentum_correction",
                kind=bool,
                default=False,
                doc="DGC: accumulate velocity u = m u + g locally and sparsify that (masking u at sent "
                "indices); use with a momentum-free optimizer",
            ),
            Param(name="momentum", kind=float, default=0.9, low=0.0, high=0.999, doc="DGC's m"),
            Param(
                name="clip_norm",
                kind=float,
                default=0.0,
                low=0.0,
                doc="DGC local clipping: each tensor's gradient norm clipped to clip_norm / sqrt(N) "
                "before accumulation; 0 = off",
            ),
            Param(
                name="warmup_steps",
                kind=int,
                default=0,
                low=0,
                high=10**9,
                unit="steps",
                doc="DGC density warm-up: 0.25 falling exponentially to density over these steps",
            ),
        ),
        unsupported="top-k sparsification is not expressible; gradients are reduced dense",
    ),
    Method(
        name="accordion",
        axis="compression",
        exact=False,
        zero_stages=(0, 1),
        split_backward=False,
        summary="PowerSGD whose rank switches per tensor between critical_rank (critical regime: the "
        "accumulated gradient norm changed by >= eta over a window) and rank",
        source="Agarwal et al., Accordion, MLSys 2021",
        params=(
            Param(name="rank", kind=int, default=1, low=1, high=1024, doc="rank outside critical regimes"),
            Param(
                name="critical_rank",
                kind=int,
                default=2,
                low=1,
                high=1024,
                doc="rank in critical regimes (low compression)",
            ),
            Param(
                name="window",
                kind=int,
                default=100,
                low=1,
                high=10**9,
                unit="steps",
                doc="steps between switching decisions (the paper's switch_freq epochs)",
            ),
            Param(
                name="eta",
                kind=float,
                default=0.5,
                low=0.0,
                high=1e9,
                doc="critical when |norm_prev - norm_now| / norm_prev >= eta",
            ),
            Param(
                name="critical_fraction",
                kind=float,
                default=None,
                low=0.0,
                high=1.0,
                doc="share of steps at critical_rank the planner's expected bytes use (e.g. the share "
                "a run's notes report); unset: the band's top, every step at critical_rank",
            ),
            Param(
                name="start_iter",
                kind=int,
                default=0,
                low=0,
                high=10**9,
                unit="steps",
                doc="plain all-reduce before this step, as powersgd's start_iter (0 = compress from the "
                "first step; the planner prices the steady state after it)",
            ),
            Param(
                name="min_compression_rate",
                kind=float,
                default=2.0,
                low=1.0,
                unit="x",
                doc="a matrix is compressed only when (n m) / ((n + m) r) >= this",
            ),
        ),
        unsupported="Accordion is not expressible; gradients are reduced dense",
    ),
    Method(
        name="accordion_topk",
        axis="compression",
        exact=False,
        zero_stages=(0, 1),
        split_backward=False,
        summary="top-k whose density switches per tensor between critical_density (critical regime) "
        "and density, by Accordion's rule",
        source="Agarwal et al., Accordion, MLSys 2021",
        params=(
            Param(name="density", kind=float, default=0.01, low=1e-6, high=1.0, doc="density outside critical regimes"),
            Param(
                name="critical_density",
                kind=float,
                default=0.1,
                low=1e-6,
                high=1.0,
                doc="density in critical regimes (low compression)",
            ),
            Param(
                name="window",
                kind=int,
                default=100,
                low=1,
                high=10**9,
                unit="steps",
                doc="steps between switching decisions",
            ),
            Param(
                name="eta",
                kind=float,
                default=0.5,
                low=0.0,
                high=1e9,
                doc="critical when |norm_prev - norm_now| / norm_prev >= eta",
            ),
            Param(
                name="critical_fraction",
                kind=float,
                default=None,
                low=0.0,
                high=1.0,
                doc="share of steps at critical_density the planner's expected bytes use (e.g. the "
                "share a run's notes report); unset: the band's top, every step at critical_density",
            ),
            Param(name="error_feedback", kind=bool, default=True, doc="keep what was not sent"),
        ),
        unsupported="Accordion is not expressible; gradients are reduced dense",
    ),
    *(
        Method(
            name=name,
            axis="compression",
            exact=False,
            zero_stages=(0, 1),
            split_backward=False,
            summary=summary,
            source=source,
            params=(
                Param(
                    name="bits",
                    kind=int,
                    default=bits,
                    low=2,
                    high=8,
                    unit="bits",
                    doc="per coordinate: one sign bit + (bits - 1) bits of level index",
                ),
                Param(
                    name="bucket_size",
                    kind=int,
                    default=512,
                    low=1,
                    high=2**24,
                    unit="elements",
                    doc="coordinates sharing one fp32 norm",
                ),
                Param(
                    name="quantize",
                    kind=bool,
                    default=True,
                    doc="false: send the fp32 values through the same all-gather (the identity)",
                ),
                *(
                    (
                        Param(
                            name="refit_every",
                            kind=int,
                            default=100,
                            low=1,
                            high=10**9,
                            unit="steps",
                            doc="levels re-fitted from the gathered histograms every this many steps",
                        ),
                    )
                    if adaptive
                    else ()
                ),
            ),
            unsupported=f"{name} quantization is not expressible; gradients are reduced dense",
        )
        for name, bits, adaptive, summary, source in (
            (
                "qsgd",
                4,
                False,
                "unbiased stochastic rounding onto s = 2^(bits-1) - 1 uniform levels of "
                "|v|/||v|| per bucket, bit-packed, all-gathered",
                "Alistarh et al., QSGD, NeurIPS 2017",
            ),
            (
                "nuqsgd",
                4,
                False,
                "as qsgd on exponentially spaced levels {0, 2^-(s-1), ..., 1/2, 1}",
                "Ramezani-Kebrya et al., NUQSGD, JMLR 2021",
            ),
            (
                "alq",
                3,
                True,
                "as qsgd on levels fitted to the gradients' distribution by coordinate descent "
                "(minimum variance), re-fitted every refit_every steps",
                "Faghri et al., NeurIPS 2020 (ALQ)",
            ),
            (
                "amq",
                3,
                True,
                "as qsgd on exponential levels {p^j} whose multiplier p is fitted to minimum "
                "variance, re-fitted every refit_every steps",
                "Faghri et al., NeurIPS 2020 (AMQ)",
            ),
        )
    ),
    # --- replica synchronisation --------------------------------------------------------------
    Method(
        name="allreduce",
        axis="sync",
        exact=True,
        exports=_native(*_ALL),
        summary="synchronous data parallelism: gradients averaged every step",
        source="PyTorch DDP (Li et al., VLDB 2020)",
    ),
    # the sync methods below run without DDP on plain replicas (zero_stage 0, no TP, pp = 1:
    # feasibility.py); executor/methods/sync_*.py, planner/methods/sync.py, docs/methods/
    Method(
        name="master",
        axis="sync",
        exact=True,
        zero_stages=(0,),
        tensor_parallel=False,
        split_backward=False,
        summary="master aggregation: every worker sends its gradients to rank 0, which averages them, "
        "steps the optimizer and sends the parameters back (exact: the same averaged gradient "
        "and update as all-reduce; the master's link carries (N-1)x the model each way)",
        source="parameter-server data parallelism (Dean et al., NeurIPS 2012; Li et al., OSDI 2014)",
        unsupported="master aggregation is not expressible; gradients are all-reduced",
    ),
    Method(
        name="local-sgd",
        axis="sync",
        exact=False,
        zero_stages=(0,),
        tensor_parallel=False,
        split_backward=False,
        summary="local SGD: H local optimizer steps, then the parameters averaged (post-local SGD: "
        "synchronous warm-up steps first; hierarchical: groups average every group_period)",
        source="Stich, ICLR 2019; Lin et al., ICLR 2020; torch PostLocalSGDOptimizer / "
        "PeriodicModelAverager / HierarchicalModelAverager",
        params=(
            Param(
                name="period",
                kind=int,
                default=4,
                low=1,
                high=10**6,
                unit="steps",
                doc="H: parameters averaged over all replicas every H steps",
            ),
            Param(
                name="warmup_steps",
                kind=int,
                default=0,
                low=0,
                high=10**9,
                unit="steps",
                doc="post-local SGD: gradients all-reduced every step before this one",
            ),
            Param(
                name="group_size",
                kind=int,
                default=0,
                low=0,
                high=10**6,
                unit="ranks",
                doc="hierarchical averaging: groups of this many consecutive ranks (a node); 0 = flat",
            ),
            Param(
                name="group_period",
                kind=int,
                default=1,
                low=1,
                high=10**6,
                unit="steps",
                doc="hierarchical: a group averages every group_period steps (must divide period)",
            ),
        ),
        unsupported="local SGD is not expressible; the target all-reduces gradients every step",
    ),
    Method(
        name="crossbow",
        axis="sync",
        exact=False,
        zero_stages=(0,),
        tensor_parallel=False,
        split_backward=False,
        summary="Crossbow: k small-batch learners per device, each its own replica, kept together by "
        "synchronous model averaging with a central model and momentum (memory x k)",
        source="Koliousis et al., CROSSBOW, VLDB 2019 (lsds/Crossbow sma.c)",
        params=(
            Param(
                name="learners",
                kind=int,
                default=0,
                low=0,
                high=64,
                doc="k: learners (replicas) per device, each on 1/k of the local batch; 0 = auto: the "
                "planner picks the k of least modelled step time whose memory fits (planner/sync.py)",
            ),
            Param(
                name="alpha",
                kind=float,
                default=0.0,
                low=0.0,
                high=1.0,
                doc="correction rate toward the central model; 0 = 1/K (K = k x replicas)",
            ),
            Param(
                name="momentum",
                kind=float,
                default=0.9,
                low=0.0,
                high=0.999,
                doc="mu: momentum of the central model's update",
            ),
            Param(
                name="reset", kind=bool, default=False, doc="learners restart from the central model after every sync"
            ),
        ),
        unsupported="Crossbow's learners are not expressible; one replica per device runs",
    ),
    Method(
        name="dabmd",
        axis="sync",
        exact=False,
        zero_stages=(0,),
        tensor_parallel=False,
        split_backward=False,
        summary="distributed any-batch mirror descent: each node computes microbatches for a fixed "
        "time budget (its batch varies), takes its own mirror step (Euclidean or negative entropy), "
        "then averages parameters with its ring neighbours through a mixing matrix",
        source="Eshraghi & Liang, ICML 2020; Ferdinand et al., Anytime Minibatch, ICLR 2019 (gradient_allreduce)",
        params=(
            Param(
                name="budget_ms",
                kind=float,
                default=0.0,
                low=0.0,
                high=1e7,
                unit="ms",
                doc="compute time per step; 0 = the whole local batch (synchronous SGD)",
            ),
            Param(
                name="min_microbatches",
                kind=int,
                default=1,
                low=1,
                high=10**6,
                doc="microbatches a worker always computes, whatever the budget",
            ),
            Param(
                name="consensus_rounds",
                kind=int,
                default=1,
                low=1,
                high=1000,
                doc="consensus iterations per round (1: single-consensus DABMD; more: multi-consensus, W^r)",
            ),
            Param(
                name="time_varying",
                kind=bool,
                default=False,
                doc="re-draw the ring (a permutation of the nodes every rank agrees on) every iteration",
            ),
            Param(
                name="entropy",
                kind=bool,
                default=False,
                doc="negative-entropy mirror map (exponentiated gradient; parameters on the simplex) "
                "instead of the Euclidean one (SGD)",
            ),
            Param(
                name="gradient_allreduce",
                kind=bool,
                default=False,
                doc="the exact variant: one all-reduce of sample-weighted gradients and the plan's optimizer "
                "(Anytime Minibatch; budget 0 = DDP) instead of mirror steps and neighbour consensus",
            ),
        ),
        unsupported="any-batch training is not expressible; every worker computes its whole batch",
    ),
    Method(
        name="gossip",
        axis="sync",
        exact=False,
        zero_stages=(0,),
        tensor_parallel=False,
        split_backward=False,
        summary="decentralised SGD: after its local step each replica averages its parameters with its "
        "two ring neighbours (low_precision: 8-bit min-max differences, CHOCO-gossip)",
        source="BAGUA decentralized / low_precision_decentralized (Gan et al., VLDB 2022); "
        "Lian et al., NeurIPS 2017; Koloskova et al., ICML 2019",
        params=(
            Param(
                name="period",
                kind=int,
                default=1,
                low=1,
                high=10**6,
                unit="steps",
                doc="a gossip round every this many steps",
            ),
            Param(
                name="low_precision",
                kind=bool,
                default=False,
                doc="send 8-bit min-max quantised parameter differences instead of fp32 parameters",
            ),
            Param(
                name="chunk",
                kind=int,
                default=4096,
                low=16,
                high=2**30,
                unit="elements",
                doc="low_precision: elements sharing one (min, max) pair",
            ),
            Param(
                name="gamma",
                kind=float,
                default=1.0,
                low=0.01,
                high=1.0,
                doc="consensus step size (1 = plain ring averaging)",
            ),
        ),
        unsupported="gossip averaging is not expressible; gradients are all-reduced",
    ),
    Method(
        name="async",
        axis="sync",
        exact=False,
        zero_stages=(0,),
        tensor_parallel=False,
        split_backward=False,
        summary="asynchronous model averaging: a background thread with its own process group averages "
        "a snapshot of the parameters while training goes on, applied when it lands",
        source="BAGUA async_model_average (Gan et al., VLDB 2022)",
        params=(
            Param(
                name="period",
                kind=int,
                default=1,
                low=1,
                high=10**6,
                unit="steps",
                doc="a snapshot handed to the averaging thread every this many steps",
            ),
            Param(
                name="timeout_s",
                kind=float,
                default=60.0,
                low=1.0,
                high=3600.0,
                unit="s",
                doc="how long an averaging round waits for a peer (a dead rank) before giving up",
            ),
        ),
        unsupported="asynchronous averaging is not expressible; gradients are all-reduced",
    ),
    # --- communication scheduling -------------------------------------------------------------
    Method(
        name="buckets",
        axis="comm_schedule",
        exact=True,
        summary="gradients all-reduced in fixed-size buckets as backward produces them",
        source="PyTorch DDP bucket_cap_mb (Li et al., VLDB 2020)",
        params=(Param(name="bucket_mb", kind=int, default=25, low=1, high=4096, unit="MiB", doc="DDP bucket_cap_mb"),),
        exports={
            "torchtitan": "",
            "megatron": "--ddp-bucket-size",
            "deepspeed": "reduce_bucket_size",
            "accelerate": "bucket_cap_mb",
        },
    ),
    Method(
        name="bytescheduler",
        axis="comm_schedule",
        exact=True,
        zero_stages=(0,),
        tensor_parallel=False,
        split_backward=False,
        summary="gradients cut into chunks, all-reduced in layer-priority order (input side first) "
        "under a credit window of bytes in flight; the next forward waits per layer",
        source="Peng et al., ByteScheduler, SOSP 2019 (bytedance/byteps bytescheduler/)",
        params=(
            Param(
                name="chunk_mb",
                kind=float,
                default=4.0,
                low=0.0625,
                high=4096,
                unit="MiB",
                doc="partition unit: a gradient larger than this is sent as chunks of it",
            ),
            Param(
                name="credit_mb",
                kind=float,
                default=16.0,
                low=0.0625,
                high=65536,
                unit="MiB",
                doc="credit: most chunk bytes in flight at once (>= one chunk)",
            ),
        ),
        exports={
            "torchtitan": "",
            "megatron": "--ddp-bucket-size (bucket order only)",
            "deepspeed": "reduce_bucket_size (bucket order only)",
            "accelerate": "bucket_cap_mb (order only)",
        },
        unsupported="ByteScheduler's priority order is not expressible; gradients go in DDP bucket order",
    ),
    # --- state placement ----------------------------------------------------------------------
    Method(
        name="none",
        axis="offload",
        exact=True,
        exports=_native(*_ALL),
        summary="parameters, gradients and optimizer states on the device",
        source="",
    ),
    Method(
        name="cpu",
        axis="offload",
        exact=True,
        inexact_params=("delayed_update",),
        summary="ZeRO-Offload: optimizer states and the optimizer step on the host, gradients down and "
        "parameters up over PCIe (ZeRO-3: FSDP2 CPUOffloadPolicy, the sharded parameters too)",
        source="Ren et al., ZeRO-Offload, USENIX ATC 2021; torch FSDP2 CPUOffloadPolicy",
        params=(
            Param(
                name="delayed_update",
                kind=bool,
                default=False,
                doc="one-step delayed parameter update (DPU, ZeRO-Offload Sec 5): the host step of "
                "step t overlaps step t+1 and applies one step late (changes the mathematics)",
            ),
        ),
        exports={
            "torchtitan": "[training] enable_cpu_offload = true",
            "megatron": "--optimizer-cpu-offload (Megatron-Core >= 0.11)",
            "deepspeed": "offload_optimizer/offload_param device cpu",
            "accelerate": "fsdp_offload_params",
        },
    ),
    Method(
        name="nvme",
        axis="offload",
        exact=True,
        summary="ZeRO-Infinity: optimizer states in files on local NVMe, page cache bypassed (meshplan run "
        "--offload-dir), prefetched one parameter ahead and streamed through the host step; with "
        "params=true (ZeRO-3) the parameter shards too, read before each gather",
        source="Rajbhandari et al., ZeRO-Infinity, SC 2021; DeepSpeed offload_optimizer/offload_param device nvme",
        params=(
            Param(
                name="params",
                kind=bool,
                default=False,
                doc="ZeRO-3 only: each rank's parameter shards in files too, read before each "
                "all-gather and freed after it, written back by the host step",
                zero_stages=(3,),
                zero_stages_why="only fully sharded parameters are paged to NVMe",
            ),
        ),
        exports={
            "deepspeed": "offload_optimizer device nvme (params=true: offload_param device nvme too; "
            "nvme_path = --offload-dir)"
        },
        unsupported="NVMe offload is not expressible; optimizer states stay in memory",
    ),
    # --- wave scheduling ----------------------------------------------------------------------
    Method(
        name="1", axis="waves", exact=True, exports=_native(*_ALL), summary="one wave of training per device", source=""
    ),
    Method(
        name="2",
        axis="waves",
        exact=False,
        zero_stages=(0,),
        summary="Wavelet tick-tock: 2N tasks of half the microbatch in two waves on the same devices, the "
        "second started half a forward+backward later so their activation peaks interleave; each wave "
        "all-reduces within itself, the waves average models without waiting (approximate)",
        source="Wang et al., Wavelet, MLSys 2021",
        unsupported="Wavelet's two waves are not expressible; one wave runs",
    ),
)

_BY_KEY = {(m.axis, m.name): m for m in METHODS}
DEFAULTS = {"compression": "none", "sync": "allreduce", "comm_schedule": "buckets", "offload": "none", "waves": "1"}
"""The plain data parallelism every plan has unless a method is pinned or chosen."""


@functools.cache
def _defaults_of(axis: str, name: str) -> tuple:
    return tuple(method(axis, name).resolve({}, axis).items())


def defaults_of(axis: str, name: str) -> dict[str, Any]:
    """A method's parameters at their defaults (a fresh dict; memoised: the search asks often)."""
    return dict(_defaults_of(axis, name))


def default_params(axis: str) -> dict[str, Any]:
    """The resolved parameters of the axis's default method (a fresh dict)."""
    return defaults_of(axis, DEFAULTS[axis])


def names(axis: str) -> list[str]:
    return [m.name for m in METHODS if m.axis == axis]


def method(axis: str, name: str, where: str = "") -> Method:
    """The registry row, or one line listing the valid names of the axis."""
    if axis not in AXES:
        raise MeshplanError(f"{where or 'dp_methods'}: unknown axis {axis!r}; use one of {', '.join(AXES)}")
    hit = _BY_KEY.get((axis, name))
    if hit is None:
        raise MeshplanError(
            f"{where or axis} = {name!r}: unknown {AXES[axis]} method; use one of {', '.join(names(axis))}"
        )
    return hit


def approximate(axis: str) -> list[str]:
    return [m.name for m in METHODS if m.axis == axis and not m.exact]


def exact(axis: str) -> list[str]:
    return [m.name for m in METHODS if m.axis == axis and m.exact]


def parse_spec(axis: str, text: str, flag: str) -> tuple[str, dict[str, Any]]:
    """`NAME[:k=v,...]` (a CLI pin) -> (name, resolved parameters)."""
    name, _, rest = text.partition(":")
    row = method(axis, name.strip(), flag)
    given: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise MeshplanError(
                f"{flag} {text!r}: {item!r} is not key=value; write e.g. "
                f"{name}:{row.params[0].name}={row.params[0].default}"
                if row.params
                else f"{flag} {text!r}: {name} takes no parameters"
            )
        if key.strip() in given:
            raise MeshplanError(f"{flag} {text!r}: {key.strip()} is given twice; give each parameter once")
        given[key.strip()] = value.strip()
    return row.name, row.resolve(given, f"{flag} {name}")


def _unsearched_exact(axis: str) -> list[str]:
    """Exact methods the search does not try by itself but prices when allowed (sync=master: the
    same updates as all-reduce, never faster beyond 2 workers, so only a what-if)."""
    return ["master"] if axis == "sync" else []


def parse_allow(axis: str, text: str, flag: str) -> tuple[str, ...]:
    """`NAME,...|all` -> the approximate methods of the axis the user lets the search price."""
    if text.strip() == "all":
        return tuple(sorted(set(approximate(axis)) | set(_unsearched_exact(axis))))
    out = []
    for name in filter(None, (s.strip() for s in text.split(","))):
        row = method(axis, name, flag)
        if row.exact and row.name not in _unsearched_exact(axis):
            raise MeshplanError(
                f"{flag} {name}: {name} is exact and always searched; list approximate "
                f"methods only ({', '.join(approximate(axis)) or 'none on this axis'})"
            )
        out.append(row.name)
    return tuple(sorted(set(out)))


def export_warnings(choices: dict[str, tuple[str, dict]], target: str) -> list[str]:
    """WARNING lines for every non-default method the export target cannot express."""
    out = []
    for axis, (name, _) in choices.items():
        row = method(axis, name)
        if target not in row.exports:
            out.append(f"{row.label}: {row.unsupported or 'not expressible in ' + target}")
    return out

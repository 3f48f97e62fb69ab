"""The data-parallel method registry: one torch-free table of every way replicas exchange
gradients or parameters (DESIGN.md, "Data-parallel methods (one unit)").

A method sits on one of five axes; the Plan stores one choice per axis (`MethodChoice`: name +
parameters). Each row says whether the method leaves the training mathematics unchanged
(`exact`: the search may pick it on speed) or changes it (approximate: priced only when the user
allows it, never chosen silently), its parameters with defaults, ranges and units, and what it
composes with. The CLI, the planner's enumeration, Plan validation, the executor's check
(meshplan/feasibility.py) and the exports all read this table.

Adding a method: its row here, a cost object in planner/dp_cost.py, an executor module in
executor/methods/, and its tests (CONTRIBUTING in the README).
"""
from __future__ import annotations

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

    def coerce(self, value: Any, where: str) -> Any:
        """`value` (a CLI string or a JSON value) as this parameter's type, range-checked."""
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
        if self.kind is not bool and ((self.low is not None and value < self.low)
                                      or (self.high is not None and value > self.high)):
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
    Method(name="none", axis="compression", exact=True, exports=_native(*_ALL),
           summary="full-precision gradients (the training dtype's fp32 grads)",
           source="PyTorch DDP / FSDP2"),
    Method(name="fp16", axis="compression", exact=False, zero_stages=(0, 1),
           summary="gradients cast to fp16 for the all-reduce (half the bytes; rounding error)",
           source="torch default_hooks.fp16_compress_hook",
           exports={"megatron": "--grad-reduce-in-bf16 (Megatron reduces in bf16, not fp16)",
                    "deepspeed": "communication_data_type fp16", "accelerate": "DDP comm hook fp16"},
           unsupported="fp16 gradient compression is not expressible; gradients are reduced in full precision"),
    Method(name="powersgd", axis="compression", exact=False, zero_stages=(0, 1), tensor_parallel=False,
           split_backward=False,
           summary="rank-r low-rank gradient approximation with error feedback (two small all-reduces)",
           source="Vogels et al., NeurIPS 2019; torch powerSGD_hook",
           params=(
               Param(name="rank", kind=int, default=2, low=1, high=1024,
                     doc="matrix_approximation_rank r: P is n x r, Q is m x r"),
               Param(name="start_iter", kind=int, default=2, low=2, high=10**9, unit="steps",
                     doc="plain all-reduce before this step (torch needs >= 2 with error feedback)"),
               Param(name="min_compression_rate", kind=float, default=2.0, low=1.0, unit="x",
                     doc="a matrix is compressed only when (n m) / ((n + m) r) >= this; else sent dense"),
               Param(name="error_feedback", kind=bool, default=True, doc="add the last step's residual"),
               Param(name="warm_start", kind=bool, default=True, doc="reuse last step's Q"),
           ),
           exports={"accelerate": "DDP comm hook powersgd (DDPCommunicationHookType.POWER_SGD)"},
           unsupported="PowerSGD is not expressible; gradients are reduced dense"),
    # --- replica synchronisation --------------------------------------------------------------
    Method(name="allreduce", axis="sync", exact=True, exports=_native(*_ALL),
           summary="synchronous data parallelism: gradients averaged every step",
           source="PyTorch DDP (Li et al., VLDB 2020)"),
    # --- communication scheduling -------------------------------------------------------------
    Method(name="buckets", axis="comm_schedule", exact=True,
           summary="gradients all-reduced in fixed-size buckets as backward produces them",
           source="PyTorch DDP bucket_cap_mb (Li et al., VLDB 2020)",
           params=(Param(name="bucket_mb", kind=int, default=25, low=1, high=4096, unit="MiB",
                         doc="DDP bucket_cap_mb"),),
           exports={"torchtitan": "", "megatron": "--ddp-bucket-size", "deepspeed": "reduce_bucket_size",
                    "accelerate": "bucket_cap_mb"}),
    # --- state placement ----------------------------------------------------------------------
    Method(name="none", axis="offload", exact=True, exports=_native(*_ALL),
           summary="parameters, gradients and optimizer states on the device",
           source=""),
    Method(name="cpu", axis="offload", exact=True, zero_stages=(3,),
           summary="FSDP2 CPUOffloadPolicy: sharded parameters, gradients and the optimizer step on the host",
           source="Ren et al., ZeRO-Offload, USENIX ATC 2021; torch FSDP2 CPUOffloadPolicy",
           exports={"torchtitan": "[training] enable_cpu_offload = true",
                    "megatron": "--optimizer-cpu-offload (Megatron-Core >= 0.11)",
                    "deepspeed": "offload_optimizer/offload_param device cpu",
                    "accelerate": "fsdp_offload_params"}),
    # --- wave scheduling ----------------------------------------------------------------------
    Method(name="1", axis="waves", exact=True, exports=_native(*_ALL),
           summary="one wave of training per device", source=""),
)

_BY_KEY = {(m.axis, m.name): m for m in METHODS}
DEFAULTS = {"compression": "none", "sync": "allreduce", "comm_schedule": "buckets", "offload": "none",
            "waves": "1"}
"""The plain data parallelism every plan has unless a method is pinned or chosen."""


def names(axis: str) -> list[str]:
    return [m.name for m in METHODS if m.axis == axis]


def method(axis: str, name: str, where: str = "") -> Method:
    """The registry row, or one line listing the valid names of the axis."""
    if axis not in AXES:
        raise MeshplanError(f"{where or 'dp_methods'}: unknown axis {axis!r}; use one of {', '.join(AXES)}")
    hit = _BY_KEY.get((axis, name))
    if hit is None:
        raise MeshplanError(f"{where or axis} = {name!r}: unknown {AXES[axis]} method; "
                            f"use one of {', '.join(names(axis))}")
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
            raise MeshplanError(f"{flag} {text!r}: {item!r} is not key=value; write e.g. "
                                f"{name}:{row.params[0].name}={row.params[0].default}" if row.params else
                                f"{flag} {text!r}: {name} takes no parameters")
        given[key.strip()] = value.strip()
    return row.name, row.resolve(given, f"{flag} {name}")


def parse_allow(axis: str, text: str, flag: str) -> tuple[str, ...]:
    """`NAME,...|all` -> the approximate methods of the axis the user lets the search price."""
    if text.strip() == "all":
        return tuple(approximate(axis))
    out = []
    for name in filter(None, (s.strip() for s in text.split(","))):
        row = method(axis, name, flag)
        if row.exact:
            raise MeshplanError(f"{flag} {name}: {name} is exact and always searched; list approximate "
                                f"methods only ({', '.join(approximate(axis)) or 'none on this axis'})")
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

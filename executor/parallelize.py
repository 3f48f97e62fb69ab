"""`apply(model, plan, mesh)`: turn one LayeredModel into this rank's parallelised parts.

The order is fixed (torchtitan's `parallelize`), each step one small `apply_*` function:
  1. pipeline split   – keep this pipeline rank's stages (FQN lists from plan.stages)
  2. tensor/sequence  – DTensor parallelize_module from the profile's TP rules (needs unsharded
     parallel              params, so it precedes data parallelism)
  3. recompute        – activation checkpointing per layer (inside FSDP/DDP, as torchtitan)
  4. ZeRO-2/3         – FSDP2 fully_shard on the meta stage (shards before anything is allocated),
                        with the offload method's policy (offload=cpu: CPUOffloadPolicy) and
                        FSDP2's custom comms counting every gather / reduce-scatter
  5. materialise      – allocate and fill each local shard from the single-process weights, on
                        the offload method's device (the host for offload=cpu)
  6. DDP / ZeRO-1     – wrap real tensors (DDP broadcasts rank 0's state at construction) with
                        the comm_schedule method's buckets, then the compression method's comm
                        hook (allreduce / fp16 / powersgd); DTensor stages, and zero-bubble
                        schedules (whose split weight-gradient pass DDP's hooks miss), get a
                        bucketed gradient reducer instead (same buckets, fp16 wire for fp16)
  7. schedule         – torch.distributed.pipelining stages and the plan's schedule (pp > 1)
  8. sync method      – sync != allreduce: the replicas stay plain (no DDP; local-sgd keeps DDP with
                        torch's post-local SGD hook) and executor/methods/sync_*.py runs each step
The data-parallel methods' executor modules live in executor/methods/ (one per registry row);
every collective they issue is counted into `Parallelized.comm_bytes` (meshplan/comm_bytes.py),
closed once per optimizer step by `end_step()` (executor/train.py).
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor

from meshplan.comm_bytes import ByteCounter
from meshplan.errors import MeshplanError
from meshplan.executor import data_parallel as dp_
from meshplan.executor import methods
from meshplan.executor.activation_checkpoint import apply_ac
from meshplan.executor.data import IGNORE_INDEX
from meshplan.executor.grad_clip import clip_grad_norm
from meshplan.executor.materialize import FullValue, init_source, materialize, state_source
from meshplan.executor.methods.sync import SyncMethod
from meshplan.executor.model import tp_rules_for
from meshplan.executor.parallel_dims import ParallelDims
from meshplan.executor.phases import PhaseTimer, time_stages
from meshplan.executor.pipeline import build_schedule, schedule_step, split_stages
from meshplan.executor.tensor_parallel import apply_tp
from meshplan.executor.tied import TiedGrads
from meshplan.feasibility import SPLIT_BACKWARD
from meshplan.model_profile import TPRule
from meshplan.models.identity import full_state, retie, tied_groups
from meshplan.models.zoo.base import LayeredModel
from meshplan.plan import MESH_AXES, Plan


@dataclass(kw_only=True)
class Parallelized:
    """This rank's share of the model and how to run one training step on it."""

    plan: Plan
    dims: ParallelDims
    device: torch.device
    parts: list[nn.Module]
    """Model chunks held by this rank (one per local pipeline stage), DDP/FSDP-wrapped."""
    stage_ids: list[int]
    loss_fn: Callable
    schedule: object | None = None
    """torch.distributed.pipelining schedule, or None when pp = 1."""
    stages: list = field(default_factory=list)
    reducers: list = field(default_factory=list)
    """ReplicaGradReducer per part for DTensor stages under DDP/ZeRO-1 semantics."""
    autocast_dtype: torch.dtype | None = None
    comm_bytes: ByteCounter = field(default_factory=ByteCounter)
    phases: PhaseTimer = field(default_factory=lambda: PhaseTimer(torch.device("cpu")))
    """Per-phase step times (executor/phases.py): apply() gives it the device; train.py reads it."""
    """This rank's data-parallel bytes on the wire, per mesh axis, one entry per optimizer step."""
    offload_dir: str = "offload"
    """offload=nvme: this rank's folder for the optimizer-state files (one subfolder per part)."""
    tied: TiedGrads | None = None
    """Keeps the copies of tied weights equal (executor/tied.py); None when the model has none."""
    sync: SyncMethod | None = None
    """The sync method's SyncMethod (executor/methods/sync.py: it runs the step); None for
    sync=allreduce, whose gradients DDP / the reducers average."""

    def parameters(self) -> list[nn.Parameter]:
        return [p for part in self.parts for p in part.parameters()]

    def make_optimizers(self, name: str = "adamw", lr: float = 3e-4, weight_decay: float = 0.1) -> list:
        """One optimizer per part ("adamw" or "sgd"); ZeRO-1 plans get sharded optimizer states."""
        opts = [
            dp_.build_optimizer(
                part,
                self.dims,
                self.plan,
                name,
                lr,
                weight_decay,
                self.comm_bytes,
                offload_dir=f"{self.offload_dir}/part{i}",
            )
            for i, part in enumerate(self.parts)
        ]
        return self.sync.wrap_optimizers(opts, name, lr, weight_decay) if self.sync else opts

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Clip to a global L2 norm over every parallel dimension; returns the norm before clipping
        (a 0-dim tensor: no host synchronisation until you read it)."""
        skip = self.tied.duplicates if self.tied else set()  # a tied weight counts once ...
        norm = clip_grad_norm(
            [p for p in self.parameters() if id(p) not in skip], max_norm, self.dims.pp_group, self.device
        )
        if self.tied and skip and max_norm > 0:  # ... and all its copies are scaled alike
            self.tied.scale_duplicates((max_norm / (norm + 1e-6)).clamp(max=1.0))
        return norm

    def local_batch(self, tensor: torch.Tensor) -> torch.Tensor:
        """This data-parallel replica's slice of a global batch (dim 0)."""
        per = tensor.shape[0] // self.dims.dp_degree
        return tensor[self.dims.dp_rank * per : (self.dims.dp_rank + 1) * per]

    def step(self, inputs: torch.Tensor, targets: torch.Tensor) -> float:
        """Forward + backward of one replica batch (all microbatches) and the gradient reduction;
        returns the global-batch mean loss, identical on every rank. The caller clips and steps."""
        return self.global_losses([self.step_local(inputs, targets)])[0]

    def step_local(self, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """As `step` without communicating the loss: returns this rank's share of it (its replica's
        mean on loss-owning ranks, 0 elsewhere); `global_losses` turns shares into losses."""
        if targets is None:  # models trained on their output alone: a chunkable placeholder
            targets = torch.empty(inputs.shape[0], 0)
        with self._autocast():
            if self.schedule:
                with self._phase("pipeline"):  # less its stages' forward and backward (time_stages)
                    local = self._pipelined(inputs, targets)
            else:
                local = self._accumulated(inputs, targets)
        with self._phase("dp_comm"):
            for reducer in self.reducers:
                reducer.reduce()
            if self.tied:
                self.tied.reduce()
        if not self.dims.is_loss_owner:
            return torch.zeros((), dtype=torch.float64, device=self.device)
        return local.detach().to(torch.float64)

    def global_losses(self, shares: list[torch.Tensor]) -> list[float]:
        """Global-batch losses from every step's shares with ONE all-reduce (so a training loop
        need not synchronise on the loss each step)."""
        total = torch.stack([s.to(self.device) for s in shares])
        dist.all_reduce(total)
        return (total / self.dims.dp_degree).tolist()

    def _pipelined(self, inputs, targets) -> torch.Tensor:
        losses = schedule_step(self.schedule, self.stages, inputs.to(self.device), targets.to(self.device))
        return torch.stack([l.detach().float() for l in losses]).mean() if losses else torch.zeros(())

    def _accumulated(self, inputs, targets) -> torch.Tensor:
        (model,), n = self.parts, self.plan.num_microbatches
        # ZeRO-2/3 whose plan chose to reduce-scatter every microbatch keeps FSDP2's sync on: no
        # unsharded gradients are held (runtime behaviour fsdp_reduce_every_microbatch)
        each = self.plan.zero_stage >= 2 and bool(self.plan.runtime_behaviours.get("fsdp_reduce_every_microbatch"))
        total = torch.zeros((), device=self.device)  # no host sync per microbatch on GPU
        for i, (x, y) in enumerate(zip(inputs.chunk(n), targets.chunk(n))):
            with _grad_sync(model, last=each or i == n - 1):
                with self._phase("forward"):
                    loss = self.loss_fn(model(x.to(self.device)), y.to(self.device)) / n
                with self._phase("backward"):
                    loss.backward()
            total += loss.detach().float()
        return total

    def _phase(self, name: str):
        return self.phases.phase(name)

    def _autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)


@runtime_checkable
class GradientSyncToggle(Protocol):
    """A module that reduces gradients only when told to (FSDP2's FSDPModule, ByteScheduler's
    wrapper): off for all but the last microbatch of a step."""

    def set_requires_gradient_sync(self, flag: bool, /) -> None: ...


def _grad_sync(model: nn.Module, last: bool):
    """No gradient reduction on all but the last microbatch (DDP no_sync / FSDP2 flag); `last`
    True keeps it on."""
    if isinstance(model, dp_.DDP):
        return contextlib.nullcontext() if last else model.no_sync()
    if isinstance(model, GradientSyncToggle):
        model.set_requires_gradient_sync(last)
    return contextlib.nullcontext()


def apply(
    model: LayeredModel, plan: Plan, mesh: DeviceMesh, *, seed: int = 0, device: torch.device | None = None
) -> Parallelized:
    """Parallelise `model` per `plan` on `mesh` (build_mesh(plan, ...)); see the module docstring.

    A meta-device model is filled from `init_tensor(fqn, shape, seed)`; a real model keeps its
    own weights. Every rank must pass the same model.

    Example (under torchrun, after init_process_group)::

        par = apply(build_model_for_plan(plan, "meta"), plan, build_mesh(plan, "cpu"))
        opts = par.make_optimizers("adamw", lr=3e-4)
        for x, y in global_batches:
            loss = par.step(par.local_batch(x), par.local_batch(y))  # same value on every rank
            par.clip_grad_norm_(1.0)
            for opt in opts:
                opt.step()
                opt.zero_grad()
    """
    if tuple(mesh.mesh_dim_names or ()) != MESH_AXES:
        raise MeshplanError(
            f"apply(mesh=...): mesh axes {mesh.mesh_dim_names} are not {MESH_AXES}; "
            "build the mesh with meshplan.executor.build_mesh(plan, device_type)"
        )
    dims = ParallelDims(plan=plan, mesh=mesh)
    device = device or _default_device(mesh)
    on_meta = any(p.is_meta for p in model.parameters())
    # every parameter and buffer as the model's own code set it (non-persistent buffers too)
    full_value = init_source(seed) if on_meta else state_source(full_state(model))
    tied = tied_groups(model)  # before .to("meta"), which unties them
    full_value = _tied_source(full_value, tied)
    meta = model if on_meta else copy.deepcopy(model).to("meta")
    rules = tp_rules_for(meta) if plan.tensor_parallel_degree > 1 else {}
    stage_ids, stage_parts = split_stages(meta, plan, dims.pp_rank)  # 1
    counter = ByteCounter()
    wrapped = [_parallelize_part(p, plan, dims, rules, device, full_value, counter, tied) for p in stage_parts]
    parts, reducers = [p for p, _ in wrapped], [r for _, r in wrapped if r is not None]
    result = Parallelized(
        plan=plan,
        dims=dims,
        device=device,
        parts=parts,
        stage_ids=stage_ids,
        loss_fn=_loss_fn(model, plan, dims.dp_degree),
        reducers=reducers,
        autocast_dtype=_autocast_dtype(plan, device),
        comm_bytes=counter,
    )
    result.tied = TiedGrads(plan, tied, parts, mesh) if tied else None
    sync, sync_params = methods.sync_of(plan)  # 8
    result.sync = sync.build(result, sync_params, counter) if dims.dp_degree > 1 else None
    if plan.pipeline_parallel_degree > 1 or len(plan.stages) > 1:  # 7
        result.schedule, result.stages = build_schedule(plan, stage_ids, parts, mesh["pp"], device, result.loss_fn)
    result.phases = PhaseTimer(device)
    time_stages(result.stages, result.phases)
    return result


def _parallelize_part(
    part: LayeredModel,
    plan: Plan,
    dims: ParallelDims,
    rules: dict[str, TPRule],
    device: torch.device,
    full_value: FullValue,
    counter: ByteCounter,
    tied: list[list[str]],
) -> tuple[nn.Module, dp_.ReplicaGradReducer | None]:
    if plan.tensor_parallel_degree > 1:  # 2
        apply_tp(part, rules, dims.mesh["tp"], plan.sequence_parallel)
    apply_ac(part, plan.recompute)  # 3
    data_parallel = dims.dp_degree > 1
    if data_parallel and plan.zero_stage >= 2:  # 4
        dp_.apply_fsdp(part, dims, plan, device, counter)
    # FSDP2 CPU offload keeps the sharded parameters in host memory (torchtitan does the same)
    offload, offload_params = methods.offload_of(plan)
    materialize(part, offload.shard_device(offload_params, device, plan.zero_stage), full_value)  # 5
    _retie_plain(part, tied)  # one weight again where nothing sharded it (DDP then sees it once)
    if data_parallel and plan.zero_stage <= 1 and any(p.requires_grad for p in part.parameters()):  # 6
        if not methods.sync_of(plan)[0].USES_DDP:
            return part, None  # a sync method on plain replicas (executor/methods/sync.py)
        if dp_.has_dtensor_params(part) or plan.pipeline_schedule in SPLIT_BACKWARD:
            return part, dp_.replica_reducer(part, dims, plan, counter)
        return dp_.apply_ddp(part, dims, plan, device, counter), None
    return part, None


def _retie_plain(part: nn.Module, groups: list[list[str]]) -> None:
    """Tie the plain-tensor copies of each group held whole by this part (TiedGrads then has one)."""
    names = {n for n, _ in part.named_parameters(remove_duplicate=False)}
    for group in groups:
        held = [n for n in group if n in names]
        if len(held) > 1 and not any(isinstance(part.get_parameter(n), DTensor) for n in held):
            retie(part, [held])


def _tied_source(full_value: FullValue, groups: list[list[str]]) -> FullValue:
    """Every FQN of a tied group starts from its first FQN's value (one weight, equal copies)."""
    first = {fqn: names[0] for names in groups for fqn in names[1:]}
    if not first:
        return full_value
    return FullValue(
        value=lambda fqn, shape, dtype: full_value(first.get(fqn, fqn), shape, dtype), state=full_value.state
    )


class _LossFn:
    """model.loss, with the empty placeholder target (no targets) passed on as None.

    Token weighting: when some labels of the step's global batch are ignored (-100: masked-LM
    positions, padding), each microbatch's mean loss is weighted by its share of the counted
    labels, `counted_mb * n * dp / counted_global`, so that after the 1/n of gradient
    accumulation (or the pipeline schedule's) and the 1/dp of the data-parallel mean the step's
    loss and gradients are those of the mean over all counted labels of the batch, as the model's
    own loss over the whole batch is. With equal counts the weight is exactly 1."""

    def __init__(self, model: LayeredModel, plan: Plan, dp_degree: int):
        self.model, self.per_replica_parts = model, plan.num_microbatches * dp_degree
        self.num_targets: int | None = None
        """Counted labels of the step's global batch (None: no label is ignored, no weighting)."""

    def __call__(self, output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss = self.model.loss(output, None if target.numel() == 0 and target.dim() == 2 else target)
        if not self.num_targets or target.is_floating_point():
            return loss
        counted = int((target != IGNORE_INDEX).sum())
        if counted == 0:  # nothing counted here: no contribution, the graph kept for backward
            return output.sum() * 0.0
        return loss * (counted * self.per_replica_parts / self.num_targets)


def _loss_fn(model: LayeredModel, plan: Plan, dp_degree: int) -> _LossFn:
    return _LossFn(model, plan, dp_degree)


def _default_device(mesh: DeviceMesh) -> torch.device:
    if mesh.device_type == "cuda":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(mesh.device_type)


def _autocast_dtype(plan: Plan, device: torch.device) -> torch.dtype | None:
    """bf16 autocast on GPU for precision "bf16"; CPU runs fp32 (CPU autocast is slow and lossy)."""
    return torch.bfloat16 if plan.precision == "bf16" and device.type == "cuda" else None

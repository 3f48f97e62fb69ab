"""Pipeline parallelism: cut the model into the plan's stages and drive them with a schedule.

A stage is a copy of the (meta) model with the layers of other stages removed (torchtitan's
manual split): `embed`/`head` set to None, other `layers.*` keys deleted, so every parameter
keeps its FQN. Stage s runs on pipeline rank s % pp (the "loop" placement), so with v virtual
stages a rank holds stages r, r + pp, ..., r + (v-1)pp.
Schedules are torch.distributed.pipelining's; gradients come out scaled by 1/num_microbatches
(scale_grads=True), i.e. the gradient of the mean loss over the replica's batch.
gloo sends and receives only contiguous tensors: every stage's outputs are made contiguous (a
ViT's patch embedding ends in a transpose) and so are the gradients it sends back for its
inputs (`contiguous_boundaries`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    PipelineScheduleMulti,
    PipelineScheduleSingle,
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    ScheduleInterleavedZeroBubble,
    ScheduleLoopedBFS,
)

from meshplan.models.user_models import ContiguousGrad
from meshplan.models.zoo.base import LayeredModel
from meshplan.plan import Plan

SCHEDULE_CLASSES: dict[str, type[PipelineScheduleSingle] | type[PipelineScheduleMulti]] = {
    "GPipe": ScheduleGPipe,
    "1F1B": Schedule1F1B,
    "Interleaved1F1B": ScheduleInterleaved1F1B,
    "LoopedBFS": ScheduleLoopedBFS,
    "InterleavedZeroBubble": ScheduleInterleavedZeroBubble,
}


def local_stage_ids(plan: Plan, pp_rank: int) -> list[int]:
    """Stages this pipeline rank runs (loop placement)."""
    return [s for s, rank in enumerate(plan.stage_ranks()) if rank == pp_rank]


def split_stage(model: LayeredModel, keep: list[str]) -> LayeredModel:
    """A copy of `model` holding only the layers `keep` (FQNs unchanged)."""
    stage = copy.deepcopy(model)
    if "embed" not in keep:
        stage.embed = None
    if "head" not in keep:
        stage.head = None
    for key in list(stage.layers.keys()):
        if f"layers.{key}" not in keep:
            del stage.layers[key]
    return stage


def split_stages(model: LayeredModel, plan: Plan, pp_rank: int) -> tuple[list[int], list[LayeredModel]]:
    """(stage ids, stage modules) of this pipeline rank; the whole model when pp = 1."""
    if plan.pipeline_parallel_degree == 1 and len(plan.stages) == 1:
        return [0], [model]
    ids = local_stage_ids(plan, pp_rank)
    return ids, [split_stage(model, plan.stages[s]) for s in ids]


def build_schedule(
    plan: Plan,
    stage_ids: list[int],
    parts: list[nn.Module],
    pp_mesh: DeviceMesh,
    device: torch.device,
    loss_fn: Callable,
):
    """PipelineStage per local stage, then the plan's schedule over them."""
    num_stages = len(plan.stages)
    group = pp_mesh.get_group()
    for part in parts:
        contiguous_boundaries(part)
    stages = [PipelineStage(part, s, num_stages, device, group=group) for s, part in zip(stage_ids, parts)]
    cls = SCHEDULE_CLASSES[plan.pipeline_schedule]
    if issubclass(cls, PipelineScheduleMulti):
        # a list of the stages' base class, as the schedule is typed (lists are invariant)
        return cls(list(stages), n_microbatches=plan.num_microbatches, loss_fn=loss_fn), stages
    assert len(stages) == 1, f"{plan.pipeline_schedule} runs one stage per rank"
    return cls(stages[0], n_microbatches=plan.num_microbatches, loss_fn=loss_fn), stages


def contiguous_boundaries(part: nn.Module) -> None:
    """Hooks on a stage module: contiguous outputs (what the stage sends forward) and contiguous
    gradients for its inputs that require grad (what it sends back)."""
    part.register_forward_pre_hook(lambda m, args: tuple(_grad_contiguous(a) for a in args))
    part.register_forward_hook(lambda m, args, out: _contiguous(out))


def _grad_contiguous(t):
    return ContiguousGrad.apply(t) if isinstance(t, torch.Tensor) and t.requires_grad else t


def _contiguous(out):
    if isinstance(out, torch.Tensor):
        return out.contiguous()
    if isinstance(out, tuple):
        return tuple(_contiguous(t) for t in out)
    return out


def schedule_step(schedule, stages, inputs: torch.Tensor, targets: torch.Tensor) -> list[torch.Tensor]:
    """One pipelined forward+backward over the replica batch; returns the last stage's
    per-microbatch losses (empty on ranks without the last stage)."""
    first = any(st.is_first for st in stages)
    last = any(st.is_last for st in stages)
    losses: list[torch.Tensor] = []
    args = (inputs,) if first else ()
    kwargs = {"target": targets, "losses": losses} if last else {}
    schedule.step(*args, **kwargs)
    return losses

"""`check_plan`: every mismatch between a plan, its model and the launch, found before any
process starts, as one MeshplanError line naming the value and the fix."""
from __future__ import annotations

import torch

from meshplan.errors import MeshplanError
from meshplan.executor.model import build_model_for_plan, tp_rules_for
from meshplan.executor.pipeline import SCHEDULE_CLASSES, SPLIT_BACKWARD
from meshplan.executor.tensor_parallel import tp_divisor_problem
from meshplan.plan import Plan


def local_device_count() -> int:
    """GPUs on this node, or 0 on a CPU-only node (where any number of processes may run)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def check_plan(plan: Plan, *, nnodes: int = 1) -> None:
    """Raise MeshplanError if `plan` cannot run on its model or on `nnodes` nodes of this kind."""
    plan.validate("plan")
    _check_launch(plan, nnodes)
    _check_features(plan)
    model = build_model_for_plan(plan, "meta")
    names = model.layer_names()
    if plan.layers != names:
        bad = next((a for a, b in zip(plan.layers, names) if a != b), None) or \
            (plan.layers[len(names)] if len(plan.layers) > len(names) else names[len(plan.layers)])
        raise MeshplanError(f"plan.layers: {bad!r} does not match the layers of {plan.model_name} "
                            f"({names[0]} .. {names[-1]}, {len(names)} layers); re-plan for this model")
    seq = getattr(model, "seq_len", 1)
    if seq > 1 and plan.seq_len > seq:
        raise MeshplanError(f"plan.seq_len = {plan.seq_len}: {plan.model_name} handles at most {seq} tokens; "
                            "re-plan with a shorter sequence or a model with a longer context")
    _check_tp(plan, model)


def _check_launch(plan: Plan, nnodes: int) -> None:
    if nnodes < 1 or plan.world_size % nnodes:
        raise MeshplanError(f"--nnodes {nnodes}: does not divide plan.world_size = {plan.world_size}; "
                            "launch on a divisor of the world size")
    per_node, gpus = plan.world_size // nnodes, local_device_count()
    if gpus and per_node > gpus:
        raise MeshplanError(f"plan.world_size = {plan.world_size}: needs {per_node} GPUs per node on {nnodes} "
                            f"node(s) but this node has {gpus}; use --nnodes {-(-plan.world_size // gpus)}")


def _check_features(plan: Plan) -> None:
    if plan.context_parallel_degree > 1:
        raise MeshplanError(f"plan.context_parallel_degree = {plan.context_parallel_degree}: the executor does not "
                            "run context parallelism; re-plan with context_parallel_degree 1")
    if plan.offload and plan.zero_stage != 3:
        raise MeshplanError(f"plan.offload = true with zero_stage {plan.zero_stage}: the executor offloads only "
                            "with FSDP2 (zero_stage 3); set zero_stage 3 or offload false")
    if plan.gradient_comm != "allreduce" and plan.zero_stage >= 2:
        raise MeshplanError(f"plan.gradient_comm = {plan.gradient_comm!r}: FSDP2 (zero_stage {plan.zero_stage}) "
                            "has no communication hooks; use allreduce or zero_stage 0/1")
    if plan.gradient_comm == "powersgd" and plan.tensor_parallel_degree > 1:
        raise MeshplanError("plan.gradient_comm = 'powersgd': needs DDP, which cannot hold tensor-parallel "
                            "parameters; use allreduce or fp16 with tensor_parallel_degree > 1")
    if plan.pipeline_schedule not in SCHEDULE_CLASSES:
        raise MeshplanError(f"plan.pipeline_schedule = {plan.pipeline_schedule!r}: not runnable; use one of "
                            + ", ".join(SCHEDULE_CLASSES))
    if plan.pipeline_schedule in SPLIT_BACKWARD and plan.pipeline_parallel_degree > 1:
        if plan.zero_stage >= 2 and plan.data_parallel_degree > 1:
            raise MeshplanError(f"plan.pipeline_schedule = {plan.pipeline_schedule!r} with zero_stage "
                                f"{plan.zero_stage}: FSDP2 misses the split weight-gradient pass; use "
                                "Interleaved1F1B or zero_stage 0/1")
        if plan.gradient_comm == "powersgd" and plan.data_parallel_degree > 1:
            raise MeshplanError(f"plan.gradient_comm = 'powersgd' with {plan.pipeline_schedule}: needs DDP hooks, "
                                "which miss the split weight-gradient pass; use allreduce or fp16")
    pp, nmb = plan.pipeline_parallel_degree, plan.num_microbatches
    if pp > 1 and plan.pipeline_schedule != "GPipe" and nmb % pp and nmb > pp:
        raise MeshplanError(f"plan.num_microbatches = {nmb}: {plan.pipeline_schedule} needs a multiple of "
                            f"pp = {pp} when above it; use {nmb - nmb % pp} or {nmb + pp - nmb % pp}")


def _check_tp(plan: Plan, model) -> None:
    tp = plan.tensor_parallel_degree
    if tp == 1:
        if plan.sequence_parallel:
            raise MeshplanError("plan.sequence_parallel = true with tensor_parallel_degree 1: sequence "
                                "parallelism splits over the TP group; set tensor_parallel_degree > 1 or false")
        return
    rules = tp_rules_for(model)
    problem = tp_divisor_problem(rules, tp)
    if problem:
        raise MeshplanError(f"plan.tensor_parallel_degree = {tp}: {problem}; use a divisor of it")
    if plan.sequence_parallel and plan.seq_len % tp:
        raise MeshplanError(f"plan.seq_len = {plan.seq_len}: sequence parallelism needs it divisible by "
                            f"tensor_parallel_degree = {tp}")

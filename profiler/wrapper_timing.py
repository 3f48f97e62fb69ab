"""Overheads of the executor's parallel wrappers, measured on a one-rank mesh.

Tensor parallelism runs a layer as DTensors (executor/tensor_parallel.apply_tp) and ZeRO-2/3 as
FSDP2 `fully_shard` units; on a CPU rank each DTensor op pays dispatch and sharding propagation,
and each FSDP2 unit its pre/post hooks and all-gather copy-in/out. These costs do not shrink with
the degree t or d (the arithmetic does), so one measurement at degree 1 — the wrapped layer
against the plain one, same input, same host share — gives the per-microbatch overhead, and the
optimizer step over DTensor parameters its per-step overhead (LayerProfile.framework_overhead_s).
Activation recompute is measured the same way (executor/activation_checkpoint.apply_ac, full and
selective): "recompute_full" / "recompute_selective" are the checkpointed layer's forward+backward
minus the plain one's — the recomputed forward plus the checkpoint machinery (saved-tensor hooks,
the selective policy's dispatch), which on small layers costs more than the arithmetic.
Skipped (empty) where a process group already exists (inside a launched job) or on CUDA.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from meshplan.model_profile import TPRule
from meshplan.profiler.step_timing import optimizer_step_cpu_s


def _one_rank_mesh():
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return init_device_mesh("cpu", (1,))


def _wrap_tp(layer, rule: TPRule, mesh):
    from meshplan.executor.tensor_parallel import apply_tp

    apply_tp(layer, {"": rule}, mesh, False)
    return layer


def _wrap_fsdp(layer, rule: TPRule, mesh):
    from torch.distributed.fsdp import fully_shard

    fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    return layer


def _wrap_recompute(mode: str):
    def wrap(layer, rule: TPRule, mesh):
        from meshplan.executor.activation_checkpoint import apply_ac

        apply_ac(layer, {"": mode})
        return layer
    return wrap


WRAPPERS = {"tp": _wrap_tp, "fsdp": _wrap_fsdp, "recompute_full": _wrap_recompute("full"),
            "recompute_selective": _wrap_recompute("selective")}
PER_STEP = ("tp", "fsdp")
"""Wrappers whose parameters the optimizer then steps differently (DTensor / sharded): their
optimizer-step overhead is measured too."""


def wrapper_overheads(layers: dict[str, torch.nn.Module], rules: dict[str, TPRule],
                      inputs: dict[str, torch.Tensor], measure_times) -> dict[str, dict[str, float]]:
    """{fqn: {"tp": s, "fsdp": s, "tp_optimizer": s, "fsdp_optimizer": s}} in CPU seconds
    (callers scale by the host share, which these passes do not enter: their collectives wait on
    nothing but still run gloo threads); {} when a process group exists already."""
    if dist.is_available() and dist.is_initialized():
        return {}
    mesh = _one_rank_mesh()
    try:
        return {fqn: _layer_overheads(layer, rules[fqn], inputs[fqn], mesh, measure_times)
                for fqn, layer in layers.items()}
    finally:
        dist.destroy_process_group()


def _layer_overheads(layer, rule: TPRule, x, mesh, measure_times) -> dict[str, float]:
    plain_f, plain_b = measure_times(layer, x, "cpu")
    plain_opt = optimizer_step_cpu_s(layer, x)[0]
    out = {}
    for name, wrap in WRAPPERS.items():
        if name == "tp" and rule.kind not in ("block", "embedding", "head"):
            continue
        try:
            wrapped = wrap(copy.deepcopy(layer), rule, mesh)
            fwd, bwd = measure_times(wrapped, x, "cpu")
            opt = optimizer_step_cpu_s(wrapped, x)[0] if name in PER_STEP else 0.0
        except Exception:  # a layer a wrapper cannot take: no measurement, the model then ignores it
            continue
        key = name if name in PER_STEP else f"{name}:b{x.shape[0]}"  # recompute scales with b
        out[key] = max(0.0, fwd + bwd - plain_f - plain_b)
        if name in PER_STEP:
            out[f"{name}_optimizer"] = max(0.0, opt - plain_opt)
    return out

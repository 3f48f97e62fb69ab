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
import statistics
import time

import torch
import torch.distributed as dist

from meshplan.model_profile import TPRule
from meshplan.profiler.runner import clear_grad, forward_backward
from meshplan.profiler.step_timing import optimizer_step_cpu_s


def _one_rank_mesh():
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return init_device_mesh("cpu", (1,))


def _wrap_tp(layer, rule: TPRule, mesh):
    from meshplan.executor.wrappers import apply_tp

    apply_tp(layer, {"": rule}, mesh, False)
    return layer


def _wrap_fsdp(layer, rule: TPRule, mesh):
    from torch.distributed.fsdp import fully_shard

    fully_shard(layer, mesh=mesh, reshard_after_forward=True)
    return layer


def _wrap_recompute(mode: str):
    def wrap(layer, rule: TPRule, mesh):
        from meshplan.executor.wrappers import apply_ac

        apply_ac(layer, {"": mode})
        return layer

    return wrap


WRAPPERS = {
    "tp": _wrap_tp,
    "fsdp": _wrap_fsdp,
    "recompute_full": _wrap_recompute("full"),
    "recompute_selective": _wrap_recompute("selective"),
}
PER_STEP = ("tp", "fsdp")
"""Wrappers whose parameters the optimizer then steps differently (DTensor / sharded): their
optimizer-step overhead is measured too."""


def wrapper_overheads(
    layers: dict[str, torch.nn.Module],
    rules: dict[str, TPRule],
    inputs: dict[str, dict[int, torch.Tensor]],
    measure_times,
    window_s: float = 0.0,
) -> dict[str, dict[str, float]]:
    """{fqn: {"tp": s, "fsdp": s, "tp_optimizer": s, "fsdp_optimizer": s, "recompute_full:bB": s,
    ...}} in CPU seconds, unclamped: wrapped minus plain, below zero where the host's noise
    outweighed the overhead (`clamped` makes what the profile stores). Callers scale by the host
    share, which these passes do not enter (their collectives wait on nothing but still run gloo
    threads); {} when a process group exists already. `inputs[fqn]` maps microbatch sizes to
    inputs: TP and FSDP are measured at the smallest (their overhead is per call), recompute at
    each (its machinery grows with the saved bytes), each recompute case over at least `window_s`
    of passes (its wrapped-minus-plain difference is small against a pass)."""
    if dist.is_available() and dist.is_initialized():
        return {}
    mesh = _one_rank_mesh()
    try:
        return {
            fqn: _layer_overheads(layer, rules[fqn], inputs[fqn], mesh, measure_times, window_s)
            for fqn, layer in layers.items()
        }
    finally:
        dist.destroy_process_group()


def paired_extra_s(
    plain: torch.nn.Module,
    wrapped: torch.nn.Module,
    x: torch.Tensor,
    window_s: float,
    warmup: int = 2,
    min_pairs: int = 5,
    max_pairs: int = 400,
) -> float:
    """Median over alternating passes of (wrapped - plain) forward+backward CPU seconds, until
    the pairs cover `window_s` of wall time: each difference is taken on the same host state,
    so drift between two separate timing runs (tens of percent on a shared host, against a
    difference of a fraction of a pass) cancels. Unclamped: negative when noise wins."""

    def pass_cpu_s(layer) -> float:
        clear_grad(x)
        start = time.process_time()
        forward_backward(layer, x)
        return time.process_time() - start

    for _ in range(warmup):
        pass_cpu_s(plain), pass_cpu_s(wrapped)
    diffs: list[float] = []
    t0 = time.perf_counter()
    while len(diffs) < min_pairs or (time.perf_counter() - t0 < window_s and len(diffs) < max_pairs):
        base = pass_cpu_s(plain)
        diffs.append(pass_cpu_s(wrapped) - base)
    return statistics.median(diffs)


def _layer_overheads(
    layer, rule: TPRule, xs: dict[int, torch.Tensor], mesh, measure_times, window_s: float
) -> dict[str, float]:
    x = xs[min(xs)]
    plain_f, plain_b = measure_times(layer, x, "cpu")
    plain_opt = optimizer_step_cpu_s(layer, x)[0]
    out = {}
    for name, wrap in WRAPPERS.items():
        if name == "tp" and rule.kind not in ("block", "embedding", "head"):
            continue
        try:
            wrapped = wrap(copy.deepcopy(layer), rule, mesh)
            if name in PER_STEP:
                fwd, bwd = measure_times(wrapped, x, "cpu")
                out[name] = fwd + bwd - plain_f - plain_b
                out[f"{name}_optimizer"] = optimizer_step_cpu_s(wrapped, x)[0] - plain_opt
                continue
            for b, xb in sorted(xs.items()):  # recompute: per size, against the plain layer
                out[f"{name}:b{b}"] = paired_extra_s(layer, wrapped, xb, window_s)
        except Exception:  # a layer a wrapper cannot take: no measurement, the model then ignores it
            continue
    return out


def clamped(raw: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """What the profile stores: an overhead measured below zero is noise around zero, charged 0."""
    return {fqn: {key: max(0.0, value) for key, value in row.items()} for fqn, row in raw.items()}

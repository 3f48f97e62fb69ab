"""The executor's public wrappers: what the profiler times, exactly as the executor applies them.

docs/design.md ("Dependency direction"): the profiler measures the executor's own wrappers through this
module and imports nothing else of the executor (tests/test_layering.py holds it to that).
- apply_tp(stage, rules, tp_mesh, sequence_parallel): DTensor tensor/sequence parallel per TPRule
- apply_ac(stage, recompute): activation checkpointing per layer ("full" / "selective")
- optimizer_spec(name, lr, weight_decay) -> (optimizer class, kwargs), as the executor builds it
- clip_grad_norm(params, max_norm, pp_group, device): global-norm clipping over DTensor grads
- contiguous_boundaries(stage): the hooks a pipeline stage's module gets, contiguous sends both ways
- DEFAULT_BUCKET_CAP_MB: DDP's bucket_cap_mb under the default comm_schedule method
- codec(name, params, world), LoopbackComm(world), CODECS: the gradient compressors' codecs and a
  local stand-in group, timed by profiler/codecs.py (executor/methods/codecs.py)
"""

from __future__ import annotations

from meshplan.executor.activation_checkpoint import apply_ac
from meshplan.executor.data_parallel import DEFAULT_BUCKET_CAP_MB
from meshplan.executor.grad_clip import clip_grad_norm
from meshplan.executor.methods.codecs import CODECS, LoopbackComm, codec
from meshplan.executor.optimizers import optimizer_spec
from meshplan.executor.pipeline import contiguous_boundaries
from meshplan.executor.tensor_parallel import apply_tp

__all__ = [
    "apply_tp",
    "apply_ac",
    "optimizer_spec",
    "clip_grad_norm",
    "contiguous_boundaries",
    "DEFAULT_BUCKET_CAP_MB",
    "codec",
    "LoopbackComm",
    "CODECS",
]

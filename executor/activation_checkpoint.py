"""Activation recompute per layer, as the plan says (`plan.recompute[fqn]`).

- "full": the whole layer is recomputed in backward (only its input is saved; Chen et al. 2016).
- "selective": selective activation checkpointing (SAC) over the layer: outputs of the matmuls
  are saved, everything else (norms, activations, the attention core softmax(QK^T)V) is
  recomputed, Korthikanti et al. 2022 §5's "selective" recompute generalised to any layer.
  Outputs of tensor-parallel collectives are saved too (as torchtitan's SAC list does), so the
  recompute never repeats an all-reduce / all-gather / reduce-scatter: the cost model charges
  selective recompute no communication.

The layer's `forward` is replaced in place (no wrapper module), so parameter FQNs — which the
weight materialisation, TP rules and checkpoints key on — stay those of the single-process model.
"""

from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

_SAVE_OPS = {
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops.aten.bmm.default,
    torch.ops.aten.linear.default,
    torch.ops.aten.convolution.default,
    torch.ops._c10d_functional.all_reduce.default,
    torch.ops._c10d_functional.all_gather_into_tensor.default,
    torch.ops._c10d_functional.reduce_scatter_tensor.default,
    torch.ops._c10d_functional.wait_tensor.default,
}


def _sac_policy(ctx, op, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if op in _SAVE_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _checkpointed(forward, mode: str, *args, **kwargs):
    if mode == "selective":
        context = functools.partial(create_selective_checkpoint_contexts, _sac_policy)
        return checkpoint(forward, *args, use_reentrant=False, context_fn=context, **kwargs)
    return checkpoint(forward, *args, use_reentrant=False, preserve_rng_state=False, **kwargs)


def apply_ac(stage: nn.Module, recompute: dict[str, str]) -> int:
    """Wrap the forward of each held layer whose mode is not "none"; returns how many."""
    count = 0
    for fqn, mode in recompute.items():
        if mode == "none":
            continue
        try:
            layer = stage.get_submodule(fqn)
        except AttributeError:
            continue
        if layer is None:
            continue
        layer.forward = functools.partial(_checkpointed, layer.forward, mode)
        count += 1
    return count

"""Tensor and sequence parallelism from the profile's TP rules (Shoeybi et al. 2019 §3;
sequence parallelism: Korthikanti et al. 2022 §4.2.2), via DTensor `parallelize_module`.

Per layer kind:
- "block": column children -> ColwiseParallel, row children -> RowwiseParallel; a replicated
  norm inside a column group's parent (Qwen3's per-head q_norm/k_norm) reads the local heads as a
  DTensor sharded on the head dim (SequenceParallel(sequence_dim=2)), so its replicated weight's
  gradient is summed over the TP ranks. With sequence
  parallelism the block's input and output are sharded on the sequence dim (Shard(1)): norms
  become SequenceParallel, the parent of each column group all-gathers its input
  (PrepareModuleInput Shard(1) -> Replicate) and row layers reduce-scatter (output Shard(1)).
- "embedding": vocab-parallel (RowwiseParallel on nn.Embedding) with a replicated output; with
  SP the layer's output is then sliced to Shard(1) (no communication).
- "head": ColwiseParallel logits gathered to Replicate, so the loss is the plain mean
  cross-entropy; with SP its input is Shard(1) and norms are SequenceParallel.
- "none" (and "conv"): replicated; with SP the input is gathered and the output re-sliced, as for
  a block's replicated non-norm children (a MoE MLP); HF blocks call their attention with
  `hidden_states=` keywords, which the gather before each column group accepts too.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)
from torch.distributed.tensor.parallel.style import ParallelStyle

from meshplan.model_profile import TPRule
from meshplan.models.hf_layers import HFBlock


def apply_tp(stage: nn.Module, rules: dict[str, TPRule], tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
    """Parallelise every layer of a pipeline stage in place (layers it does not hold are skipped)."""
    for fqn, rule in rules.items():
        try:
            layer = stage.get_submodule(fqn)
        except AttributeError:
            continue  # on another pipeline stage
        if layer is None:
            continue
        plan = _layer_plan(rule, sequence_parallel)
        if sequence_parallel and isinstance(layer, HFBlock):
            layer.seq_shards = tp_mesh.size()  # HF layers: RoPE angles for the whole sequence
        if plan:
            parallelize_module(layer, tp_mesh, plan)
        outer = _layer_boundary(rule, sequence_parallel)
        if outer is not None:
            parallelize_module(layer, tp_mesh, outer)


def _layer_plan(rule: TPRule, sp: bool) -> dict[str, ParallelStyle]:
    seq = Shard(1)
    plan: dict[str, ParallelStyle]
    if rule.kind == "block":
        plan = {
            c: ColwiseParallel(input_layouts=seq) if sp and "." not in c else ColwiseParallel() for c in rule.column
        }
        plan.update({r: RowwiseParallel(output_layouts=seq if sp else Replicate()) for r in rule.row})
        parents = sorted({c.rsplit(".", 1)[0] for c in rule.column if "." in c})
        heads = [n for n in rule.replicated if "." in n and n.rsplit(".", 1)[0] in parents]
        if sp:
            plan.update(
                {
                    n: SequenceParallel() if _is_norm_name(n) else _GatherScatter()
                    for n in rule.replicated
                    if n not in heads
                }
            )
            plan.update({p: _GatherSequence() for p in parents})
        # a norm inside a column-split attention (Qwen3's q_norm/k_norm) sees this rank's heads,
        # dim 2 of (B, T, heads, head_dim): its weight replicated, its gradient summed over TP
        plan.update({n: SequenceParallel(sequence_dim=2, use_local_output=True) for n in heads})
        return plan
    if rule.kind == "embedding":
        plan = {r: RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()) for r in rule.row}
        plan.update({c: ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()) for c in rule.column})
        return plan
    if rule.kind == "head":
        plan = {
            c: ColwiseParallel(input_layouts=seq if sp else Replicate(), output_layouts=Replicate())
            for c in rule.column
        }
        plan.update({r: RowwiseParallel(output_layouts=Replicate()) for r in rule.row})
        if sp:
            plan.update({n: SequenceParallel() for n in rule.replicated if _is_norm_name(n)})
        return plan
    return {}


def _layer_boundary(rule: TPRule, sp: bool):
    """Style for the layer module itself, so it reads and writes the SP sequence-sharded layout."""
    if not sp:
        return None
    if rule.kind == "embedding":
        return PrepareModuleOutput(output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),))
    if rule.kind in ("block", "head"):
        return None
    return _GatherScatter()


class _GatherSequence(ParallelStyle):
    """All-gather a sequence-sharded input (Shard(1)) to a plain full tensor before the module
    runs, whether it comes positionally or as `hidden_states=` (HF calls self_attn by keyword)."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        def gather(t):
            if not isinstance(t, torch.Tensor):
                return t
            dt = t if isinstance(t, DTensor) else DTensor.from_local(t, device_mesh, (Shard(1),), run_check=False)
            return dt.redistribute(device_mesh, (Replicate(),)).to_local()

        def hook(_module, args, kwargs):
            if args:
                return (gather(args[0]), *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": gather(kwargs["hidden_states"])}

        module.register_forward_pre_hook(hook, with_kwargs=True)
        return module


class _GatherScatter(_GatherSequence):
    """A replicated module inside a sequence-parallel model: all-gather in (plain tensors inside,
    so its own parameters stay plain), slice this rank's sequence shard back out."""

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        module = super()._apply(module, device_mesh)

        def scatter(_module, _args, out):
            first = out[0] if isinstance(out, tuple) else out
            local = DTensor.from_local(first, device_mesh, (Replicate(),), run_check=False)
            local = local.redistribute(device_mesh, (Shard(1),)).to_local()
            return (local, *out[1:]) if isinstance(out, tuple) else local

        module.register_forward_hook(scatter)
        return module


def _is_norm_name(name: str) -> bool:
    leaf = name.rsplit(".", 1)[-1].lower()
    return "norm" in leaf or leaf.startswith("ln")


def tp_divisor_problem(rules: dict[str, TPRule], tp: int) -> str | None:
    """First "<what> = N of <layer>" that `tp` does not divide, or None."""
    for fqn, rule in rules.items():
        for what, size in rule.divisors.items():
            if size % tp:
                return f"does not divide {what} = {size} of {fqn}"
    return None

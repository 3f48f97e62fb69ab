"""Tensor-parallel rules per layer: which linears are column/row parallel (Megatron-LM style).

Shoeybi et al. 2019 §3: in a transformer block the first GEMM of each pair is split by columns
(output dim) and the second by rows (input dim), so attention and MLP each need one all-reduce
in forward. The executor turns a TPRule into `parallelize_module` styles (ColwiseParallel /
RowwiseParallel); the planner reads `divisors` (the TP degree must divide each) and
`num_allreduce_fwd`. Rules are looked up by layer class; unknown layers are "none" (replicated).
"""
from __future__ import annotations

from typing import Callable

from torch import nn

from meshplan.model_profile import TPRule

_RULES: dict[type, Callable[[nn.Module], TPRule]] = {}


def register_tp_rule(cls: type) -> Callable:
    """Decorator: `@register_tp_rule(Block) def rule(block) -> TPRule` for a layer class."""
    def wrap(fn: Callable[[nn.Module], TPRule]) -> Callable[[nn.Module], TPRule]:
        _RULES[cls] = fn
        return fn
    return wrap


def layer_tp_rule(layer: nn.Module) -> TPRule:
    """The rule for one layer module; layers TP cannot split get kind "none" (kept whole)."""
    for cls in type(layer).__mro__:
        if cls in _RULES:
            return _RULES[cls](layer)
    return TPRule(kind="none")


def tp_rules(model: nn.Module) -> dict[str, TPRule]:
    """TPRule per layer FQN of a LayeredModel (embed, layers.i, head), in execution order."""
    _ensure_zoo_rules()
    return {fqn: layer_tp_rule(model.get_submodule(fqn)) for fqn in model.layer_names()}


def attention_heads(attn: nn.Module) -> tuple[int, int]:
    """(query heads, key/value heads) of an attention module with wq/wk and head_dim."""
    heads = attn.wq.out_features // attn.head_dim
    return heads, attn.wk.out_features // attn.head_dim


_ZOO_RULES_LOADED = False


def _ensure_zoo_rules() -> None:
    """Import the zoo's rule definitions once (they register themselves below)."""
    global _ZOO_RULES_LOADED
    if not _ZOO_RULES_LOADED:
        _ZOO_RULES_LOADED = True
        _register_zoo_rules()


def _register_zoo_rules() -> None:
    from meshplan.profiler.zoo import gpt

    @register_tp_rule(gpt.Block)
    def _gpt_block(block: gpt.Block) -> TPRule:
        heads, _ = attention_heads(block.attn)
        return TPRule(column=["attn.wq", "attn.wk", "attn.wv", "mlp.fc1"],
                      row=["attn.wo", "mlp.fc2"], replicated=["ln1", "ln2"],
                      divisors={"heads": heads, "ffn": block.mlp.fc1.out_features},
                      num_allreduce_fwd=2, kind="block")

    @register_tp_rule(gpt.Embedding)
    def _gpt_embed(embed: gpt.Embedding) -> TPRule:
        # vocab-parallel token embedding (torchtitan: RowwiseParallel on nn.Embedding) ends with
        # one all-reduce; uneven vocab splits are allowed by DTensor, so vocab is no divisor.
        return TPRule(row=["tok"], replicated=["pos"], num_allreduce_fwd=1, kind="embedding")

    @register_tp_rule(gpt.Head)
    def _gpt_head(head: gpt.Head) -> TPRule:
        # vocab-parallel logits (ColwiseParallel): no all-reduce, the loss is computed in parallel
        return TPRule(column=["proj"], replicated=["norm"], num_allreduce_fwd=0, kind="head")

    _register_more_zoo_rules()


def _register_more_zoo_rules() -> None:
    """Rules for the rest of the zoo (each family module defines `tp_rule_for(layer)`)."""
    import importlib

    for name in ("llama", "bert", "vit", "moe", "resnet"):
        try:
            mod = importlib.import_module(f"meshplan.profiler.zoo.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"meshplan.profiler.zoo.{name}":
                raise
            continue
        for cls, fn in getattr(mod, "TP_RULES", {}).items():
            _RULES[cls] = fn

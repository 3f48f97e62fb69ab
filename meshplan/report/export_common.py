"""Plan facts every export needs: transformer blocks per stage, recompute patterns, node layout."""

from __future__ import annotations

import re

from meshplan import dp_methods
from meshplan.errors import MeshplanError
from meshplan.plan import Plan
from meshplan.schema import content_hash

BLOCK = re.compile(r"^layers\.(\d+)$")


def is_block(fqn: str) -> bool:
    return BLOCK.match(fqn) is not None


def blocks(plan: Plan) -> list[str]:
    """Transformer blocks ("layers.N"): what Megatron's --num-layers and torchtitan's AC count."""
    return [f for f in plan.layers if is_block(f)]


def is_transformer(plan: Plan) -> bool:
    """The zoo convention embed / layers.N / head with at least one block."""
    return bool(blocks(plan)) and all(f in ("embed", "head") or is_block(f) for f in plan.layers)


def blocks_per_stage(plan: Plan) -> list[int]:
    return [sum(1 for f in stage if is_block(f)) for stage in plan.stages]


def recompute_modes(plan: Plan) -> list[str]:
    """Recompute mode of every transformer block, in model order."""
    return [plan.recompute.get(f, "none") for f in blocks(plan)]


def non_block_recompute(plan: Plan) -> list[str]:
    return [f for f, mode in plan.recompute.items() if mode != "none" and not is_block(f)]


def uniform_recompute(plan: Plan) -> str | None:
    """ "none" / "selective" / "full" when every block has the same mode, else None."""
    modes = set(recompute_modes(plan))
    return modes.pop() if len(modes) == 1 else ("none" if not modes else None)


def strongest_recompute(plan: Plan) -> str:
    """The single mode that saves at least as much memory as the plan's per-layer choice."""
    modes = set(recompute_modes(plan))
    return "full" if "full" in modes else "selective" if "selective" in modes else "none"


def recompute_text(plan: Plan) -> str:
    modes = recompute_modes(plan)
    parts = [f"{m} on {modes.count(m)}" for m in ("full", "selective", "none") if modes.count(m)]
    return ", ".join(parts) + f" of {len(modes)} blocks"


def devices_per_node(plan: Plan) -> int:
    """From the plan's cluster preset; 8 (a DGX/HGX node) when the name is not a preset."""
    from meshplan.presets import cluster_preset

    try:
        spec = cluster_preset(plan.cluster_name, plan.world_size)
    except (MeshplanError, KeyError, ValueError):
        return min(8, plan.world_size)
    return min(spec.devices_per_node, plan.world_size)


def num_nodes(plan: Plan) -> int:
    per_node = devices_per_node(plan)
    return -(-plan.world_size // per_node)


def header_lines(plan: Plan, target: str) -> list[str]:
    """Comment lines (without the comment marker) opening every exported file."""
    dp = plan.data_parallel_degree
    return [
        f"meshplan plan -> {target}: {plan.model_name} on {plan.world_size} x {plan.cluster_name}",
        f"plan decisions hash {plan_hash(plan)}; mesh pp={plan.pipeline_parallel_degree} "
        f"dp_replicate={plan.data_parallel_replicate_degree} dp_shard={plan.data_parallel_shard_degree} "
        f"cp={plan.context_parallel_degree} tp={plan.tensor_parallel_degree}",
        f"global batch {plan.global_batch_size} = micro {plan.microbatch_size} x accumulation "
        f"{plan.num_microbatches} x data-parallel {dp}; seq_len {plan.seq_len}",
    ]


def plan_hash(plan: Plan) -> str:
    """content_hash of the plan's decisions: without the search summary (search_time_s is measured)
    and the prediction (cost-model floats), so it names what would be run."""
    from meshplan.schema import to_dict

    data = to_dict(plan)
    for key in ("search", "prediction"):
        data.pop(key, None)
    return content_hash(data)


def common_warnings(plan: Plan) -> list[str]:
    """Plan features no export target sees: recompute on non-block layers."""
    extra = non_block_recompute(plan)
    if not extra:
        return []
    return [
        f"recompute on non-block layers {', '.join(extra)} is not expressible (trainers checkpoint "
        "transformer blocks only); those layers run without recompute and use more memory than planned"
    ]


def comment(lines: list[str], marker: str = "#") -> str:
    return "\n".join(f"{marker} {line}".rstrip() for line in lines) + "\n"


def warning_lines(warnings: list[str]) -> list[str]:
    return [f"WARNING: {w}" for w in warnings] or ["every setting of the plan is expressed below"]


def offloads(plan: Plan) -> bool:
    return plan.dp_methods.offload.name == "cpu"


def method_warnings(plan: Plan, target: str) -> list[str]:
    """WARNING lines for the plan's data-parallel methods, from the registry (meshplan/dp_methods.py):
    each method `target` cannot express (its `unsupported` text, dp_methods.export_warnings), and
    for each non-default method it expresses through a setting, that setting (the row's `exports`)."""
    out = dp_methods.export_warnings({axis: (c.name, c.params) for axis, c in plan.dp_methods.items()}, target)
    for axis, choice in plan.dp_methods.non_default():
        row = dp_methods.method(axis, choice.name)
        if row.exports.get(target):
            out.append(f"{row.label} maps to {row.exports[target]}")
    return out + runtime_warnings(plan, target)


TARGET_RUNTIMES = {
    "torchtitan": ("torchtitan",),
    "megatron": ("megatron-lm", "megatron-core"),
    "deepspeed": ("deepspeed",),
    "accelerate": ("meshplan", "torchtitan", "deepspeed"),
}
"""Runtimes (meshplan/runtimes.py) whose prediction an export target runs as predicted."""


def runtime_warnings(plan: Plan, target: str) -> list[str]:
    """A WARNING when the plan was predicted for a runtime other than the target's."""
    if plan.runtime in TARGET_RUNTIMES.get(target, ()):
        return []
    hint = " or ".join(TARGET_RUNTIMES.get(target, ()))
    return [
        f"the prediction was made for runtime {plan.runtime}; {target} runs this plan with its own behaviours "
        f"(README, Runtimes), so its step time and memory will differ: re-plan with --runtime {hint}"
    ]

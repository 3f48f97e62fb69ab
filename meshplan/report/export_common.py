"""Plan facts every export needs: transformer blocks per stage, recompute patterns, node layout."""

from __future__ import annotations

import re

from meshplan import dp_methods
from meshplan.errors import MeshplanError
from meshplan.plan import Plan
from meshplan.schema import content_hash, to_dict

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
        estimate_line(plan),
    ]


ESTIMATE_BEHAVIOURS = (
    "state_layout",
    "overlap_dp_comm",
    "overlap_tp_comm",
    "attention",
    "uniform_stages",
    "free_stage_outputs",
    "elementwise",
    "loss",
    "fused_projections",
    "fsdp_gather_bytes",
    "fsdp_reduce_bytes",
    "fsdp_unit_buffers",
    "reduce_bucket_elems",
    "zero2_grad_collective",
)
"""Runtime behaviours (meshplan/runtimes.py) an export's estimate line carries where the plan's
value is not the runtime's, each through its own flag (runtimes.Flag)."""


def estimate_line(plan: Plan) -> str:
    """`meshplan estimate --import` of this file predicts the plan: the model, cluster, runtime and each
    behaviour the prediction used other than the runtime's default (read back by meshplan/imports)."""
    import shlex

    from meshplan import runtimes

    words = ["--model", plan.model_name]
    if plan.model_name.startswith("analytic:"):
        words += ["--set", *(f"{k}={v}" for k, v in plan.model_config.items())]
    words += ["--cluster", plan.cluster_name, "--runtime", plan.runtime]
    defaults = runtimes.request_behaviours(plan.runtime, {})
    flags = {row.name: row.flag for row in runtimes.ROWS if row.flag is not None}
    for key in ESTIMATE_BEHAVIOURS:
        value = plan.runtime_behaviours.get(key)
        if value is None or value == defaults.get(key):
            continue
        words += flags[key].cli_words(value)
    return "predict it: meshplan estimate --import THIS_FILE " + shlex.join(words)


def plan_hash(plan: Plan) -> str:
    """content_hash of the plan's decisions: without the search summary (search_time_s is measured)
    and the prediction (cost-model floats), so it names what would be run."""
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


def method_warnings(plan: Plan, target: str, runs_on: str | None = None) -> list[str]:
    """WARNING lines for the plan's data-parallel methods, from the registry (meshplan/dp_methods.py):
    each method `target` cannot express (its `unsupported` text, dp_methods.export_warnings), and
    for each non-default method it expresses through a setting, that setting (the row's `exports`);
    then runtime_warnings (`runs_on`: see there)."""
    out = dp_methods.export_warnings({axis: (c.name, c.params) for axis, c in plan.dp_methods.items()}, target)
    for axis, choice in plan.dp_methods.non_default():
        row = dp_methods.method(axis, choice.name)
        if row.exports.get(target):
            out.append(f"{row.label} maps to {row.exports[target]}")
    return out + runtime_warnings(plan, target, runs_on)


TARGET_RUNTIMES = {
    "torchtitan": ("torchtitan",),
    "megatron": ("megatron-lm", "megatron-core"),
    "deepspeed": ("deepspeed",),
    "accelerate": ("meshplan", "torchtitan"),
}
"""Runtimes (meshplan/runtimes.py) whose prediction an export target runs as predicted. accelerate's
own engines are torch's (DDP, FSDP2 with DTensor TP and torch context_parallel); a plan it runs through
its DeepSpeed plugin runs DeepSpeed's engine, held to "deepspeed" (runtime_warnings' runs_on)."""


def runtime_warnings(plan: Plan, target: str, runs_on: str | None = None) -> list[str]:
    """A WARNING when the plan was predicted for a runtime other than the one whose engine runs it:
    `target`'s, or that of the export target `runs_on` where `target` hands the plan to another
    engine (accelerate's DeepSpeed plugin: "deepspeed")."""
    engine = runs_on or target
    expected = TARGET_RUNTIMES.get(engine, ())
    if plan.runtime in expected:
        return []
    hint = " or ".join(expected)
    where = f"{target} runs this plan on {engine}'s engine" if runs_on else f"{target} runs this plan"
    return [
        f"the prediction was made for runtime {plan.runtime}; {where} with its own behaviours "
        f"(README, Runtimes), so its step time and memory will differ: re-plan with --runtime {hint}"
    ]


# --- the model's architecture, as the targets name it ---------------------------------------------


ARCHITECTURES = {
    # meshplan's GPT (models/zoo/gpt.py, models/analytic.py gpt_profile): pre-LN LayerNorm blocks, GELU
    # MLP, learned absolute positions, biased linears, an LM head of its own (untied)
    "gpt": {"norm": "LayerNorm", "activation": "gelu", "position": "learned_absolute", "bias": True, "tied": False},
    # Llama-3 (models/zoo/llama.py, llama_profile): RMSNorm, SwiGLU, rotary, no biases, untied output
    "llama": {"norm": "RMSNorm", "activation": "swiglu", "position": "rope", "bias": False, "tied": False},
}
"""Model family -> architecture facts, for plans written before Plan.model_architecture recorded them."""


def architecture(plan: Plan) -> dict | None:
    """The plan's decoder architecture and shape: the one the profile recorded (Plan.model_architecture: zoo,
    closed-form and HF decoders), else the ARCHITECTURES row of its family (older plans); None for a model
    without one (bert, vit, moe, resnet, user, an HF model meshplan cannot name)."""
    cfg = plan.model_config
    if not is_transformer(plan) or not all(k in cfg for k in ("hidden", "heads", "vocab")):
        return None
    hidden, heads = int(cfg["hidden"]), int(cfg["heads"])
    shape = {"layers": len(blocks(plan)), "hidden": hidden, "heads": heads, "vocab": int(cfg["vocab"])}
    recorded = plan.model_architecture
    if recorded is not None:
        facts = {k: v for k, v in to_dict(recorded).items() if k != "model_type"}
        return {**facts, "family": recorded.model_type, **shape}
    row = ARCHITECTURES.get(plan.model_family)
    if row is None:
        return None
    return {
        **row,
        "family": plan.model_family,
        **shape,
        "kv_heads": int(cfg.get("kv_heads", heads)),
        "ffn_hidden": int(cfg.get("ffn_hidden", 4 * hidden)),
        "rope_theta": float(cfg.get("rope_theta", 500000.0)),
        "norm_eps": float(cfg.get("norm_eps", 1e-5)),
        "qk_norm": False,
    }


def architecture_text(arch: dict) -> str:
    return (
        f"{arch['layers']} layers, hidden {arch['hidden']}, {arch['heads']} heads ({arch['kv_heads']} kv), "
        f"ffn {arch['ffn_hidden']}, vocab {arch['vocab']}, {arch['norm']}, {arch['activation']}, "
        f"{arch['position']} positions, {'tied' if arch['tied'] else 'untied'} embeddings"
    )


# --- launching on many nodes ----------------------------------------------------------------------


def torchrun_line(plan: Plan, target: str) -> str:
    """torchrun for every node: one process per device of a node, the node count, this node's rank
    and node 0's endpoint from the environment (set NODE_RANK and MASTER_ADDR on each node)."""
    return (
        f"torchrun --nnodes {num_nodes(plan)} --nproc-per-node {devices_per_node(plan)} "
        '--node-rank "${NODE_RANK:-0}" --rdzv-backend c10d '
        '--rdzv-endpoint "${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}" ' + target
    )


def launch_notes(plan: Plan) -> list[str]:
    nodes = num_nodes(plan)
    if nodes == 1:
        return [f"launch: one node of {devices_per_node(plan)} devices"]
    return [
        f"launch: run this on each of the {nodes} nodes ({devices_per_node(plan)} devices each) with "
        f"NODE_RANK=0..{nodes - 1} and MASTER_ADDR=<node 0's address> set"
    ]


def precision_warnings(plan: Plan, target: str, fallback: str = "bf16") -> list[str]:
    """fp8 where `target` has no fp8 setting in its config: said, and what is written instead."""
    if plan.precision != "fp8":
        return []
    return [
        f"precision fp8 has no {target} config setting: exported {fallback} mixed precision (the GEMMs run "
        "at the bf16 rate, slower than predicted); add fp8 in model code (Transformer Engine or torchao float8)"
    ]

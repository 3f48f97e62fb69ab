"""Export a plan to Megatron-LM command-line flags (megatron/training/arguments.py names).

Megatron derives data-parallel size = world / (tp x pp x cp) and gradient accumulation =
global-batch-size / (micro-batch-size x dp); the flags below are chosen so both match the plan.
"""

from __future__ import annotations

import shlex

from meshplan.plan import Plan
from meshplan.report import export_common as ec

MODEL_FLAGS = {
    "hidden": "--hidden-size",
    "heads": "--num-attention-heads",
    "ffn_hidden": "--ffn-hidden-size",
    "vocab": "--vocab-size",
    "kv_heads": "--num-query-groups",
}


def _pipeline_flags(plan: Plan, warnings: list[str]) -> list[str]:
    pp, v = plan.pipeline_parallel_degree, plan.virtual_stages
    if pp == 1:
        return []
    flags = []
    per_stage = ec.blocks_per_stage(plan)
    layer_counts = [len(stage) for stage in plan.stages]
    if v > 1 and len(set(per_stage)) == 1:
        flags += ["--num-layers-per-virtual-pipeline-stage", str(per_stage[0])]
    elif len(set(per_stage)) > 1 and len(set(layer_counts)) == 1 and ec.is_transformer(plan):
        # even once embedding and loss count as one layer each (Megatron-Core >= 0.11)
        flags += ["--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split"]
        flags += ["--num-virtual-stages-per-pipeline-rank", str(v)] if v > 1 else []
    elif v == 1 and len(set(per_stage)) > 1 and len(set(per_stage[1:-1])) <= 1 and pp > 2:
        flags += [
            "--decoder-first-pipeline-num-layers",
            str(per_stage[0]),
            "--decoder-last-pipeline-num-layers",
            str(per_stage[-1]),
        ]
    elif v == 1 and len(set(per_stage)) > 1 and pp == 2:
        flags += ["--decoder-first-pipeline-num-layers", str(per_stage[0])]
    elif len(set(per_stage)) > 1 and ec.is_transformer(plan):
        # Megatron-Core's explicit layout: one "|"-separated entry per (virtual) stage in the plan's order
        # (stage s on pipeline rank s % pp), E = embedding, t = transformer layer, L = output layer and loss
        flags += ["--pipeline-model-parallel-layout", layout(plan)]
    elif len(set(per_stage)) > 1:
        warnings.append(
            f"uneven stage boundaries (blocks per stage {per_stage}) are not expressible for a model outside "
            "meshplan's embed/layers.N/head layout: Megatron-LM splits blocks evenly over (virtual) stages"
        )
        if v > 1:
            flags += ["--num-virtual-stages-per-pipeline-rank", str(v)]
    if v > 1 and plan.num_microbatches % pp:
        warnings.append(
            f"interleaved 1F1B in Megatron-LM needs microbatches ({plan.num_microbatches}) divisible by "
            f"pp={pp}; Megatron will refuse this batch unless you change --global-batch-size"
        )
    if plan.pipeline_schedule in ("GPipe", "LoopedBFS", "InterleavedZeroBubble"):
        warnings.append(
            f"schedule {plan.pipeline_schedule} is not available in Megatron-LM; it runs "
            f"{'interleaved ' if v > 1 else ''}1F1B (same bubble as the plan's for GPipe/LoopedBFS)"
        )
    return flags


def layout(plan: Plan) -> str:
    """--pipeline-model-parallel-layout of the plan's stages, e.g. "Et*3|t*4|t*4|t*3L"."""
    parts = []
    for stage in plan.stages:
        text = "E" if "embed" in stage else ""
        n = sum(1 for f in stage if ec.is_block(f))
        text += "t" if n == 1 else f"t*{n}" if n else ""
        parts.append(text + ("L" if "head" in stage else ""))
    return "|".join(parts)


def _recompute_flags(plan: Plan, warnings: list[str]) -> list[str]:
    uniform = ec.uniform_recompute(plan)
    if uniform == "none":
        return []
    if uniform == "selective":
        return ["--recompute-granularity", "selective"]
    if uniform == "full":
        return _recompute_flags_for("full", plan.recompute_num_layers)
    counts = _full_blocks_per_stage(plan)
    if counts:  # full or none per block, mixed (so some stage recomputes): the most any stage recomputes
        most = max(counts)
        flags = ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", str(most)]
        if len(set(counts)) == 1:  # identical blocks: which of a stage's blocks are full does not change the cost
            return flags
        warnings.append(
            f"per-layer recompute ({ec.recompute_text(plan)}): Megatron's --recompute-method block recomputes the same "
            f"number of blocks in every (virtual) stage; exported the most any stage recomputes, {most} (stages "
            "with fewer recompute more than predicted: slower, never more memory)"
        )
        return flags
    strongest = ec.strongest_recompute(plan)
    warnings.append(
        f"per-layer recompute ({ec.recompute_text(plan)}) is not expressible in Megatron-LM; "
        f"exported {strongest} recompute on every block (slower than predicted, never more memory)"
    )
    return _recompute_flags_for(strongest)


def _recompute_flags_for(mode: str, num_layers: int = 1) -> list[str]:
    """Megatron's flags for one recompute mode on every block; full recompute checkpoints chunks of
    `num_layers` blocks (the plan's recompute_num_layers, --recompute-method uniform)."""
    if mode == "full":
        return [
            "--recompute-granularity",
            "full",
            "--recompute-method",
            "uniform",
            "--recompute-num-layers",
            str(num_layers),
        ]
    return ["--recompute-granularity", "selective"]


def _full_blocks_per_stage(plan: Plan) -> list[int]:
    """Fully recomputed blocks of each (virtual) stage where every block is full or none; [] where a block
    takes another mode."""
    counts = []
    for stage in plan.stages:
        modes = [plan.recompute.get(f, "none") for f in stage if ec.is_block(f)]
        if any(mode not in ("full", "none") for mode in modes):
            return []
        counts.append(modes.count("full"))
    return counts


def _data_parallel_flags(plan: Plan, warnings: list[str]) -> list[str]:
    flags = []
    if plan.zero_stage in (1, 2):
        flags.append("--use-distributed-optimizer")
        if plan.zero_stage == 2:
            warnings.append(
                "ZeRO-2 maps to --use-distributed-optimizer, which shards optimizer states and "
                "reduce-scatters gradients but keeps a full gradient buffer (ZeRO-1 gradient memory)"
            )
        if plan.data_parallel_replicate_degree > 1 and plan.data_parallel_shard_degree > 1:
            flags += ["--num-distributed-optimizer-instances", str(plan.data_parallel_replicate_degree)]
    if plan.zero_stage == 3 and plan.pipeline_parallel_degree > 1:
        # arguments.py: "--use-torch-fsdp2 is not supported with pipeline parallelism"
        flags.append("--use-distributed-optimizer")
        warnings.append(
            f"ZeRO-3 with pp={plan.pipeline_parallel_degree} is refused by Megatron (--use-torch-fsdp2 needs pp = 1): "
            "exported --use-distributed-optimizer (ZeRO-1: parameters and gradients unsharded, more memory than predicted)"
        )
    elif plan.zero_stage == 3:
        # arguments.py: FSDP2 needs no distributed optimizer, no gradient-accumulation fusion, a torch_dist or
        # torch_dcp checkpoint and untied embeddings (the architecture flags untie them)
        flags += ["--use-torch-fsdp2", "--no-gradient-accumulation-fusion", "--ckpt-format", "torch_dist"]
        warnings.append(
            "ZeRO-3 maps to --use-torch-fsdp2 (Megatron-Core >= 0.9); older versions cannot shard parameters"
        )
        if plan.data_parallel_replicate_degree > 1:
            warnings.append(
                "hybrid sharding (replicate x shard) is not expressible with --use-torch-fsdp2; "
                "it shards over the whole data-parallel group"
            )
    if ec.offloads(plan) and plan.zero_stage == 3:
        warnings.append(
            "optimizer offload with ZeRO-3 is not expressible: Megatron's --optimizer-cpu-offload "
            "runs inside the distributed optimizer, not --use-torch-fsdp2 (more device memory than "
            "predicted)"
        )
    elif ec.offloads(plan):
        # Megatron-Core's OptimizerConfig: cpu offload and the precision-aware optimizer live in the
        # distributed optimizer (its __post_init__ refuses them without it)
        if "--use-distributed-optimizer" not in flags:
            flags.append("--use-distributed-optimizer")
        flags += ["--optimizer-cpu-offload", "--use-precision-aware-optimizer"]
    if plan.dp_methods.compression.name == "fp16":
        flags.append("--grad-reduce-in-bf16")
    warnings.extend(ec.method_warnings(plan, "megatron"))
    return flags


def megatron_flags(plan: Plan, warnings: list[str]) -> list[str]:
    if not ec.is_transformer(plan):
        warnings.append(
            f"Megatron-LM trains transformer models only; {plan.model_name} is not one, so only "
            "the parallel and batch flags below carry over"
        )
    flags = [
        "--tensor-model-parallel-size",
        str(plan.tensor_parallel_degree),
        "--pipeline-model-parallel-size",
        str(plan.pipeline_parallel_degree),
        "--context-parallel-size",
        str(plan.context_parallel_degree),
    ]
    flags += _pipeline_flags(plan, warnings)
    if plan.sequence_parallel and plan.tensor_parallel_degree > 1:
        flags.append("--sequence-parallel")
    flags += [
        "--micro-batch-size",
        str(plan.microbatch_size),
        "--global-batch-size",
        str(plan.global_batch_size),
        "--seq-length",
        str(plan.seq_len),
        "--max-position-embeddings",
        str(plan.seq_len),
    ]
    flags += _architecture_flags(plan, warnings)
    flags += _recompute_flags(plan, warnings) + _data_parallel_flags(plan, warnings)
    if "--use-torch-fsdp2" in flags and "--untie-embeddings-and-output-weights" not in flags:
        flags.append("--untie-embeddings-and-output-weights")  # arguments.py: FSDP2 requires it
        warnings.append("--use-torch-fsdp2 requires untied embeddings: the output layer gets its own weights")
    if plan.precision in ("bf16", "fp8"):
        flags.append("--bf16")
    if plan.precision == "fp8":
        # Transformer Engine (the default --transformer-impl): fp8 GEMMs, E4M3 forward and E5M2 gradients
        flags += ["--fp8-format", "hybrid"]
    return flags + _runtime_flags(plan, warnings)


def _architecture_flags(plan: Plan, warnings: list[str]) -> list[str]:
    """The model Megatron builds (pretrain_gpt.py's GPTModel): shape, norm, activation, positions, biases,
    tied or untied output layer; without them Megatron builds a GELU/LayerNorm model with tied embeddings."""
    arch = ec.architecture(plan)
    cfg = plan.model_config
    if arch is None:
        warnings.append(
            f"the plan does not record the decoder architecture of {plan.model_name} (family "
            f"{plan.model_family or 'not recorded'}; meshplan records it for the decoders it can name, docs/models.md): "
            "only its shape is written, "
            "so Megatron builds its default GPT (LayerNorm, GELU, ffn 4 x hidden, no grouped-query attention, tied "
            "embeddings); give Megatron's architecture flags yourself"
        )
        flags = ["--num-layers", str(len(ec.blocks(plan)))] if ec.is_transformer(plan) else []
        for key, flag in MODEL_FLAGS.items():
            if key in cfg:
                flags += [flag, str(cfg[key])]
        return flags
    tp = plan.tensor_parallel_degree
    flags = [
        "--num-layers", str(arch["layers"]),
        "--hidden-size", str(arch["hidden"]),
        "--ffn-hidden-size", str(arch["ffn_hidden"]),
        "--num-attention-heads", str(arch["heads"]),
    ]  # fmt: skip
    if arch["kv_heads"] != arch["heads"]:
        flags += ["--group-query-attention", "--num-query-groups", str(arch["kv_heads"])]
    # Megatron pads the vocabulary to a multiple of make-vocab-size-divisible-by x tp: the largest
    # divisor (<= its default 128) that keeps the plan's vocabulary exact
    divisible = max(d for d in (128, 64, 32, 16, 8, 4, 2, 1) if arch["vocab"] % (d * tp) == 0 or d == 1)
    if arch["vocab"] % (divisible * tp):
        warnings.append(
            f"vocab {arch['vocab']} is not a multiple of tp={tp}: Megatron pads it to "
            f"{-(-arch['vocab'] // tp) * tp} (a few more embedding parameters than planned)"
        )
    flags += ["--vocab-size", str(arch["vocab"]), "--make-vocab-size-divisible-by", str(divisible)]
    flags += ["--normalization", arch["norm"], "--norm-epsilon", f"{arch['norm_eps']:g}"]
    flags += ["--position-embedding-type", arch["position"]]
    if arch["position"] == "rope":
        flags += ["--rotary-base", str(int(arch["rope_theta"]))]
    if arch["activation"] == "swiglu":
        flags.append("--swiglu")
    elif arch["activation"] != "gelu":
        warnings.append(
            f"the MLP's {arch['activation']} has no Megatron flag (it has --swiglu, and GELU by default): Megatron "
            "builds a GELU MLP of the same width; set its activation_func in your model provider"
        )
    if arch["qk_norm"]:
        flags.append("--qk-layernorm")
    if not arch["bias"]:
        flags.append("--disable-bias-linear")
    if not arch["tied"]:
        flags.append("--untie-embeddings-and-output-weights")
    return flags


def _runtime_flags(plan: Plan, warnings: list[str]) -> list[str]:
    """The flags a megatron-core prediction's behaviours imply (meshplan/runtimes.py): gradient
    and parameter-gather overlap, TP communication overlap, fp8; Megatron-LM before Core has none."""
    b = plan.runtime_behaviours
    if plan.runtime != "megatron-core":
        return []
    flags = []
    if b.get("overlap_dp_comm") and plan.data_parallel_degree > 1:
        flags.append("--overlap-grad-reduce")
        if plan.zero_stage in (1, 2):
            flags.append("--overlap-param-gather")
    if b.get("overlap_tp_comm") and plan.tensor_parallel_degree > 1:
        if plan.sequence_parallel:
            flags.append("--tp-comm-overlap")
        else:
            warnings.append("--tp-comm-overlap needs --sequence-parallel; the predicted TP overlap is not expressed")
    return flags


def export_megatron(plan: Plan) -> dict[str, str]:
    warnings = ec.common_warnings(plan)
    flags = megatron_flags(plan, warnings)
    dp = plan.world_size // (plan.tensor_parallel_degree * plan.pipeline_parallel_degree * plan.context_parallel_degree)
    pairs, i = [], 0
    while i < len(flags):  # one flag (with its value) per line
        has_value = i + 1 < len(flags) and not flags[i + 1].startswith("--")
        pairs.append(" ".join(shlex.quote(f) for f in flags[i : i + 1 + has_value]))
        i += 1 + has_value
    text = "#!/usr/bin/env bash\n" + ec.comment(
        ec.header_lines(plan, "Megatron-LM") + ec.warning_lines(warnings) + ec.launch_notes(plan)
    )
    text += (
        f"# Megatron derives data-parallel size = {plan.world_size} / (tp x pp x cp) = {dp} and gradient "
        f"accumulation = {plan.global_batch_size} / ({plan.microbatch_size} x {dp}) = "
        f"{plan.global_batch_size // (plan.microbatch_size * dp)}\n"
    )
    text += _environment(plan, flags)
    text += "MESHPLAN_ARGS=(\n" + "".join(f"    {p}\n" for p in pairs) + ")\n"
    text += ec.torchrun_line(plan, 'pretrain_gpt.py "${MESHPLAN_ARGS[@]}" "$@"') + "\n"
    return {"megatron_args.sh": text}


def _environment(plan: Plan, flags: list[str]) -> str:
    """arguments.py (before Blackwell): TP or CP needs CUDA_DEVICE_MAX_CONNECTIONS=1 (one queue keeps the TP
    communication ahead of the GEMMs it overlaps); --use-torch-fsdp2 needs it other than 1 (then only warned)."""
    if plan.tensor_parallel_degree * plan.context_parallel_degree == 1:
        return ""
    if "--use-torch-fsdp2" in flags:
        return "unset CUDA_DEVICE_MAX_CONNECTIONS  # FSDP2 needs more than one connection\n"
    return "export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron requires it with tensor or context parallelism\n"

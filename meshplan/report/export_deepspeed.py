"""Export a plan to DeepSpeed (config JSON + launch line) and to Hugging Face accelerate (YAML).

DeepSpeed checks train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x
data-parallel world size, where the data-parallel world is world / (tp x pp) (deepspeed/runtime/config.py).
"""

from __future__ import annotations

import json

from meshplan.plan import Plan
from meshplan.report import export_common as ec


def _zero(plan: Plan, warnings: list[str]) -> dict:
    zero = {"stage": plan.zero_stage, "overlap_comm": True, "contiguous_gradients": True}
    if ec.offloads(plan):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if plan.zero_stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if plan.data_parallel_replicate_degree > 1 and plan.data_parallel_shard_degree > 1:
        # MiCS (zero_optimization.mics_shard_size) was removed from DeepSpeed (its config class refuses
        # the key, tests/test_export_parsers.py); ZeRO++ hpZ shards a secondary copy only
        warnings.append(
            f"ZeRO-{plan.zero_stage} over dp_shard={plan.data_parallel_shard_degree} replicated "
            f"{plan.data_parallel_replicate_degree}x is not expressible; DeepSpeed shards over "
            "the whole data-parallel group (less memory, more communication than predicted)"
        )
    return zero


def _pipeline_notes(plan: Plan, warnings: list[str]) -> list[str]:
    pp = plan.pipeline_parallel_degree
    if pp == 1:
        return []
    sizes = [len(s) for s in plan.stages]
    notes = [
        f"pipeline: wrap the model in deepspeed.pipe.PipelineModule(layers=..., num_stages={pp}); "
        f"layers per stage {sizes}"
    ]
    if plan.virtual_stages > 1 or plan.pipeline_schedule != "1F1B":
        warnings.append(
            f"schedule {plan.pipeline_schedule} (virtual stages {plan.virtual_stages}) is not "
            "available in DeepSpeed's pipeline engine, which runs 1F1B with one stage per rank"
        )
    if len(set(sizes)) > 1:
        warnings.append(
            f"uneven stage boundaries {sizes} are not expressible in the config: PipelineModule's "
            "partition_method='uniform' splits evenly; give the boundaries in code"
        )
    return notes


def _activation_checkpointing(plan: Plan, warnings: list[str]) -> dict | None:
    if ec.strongest_recompute(plan) == "none":
        return None
    if ec.uniform_recompute(plan) is None or "selective" in ec.recompute_modes(plan):
        warnings.append(
            f"recompute ({ec.recompute_text(plan)}) is chosen in model code with "
            "deepspeed.checkpointing.checkpoint; DeepSpeed has no selective (op-level) recompute, "
            "so checkpoint the listed blocks fully"
        )
    return {
        "partition_activations": plan.tensor_parallel_degree > 1,
        "contiguous_memory_optimization": False,
        "cpu_checkpointing": False,
    }


def deepspeed_config(plan: Plan, warnings: list[str]) -> dict:
    config = {
        "train_batch_size": plan.global_batch_size,
        "train_micro_batch_size_per_gpu": plan.microbatch_size,
        "gradient_accumulation_steps": plan.num_microbatches,
        "zero_optimization": _zero(plan, warnings),
        "bf16": {"enabled": plan.precision == "bf16"},
    }
    if plan.tensor_parallel_degree > 1:
        config["tensor_parallel"] = {"autotp_size": plan.tensor_parallel_degree}
        if plan.sequence_parallel:
            warnings.append(
                "sequence parallel with TP is not expressible (DeepSpeed AutoTP keeps norm "
                "activations replicated): activation memory is higher than predicted"
            )
    if plan.context_parallel_degree > 1:
        warnings.append(f"context parallel cp={plan.context_parallel_degree} needs DeepSpeed-Ulysses in model code")
    if plan.dp_methods.compression.name == "fp16":
        config["communication_data_type"] = "fp16"
    warnings.extend(ec.method_warnings(plan, "deepspeed"))
    checkpointing = _activation_checkpointing(plan, warnings)
    if checkpointing:
        config["activation_checkpointing"] = checkpointing
    return config


def export_deepspeed(plan: Plan) -> dict[str, str]:
    warnings = ec.common_warnings(plan)
    notes = _pipeline_notes(plan, warnings)
    config = deepspeed_config(plan, warnings)
    dp = plan.world_size // (plan.tensor_parallel_degree * plan.pipeline_parallel_degree)
    launch = "#!/usr/bin/env bash\n" + ec.comment(
        ec.header_lines(plan, "DeepSpeed") + ec.warning_lines(warnings) + notes
    )
    launch += (
        f"# DeepSpeed checks train_batch_size {plan.global_batch_size} = micro {plan.microbatch_size} x "
        f"accumulation {plan.num_microbatches} x data-parallel {dp} (world / (tp x pp))\n"
    )
    launch += (
        f"deepspeed --num_nodes {ec.num_nodes(plan)} --num_gpus {ec.devices_per_node(plan)} train.py "
        '--deepspeed --deepspeed_config ds_config.json "$@"\n'
    )
    return {"ds_config.json": json.dumps(config, indent=2) + "\n", "launch_deepspeed.sh": launch}


def _yaml(data: dict, indent: int = 0) -> str:
    out = ""
    for key, value in data.items():
        if isinstance(value, dict):
            out += " " * indent + f"{key}:\n" + _yaml(value, indent + 2)
        else:
            text = ("true" if value else "false") if isinstance(value, bool) else str(value)
            out += " " * indent + f"{key}: {text}\n"
    return out


def accelerate_config(plan: Plan, warnings: list[str]) -> dict:
    """accelerate launch config: DDP, FSDP2 (ZeRO-2/3, with ParallelismConfig axes) or DeepSpeed (ZeRO-1)."""
    cfg = {
        "compute_environment": "LOCAL_MACHINE",
        "machine_rank": 0,
        "num_machines": ec.num_nodes(plan),
        "num_processes": plan.world_size,
        "mixed_precision": "bf16" if plan.precision == "bf16" else "no",
        "main_training_function": "main",
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    }
    if plan.zero_stage == 1:
        cfg["distributed_type"] = "DEEPSPEED"
        cfg["deepspeed_config"] = {
            "zero_stage": 1,
            "gradient_accumulation_steps": plan.num_microbatches,
            "offload_optimizer_device": "cpu" if ec.offloads(plan) else "none",
            "offload_param_device": "none",
            "zero3_init_flag": False,
        }
    elif plan.zero_stage in (2, 3) or plan.data_parallel_shard_degree > 1:
        cfg["distributed_type"] = "FSDP"
        cfg["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": plan.zero_stage == 3,
            "fsdp_offload_params": ec.offloads(plan),
            "fsdp_activation_checkpointing": ec.strongest_recompute(plan) != "none",
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
        }
    else:
        cfg["distributed_type"] = "MULTI_GPU" if plan.world_size > 1 else "NO"
    cfg["parallelism_config"] = {
        "parallelism_config_dp_replicate_size": plan.data_parallel_replicate_degree,
        "parallelism_config_dp_shard_size": plan.data_parallel_shard_degree,
        "parallelism_config_tp_size": plan.tensor_parallel_degree,
        "parallelism_config_cp_size": plan.context_parallel_degree,
    }
    return cfg


def _accelerate_warnings(plan: Plan, warnings: list[str]) -> None:
    if plan.pipeline_parallel_degree > 1:
        warnings.append(
            f"pipeline_parallel_degree={plan.pipeline_parallel_degree} is not expressible: accelerate "
            "has no pipeline-parallel training; use the torchtitan or Megatron-LM export for this plan"
        )
    if plan.zero_stage == 1 and plan.tensor_parallel_degree * plan.context_parallel_degree > 1:
        warnings.append(
            "ZeRO-1 is exported through accelerate's DeepSpeed plugin, which ignores parallelism_config tp/cp sizes"
        )
    if ec.uniform_recompute(plan) not in ("none", "full"):
        warnings.append(
            f"recompute ({ec.recompute_text(plan)}): accelerate checkpoints every wrapped block or none; "
            f"exported fsdp_activation_checkpointing={ec.strongest_recompute(plan) != 'none'}"
        )
    warnings.extend(ec.method_warnings(plan, "accelerate"))


def export_accelerate(plan: Plan) -> dict[str, str]:
    warnings = ec.common_warnings(plan)
    _accelerate_warnings(plan, warnings)
    cfg = accelerate_config(plan, warnings)
    head = ec.comment(
        ec.header_lines(plan, "accelerate")
        + ec.warning_lines(warnings)
        + [
            f"in the training script: per_device_train_batch_size = {plan.microbatch_size}, "
            f"Accelerator(gradient_accumulation_steps={plan.num_microbatches}); global batch "
            f"{plan.global_batch_size} = {plan.microbatch_size} x {plan.num_microbatches} x dp {plan.data_parallel_degree}",
            "launch: accelerate launch --config_file accelerate_config.yaml train.py",
        ]
    )
    snippet = (
        f"# meshplan batch settings for accelerate (see accelerate_config.yaml)\n"
        f"PER_DEVICE_TRAIN_BATCH_SIZE = {plan.microbatch_size}\n"
        f"GRADIENT_ACCUMULATION_STEPS = {plan.num_microbatches}\n"
        f"GLOBAL_BATCH_SIZE = {plan.global_batch_size}  # = micro x accumulation x dp "
        f"{plan.data_parallel_degree}\nSEQ_LEN = {plan.seq_len}\n"
    )
    return {"accelerate_config.yaml": head + _yaml(cfg), "accelerate_batch.py": snippet}

"""Export a plan to Hugging Face accelerate: accelerate_config.yaml (written with a YAML library) and the
batch settings of the training script.

`accelerate launch` turns the file's parallelism_config into PARALLELISM_CONFIG_* variables, from which
Accelerator() builds a ParallelismConfig (accelerate/parallelism_config.py) and checks that
dp_replicate x dp_shard x tp x cp equals the number of processes, and refuses tp or cp > 1 with pure
replication (dp_replicate > 1, dp_shard = 1). Accelerate has no pipeline parallelism.
"""

from __future__ import annotations

from dataclasses import dataclass

import yaml

from meshplan.plan import Plan
from meshplan.report import export_common as ec


@dataclass(kw_only=True)
class AccelerateLayout:
    """The mesh and batch accelerate runs: the plan's where accelerate can express it."""

    dp_replicate: int
    dp_shard: int
    tp: int
    cp: int
    accumulation: int
    zero: int
    distributed_type: str


def _fold_pipeline(plan: Plan, warnings: list[str]) -> tuple[int, int, int]:
    """(dp_replicate, dp_shard, accumulation) with the pipeline ranks counted as data parallel."""
    pp, m = plan.pipeline_parallel_degree, plan.num_microbatches
    dpr, dps = plan.data_parallel_replicate_degree, plan.data_parallel_shard_degree
    if pp == 1:
        return dpr, dps, m
    accumulation = m // pp if m % pp == 0 else m
    if plan.zero_stage >= 2 or dps > 1:
        dps *= pp
    else:
        dpr *= pp
    batch = plan.microbatch_size * accumulation * dpr * dps
    warnings.append(
        f"pipeline_parallel_degree={pp} is not expressible: accelerate has no pipeline-parallel training; exported "
        f"the {pp} pipeline ranks as data parallel (dp_replicate {dpr}, dp_shard {dps}, accumulation {m} -> "
        f"{accumulation}, global batch {batch}), a plan the prediction is not for: re-plan with --pp 1, or use "
        "the torchtitan or Megatron-LM export for this plan"
    )
    return dpr, dps, accumulation


def layout(plan: Plan, warnings: list[str]) -> AccelerateLayout:
    dpr, dps, accumulation = _fold_pipeline(plan, warnings)
    tp, cp, zero = plan.tensor_parallel_degree, plan.context_parallel_degree, plan.zero_stage
    if (tp > 1 or cp > 1) and dpr > 1 and dps == 1:
        warnings.append(
            f"ZeRO-{zero} replicated over dp_replicate={dpr} with tp={tp} cp={cp} is refused by accelerate's "
            "ParallelismConfig (tp/cp compose with FSDP2 only): exported FSDP2 over dp_shard="
            f"{dpr} with reshard_after_forward false (ZeRO-2: gradients and optimizer states sharded, less memory "
            "and a reduce-scatter + all-gather instead of the all-reduce)"
        )
        dpr, dps, zero = 1, dpr, 2
    if zero == 1:
        kind = "DEEPSPEED"
    elif zero in (2, 3) or dps > 1:
        kind = "FSDP"
        if dps == 1 and cp == 1:
            warnings.append(f"ZeRO-{zero} over one data-parallel rank shards nothing: exported without FSDP")
            kind, zero = "MULTI_GPU", 0
    else:
        kind = "MULTI_GPU" if plan.world_size > 1 else "NO"
    return AccelerateLayout(
        dp_replicate=dpr, dp_shard=dps, tp=tp, cp=cp, accumulation=accumulation, zero=zero, distributed_type=kind
    )


def accelerate_config(plan: Plan, lay: AccelerateLayout) -> dict:
    """accelerate launch config: DDP, FSDP2 (ZeRO-2/3) or its DeepSpeed plugin (ZeRO-1), with ParallelismConfig axes."""
    cfg: dict = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": lay.distributed_type,
        "machine_rank": 0,
        "num_machines": ec.num_nodes(plan),
        "num_processes": plan.world_size,
        "mixed_precision": "bf16" if plan.precision in ("bf16", "fp8") else "no",
        "main_training_function": "main",
        "main_process_port": 29500,
        "rdzv_backend": "static" if ec.num_nodes(plan) == 1 else "c10d",
        "same_network": True,
        "use_cpu": False,
    }
    if lay.distributed_type == "DEEPSPEED":
        cfg["deepspeed_config"] = {
            "zero_stage": 1,
            "gradient_accumulation_steps": lay.accumulation,
            "offload_optimizer_device": "cpu" if ec.offloads(plan) else "none",
            "offload_param_device": "none",
            "zero3_init_flag": False,
        }
    elif lay.distributed_type == "FSDP":
        cfg["fsdp_config"] = {
            "fsdp_version": 2,
            "fsdp_reshard_after_forward": lay.zero == 3,
            "fsdp_offload_params": ec.offloads(plan),
            "fsdp_activation_checkpointing": ec.strongest_recompute(plan) != "none",
            "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
            "fsdp_state_dict_type": "SHARDED_STATE_DICT",
            "fsdp_cpu_ram_efficient_loading": True,
        }
    cfg["parallelism_config"] = {
        "parallelism_config_dp_replicate_size": lay.dp_replicate,
        "parallelism_config_dp_shard_size": lay.dp_shard,
        "parallelism_config_tp_size": lay.tp,
        "parallelism_config_cp_size": lay.cp,
    }
    return cfg


def _accelerate_warnings(plan: Plan, lay: AccelerateLayout, warnings: list[str]) -> None:
    if ec.uniform_recompute(plan) not in ("none", "full"):
        warnings.append(
            f"recompute ({ec.recompute_text(plan)}): accelerate checkpoints every wrapped block or none; "
            f"exported fsdp_activation_checkpointing={ec.strongest_recompute(plan) != 'none'}"
        )
    if ec.strongest_recompute(plan) != "none" and lay.distributed_type != "FSDP":
        warnings.append(
            f"recompute ({ec.recompute_text(plan)}) has no {lay.distributed_type} setting in accelerate: call "
            "model.gradient_checkpointing_enable() (or torch.utils.checkpoint) on those blocks in the training script"
        )
    if plan.tensor_parallel_degree > 1 and plan.sequence_parallel:
        # transformers' tp_plans (e.g. LlamaConfig.base_model_tp_plan) shard the attention and MLP linears only
        warnings.append(
            "sequence parallel with TP is not expressible: accelerate applies the model's own TP plan (transformers "
            "tp_plan: column/row-parallel linears, norms and residual activations replicated over the TP ranks), so "
            "activation memory is higher and TP communication an all-reduce instead of reduce-scatter + all-gather"
        )
    elif plan.tensor_parallel_degree > 1:
        warnings.append(
            "accelerate's tensor parallelism applies the model's own TP plan (transformers tp_plan), which may "
            "differ from the plan's (sequence parallel off): activation memory can differ from the prediction"
        )
    warnings.extend(ec.precision_warnings(plan, "accelerate"))
    warnings.extend(ec.method_warnings(plan, "accelerate"))


def _launch_line(plan: Plan) -> str:
    if ec.num_nodes(plan) == 1:
        return "accelerate launch --config_file accelerate_config.yaml train.py"
    return (
        'accelerate launch --config_file accelerate_config.yaml --machine_rank "${NODE_RANK}" '
        '--main_process_ip "${MASTER_ADDR}" train.py'
    )


def export_accelerate(plan: Plan) -> dict[str, str]:
    warnings = ec.common_warnings(plan)
    lay = layout(plan, warnings)
    _accelerate_warnings(plan, lay, warnings)
    cfg = accelerate_config(plan, lay)
    dp = lay.dp_replicate * lay.dp_shard  # data-parallel ranks (cp and tp ranks share a sample)
    batch = plan.microbatch_size * lay.accumulation * dp
    head = ec.comment(
        ec.header_lines(plan, "accelerate")
        + ec.warning_lines(warnings)
        + ec.launch_notes(plan)
        + [
            f"in the training script: per_device_train_batch_size = {plan.microbatch_size}, "
            f"Accelerator(gradient_accumulation_steps={lay.accumulation}); global batch "
            f"{batch} = {plan.microbatch_size} x {lay.accumulation} x dp {dp}",
            "launch: " + _launch_line(plan),
        ]
    )
    snippet = (
        f"# meshplan batch settings for accelerate (see accelerate_config.yaml)\n"
        f"PER_DEVICE_TRAIN_BATCH_SIZE = {plan.microbatch_size}\n"
        f"GRADIENT_ACCUMULATION_STEPS = {lay.accumulation}\n"
        f"GLOBAL_BATCH_SIZE = {batch}  # = micro x accumulation x dp {dp}\nSEQ_LEN = {plan.seq_len}\n"
    )
    body = yaml.safe_dump(cfg, sort_keys=False, default_flow_style=False)
    return {"accelerate_config.yaml": head + body, "accelerate_batch.py": snippet}

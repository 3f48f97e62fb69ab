"""Export a plan to Hugging Face accelerate: accelerate_config.yaml (written with a YAML library) and the
batch settings of the training script.

`accelerate launch` turns the file's parallelism_config into PARALLELISM_CONFIG_* variables, from which
Accelerator() builds a ParallelismConfig (accelerate/parallelism_config.py) and checks that
dp_replicate x dp_shard x tp x cp equals the number of processes, and refuses tp or cp > 1 with pure
replication (dp_replicate > 1, dp_shard = 1). Accelerate has no pipeline parallelism.

A plan priced for DeepSpeed's engine (--runtime deepspeed), and any ZeRO-1 plan (accelerate's FSDP2 has
no ZeRO-1), runs through accelerate's DeepSpeed plugin with a ds_config.json beside the YAML
(deepspeed_config_file): the one export_deepspeed writes for the plan, so the engine's stage, buckets,
overlap, gradient dtype and offload are the ones priced, with the batch of the layout accelerate runs.
accelerate then takes the stage, accumulation, offload and mixed precision from that file and refuses
them in the YAML (utils/dataclasses.py DeepSpeedPlugin._deepspeed_config_checks; the launcher counts a
mixed_precision in the YAML as one of them); DeepSpeed owns the mesh (AutoTP from
tensor_parallel.autotp_size, data parallel over the rest), so no parallelism_config is written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import yaml

from meshplan.plan import Plan
from meshplan.report import export_common as ec
from meshplan.report import export_deepspeed

DS_CONFIG = "ds_config.json"
"""The DeepSpeed config accelerate's plugin reads (deepspeed_config_file), written beside the YAML."""


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


def deepspeed_engine(plan: Plan) -> bool:
    """Whether accelerate runs the plan with its DeepSpeed plugin: a plan priced for DeepSpeed's engine, or
    a ZeRO-1 plan; not with context parallelism, which DeepSpeed's config cannot express."""
    deepspeed = plan.runtime in ec.TARGET_RUNTIMES["deepspeed"] or plan.zero_stage == 1
    return deepspeed and plan.context_parallel_degree == 1


def layout(plan: Plan, warnings: list[str]) -> AccelerateLayout:
    dpr, dps, accumulation = _fold_pipeline(plan, warnings)
    tp, cp, zero = plan.tensor_parallel_degree, plan.context_parallel_degree, plan.zero_stage
    if deepspeed_engine(plan):
        if zero >= 1 and dpr > 1 and dps > 1:
            warnings.append(export_deepspeed.replicated_shards_warning(zero, dps, dpr))
        return AccelerateLayout(
            dp_replicate=dpr,
            dp_shard=dps,
            tp=tp,
            cp=cp,
            accumulation=accumulation,
            zero=zero,
            distributed_type="DEEPSPEED",
        )
    if (tp > 1 or cp > 1) and dpr > 1 and dps == 1:
        warnings.append(
            f"ZeRO-{zero} replicated over dp_replicate={dpr} with tp={tp} cp={cp} is refused by accelerate's "
            "ParallelismConfig (tp/cp compose with FSDP2 only): exported FSDP2 over dp_shard="
            f"{dpr} with reshard_after_forward false (ZeRO-2: gradients and optimizer states sharded, less memory "
            "and a reduce-scatter + all-gather instead of the all-reduce)"
        )
        dpr, dps, zero = 1, dpr, 2
    if zero == 1:  # with context parallelism: FSDP2, which has no ZeRO-1
        warnings.append(
            f"ZeRO-1 with cp={cp}: DeepSpeed has no context parallelism and accelerate's FSDP2 no ZeRO-1; "
            "exported FSDP2 with reshard_after_forward false (ZeRO-2: gradients sharded too, less memory and a "
            "reduce-scatter instead of the all-reduce)"
        )
        zero = 2
    if zero in (2, 3) or dps > 1:
        kind = "FSDP"
        if dps == 1 and cp == 1:
            warnings.append(f"ZeRO-{zero} over one data-parallel rank shards nothing: exported without FSDP")
            kind, zero = "MULTI_GPU", 0
    else:
        kind = "MULTI_GPU" if plan.world_size > 1 else "NO"
    return AccelerateLayout(
        dp_replicate=dpr, dp_shard=dps, tp=tp, cp=cp, accumulation=accumulation, zero=zero, distributed_type=kind
    )


def deepspeed_file(plan: Plan, lay: AccelerateLayout) -> dict:
    """ds_config.json for accelerate's DeepSpeed plugin: export_deepspeed's config of the plan (its stage,
    buckets, overlap, gradient dtype, offload, AutoTP), with the batch and stage of the layout accelerate
    runs (no pipeline engine: the pipeline ranks are data parallel, ZeRO-2/3 kept). Under accelerate
    deepspeed.initialize gets no mpu, so DeepSpeed's batch check counts every process, the TP ranks too
    (runtime/config.py: world_size = dist.get_world_size()): train_batch_size is micro x accumulation x
    processes, as accelerate itself fills it in ("auto"), while the TP ranks share their samples."""
    config = export_deepspeed.deepspeed_config(plan, [])  # its warnings are DeepSpeed's launcher's, not these
    config["train_batch_size"] = plan.microbatch_size * lay.accumulation * plan.world_size
    config["train_micro_batch_size_per_gpu"] = plan.microbatch_size
    config["gradient_accumulation_steps"] = lay.accumulation
    config["zero_optimization"]["stage"] = lay.zero
    config.pop("activation_checkpointing", None)  # read by deepspeed.checkpointing, which accelerate never configures
    config.pop("pipeline", None)  # the pipeline engine's settings: accelerate runs no PipelineModule
    if lay.tp > 1:  # AutoTP also where a pipeline was folded away (export_deepspeed writes it for pp = 1 only)
        config["tensor_parallel"] = {"autotp_size": lay.tp}
    return config


def accelerate_config(plan: Plan, lay: AccelerateLayout) -> dict:
    """accelerate launch config: DDP or FSDP2 with ParallelismConfig axes, or the DeepSpeed plugin reading
    ds_config.json (deepspeed_file)."""
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
        del cfg["mixed_precision"]  # the file's bf16 section: accelerate refuses both
        cfg["deepspeed_config"] = {"deepspeed_config_file": DS_CONFIG, "zero3_init_flag": lay.zero == 3}
        if ec.num_nodes(plan) > 1:  # each node's own `accelerate launch` (torchrun), not pdsh over a hostfile
            cfg["deepspeed_config"]["deepspeed_multinode_launcher"] = "standard"
        return cfg
    if lay.distributed_type == "FSDP":
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
    if plan.tensor_parallel_degree > 1 and lay.distributed_type == "DEEPSPEED":
        # DeepSpeed AutoTP (module_inject/auto_tp.py) splits the linears; norms and residuals stay whole
        warnings.append(
            f"tensor parallelism is DeepSpeed's AutoTP (tensor_parallel.autotp_size {lay.tp} in {DS_CONFIG}), "
            "which shards the model's linears by its own rules"
            + (
                ": sequence parallel with TP is not expressible (norm and residual activations replicated over the "
                "TP ranks), so activation memory is higher and TP communication an all-reduce"
                if plan.sequence_parallel
                else ""
            )
        )
    elif plan.tensor_parallel_degree > 1 and plan.sequence_parallel:
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
    runs_on = "deepspeed" if lay.distributed_type == "DEEPSPEED" else None  # the plugin runs DeepSpeed's engine
    warnings.extend(ec.method_warnings(plan, "accelerate", runs_on))


def _deepspeed_notes(plan: Plan, lay: AccelerateLayout, ds_config: dict | None) -> list[str]:
    if ds_config is None:
        return []
    notes = [
        f"DeepSpeed plugin: ZeRO-{lay.zero}, its engine settings and mixed precision in {DS_CONFIG} (launch from "
        "this folder: accelerate reads the file relative to the working directory)"
    ]
    if lay.tp > 1:
        notes.append(
            f"{DS_CONFIG} train_batch_size {ds_config['train_batch_size']} counts all {plan.world_size} processes, "
            f"as DeepSpeed's batch check does under accelerate (no mpu); the {lay.tp} AutoTP ranks of a group "
            "share their samples"
        )
    return notes


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
    ds_config = deepspeed_file(plan, lay) if lay.distributed_type == "DEEPSPEED" else None
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
            *_deepspeed_notes(plan, lay, ds_config),
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
    files = {"accelerate_config.yaml": head + body, "accelerate_batch.py": snippet}
    if ds_config is not None:
        files[DS_CONFIG] = json.dumps(ds_config, indent=2) + "\n"
    return files

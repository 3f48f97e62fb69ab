"""Export a plan to torchtitan: a TOML job config and a Python function that sets the same fields.

torchtitan names (torchtitan/config/job_config.py): [parallelism] *_degree,
pipeline_parallel_schedule, pipeline_parallel_microbatch_size, module_fqns_per_model_part,
fsdp_reshard_after_forward; [activation_checkpoint] mode / selective_ac_option;
[training] local_batch_size, global_batch_size, seq_len, mixed_precision_param, enable_cpu_offload,
compile (written true when the plan was predicted compiled: --compile).
torchtitan's gradient accumulation = global_batch_size / (local_batch_size x dp).
"""

from __future__ import annotations

import json

from meshplan.plan import Plan
from meshplan.report import export_common as ec

# meshplan zoo FQNs -> torchtitan's Llama/DeepSeek module names
TITAN_FQNS = {"embed": ["tok_embeddings"], "head": ["norm", "output"]}


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return str(value)
    return json.dumps(value)  # strings and lists of strings: JSON spelling is valid TOML


def _reshard(plan: Plan, warnings: list[str]) -> str:
    """fsdp_reshard_after_forward: "never" = ZeRO-2 (params kept after forward); ZeRO-3 is "default"
    without pipeline parallelism and "always" with it (torchtitan's default then keeps them)."""
    if plan.zero_stage == 1:
        warnings.append(
            "ZeRO-1 (sharded optimizer states only) has no torchtitan setting: FSDP2 shards "
            "gradients and parameters too; the degrees below keep the plan's replicate/shard split, "
            "so the optimizer states stay replicated over data_parallel_replicate_degree"
        )
    if plan.zero_stage == 0 and plan.data_parallel_shard_degree > 1:
        warnings.append("plan uses plain DDP but data_parallel_shard_degree > 1: torchtitan shards with FSDP2")
    if plan.zero_stage == 2:
        return "never"
    # "default" keeps the parameters gathered under pipeline parallelism (ZeRO-2, to avoid
    # per-microbatch all-gathers: torchtitan apply_fsdp); ZeRO-3 with PP must say "always"
    return "always" if plan.pipeline_parallel_degree > 1 else "default"


def _activation_checkpoint(plan: Plan, warnings: list[str]) -> dict:
    """torchtitan AC: none / full / selective "op" (Korthikanti selective) / selective "k" (every k-th block)."""
    uniform = ec.uniform_recompute(plan)
    if uniform is not None:
        return {"mode": uniform, **({"selective_ac_option": "op"} if uniform == "selective" else {})}
    modes = ec.recompute_modes(plan)
    full_idx = [i for i, m in enumerate(modes) if m == "full"]
    if set(modes) == {"full", "none"}:
        # torchtitan counts blocks from 1 and checkpoints those with count % k == 0
        for k in range(2, len(modes) + 1):
            if full_idx == [i for i in range(len(modes)) if (i + 1) % k == 0]:
                return {"mode": "selective", "selective_ac_option": str(k)}
    strongest = ec.strongest_recompute(plan)
    warnings.append(
        f"per-layer recompute ({ec.recompute_text(plan)}) is not expressible in torchtitan; "
        f"exported mode={strongest} on every block, which recomputes more than planned "
        "(slower than predicted, never more memory)"
    )
    return {"mode": strongest, **({"selective_ac_option": "op"} if strongest == "selective" else {})}


def _model_parts(plan: Plan, warnings: list[str]) -> list[list[str]]:
    if ec.is_transformer(plan):
        return [[name for fqn in stage for name in TITAN_FQNS.get(fqn, [fqn])] for stage in plan.stages]
    warnings.append(
        f"{plan.model_name} is not a transformer in meshplan's embed/layers.N/head layout; "
        "module_fqns_per_model_part lists meshplan's layer FQNs, map them to your model's"
    )
    return [list(stage) for stage in plan.stages]


def _settings(plan: Plan, warnings: list[str]) -> dict[str, dict]:
    pp, m, dp = plan.pipeline_parallel_degree, plan.num_microbatches, plan.data_parallel_degree
    par = {
        "data_parallel_replicate_degree": plan.data_parallel_replicate_degree,
        "data_parallel_shard_degree": plan.data_parallel_shard_degree,
        "fsdp_reshard_after_forward": _reshard(plan, warnings),
        "tensor_parallel_degree": plan.tensor_parallel_degree,
        "context_parallel_degree": plan.context_parallel_degree,
        "pipeline_parallel_degree": pp,
    }
    if pp > 1:
        par.update(
            pipeline_parallel_schedule=plan.pipeline_schedule,
            pipeline_parallel_microbatch_size=plan.microbatch_size,
            module_fqns_per_model_part=_model_parts(plan, warnings),
        )
    if plan.tensor_parallel_degree > 1 and not plan.sequence_parallel:
        warnings.append(
            "torchtitan always applies sequence parallel with tensor parallel; "
            "the plan has it off, so activation memory will be lower than predicted"
        )
    # with PP the local batch is split into microbatches; without PP torchtitan accumulates gradients
    local = plan.microbatch_size * m if pp > 1 else plan.microbatch_size
    training = {
        "local_batch_size": local,
        "global_batch_size": local * dp * (1 if pp > 1 else m),
        "seq_len": plan.seq_len,
        "mixed_precision_param": "bfloat16" if plan.precision == "bf16" else "float32",
        "enable_cpu_offload": ec.offloads(plan),
    }
    if plan.runtime_behaviours.get("elementwise") == "compiled":  # predicted with --compile
        training["compile"] = True
    warnings.extend(ec.method_warnings(plan, "torchtitan"))
    return {"parallelism": par, "activation_checkpoint": _activation_checkpoint(plan, warnings), "training": training}


def _toml(plan: Plan, settings: dict[str, dict], warnings: list[str]) -> str:
    out = ec.comment(ec.header_lines(plan, "torchtitan") + ec.warning_lines(warnings))
    out += (
        f"# launch: NGPU={plan.world_size} (torchrun --nproc_per_node {ec.devices_per_node(plan)} "
        f"--nnodes {ec.num_nodes(plan)}) ./run_train.sh --job.config_file meshplan.toml\n"
    )
    for section, values in settings.items():
        out += f"\n[{section}]\n"
        out += "".join(f"{key} = {_toml_value(value)}\n" for key, value in values.items())
    return out


def _python(plan: Plan, settings: dict[str, dict], warnings: list[str]) -> str:
    lines = [
        '"""' + "\n".join(ec.header_lines(plan, "torchtitan (Python config)")),
        *ec.warning_lines(warnings),
        '"""',
        "",
        "",
        "def meshplan_config(job_config):",
        '    """Set the plan\'s parallelism, activation checkpointing and batch on a torchtitan '
        'JobConfig; returns it."""',
    ]
    for section, values in settings.items():
        for key, value in values.items():
            lines.append(f"    job_config.{section}.{key} = {value!r}")
    lines.append("    return job_config")
    return "\n".join(lines) + "\n"


def export_torchtitan(plan: Plan) -> dict[str, str]:
    warnings = ec.common_warnings(plan)
    settings = _settings(plan, warnings)
    return {"meshplan.toml": _toml(plan, settings, warnings), "meshplan_config.py": _python(plan, settings, warnings)}

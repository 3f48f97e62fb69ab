"""Export a plan to torchtitan.

The current release (0.3, the default): a Python config module for `--module meshplan_torchtitan --config
meshplan`, a config_registry function that starts from torchtitan's own recipe for the model (llama3_8b, ...)
and sets the plan on it: Trainer.Config's parallelism, training, activation_checkpoint (FullAC, SelectiveAC,
None), compile and the model spec (model_registry(flavor, converters=[Float8LinearConverter] for fp8)).
torchtitan 0.2 (`version="0.2"`): the TOML job config of `--job.config_file` ([model] name/flavor,
[parallelism], [activation_checkpoint] mode, [training], [float8]) and a Python function setting the same
fields on a JobConfig. Both: torchtitan's gradient accumulation = global_batch_size / (local_batch_size x dp).
"""

from __future__ import annotations

import tomli_w

from meshplan.errors import MeshplanError
from meshplan.plan import Plan
from meshplan.report import export_common as ec

VERSIONS = ("0.3", "0.2")
"""torchtitan releases the export writes; the first is the default."""

LLAMA3_FLAVORS = {
    # torchtitan/models/llama3 (0.2 and 0.3): (layers, dim, heads, kv heads, ffn, vocab), untied output
    "8B": (32, 4096, 32, 8, 14336, 128256),
    "70B": (80, 8192, 64, 8, 28672, 128256),
    "405B": (126, 16384, 128, 8, 53248, 128256),
}
"""Llama 3.1 flavours torchtitan ships (1B and 3B tie their embeddings: not meshplan's untied Llama)."""

LLAMA3_ARCHITECTURE = {
    "family": "llama",
    "norm": "RMSNorm",
    "activation": "swiglu",
    "position": "rope",
    "rope_theta": 500000.0,
    "bias": False,
    "tied": False,
    "qk_norm": False,
}
"""torchtitan's llama3 beyond the shape (torchtitan/models/llama3: RMSNorm, SwiGLU, rotary base 500000, no
biases, its own output layer)."""

HEAD_FQNS = {"0.3": ["norm", "lm_head"], "0.2": ["norm", "output"]}


def shipped_model(plan: Plan) -> tuple[str, str] | None:
    """(torchtitan model name, flavour) when the plan's architecture and shape are one torchtitan ships."""
    arch = ec.architecture(plan)
    if arch is None or {k: arch[k] for k in LLAMA3_ARCHITECTURE} != LLAMA3_ARCHITECTURE:
        return None
    shape = (arch["layers"], arch["hidden"], arch["heads"], arch["kv_heads"], arch["ffn_hidden"], arch["vocab"])
    return next((("llama3", flavor) for flavor, dims in LLAMA3_FLAVORS.items() if dims == shape), None)


def _model_warnings(plan: Plan, warnings: list[str]) -> None:
    if shipped_model(plan) is not None:
        return
    arch = ec.architecture(plan)
    if arch:
        said = f"torchtitan ships no model of this architecture and shape ({ec.architecture_text(arch)})"
    else:  # a model meshplan cannot name (docs/models.md), or a plan written before model_architecture
        said = (
            f"the plan does not record the decoder architecture of {plan.model_name} (family "
            f"{plan.model_family or 'not recorded'}), so it cannot be matched to a model torchtitan ships (a Llama "
            "3.1 8B/70B/405B is llama3 with that flavour: name it in model_spec() instead)"
        )
    warnings.append(
        f"{said}: the model section names a custom model (register your model's spec as shown there); the stage "
        "module names below are torchtitan's decoder names (tok_embeddings, layers.N, norm and the output layer): "
        "give your model's modules those names"
    )


def ddp_beside_model_parallel(plan: Plan) -> bool:
    """Replicas torchtitan would run as DDP (ZeRO-0/1: no FSDP shard degree) beside tensor, pipeline or
    context parallelism: its apply_ddp takes a 1-D mesh only and raises on them."""
    model_parallel = plan.tensor_parallel_degree * plan.pipeline_parallel_degree * plan.context_parallel_degree
    return plan.zero_stage <= 1 and plan.data_parallel_degree > 1 and model_parallel > 1


def _data_parallel_degrees(plan: Plan, warnings: list[str]) -> tuple[int, int]:
    """(data_parallel_replicate_degree, data_parallel_shard_degree): the plan's, except for ZeRO-0/1 replicas
    beside model parallelism, which torchtitan refuses ("DDP has not supported > 1D parallelism"): its
    replicas are written as FSDP2 shards that keep their parameters gathered (reshard never, ZeRO-2)."""
    if not ddp_beside_model_parallel(plan):
        return plan.data_parallel_replicate_degree, plan.data_parallel_shard_degree
    warnings.append(
        f"ZeRO-{plan.zero_stage} replicas ({plan.data_parallel_degree}) beside tensor/pipeline/context parallelism: "
        "torchtitan runs DDP on a 1-D mesh only (apply_ddp raises 'DDP has not supported > 1D parallelism'), "
        f"so the replicas are exported as FSDP2 shards (data_parallel_shard_degree {plan.data_parallel_degree}, "
        "reshard never: ZeRO-2), which hold less memory and reduce-scatter gradients instead of all-reducing "
        "them; plan with --runtime torchtitan to price what it runs"
    )
    return 1, plan.data_parallel_degree


def _reshard(plan: Plan, warnings: list[str]) -> str:
    """fsdp_reshard_after_forward: "never" = ZeRO-2 (params kept after forward); ZeRO-3 is "default"
    without pipeline parallelism and "always" with it (torchtitan's default then keeps them)."""
    if plan.zero_stage == 1 and not ddp_beside_model_parallel(plan):  # else _data_parallel_degrees says it
        warnings.append(
            "ZeRO-1 (sharded optimizer states only) has no torchtitan setting: FSDP2 shards "
            "gradients and parameters too; the degrees below keep the plan's replicate/shard split, "
            "so the optimizer states stay replicated over data_parallel_replicate_degree"
        )
    if plan.zero_stage == 0 and plan.data_parallel_shard_degree > 1:
        warnings.append("plan uses plain DDP but data_parallel_shard_degree > 1: torchtitan shards with FSDP2")
    if plan.zero_stage == 2 or ddp_beside_model_parallel(plan):
        return "never"
    # "default" keeps the parameters gathered under pipeline parallelism (ZeRO-2, to avoid
    # per-microbatch all-gathers: torchtitan apply_fsdp); ZeRO-3 with PP must say "always"
    return "always" if plan.pipeline_parallel_degree > 1 else "default"


def _activation_checkpoint(plan: Plan, warnings: list[str], version: str) -> dict:
    """torchtitan AC: none / full / selective "op" (Korthikanti selective); 0.2 also selective "k" (every k-th block)."""
    uniform = ec.uniform_recompute(plan)
    if uniform is not None:
        return {"mode": uniform, **({"selective_ac_option": "op"} if uniform == "selective" else {})}
    modes = ec.recompute_modes(plan)
    full_idx = [i for i, m in enumerate(modes) if m == "full"]
    if set(modes) == {"full", "none"} and version == "0.2":
        # torchtitan 0.2 counts blocks from 1 and checkpoints those with count % k == 0
        for k in range(2, len(modes) + 1):
            if full_idx == [i for i in range(len(modes)) if (i + 1) % k == 0]:
                return {"mode": "selective", "selective_ac_option": str(k)}
    strongest = ec.strongest_recompute(plan)
    warnings.append(
        f"per-layer recompute ({ec.recompute_text(plan)}) is not expressible in torchtitan {version}; "
        f"exported mode={strongest} on every block, which recomputes more than planned "
        "(slower than predicted, never more memory)"
    )
    return {"mode": strongest, **({"selective_ac_option": "op"} if strongest == "selective" else {})}


def _model_parts(plan: Plan, warnings: list[str], version: str) -> list[list[str]]:
    if ec.is_transformer(plan):
        names = {"embed": ["tok_embeddings"], "head": HEAD_FQNS[version]}
        return [[name for fqn in stage for name in names.get(fqn, [fqn])] for stage in plan.stages]
    warnings.append(
        f"{plan.model_name} is not a transformer in meshplan's embed/layers.N/head layout; "
        "module_fqns_per_model_part lists meshplan's layer FQNs, map them to your model's"
    )
    return [list(stage) for stage in plan.stages]


def settings(plan: Plan, warnings: list[str], version: str) -> dict[str, dict]:
    """The plan as torchtitan's config sections (the same names in 0.2's JobConfig and 0.3's Trainer.Config)."""
    pp, m, dp = plan.pipeline_parallel_degree, plan.num_microbatches, plan.data_parallel_degree
    replicate, shard = _data_parallel_degrees(plan, warnings)
    par: dict = {
        "data_parallel_replicate_degree": replicate,
        "data_parallel_shard_degree": shard,
        "fsdp_reshard_after_forward": _reshard(plan, warnings),
        "tensor_parallel_degree": plan.tensor_parallel_degree,
        "context_parallel_degree": plan.context_parallel_degree,
        "pipeline_parallel_degree": pp,
    }
    if version != "0.2" and plan.tensor_parallel_degree > 1:
        par["enable_sequence_parallel"] = plan.sequence_parallel
    if pp > 1:
        par.update(
            pipeline_parallel_schedule=plan.pipeline_schedule,
            pipeline_parallel_microbatch_size=plan.microbatch_size,
            module_fqns_per_model_part=_model_parts(plan, warnings, version),
        )
    if version == "0.2" and plan.tensor_parallel_degree > 1 and not plan.sequence_parallel:
        warnings.append(
            "torchtitan 0.2 always applies sequence parallel with tensor parallel; "
            "the plan has it off, so activation memory will be lower than predicted"
        )
    # with PP the local batch is split into microbatches; without PP torchtitan accumulates gradients
    local = plan.microbatch_size * m if pp > 1 else plan.microbatch_size
    training = {
        "local_batch_size": local,
        "global_batch_size": local * dp * (1 if pp > 1 else m),
        "seq_len": plan.seq_len,
        "mixed_precision_param": "float32" if plan.precision == "fp32" else "bfloat16",
        "enable_cpu_offload": ec.offloads(plan),
    }
    out = {"parallelism": par, "training": training}
    out["activation_checkpoint"] = _activation_checkpoint(plan, warnings, version)
    out["compile"] = {"enable": plan.runtime_behaviours.get("elementwise") == "compiled"}
    if plan.data_parallel_shard_degree > 1 and plan.runtime_behaviours.get("fsdp_reduce_bytes") == 2:
        warnings.append(
            "the plan reduce-scatters bf16 gradients; torchtitan's training.mixed_precision_reduce takes "
            "float32 only, so its reduce-scatters move twice the planned bytes"
        )
    warnings.extend(ec.method_warnings(plan, "torchtitan"))
    return out


def _launch(plan: Plan, target: str) -> str:
    return ec.torchrun_line(plan, target)


# --- torchtitan 0.3: a config_registry module --------------------------------------------------------

CUSTOM_MODEL = '''
def model_spec(converters):
    """Your model as a torchtitan ModelSpec (torchtitan ships none of this architecture): build it like
    torchtitan/models/llama3/__init__.py model_registry does, with the shape above and `converters`."""
    import importlib
    import os

    return importlib.import_module(os.environ.get("MESHPLAN_MODEL_MODULE", "my_model")).model_spec(converters)
'''


def _python_03(plan: Plan, cfg: dict[str, dict], warnings: list[str]) -> str:
    shipped = shipped_model(plan)
    arch = ec.architecture(plan)
    fp8 = plan.precision == "fp8"
    compiled = cfg["compile"]["enable"]
    lines = [
        '"""' + "\n".join(ec.header_lines(plan, "torchtitan 0.3")),
        *ec.warning_lines(warnings),
        *ec.launch_notes(plan),
        "launch: " + _launch(plan, "-m torchtitan.train --module meshplan_torchtitan --config meshplan"),
        '"""',
        "",
        "from torchtitan.components.quantization import Float8LinearConverter",
        "from torchtitan.config import CompileConfig",
        "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC",
    ]
    if shipped:
        name, flavor = shipped
        lines += [
            f"from torchtitan.models.{name} import model_registry",
            f"from torchtitan.models.{name}.config_registry import {name}_{flavor.lower()}",
            "",
            "",
            "def model_spec(converters):",
            f'    return model_registry("{flavor}", converters=converters)  # torchtitan\'s {name} {flavor}',
        ]
        base = f"{name}_{flavor.lower()}()  # torchtitan's own recipe: optimizer, data, tokenizer"
    else:
        lines += ["from torchtitan.trainer import Trainer", "", "", *CUSTOM_MODEL.strip("\n").splitlines()]
        if arch:
            lines.insert(-8, f"# the model: {ec.architecture_text(arch)}")
        base = "Trainer.Config()"
    converters = f"[Float8LinearConverter.Config(model_compile_enabled={compiled})]" if fp8 else "[]"
    lines += [
        "",
        "",
        "def meshplan():",
        '    """The plan on a torchtitan Trainer.Config (torchtitan.config.manager: --module/--config)."""',
        f"    config = {base}",
        f"    config.model_spec = model_spec({converters})" + ("  # fp8 GEMMs: torchao float8" if fp8 else ""),
    ]
    for section in ("parallelism", "training"):
        lines += [f"    config.{section}.{key} = {value!r}" for key, value in cfg[section].items()]
    if plan.pipeline_parallel_degree > 1:  # 0.3's TrainingConfig refuses CUDA graphs with pipeline parallelism
        lines.append("    config.training.disable_cuda_graphs = True")
    ac = cfg["activation_checkpoint"]
    lines.append(
        "    config.activation_checkpoint = "
        + {"none": "None", "full": "FullAC.Config()", "selective": "SelectiveAC.Config()"}[ac["mode"]]
    )
    lines.append(f"    config.compile = CompileConfig(enable={compiled})")
    lines.append("    return config")
    return "\n".join(lines) + "\n"


def _launch_script(plan: Plan, target: str) -> str:
    return (
        "#!/usr/bin/env bash\n"
        + ec.comment(ec.header_lines(plan, "torchtitan") + ec.launch_notes(plan))
        + (_launch(plan, target) + ' "$@"\n')
    )


def export_torchtitan(plan: Plan, version: str | None = None) -> dict[str, str]:
    version = version or VERSIONS[0]
    if version not in VERSIONS:
        raise MeshplanError(f"--target-version {version}: torchtitan exports are for {' or '.join(VERSIONS)}")
    warnings = ec.common_warnings(plan)
    _model_warnings(plan, warnings)
    cfg = settings(plan, warnings, version)
    if version == "0.2":
        return {
            "meshplan.toml": _toml_02(plan, cfg, warnings),
            "meshplan_config.py": _python_02(plan, cfg, warnings),
            "run_torchtitan.sh": _launch_script(plan, "-m torchtitan.train --job.config_file meshplan.toml"),
        }
    return {
        "meshplan_torchtitan.py": _python_03(plan, cfg, warnings),
        "run_torchtitan.sh": _launch_script(plan, "-m torchtitan.train --module meshplan_torchtitan --config meshplan"),
    }


# --- torchtitan 0.2: TOML job config -----------------------------------------------------------------


def _sections_02(plan: Plan, cfg: dict[str, dict]) -> dict[str, dict]:
    shipped = shipped_model(plan)
    model: dict[str, object] = (
        {"name": shipped[0], "flavor": shipped[1]} if shipped else {"name": "custom", "flavor": "meshplan"}
    )
    if plan.precision == "fp8":  # torchao float8 training (torchtitan/components/quantization/float8.py)
        model["converters"] = ["quantize.linear.float8"]
    out = {"model": model, **{k: v for k, v in cfg.items() if k != "compile"}}
    if cfg["compile"]["enable"]:
        out["compile"] = {"enable": True}
    if plan.precision == "fp8":
        out["quantize"] = {"linear": {"float8": {"recipe_name": "rowwise"}}}
    return out


def _flat(prefix: str, values: dict) -> list[tuple[str, object]]:
    out: list[tuple[str, object]] = []
    for key, value in values.items():
        out += _flat(f"{prefix}.{key}", value) if isinstance(value, dict) else [(f"{prefix}.{key}", value)]
    return out


def _toml_02(plan: Plan, cfg: dict[str, dict], warnings: list[str]) -> str:
    sections = _sections_02(plan, cfg)
    head = ec.header_lines(plan, "torchtitan 0.2") + ec.warning_lines(warnings) + ec.launch_notes(plan)
    if not shipped_model(plan):
        head.append("custom model: register a TrainSpec named 'custom' with flavor 'meshplan' of the shape above")
    head.append("launch: " + _launch(plan, "-m torchtitan.train --job.config_file meshplan.toml"))
    return ec.comment(head) + "\n" + tomli_w.dumps(sections)


def _python_02(plan: Plan, cfg: dict[str, dict], warnings: list[str]) -> str:
    lines = [
        '"""' + "\n".join(ec.header_lines(plan, "torchtitan 0.2 (Python config)")),
        *ec.warning_lines(warnings),
        '"""',
        "",
        "",
        "def meshplan_config(job_config):",
        '    """Set the plan\'s model, parallelism, activation checkpointing and batch on a torchtitan 0.2 '
        'JobConfig; returns it."""',
    ]
    for section, values in _sections_02(plan, cfg).items():
        for key, value in _flat(section, values):
            lines.append(f"    job_config.{key} = {value!r}")
    lines.append("    return job_config")
    return "\n".join(lines) + "\n"

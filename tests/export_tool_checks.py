"""Feed meshplan's exports to the real tools: run by the tools' own venv (`make export-tools`: .venv-exports),
never imported by pytest. Reads a JSON list of cases on stdin ({"id", "target", "dir"}), writes one JSON
object per case on stdout: {"id", "accepted", "error", "values"} where values are what the tool itself
derived from the files (batch, degrees, ZeRO stage, precision, model, ...), for the tests to compare
with the plan. Imports no meshplan code: the files are all the tools see."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import logging
import os
import re
import shlex
import sys
import traceback
import warnings
from pathlib import Path

logging.disable(logging.WARNING)
warnings.simplefilter("ignore")


NODE_ENV = {"NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500", "HOSTFILE": "hostfile"}
"""The environment a launch line is read under: the second node of the job, node 0 at 10.0.0.1."""


def _launch_argv(text: str, command: str) -> list[str]:
    """The words of the line of `text` that starts with `command` (a script line or a `# launch:` comment), its
    ${VAR} and ${VAR:-default} expanded from NODE_ENV."""
    lines = [x.split("launch: ", 1)[-1] for x in text.splitlines()]
    line = next(x for x in lines if x.startswith(command + " "))
    line = re.sub(r"\$\{(\w+)(?::-[^}]*)?\}", lambda m: NODE_ENV[m[1]], line)
    return shlex.split(line)[1:]


def torchrun_world(text: str) -> dict:
    """torchrun's own parser (torch.distributed.run) on the export's launch line: the nodes, processes per node
    and rendezvous endpoint it would start with, and the world they make."""
    from torch.distributed.run import config_from_args, parse_args

    saved = os.environ.get("OMP_NUM_THREADS")
    config, _, _ = config_from_args(parse_args(_launch_argv(text, "torchrun")))
    os.environ.pop("OMP_NUM_THREADS", None) if saved is None else os.environ.__setitem__("OMP_NUM_THREADS", saved)
    assert config.min_nodes == config.max_nodes, f"elastic node range {config.min_nodes}:{config.max_nodes}"
    return {
        "nodes": config.max_nodes,
        "nproc_per_node": config.nproc_per_node,
        "endpoint": config.rdzv_endpoint,
        "world": config.max_nodes * config.nproc_per_node,
    }


def deepspeed_launcher_world(text: str, directory: Path) -> dict:
    """DeepSpeed's launcher (deepspeed.launcher.runner) on the launch line: its arguments, and on many nodes the
    hosts and slots it keeps from a hostfile of the line's node count (every host with one slot per device)."""
    from deepspeed.launcher import runner

    args = runner.parse_args(_launch_argv(text, "deepspeed"))
    if args.num_nodes <= 1:  # the local devices, no hostfile
        return {"nodes": 1, "nproc_per_node": args.num_gpus, "world": args.num_gpus, "master_addr": None}
    hostfile = directory / NODE_ENV["HOSTFILE"]
    hostfile.write_text("".join(f"node{i} slots={args.num_gpus}\n" for i in range(args.num_nodes)))
    pool = runner.fetch_hostfile(str(hostfile))
    active = runner.parse_inclusion_exclusion(pool, args.include, args.exclude)
    active = runner.apply_num_nodes_and_gpus(active, args.num_nodes, args.num_gpus)
    slots = [len(v) for v in active.values()]
    return {"nodes": len(slots), "nproc_per_node": max(slots), "world": sum(slots), "master_addr": args.master_addr}


@contextlib.contextmanager
def fake_world(world: int):
    """torch.distributed's fake backend as rank 0 of `world` ranks: the tools build their real process groups
    and device meshes, nothing is communicated."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    env = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": str(world), "MASTER_ADDR": "localhost", "MASTER_PORT": "29500"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        dist.destroy_process_group()
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)


def load_module(directory: str, name: str):
    sys.path.insert(0, directory)
    try:
        sys.modules.pop(name, None)
        return importlib.import_module(name)
    finally:
        sys.path.remove(directory)


# --- DeepSpeed ---------------------------------------------------------------------------------------


def _reset_deepspeed_groups() -> None:
    from deepspeed.utils import groups

    for name in ("_TENSOR_MODEL_PARALLEL_GROUP", "_MODEL_PARALLEL_GROUP", "_DATA_PARALLEL_GROUP"):
        setattr(groups, name, None)
    groups.mesh_device = None
    import deepspeed.comm.comm as ds_comm

    ds_comm.cdb = None
    from deepspeed.runtime.activation_checkpointing import checkpointing

    checkpointing.mpu = None  # configure(None, ...) keeps the last case's: its data-parallel size would be used


def _pipeline_layers(count: int) -> list:
    """An embedding, count - 2 blocks and a head, each a class of its own with parameters, as a model's
    PipelineModule layers are (DeepSpeed decides what to checkpoint by class and by parameters)."""
    import torch

    class Embedding(torch.nn.Embedding):
        pass

    class Block(torch.nn.Linear):
        pass

    class Head(torch.nn.Linear):
        pass

    return [Embedding(8, 4), *(Block(4, 4) for _ in range(count - 2)), Head(4, 8)]


def _checkpointed_layers(module) -> list[int]:
    """Global indices of this rank's layers that the PipelineModule's forward runs under a checkpoint: its own
    _is_checkpointable over each chunk of activation_checkpoint_interval layers, as its forward asks it."""
    k, funcs, out = module.activation_checkpoint_interval, module.forward_funcs, []
    if k == 0:
        return out
    for start in range(0, len(funcs), k):
        if module._is_checkpointable(funcs[start : start + k]):
            out += range(module._local_start + start, module._local_start + min(start + k, len(funcs)))
    return out


def check_deepspeed(directory: str) -> dict:
    import deepspeed
    import torch
    from deepspeed import checkpointing as ds_checkpointing
    from deepspeed.runtime.config import DeepSpeedConfig

    d = Path(directory)
    config = json.loads((d / "ds_config.json").read_text())
    launch = deepspeed_launcher_world((d / "launch_deepspeed.sh").read_text(), d)
    nodes, world = launch["nodes"], launch["world"]
    with fake_world(world):
        _reset_deepspeed_groups()
        deepspeed.init_distributed(dist_backend="fake", dist_init_required=False)
        mod = load_module(directory, "meshplan_deepspeed")
        pp, tp = mod.PIPELINE_PARALLEL_SIZE, mod.TENSOR_PARALLEL_SIZE
        values: dict = {"world_size": world, "nodes": nodes, "nproc_per_node": launch["nproc_per_node"],
                        "master_addr": launch["master_addr"]}  # fmt: skip
        if pp > 1:
            topo = mod.topology()
            values.update(topology_pipe=topo.get_dim("pipe"), topology_model=topo.get_dim("model"))
            interval = mod.ACTIVATION_CHECKPOINT_INTERVAL
            if world <= 128:  # the PipelineModule itself (its grid builds every group: minutes at 1024 ranks)
                module = mod.pipeline_module(_pipeline_layers(sum(mod.LAYERS_PER_STAGE)))
                mpu, interval = module.mpu(), module.activation_checkpoint_interval
                values["stage_layers"] = [b - a for a, b in zip(module.parts, module.parts[1:])]
                values["checkpointed_layers"] = _checkpointed_layers(module)
            else:  # the grid's data-parallel size is the topology's data axis (pipe/topology.py)
                mpu = _TopologyMPU(topo)
            values["checkpoint_interval"] = interval
        elif tp > 1:
            mpu = mod.tensor_parallel_mpu()  # deepspeed.utils.groups with the AutoTP mesh built
        else:
            mpu = None
        cfg = DeepSpeedConfig(config, mpu=mpu)  # _batch_assertion against the derived data-parallel world
        if pp == 1:  # the blocks checkpoint_blocks() puts under deepspeed.checkpointing.checkpoint
            blocks = [torch.nn.Linear(1, 1) for _ in range(sum(mod.LAYERS_PER_STAGE))]
            mod.checkpoint_blocks(blocks)
            wrapped = [
                i for i, b in enumerate(blocks) if getattr(b.forward, "func", None) is ds_checkpointing.checkpoint
            ]
            values["checkpointed_blocks"] = wrapped
        if "activation_checkpointing" in config and world <= 128:  # what initialize() calls with the engine's mpu
            ds_checkpointing.configure(mod.checkpointing_mpu(mpu), deepspeed_config=config)
        if pp > 1:  # deepspeed/runtime/pipe/engine.py PipelineEngine.__init__
            assert cfg.zero_optimization_stage < 2, "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
            assert cfg.train_batch_size == cfg.train_micro_batch_size_per_gpu * cfg.gradient_accumulation_steps * (
                mpu.get_data_parallel_world_size()
            )
        zero = cfg.zero_config
        values.update(
            train_batch_size=cfg.train_batch_size,
            micro_batch=cfg.train_micro_batch_size_per_gpu,
            accumulation=cfg.gradient_accumulation_steps,
            data_parallel=int(cfg.world_size),
            zero_stage=cfg.zero_optimization_stage,
            offload_optimizer=_device(zero.offload_optimizer),
            offload_param=_device(zero.offload_param),
            optimizer_nvme_path=str(getattr(zero.offload_optimizer, "nvme_path", None)),
            param_nvme_path=str(getattr(zero.offload_param, "nvme_path", None)),
            bf16=bool(cfg.bfloat16_config.enabled),
            fp16=bool(cfg.float16_config.enabled),
            autotp_size=cfg.tensor_parallel_config.autotp_size,
            pipeline_stages=pp,
            tensor_parallel=tp,
            activation_checkpointing="activation_checkpointing" in config,
            communication_bytes=_communication_dtype(cfg).itemsize,
            reduce_bucket_size=int(zero.reduce_bucket_size),
            multi_rank_bucket_allreduce=bool(zero.use_multi_rank_bucket_allreduce),
            overlap_comm=bool(zero.overlap_comm),
        )
    _reset_deepspeed_groups()
    return values


def _communication_dtype(cfg):
    """The dtype DeepSpeed's engine reduces gradients in under this config: its own
    communication_data_type property (deepspeed/runtime/engine.py: the config's key, else fp16 / bf16
    where enabled, else fp32), which every gradient reduction casts its buckets to."""
    from types import SimpleNamespace

    from deepspeed.runtime.engine import DeepSpeedEngine

    engine = SimpleNamespace(_config=cfg)
    engine.fp16_enabled = lambda: DeepSpeedEngine.fp16_enabled(engine)
    engine.bfloat16_enabled = lambda: DeepSpeedEngine.bfloat16_enabled(engine)
    return DeepSpeedEngine.communication_data_type.fget(engine)


def _device(offload) -> str:
    device = getattr(offload, "device", None) if offload is not None else None
    return str(getattr(device, "value", device) or "none")


class _TopologyMPU:
    def __init__(self, topo):
        self.topo = topo

    def get_data_parallel_world_size(self):
        return max(self.topo.get_dim("data"), 1)

    def get_model_parallel_world_size(self):
        return self.topo.get_dim("model")

    def get_sequence_parallel_world_size(self):
        return 1

    def get_sequence_data_parallel_world_size(self):
        return self.get_data_parallel_world_size()


# --- accelerate --------------------------------------------------------------------------------------


def _accelerate_launch_argv(text: str, path: Path) -> list[str]:
    argv = _launch_argv(text, "accelerate")[1:]  # after "accelerate launch"
    argv[argv.index("--config_file") + 1] = str(path)
    return argv


def check_accelerate(directory: str) -> dict:
    from accelerate.commands.config.config_args import load_config_from_file
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env, prepare_multi_gpu_env

    path = Path(directory) / "accelerate_config.yaml"
    text = path.read_text()
    cfg = load_config_from_file(str(path))  # ClusterConfig: unknown keys raise
    args = launch_command_parser().parse_args(_accelerate_launch_argv(text, path))
    args, _, mp_from_config = _validate_launch_command(args)  # the file's values become launch arguments
    if args.use_deepspeed:  # as accelerate's launch_command does: the YAML's DeepSpeed fields, its mixed_precision
        fields = list(cfg.deepspeed_config or {}) + (["mixed_precision"] if mp_from_config else [])
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        _, env = prepare_deepspeed_cmd_env(args)
    else:
        env = prepare_multi_gpu_env(args)
    endpoint = ""
    if cfg.num_machines > 1:  # the address every node's launcher meets at (accelerate/utils/launch.py)
        endpoint = (
            getattr(args, "rdzv_endpoint", "") or f"{getattr(args, 'master_addr', None)}:{args.main_process_port}"
        )
        assert "None" not in endpoint, f"rendezvous endpoint {endpoint}"
    from transformers import LlamaConfig  # the tp_plan accelerate's TP applies to a Llama (transformers' own)

    styles = set(LlamaConfig.base_model_tp_plan.values())
    values = {
        "tp_plan_sequence_parallel": any("sequence" in style for style in styles),
        "num_processes": cfg.num_processes,
        "num_machines": cfg.num_machines,
        "mixed_precision": str(cfg.mixed_precision),
        "distributed_type": str(cfg.distributed_type).split(".")[-1],
        "endpoint": endpoint,
        "nproc_per_node": int(getattr(args, "nproc_per_node", cfg.num_processes)),
    }
    env = {k: str(v) for k, v in env.items()}
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        values.update(_accelerator(cfg.num_processes, env))
        if env.get("ACCELERATE_USE_DEEPSPEED") == "true":
            with contextlib.chdir(directory):  # accelerate opens deepspeed_config_file from the working directory
                values.update(_deepspeed_plugin(cfg.num_processes, env))
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return values


def _deepspeed_plugin(world: int, env: dict) -> dict:
    """What accelerate's DeepSpeed plugin runs: DeepSpeedPlugin() from the launcher's environment (its
    deepspeed_config_file checks and stage, accumulation and offload read from the file), the mixed precision
    AcceleratorState takes from it, and DeepSpeed's own DeepSpeedConfig of the plugin's config as
    deepspeed.initialize builds it under accelerate (no mpu: the batch check counts every process)."""
    import deepspeed
    from accelerate.utils import DeepSpeedPlugin
    from deepspeed.runtime.config import DeepSpeedConfig

    plugin = DeepSpeedPlugin()
    plugin.set_mixed_precision(env.get("ACCELERATE_MIXED_PRECISION", "no"))
    config = plugin.deepspeed_config
    precision = "fp16" if config["fp16"].get("enabled") else "bf16" if config["bf16"].get("enabled") else "no"
    with fake_world(world):
        _reset_deepspeed_groups()
        deepspeed.init_distributed(dist_backend="fake", dist_init_required=False)
        ds = DeepSpeedConfig(dict(config), mpu=None)
    _reset_deepspeed_groups()
    zero, autotp = ds.zero_config, ds.tensor_parallel_config.autotp_size
    return {
        "mixed_precision": precision,  # AcceleratorState.mixed_precision under DeepSpeed: the file's
        "deepspeed_zero_stage": str(plugin.zero_stage),
        "gradient_accumulation_steps": str(plugin.gradient_accumulation_steps),
        "zero3_init": bool(plugin.zero3_init_flag),
        "ds_train_batch_size": ds.train_batch_size,
        "ds_micro_batch": ds.train_micro_batch_size_per_gpu,
        "ds_zero_stage": ds.zero_optimization_stage,
        "offload_optimizer": _device(zero.offload_optimizer),
        "offload_param": _device(zero.offload_param),
        "overlap_comm": bool(zero.overlap_comm),
        "reduce_bucket_size": int(zero.reduce_bucket_size),
        "multi_rank_bucket_allreduce": bool(zero.use_multi_rank_bucket_allreduce),
        "communication_bytes": _communication_dtype(ds).itemsize,
        # DeepSpeed owns the mesh: AutoTP groups of autotp_size, data parallel over the rest (groups' TP mesh)
        "tp": max(autotp, 1),
        "cp": 1,
        "data_parallel": world // max(autotp, 1),
    }


def _accelerator(world: int, env: dict) -> dict:
    """The ParallelismConfig Accelerator() builds on the launched rank (from the PARALLELISM_CONFIG_* variables
    `accelerate launch` sets) and its own _validate_accelerator, given the launched world and the plugin the
    file selects (Accelerator itself needs a GPU to become FSDP or DeepSpeed: on CPU it is MULTI_CPU)."""
    from types import SimpleNamespace

    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import DistributedType

    kind = (
        DistributedType.FSDP
        if env.get("ACCELERATE_USE_FSDP") == "true"
        else DistributedType.DEEPSPEED
        if env.get("ACCELERATE_USE_DEEPSPEED") == "true"
        else DistributedType.MULTI_GPU
    )
    values: dict = {"accelerator_distributed_type": str(kind).split(".")[-1]}
    if env.get("ACCELERATE_USE_PARALLELISM_CONFIG") == "true":
        pc = ParallelismConfig()  # __post_init__: sizes, and tp/cp only with a dp_shard axis
        stand_in = SimpleNamespace(
            multi_device=world > 1,
            num_processes=world,
            is_fsdp2=kind == DistributedType.FSDP and env.get("FSDP_VERSION") == "2",
            distributed_type=kind,
            is_main_process=True,
        )
        pc._validate_accelerator(stand_in)  # total_size == num_processes, FSDP needs a shard axis
        values.update(dp_replicate=pc.dp_replicate_size, dp_shard=pc.dp_shard_size, tp=pc.tp_size, cp=pc.cp_size)
    values["fsdp_reshard_after_forward"] = env.get("FSDP_RESHARD_AFTER_FORWARD")
    values["fsdp_version"] = env.get("FSDP_VERSION")
    values["deepspeed_zero_stage"] = env.get("ACCELERATE_DEEPSPEED_ZERO_STAGE")
    values["gradient_accumulation_steps"] = env.get("ACCELERATE_GRADIENT_ACCUMULATION_STEPS")
    values["mixed_precision_env"] = env.get("ACCELERATE_MIXED_PRECISION")
    return values


# --- Megatron-Core -----------------------------------------------------------------------------------

MEGATRON_FIELDS = {
    "--tensor-model-parallel-size": "tensor_model_parallel_size",
    "--pipeline-model-parallel-size": "pipeline_model_parallel_size",
    "--context-parallel-size": "context_parallel_size",
    "--sequence-parallel": "sequence_parallel",
    "--num-layers": "num_layers",
    "--hidden-size": "hidden_size",
    "--ffn-hidden-size": "ffn_hidden_size",
    "--num-attention-heads": "num_attention_heads",
    "--num-query-groups": "num_query_groups",
    "--normalization": "normalization",
    "--norm-epsilon": "layernorm_epsilon",
    "--recompute-granularity": "recompute_granularity",
    "--recompute-method": "recompute_method",
    "--recompute-num-layers": "recompute_num_layers",
    "--decoder-first-pipeline-num-layers": "num_layers_in_first_pipeline_stage",
    "--decoder-last-pipeline-num-layers": "num_layers_in_last_pipeline_stage",
    "--account-for-embedding-in-pipeline-split": "account_for_embedding_in_pipeline_split",
    "--account-for-loss-in-pipeline-split": "account_for_loss_in_pipeline_split",
    "--pipeline-model-parallel-layout": "pipeline_model_parallel_layout",
    "--bf16": "bf16",
    "--tp-comm-overlap": "tp_comm_overlap",
}
"""Flags that arguments.py copies into TransformerConfig (core_transformer_config_from_args: same-named fields)."""
MEGATRON_DDP = {"--overlap-grad-reduce": "overlap_grad_reduce", "--overlap-param-gather": "overlap_param_gather",
                "--use-distributed-optimizer": "use_distributed_optimizer",
                "--num-distributed-optimizer-instances": "num_distributed_optimizer_instances"}  # fmt: skip
MEGATRON_OPT = {"--use-distributed-optimizer": "use_distributed_optimizer", "--bf16": "bf16",
                "--optimizer-cpu-offload": "optimizer_cpu_offload"}  # fmt: skip
MEGATRON_TRAINING = {
    "--micro-batch-size", "--global-batch-size", "--seq-length", "--max-position-embeddings", "--use-torch-fsdp2",
    "--group-query-attention", "--num-layers-per-virtual-pipeline-stage", "--num-virtual-stages-per-pipeline-rank",
    "--vocab-size", "--make-vocab-size-divisible-by", "--position-embedding-type", "--rotary-base",
    "--untie-embeddings-and-output-weights", "--ckpt-format", "--no-gradient-accumulation-fusion", "--swiglu",
    "--disable-bias-linear", "--fp8-format", "--grad-reduce-in-bf16", "--use-precision-aware-optimizer",
    "--recompute-granularity", "--recompute-method", "--recompute-num-layers",
}  # fmt: skip
"""pretrain_gpt.py arguments that reach GPTModel, the training loop or Transformer Engine (checked by the rules)."""


def check_megatron(directory: str) -> dict:
    import dataclasses

    import torch
    from megatron.core.distributed.distributed_data_parallel_config import DistributedDataParallelConfig
    from megatron.core.optimizer.optimizer_config import OptimizerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    sys.path.insert(0, str(Path(__file__).parent))
    import megatron_rules

    text = (Path(directory) / "megatron_args.sh").read_text()
    launch = torchrun_world(text)
    derived = megatron_rules.validate(text, launch["world"])
    args = derived["args"]
    unknown = [f for f in args if f not in MEGATRON_FIELDS and f not in MEGATRON_DDP and f not in MEGATRON_OPT
               and f not in MEGATRON_TRAINING]  # fmt: skip
    assert not unknown, f"flags meshplan does not map to Megatron: {unknown}"
    kw = {}
    for flag, name in MEGATRON_FIELDS.items():
        if flag in args:
            value = args[flag]
            kw[name] = value if value is True else (int(value) if str(value).isdigit() else value)
    if "--norm-epsilon" in args:
        kw["layernorm_epsilon"] = float(args["--norm-epsilon"])
    v = derived["virtual_stages"]
    if v > 1:
        kw["virtual_pipeline_model_parallel_size"] = v
    kw["gated_linear_unit"] = "--swiglu" in args
    if "--swiglu" in args:
        kw["activation_func"] = torch.nn.functional.silu
    kw["add_bias_linear"] = "--disable-bias-linear" not in args
    if kw.get("bf16"):
        kw["pipeline_dtype"] = kw["params_dtype"] = torch.bfloat16  # arguments.py under --bf16
    tc = TransformerConfig(**kw)  # __post_init__: divisibility, layout, recompute, GQA
    ddp = DistributedDataParallelConfig(**{n: _typed(args[f]) for f, n in MEGATRON_DDP.items() if f in args and
                                           n in {x.name for x in dataclasses.fields(DistributedDataParallelConfig)}})  # fmt: skip
    OptimizerConfig(**{n: _typed(args[f]) for f, n in MEGATRON_OPT.items() if f in args})
    return {
        "world_size": launch["world"],
        "launch": launch,
        "tp": tc.tensor_model_parallel_size,
        "pp": tc.pipeline_model_parallel_size,
        "cp": tc.context_parallel_size,
        "virtual_stages": v,
        "sequence_parallel": tc.sequence_parallel,
        "micro_batch": int(args["--micro-batch-size"]),
        "global_batch": int(args["--global-batch-size"]),
        "accumulation": derived["accumulation"],
        "num_layers": tc.num_layers,
        "hidden": tc.hidden_size,
        "ffn_hidden": tc.ffn_hidden_size,
        "heads": tc.num_attention_heads,
        "kv_heads": tc.num_query_groups or tc.num_attention_heads,
        "normalization": tc.normalization,
        "gated_linear_unit": tc.gated_linear_unit,
        "add_bias_linear": tc.add_bias_linear,
        "position_embedding": args.get("--position-embedding-type", "learned_absolute"),
        "untied": "--untie-embeddings-and-output-weights" in args,
        "vocab": int(args["--vocab-size"]) if "--vocab-size" in args else None,
        "recompute_granularity": tc.recompute_granularity,
        "recompute_method": tc.recompute_method,
        "recompute_num_layers": tc.recompute_num_layers,
        "distributed_optimizer": bool(getattr(ddp, "use_distributed_optimizer", False)),
        "fsdp2": "--use-torch-fsdp2" in args,
        "bf16": bool(tc.bf16),
        "fp8": args.get("--fp8-format"),
        "cuda_device_max_connections": derived["env"].get("CUDA_DEVICE_MAX_CONNECTIONS"),
        "layout": str(tc.pipeline_model_parallel_layout) if tc.pipeline_model_parallel_layout else None,
        "num_params": _megatron_num_params(tc, args) if "--vocab-size" in args else None,
    }


def _megatron_num_params(tc, args: dict) -> int:
    """Parameters of the GPTModel pretrain_gpt.py builds from these flags: Megatron-Core's local layer spec on the
    meta device at tp = pp = 1, with one and two blocks (the embedding and head once, each further block alike),
    the vocabulary padded as Megatron pads it for the export's tp (training/tokenizer _vocab_size_with_padding)."""
    import dataclasses

    import torch
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    multiple = int(args.get("--make-vocab-size-divisible-by", 128)) * tc.tensor_model_parallel_size
    padded = -(-int(args["--vocab-size"]) // multiple) * multiple
    single = dict(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1,
                  sequence_parallel=False, tp_comm_overlap=False, virtual_pipeline_model_parallel_size=None,
                  pipeline_model_parallel_layout=None, num_layers_in_first_pipeline_stage=None,
                  num_layers_in_last_pipeline_stage=None, account_for_embedding_in_pipeline_split=False,
                  account_for_loss_in_pipeline_split=False, use_cpu_initialization=True,
                  perform_initialization=False)  # fmt: skip
    counts = []
    with fake_world(1):
        parallel_state.initialize_model_parallel(1, 1, create_gloo_process_groups=False)
        try:
            for blocks in (1, 2):
                with torch.device("meta"):
                    model = GPTModel(
                        config=dataclasses.replace(tc, num_layers=blocks, **single),
                        transformer_layer_spec=get_gpt_layer_local_spec(normalization=tc.normalization),
                        vocab_size=padded,
                        max_sequence_length=int(args["--max-position-embeddings"]),
                        share_embeddings_and_output_weights="--untie-embeddings-and-output-weights" not in args,
                        position_embedding_type=args.get("--position-embedding-type", "learned_absolute"),
                        rotary_base=int(args.get("--rotary-base", 10000)),
                    )
                counts.append(sum(p.numel() for p in model.parameters()))
        finally:
            parallel_state.destroy_model_parallel()
    return counts[0] + (tc.num_layers - 1) * (counts[1] - counts[0])


def _typed(value):
    return value if value is True else int(value) if str(value).isdigit() else value


# --- torchtitan --------------------------------------------------------------------------------------

STUB_MODEL = "meshplan_stub_model"
"""Stands in for the user's module in a custom-model export: torchtitan's llama3 debug model (the rest of the
config is what is checked; the plan's own architecture is not one torchtitan ships)."""


def _stub_model_module(directory: str) -> None:
    (Path(directory) / f"{STUB_MODEL}.py").write_text(
        "from torchtitan.models.llama3 import model_registry\n\n\n"
        "def model_spec(converters):\n    return model_registry('debugmodel', converters=converters)\n"
    )


def _titan_values(cfg, world: int, version: str) -> dict:
    par, tr = cfg.parallelism, cfg.training
    return {
        "version": version,
        "world_size": world,
        "dp_replicate": par.data_parallel_replicate_degree,
        "dp_shard": par.data_parallel_shard_degree,
        "tp": par.tensor_parallel_degree,
        "cp": par.context_parallel_degree,
        "pp": par.pipeline_parallel_degree,
        "sequence_parallel": getattr(par, "enable_sequence_parallel", True),
        "reshard": par.fsdp_reshard_after_forward,
        "schedule": par.pipeline_parallel_schedule,
        "pp_microbatch": par.pipeline_parallel_microbatch_size,
        "model_parts": par.module_fqns_per_model_part,
        "local_batch": tr.local_batch_size,
        "global_batch": tr.global_batch_size,
        "seq_len": tr.seq_len,
        "mixed_precision_param": tr.mixed_precision_param,
        "cpu_offload": tr.enable_cpu_offload,
    }


def check_torchtitan(directory: str) -> dict:
    """torchtitan 0.3: its ConfigManager loads the exported config_registry function (--module/--config), then
    ParallelDims and the mesh over the launched world, and the trainer's batch arithmetic."""
    import torchtitan.components.quantization.float8 as titan_float8
    from torchtitan.config.manager import ConfigManager
    from torchtitan.distributed import ParallelDims

    # the float8 converter refuses devices before SM89; the export is for H100s: check it as on one
    titan_float8.has_cuda_capability = lambda major, minor: (major, minor) <= (9, 0)
    d = Path(directory)
    launch = torchrun_world((d / "run_torchtitan.sh").read_text())
    world = launch["world"]
    custom = "MESHPLAN_MODEL_MODULE" in (d / "meshplan_torchtitan.py").read_text()
    if custom:
        _stub_model_module(directory)
        os.environ["MESHPLAN_MODEL_MODULE"] = STUB_MODEL
    sys.path.insert(0, directory)
    try:
        sys.modules.pop("meshplan_torchtitan", None)
        cfg = ConfigManager().parse_args(["--module", "meshplan_torchtitan", "--config", "meshplan"])
    finally:
        sys.path.remove(directory)
        os.environ.pop("MESHPLAN_MODEL_MODULE", None)
    values = {**_titan_values(cfg, world, "0.3"), "launch": launch}
    with fake_world(world):
        dims = ParallelDims.from_config(cfg.parallelism, world)  # degrees multiply to the world
        dims.build_mesh()
        batch_degree = dims.get_mesh("batch").size() if dims.dp_enabled else 1
        # parallelize_llama's last branch: replicas without FSDP run apply_ddp, which raises "DDP has not
        # supported > 1D parallelism" unless the replicate mesh is the whole world
        values["ddp_refused"] = dims.dp_replicate_enabled and not dims.fsdp_enabled and dims.dp_replicate != world
    local, global_batch = cfg.training.local_batch_size, cfg.training.global_batch_size
    assert global_batch % (local * batch_degree) == 0, "global batch size must be multiple of local batch size times data-parallel degree"  # fmt: skip
    spec = cfg.model_spec
    model = spec.model
    built = _built_model(cfg)
    values.update(
        batch_degree=batch_degree,
        accumulation=global_batch // (local * batch_degree),
        model_name=spec.name,
        flavor=spec.flavor,
        custom_model=custom,
        dim=model.dim,
        n_layers=len(model.layers),
        vocab=model.vocab_size,
        tied=bool(getattr(model, "enable_weight_tying", False)),
        float8=built["float8_linears"] > 0,
        **built,
        ac=type(cfg.activation_checkpoint).__qualname__ if cfg.activation_checkpoint is not None else None,
        compile=cfg.compile.enable,
    )
    return values


def _built_model(cfg) -> dict:
    """The model the trainer builds from this config (Trainer.__init__: update_from_config, build on the meta device,
    the module protocol check): its parameters, its float8 linears, and the stage module names it lacks."""
    import torch

    model_config = cfg.model_spec.model
    model_config.update_from_config(config=cfg)
    with torch.device("meta"):
        model = model_config.build()
    model.verify_module_protocol()
    names = {name for name, _ in model.named_modules()}
    parts = cfg.parallelism.module_fqns_per_model_part or []
    return {
        "num_params": sum(p.numel() for p in model.parameters()),
        "float8_linears": sum(type(m).__name__.startswith("Float8") for m in model.modules()),
        "missing_fqns": [fqn for part in parts for fqn in part if fqn not in names],
    }


def check_torchtitan_02(directory: str) -> dict:
    """torchtitan 0.2: its ConfigManager reads the TOML (--job.config_file); unknown keys raise."""
    from torchtitan.config.manager import ConfigManager

    d = Path(directory)
    launch = torchrun_world((d / "run_torchtitan.sh").read_text())
    cfg = ConfigManager().parse_args(["--job.config_file", str(d / "meshplan.toml")])
    values = {**_titan_values(cfg, launch["world"], "0.2"), "launch": launch}
    par = cfg.parallelism
    dp_shard = par.data_parallel_shard_degree
    others = par.data_parallel_replicate_degree * par.context_parallel_degree * par.tensor_parallel_degree * par.pipeline_parallel_degree  # fmt: skip
    if dp_shard == -1:
        dp_shard = values["world_size"] // others
    assert others * dp_shard == values["world_size"], "Invalid parallel dims"
    batch_degree = par.data_parallel_replicate_degree * dp_shard
    # 0.2's ParallelDims: fsdp_enabled = dp_shard > 1 or cp > 1; replicas without it run apply_ddp on the 1-D
    # world mesh only
    fsdp = dp_shard > 1 or par.context_parallel_degree > 1
    model_parallel = par.tensor_parallel_degree * par.pipeline_parallel_degree * par.context_parallel_degree
    values["ddp_refused"] = par.data_parallel_replicate_degree > 1 and not fsdp and model_parallel > 1
    values.update(
        batch_degree=batch_degree,
        accumulation=cfg.training.global_batch_size // (cfg.training.local_batch_size * batch_degree),
        model_name=cfg.model.name,
        flavor=cfg.model.flavor,
        converters=list(cfg.model.converters),
        float8_recipe=cfg.quantize.linear.float8.recipe_name,
        ac=cfg.activation_checkpoint.mode,
        compile=cfg.compile.enable,
    )
    return values


CHECKS = {"deepspeed": check_deepspeed, "accelerate": check_accelerate, "megatron": check_megatron,
          "torchtitan": check_torchtitan, "torchtitan-0.2": check_torchtitan_02}  # fmt: skip


def main() -> int:
    cases = json.load(sys.stdin)
    if any(case["target"] == "torchtitan-0.2" for case in cases):  # 0.2 installed beside 0.3 (make export-tools)
        assert all(case["target"] == "torchtitan-0.2" for case in cases), "torchtitan 0.2 cases run on their own"
        sys.path.insert(0, str(Path(sys.executable).parents[1] / "torchtitan-0.2"))
    out = []
    for case in cases:
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
                try:
                    values = CHECKS[case["target"]](case["dir"])
                except SystemExit as exc:
                    raise RuntimeError(f"the tool's parser exited: {err.getvalue()[-1500:]}") from exc
            out.append({"id": case["id"], "accepted": True, "error": "", "values": values})
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - the tool's refusal is the result (tyro exits)
            tail = traceback.format_exception(exc)[-1].strip()
            out.append({"id": case["id"], "accepted": False, "error": f"{type(exc).__name__}: {exc}"[:2000] or tail})
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())

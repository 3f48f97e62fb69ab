"""Every export read by the target's own parser (issue #18 item 4), from the `exports` extra:
`pip install -c constraints.txt -e '.[exports]'` (README, "Exports"). Each test fails when a
flag, key or value is unknown to the target; without the extra each skips with the reason.

- DeepSpeed: deepspeed.runtime.config.DeepSpeedConfig (pydantic models forbid unknown keys in
  zero_optimization etc.; top-level keys are checked against the names its config readers use).
- accelerate: accelerate's load_config_from_file (ClusterConfig refuses unknown keys), and the
  nested fsdp/deepspeed/parallelism maps against `accelerate launch`'s own argument parser, which
  is where `accelerate launch` copies them.
- torchtitan: the TOML JobConfig of torchtitan 0.2 (`--job.config_file`), through its own
  ConfigManager; torchtitan 0.3 replaced TOML files with Python config registries.
- Megatron: pretrain_gpt.py's parser (megatron/training/arguments.py) is not on the package index
  (the megatron-core wheel ships megatron.core only), so each flag is mapped to the Megatron-Core
  config dataclass field arguments.py fills from it (core_transformer_config_from_args matches
  field names) and the dataclasses are constructed; flags of the training loop alone are listed.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.machinery
import importlib.util
import json
import sys
import types
import typing
import warnings
from pathlib import Path

import pytest
from report_fixtures import gpt_plan
from test_exports import PLANS, megatron_args

from meshplan import runtimes
from meshplan.report import export_plan

ALL = sorted(PLANS)


def _megatron_core_plan():
    """A plan predicted for megatron-core: its export adds the overlap, TP-overlap and fp8 flags."""
    plan = gpt_plan(pp=1, dp_replicate=8, tp=2, zero=1, num_microbatches=4)
    return dataclasses.replace(
        plan,
        runtime="megatron-core",
        precision="fp8",
        sequence_parallel=True,
        runtime_behaviours=runtimes.request_behaviours("megatron-core", {}),
    )


def _megatron_core_recompute_plan():
    """A megatron-core plan with full recompute in chunks of 2 blocks (--recompute-num-layers 2)."""
    plan = gpt_plan(pp=1, dp_replicate=8, tp=2, zero=1, num_microbatches=4, recompute="full")
    return dataclasses.replace(
        plan,
        runtime="megatron-core",
        recompute_num_layers=2,
        runtime_behaviours=runtimes.request_behaviours("megatron-core", {}),
    )


MEGATRON_CORE_PLANS = {"megatron_core": _megatron_core_plan, "megatron_core_recompute_2": _megatron_core_recompute_plan}


def _need(module: str, why: str = ""):
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return importlib.import_module(module)
    except Exception as exc:  # noqa: BLE001 - ImportError, or a CUDA-only import failing on CPU
        pytest.skip(
            f"{module} not importable ({type(exc).__name__}: {exc}){why}; "
            "install the extra: pip install -c constraints.txt -e '.[exports]'"
        )


# --- DeepSpeed ---------------------------------------------------------------------------------

DS_TOP_KEYS = {
    "train_batch_size",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "zero_optimization",
    "bf16",
    "fp16",
    "tensor_parallel",
    "activation_checkpointing",
    "communication_data_type",
}


class _MPU:
    """What DeepSpeedConfig asks an mpu: the data-parallel world it checks train_batch_size against."""

    def __init__(self, plan):
        self.plan = plan

    def get_data_parallel_world_size(self):
        return self.plan.world_size // (self.plan.tensor_parallel_degree * self.plan.pipeline_parallel_degree)

    def get_model_parallel_world_size(self):
        return self.plan.tensor_parallel_degree

    def get_sequence_parallel_world_size(self):
        return 1

    def get_sequence_data_parallel_world_size(self):
        return self.get_data_parallel_world_size()


@pytest.mark.parametrize("name", ALL)
def test_deepspeed_config_class_accepts_the_export(name, monkeypatch):
    config_mod = _need("deepspeed.runtime.config")
    monkeypatch.setattr(config_mod.dist, "get_rank", lambda: 0)  # no process group: the mpu gives the world
    constants = _need("deepspeed.runtime.constants")
    plan = PLANS[name]()
    data = json.loads(export_plan(plan, "deepspeed")["ds_config.json"])
    # DeepSpeedConfig reads top-level keys by name and ignores the rest: each must be one it reads
    known = {v for k, v in vars(constants).items() if k.isupper() and isinstance(v, str)}
    known |= {"zero_optimization", "activation_checkpointing", "tensor_parallel", "communication_data_type"}
    assert set(data) <= known, f"keys DeepSpeed does not read: {sorted(set(data) - known)}"
    cfg = config_mod.DeepSpeedConfig(data, mpu=_MPU(plan))  # raises on unknown nested keys and values
    assert cfg.train_batch_size == plan.global_batch_size
    assert cfg.zero_optimization_stage == plan.zero_stage


def test_deepspeed_rejects_an_unknown_nested_key(monkeypatch):
    config_mod = _need("deepspeed.runtime.config")
    monkeypatch.setattr(config_mod.dist, "get_rank", lambda: 0)
    plan = PLANS["flat"]()
    data = json.loads(export_plan(plan, "deepspeed")["ds_config.json"])
    data["zero_optimization"]["overlap_comms"] = True
    with pytest.raises(Exception, match="overlap_comms"):
        config_mod.DeepSpeedConfig(data, mpu=_MPU(plan))


# --- accelerate --------------------------------------------------------------------------------


def _launch_dests() -> dict[str, object]:
    launch = _need("accelerate.commands.launch")
    parser = launch.launch_command_parser()
    return {a.dest: a for a in parser._actions}


@pytest.mark.parametrize("name", ALL)
def test_accelerate_config_loader_accepts_the_export(name, tmp_path):
    config_args = _need("accelerate.commands.config.config_args")
    plan = PLANS[name]()
    path = tmp_path / "accelerate_config.yaml"
    path.write_text(export_plan(plan, "accelerate")["accelerate_config.yaml"])
    cfg = config_args.load_config_from_file(str(path))  # unknown top-level keys: ValueError
    assert cfg.num_processes == plan.world_size
    dests = _launch_dests()
    nested = {
        **(cfg.fsdp_config or {}),
        **(cfg.parallelism_config or {}),
        **{
            ("deepspeed_config_file" if k == "deepspeed_config_file" else k): v
            for k, v in (cfg.deepspeed_config or {}).items()
        },
    }
    for key, value in nested.items():
        assert key in dests, f"`accelerate launch` has no --{key}"
        choices = dests[key].choices  # the YAML's values reach argparse-typed args: compare as text
        assert choices is None or str(value) in map(str, choices), f"--{key} {value!r} not in {choices}"


def test_accelerate_rejects_an_unknown_key(tmp_path):
    config_args = _need("accelerate.commands.config.config_args")
    path = tmp_path / "bad.yaml"
    path.write_text(export_plan(PLANS["flat"](), "accelerate")["accelerate_config.yaml"] + "num_gpu: 8\n")
    with pytest.raises(ValueError, match="num_gpu"):
        config_args.load_config_from_file(str(path))


# --- torchtitan --------------------------------------------------------------------------------


def _titan_manager():
    """torchtitan 0.2's ConfigManager without the package __init__, which imports model code
    (MoE kernels need triton, absent on CPU); the config modules themselves import no model."""
    spec = importlib.util.find_spec("torchtitan")
    if spec is None:
        _need("torchtitan")
    root = list(spec.submodule_search_locations)
    if not any((Path(p) / "config" / "job_config.py").exists() for p in root):
        pytest.skip(
            "torchtitan >= 0.3 has no TOML JobConfig (Python config registries); the export "
            "writes torchtitan 0.2's --job.config_file TOML: pip install 'torchtitan>=0.2,<0.3'"
        )
    if "torchtitan" not in sys.modules:
        pkg = types.ModuleType("torchtitan")
        pkg.__path__ = root
        pkg.__spec__ = importlib.machinery.ModuleSpec("torchtitan", None, is_package=True)
        pkg.__spec__.submodule_search_locations = root
        sys.modules["torchtitan"] = pkg
    manager = _need("torchtitan.config.manager")
    return manager.ConfigManager(), _need("torchtitan.config.job_config")


def _value_ok(value, hint) -> bool:
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_value_ok(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint in (int, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin is list:
        return isinstance(value, list) and all(_value_ok(v, typing.get_args(hint)[0]) for v in value)
    return True


@pytest.mark.parametrize("name", ALL)
def test_torchtitan_job_config_accepts_the_export(name, tmp_path):
    manager, job_config = _titan_manager()
    plan = PLANS[name]()
    path = tmp_path / "meshplan.toml"
    path.write_text(export_plan(plan, "torchtitan")["meshplan.toml"])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = manager.parse_args(["--job.config_file", str(path)])  # unknown sections/keys: ValueError
    import tomllib

    for section, values in tomllib.loads(path.read_text()).items():
        obj = getattr(cfg, section)
        hints = typing.get_type_hints(type(obj))
        for key, value in values.items():
            assert getattr(obj, key) == value
            # tyro only warns when a TOML default breaks the field's type: check it here
            assert _value_ok(value, hints[key]), f"[{section}] {key} = {value!r} is not a {hints[key]}"
    ac = cfg.activation_checkpoint
    if ac.mode == "selective":  # torchtitan's apply_ac: "op" or a positive integer k
        assert ac.selective_ac_option == "op" or ac.selective_ac_option.isdigit()
    assert cfg.parallelism.data_parallel_shard_degree == plan.data_parallel_shard_degree


def test_torchtitan_rejects_an_unknown_key(tmp_path):
    manager, _ = _titan_manager()
    path = tmp_path / "bad.toml"
    path.write_text(export_plan(PLANS["flat"](), "torchtitan")["meshplan.toml"].replace("seq_len", "seq_length"))
    with pytest.raises(ValueError, match="seq_length"):
        manager.parse_args(["--job.config_file", str(path)])


# --- Megatron ----------------------------------------------------------------------------------

MEGATRON_RENAMED = {
    "--num-layers-per-virtual-pipeline-stage": None,  # arguments.py derives virtual_pipeline_model_parallel_size
    "--num-virtual-stages-per-pipeline-rank": "virtual_pipeline_model_parallel_size",
    "--decoder-first-pipeline-num-layers": "num_layers_in_first_pipeline_stage",
    "--decoder-last-pipeline-num-layers": "num_layers_in_last_pipeline_stage",
    "--fp8-format": "fp8",
    "--hidden-size": "hidden_size",
    "--num-attention-heads": "num_attention_heads",
    "--ffn-hidden-size": "ffn_hidden_size",
    "--num-query-groups": "num_query_groups",
    "--grad-reduce-in-bf16": "grad_reduce_in_fp32",  # store_false into grad_reduce_in_fp32
    "--no-gradient-accumulation-fusion": "gradient_accumulation_fusion",
}
"""megatron/training/arguments.py flags whose dest is not the flag's own name in snake case."""
MEGATRON_TRAINING_ONLY = {
    "--micro-batch-size",
    "--global-batch-size",
    "--seq-length",
    "--max-position-embeddings",
    "--use-torch-fsdp2",
    "--group-query-attention",
    "--num-layers-per-virtual-pipeline-stage",
}
"""Flags of pretrain_gpt.py's training loop with no Megatron-Core config field: not checkable here."""


def _megatron_configs():
    _need("megatron.core")
    tc = _need("megatron.core.transformer.transformer_config")
    ddp = _need("megatron.core.distributed.distributed_data_parallel_config")
    opt = _need("megatron.core.optimizer.optimizer_config")
    return tc.TransformerConfig, ddp.DistributedDataParallelConfig, opt.OptimizerConfig


def _dest(flag: str) -> str | None:
    return MEGATRON_RENAMED.get(flag, flag[2:].replace("-", "_"))


@pytest.mark.parametrize("name", ALL + list(MEGATRON_CORE_PLANS))
def test_megatron_core_configs_accept_the_export(name):
    transformer, ddp, optimizer = _megatron_configs()
    plan = MEGATRON_CORE_PLANS[name]() if name in MEGATRON_CORE_PLANS else PLANS[name]()
    args = megatron_args(export_plan(plan, "megatron")["megatron_args.sh"])
    if name == "megatron_core":
        assert {"--overlap-grad-reduce", "--overlap-param-gather", "--tp-comm-overlap", "--fp8-format"} <= set(args)
    fields = {cls: {f.name for f in dataclasses.fields(cls)} for cls in (transformer, ddp, optimizer)}
    kw: dict = {cls: {} for cls in fields}
    for flag, value in args.items():
        dest = _dest(flag)
        owners = [cls for cls, names in fields.items() if dest in names]
        if flag in MEGATRON_TRAINING_ONLY:
            continue
        assert owners, f"{flag} is no Megatron-Core config field ({dest})"
        value = {"--grad-reduce-in-bf16": False, "--no-gradient-accumulation-fusion": False}.get(flag, value)
        for cls in owners:
            kw[cls][dest] = _typed(cls, dest, value)
    kw[transformer].setdefault("num_attention_heads", 8)
    kw[transformer].setdefault("hidden_size", 64 * kw[transformer]["num_attention_heads"])
    kw[transformer].pop("gradient_accumulation_fusion", None)  # needs the APEX/TE fused kernel check on GPU
    if kw[transformer].get("bf16") or kw[optimizer].get("bf16"):
        import torch  # arguments.py: pipeline_dtype = params_dtype = bf16 under --bf16

        kw[transformer]["pipeline_dtype"] = torch.bfloat16
    kw[optimizer].pop("use_precision_aware_optimizer", None)  # its check reads the Transformer Engine version
    if kw[transformer].get("fp8"):
        kw[transformer].pop("fp8")  # Transformer Engine only: not constructible on CPU
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tc = transformer(**kw[transformer])  # __post_init__ checks values and combinations
        ddp(**kw[ddp])
        optimizer(**kw[optimizer])
    assert tc.tensor_model_parallel_size == plan.tensor_parallel_degree
    assert tc.recompute_granularity in (None, "full", "selective")
    if name == "megatron_core_recompute_2":
        assert (tc.recompute_method, tc.recompute_num_layers) == ("uniform", 2)


def _typed(cls, dest: str, value):
    hint = typing.get_type_hints(cls).get(dest)
    if value is True or hint is None:
        return value
    text = str(value)
    base = [h for h in (typing.get_args(hint) or (hint,)) if h is not type(None)]
    if int in base and text.lstrip("-").isdigit():
        return int(text)
    return text


def test_megatron_rejects_an_unknown_flag():
    transformer, ddp, optimizer = _megatron_configs()
    names = {f.name for cls in (transformer, ddp, optimizer) for f in dataclasses.fields(cls)}
    assert _dest("--recompute-granularity") in names
    assert _dest("--recompute-granularities") not in names
    with pytest.raises(Exception):  # noqa: B017 -- Megatron raises ValueError or AssertionError by version
        transformer(
            num_layers=4,
            hidden_size=64,
            num_attention_heads=8,
            recompute_granularity="full",
            recompute_method="everything",
            recompute_num_layers=1,
        )

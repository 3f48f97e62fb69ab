"""An accelerate launch config (YAML) read back: processes, ParallelismConfig sizes, FSDP2/DeepSpeed plugin,
mixed precision; the batch from meshplan's accelerate_batch.py beside it where present. A DeepSpeed plugin
that names a deepspeed_config_file takes its stage, offload, engine settings, AutoTP and precision from
that file (as accelerate does), read beside the YAML when the path is relative."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from meshplan.errors import MeshplanError
from meshplan.imports import deepspeed as ds_import
from meshplan.imports.common import Imported, meshplan_header


def recognises(path: Path, text: str) -> bool:
    return path.suffix.lower() in (".yaml", ".yml") and "distributed_type" in text


STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD", "HYBRID_SHARD_ZERO2")
"""FSDP1's sharding strategies as accelerate names and numbers them (accelerate/utils/constants.py, from 1)."""


def _fsdp_strategy(fsdp: dict) -> tuple[int, bool]:
    """(ZeRO stage, sharded within each machine only) of an fsdp_config: FSDP2's fsdp_reshard_after_forward
    true/false, or FSDP1's strategy in that key or the older fsdp_sharding_strategy (a name or its number)."""
    value = fsdp.get("fsdp_reshard_after_forward", fsdp.get("fsdp_sharding_strategy", True))
    text = str(value).upper()
    if text.isdigit() and 1 <= int(text) <= len(STRATEGIES):
        text = STRATEGIES[int(text) - 1]
    if text in ("TRUE", "FALSE"):
        return (3 if text == "TRUE" else 2), False
    zero = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2, "NO_SHARD": 0, "HYBRID_SHARD": 3, "HYBRID_SHARD_ZERO2": 2}
    return zero.get(text, 3), text.startswith("HYBRID")


def _deepspeed_file(path: Path, ds: dict) -> dict | None:
    """The DeepSpeed config a plugin's deepspeed_config_file names (None where it names none)."""
    name = ds.get("deepspeed_config_file")
    if not name or str(name) == "none":
        return None
    file = Path(str(name))
    file = file if file.is_absolute() else path.parent / file
    try:
        data = json.loads(file.read_text())
    except OSError as exc:
        raise MeshplanError(
            f"--import {path}: deepspeed_config_file {name} is not readable ({exc.strerror}): put it beside the YAML"
        ) from exc
    except ValueError as exc:
        raise MeshplanError(f"--import {path}: deepspeed_config_file {name} is not valid JSON ({exc})") from exc
    if not isinstance(data, dict) or not isinstance(data.get("zero_optimization"), dict):
        raise MeshplanError(
            f"--import {path}: deepspeed_config_file {name} has no zero_optimization section (accelerate requires one)"
        )
    return data


def _from_deepspeed_file(data: dict, world: int, values: dict[str, Any], notes: list[str]) -> tuple[int, int, int]:
    """(zero, dp, tp) of a plugin's DeepSpeed file, its offload, engine settings and precision into `values`:
    DeepSpeed owns the mesh (AutoTP groups of tensor_parallel.autotp_size, data parallel over the rest)."""
    zero_cfg = data["zero_optimization"]
    zero = int(zero_cfg.get("stage", 0))
    tp = ds_import.autotp_size(data)
    ds_import.read_offload(zero_cfg, zero, values)
    ds_import.read_reduction(zero_cfg, zero, values)
    ds_import.read_precision(data, values, notes)
    return zero, max(world // tp, 1), tp


def read(path: Path, text: str, world: int | None = None) -> Imported:
    try:
        cfg = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise MeshplanError(f"--import {path}: not valid YAML ({exc})") from exc
    values: dict[str, Any] = {}
    notes: list[str] = []
    meshplan_header(text, values)
    if world:
        values.setdefault("num_gpus", world)
    world = int(cfg.get("num_processes", 1))
    par = cfg.get("parallelism_config") or {}
    dpr = int(par.get("parallelism_config_dp_replicate_size", 1))
    dps = int(par.get("parallelism_config_dp_shard_size", 1))
    tp = int(par.get("parallelism_config_tp_size", 1))
    cp = int(par.get("parallelism_config_cp_size", 1))
    if not par:
        dpr = world  # no ParallelismConfig: accelerate replicates (or FSDP shards) over every process
    kind = str(cfg.get("distributed_type", "NO"))
    fsdp = cfg.get("fsdp_config") or {}
    ds = cfg.get("deepspeed_config") or {}
    ds_file = _deepspeed_file(path, ds) if kind == "DEEPSPEED" else None
    if kind == "FSDP":
        zero, hybrid = _fsdp_strategy(fsdp)
        if not par:
            machines = int(cfg.get("num_machines", 1))
            dpr, dps = (machines, world // machines) if hybrid else (world, 1) if zero == 0 else (1, world)
    elif ds_file is not None:
        zero, dp, tp = _from_deepspeed_file(ds_file, world, values, notes)
        dpr, dps, cp = (1, dp, 1) if zero >= 2 else (dp, 1, 1)  # ZeRO-2/3 shard over the whole data-parallel group
    elif kind == "DEEPSPEED":
        zero = int(ds.get("zero_stage", 0))
    else:
        zero = 0
    values.update(tp=tp, cp=cp, pp=1, dp=dpr * dps, zero=zero, schedule="1f1b", num_gpus=world)
    values.setdefault("num_gpus", world)
    if dps > 1:
        values["dp_shard"] = dps
    if ds_file is None:
        if fsdp.get("fsdp_offload_params") or ds.get("offload_optimizer_device") == "cpu":
            values["offload"] = "cpu"
        elif ds.get("offload_optimizer_device") == "nvme":  # the DeepSpeed plugin's ZeRO-Infinity
            nvme_params = ds.get("offload_param_device") == "nvme" and zero == 3
            values["offload"] = "nvme:params=true" if nvme_params else "nvme"
        precision = str(cfg.get("mixed_precision", "no")).lower()
        values["precision"] = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8"}.get(precision, "fp32")
    values["recompute"] = "full" if fsdp.get("fsdp_activation_checkpointing") else "none"
    values["sequence_parallel"] = False  # transformers' tp_plans keep norm activations replicated
    batch = path.parent / "accelerate_batch.py"
    consts = dict(re.findall(r"^(\w+) = (\d+)", batch.read_text(), re.M)) if batch.is_file() else {}
    if "PER_DEVICE_TRAIN_BATCH_SIZE" in consts:
        micro, accumulation = int(consts["PER_DEVICE_TRAIN_BATCH_SIZE"]), int(consts["GRADIENT_ACCUMULATION_STEPS"])
        values.update(microbatch=micro, global_batch=micro * accumulation * dpr * dps)
    else:
        accumulation = int((ds_file or ds).get("gradient_accumulation_steps", 1))
        notes.append(
            "an accelerate config holds no batch size: give --microbatch and --global-batch (the training script's)"
        )
    values.setdefault("runtime", "deepspeed" if kind == "DEEPSPEED" else "meshplan")
    return Imported(format="accelerate", values=values, notes=notes)

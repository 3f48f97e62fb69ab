"""An llm-foundry training YAML (scripts/train/yamls/pretrain/*.yaml) read back: the MPT shape under
`model:`, the batch (global_train_batch_size, device_train_microbatch_size), precision, and Composer's
fsdp_config (sharding strategy, activation checkpointing, CPU offload, mixed precision, backward
prefetch); `--runtime llm-foundry`. The
file says nothing of the GPUs: their number is `--num-gpus`. `${key}` references to other keys of the
file (OmegaConf interpolation, `${max_seq_len}`, `${variables.x}`) are resolved."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from meshplan.errors import MeshplanError
from meshplan.imports.common import Imported, degrees

SHARDING = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2, "HYBRID_SHARD": 3, "_HYBRID_SHARD_ZERO2": 2, "NO_SHARD": 0}
"""Composer's fsdp_config.sharding_strategy -> ZeRO stage (HYBRID: sharded within a node, replicated across)."""
PRECISION = {"amp_bf16": "bf16", "amp_fp16": "bf16", "amp_fp8": "fp8", "fp32": "fp32"}
"""Composer's precision -> --precision (fp16 autocast runs the same 16-bit tensor cores as bf16)."""
REFERENCE = re.compile(r"^\$\{([\w.]+)\}$")
MIXED_PRECISION = {"PURE": ("bf16", "bf16"), "DEFAULT": ("bf16", "fp32"), "FULL": ("fp32", "fp32")}
"""Composer's fsdp_config.mixed_precision -> (--fsdp-gather-dtype, --fsdp-reduce-dtype) of a 16-bit run
(composer/distributed/mosaic_parallelism.py get_mixed_precision: PURE reduces in the run's dtype,
DEFAULT in fp32, FULL keeps fp32 parameters)."""
BACKWARD_PREFETCH = {"BACKWARD_POST": "backward_post", "BACKWARD_PRE": "backward_pre"}
"""Composer's fsdp_config.backward_prefetch -> --fsdp-unit-buffers (its default: BACKWARD_POST)."""


def recognises(path: Path, text: str) -> bool:
    return path.suffix.lower() in (".yaml", ".yml") and "global_train_batch_size" in text and "d_model" in text


def _resolve(value: Any, root: dict, path: Path, seen: tuple[str, ...] = ()) -> Any:
    """A `${a.b}` reference to another key of the file, followed; any other value as it is."""
    hit = REFERENCE.match(value) if isinstance(value, str) else None
    if not hit:
        return value
    key = hit.group(1)
    if key in seen:
        raise MeshplanError(f"--import {path}: ${{{key}}} refers to itself")
    node: Any = root
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise MeshplanError(f"--import {path}: ${{{key}}} names no key of the file")
        node = node[part]
    return _resolve(node, root, path, (*seen, key))


def read(path: Path, text: str, world: int | None = None) -> Imported:
    try:
        cfg = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise MeshplanError(f"--import {path}: not valid YAML ({exc})") from exc
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model"), dict):
        raise MeshplanError(f"--import {path}: an llm-foundry YAML has a model: section")

    def get(section: dict, key: str, default: Any = None) -> Any:
        return _resolve(section.get(key, default), cfg, path)

    model, notes = cfg["model"], []
    try:
        hidden, heads, layers = (int(get(model, k)) for k in ("d_model", "n_heads", "n_layers"))
    except (TypeError, ValueError) as exc:
        raise MeshplanError(f"--import {path}: model needs d_model, n_heads and n_layers as integers") from exc
    ffn = model.get("ffn_config") or {}
    ratio = float(get(model, "expansion_ratio", get(ffn, "expansion_ratio", 4)))
    seq = int(get(model, "max_seq_len", get(cfg, "max_seq_len", 2048)))
    vocab = int(get(model, "vocab_size", 50368))
    overrides = [f"layers={layers}", f"hidden={hidden}", f"heads={heads}", f"vocab={vocab}", f"seq={seq}"]
    if ratio != 4:
        overrides.append(f"ffn_hidden={int(ratio * hidden)}")
    values: dict[str, Any] = {"model": "analytic:gpt", "overrides": overrides, "runtime": "llm-foundry"}
    values["global_batch"] = int(get(cfg, "global_train_batch_size"))
    micro = get(cfg, "device_train_microbatch_size")
    if isinstance(micro, int):
        values["microbatch"] = micro
    else:
        notes.append(f"device_train_microbatch_size is {micro!r}: give --microbatch (or let `plan` search it)")
    precision = str(get(cfg, "precision", "amp_bf16"))
    values["precision"] = PRECISION.get(precision, "bf16")
    fsdp, hybrid = cfg.get("fsdp_config"), False
    if isinstance(fsdp, dict):
        strategy = str(get(fsdp, "sharding_strategy", "FULL_SHARD")).upper()
        if strategy not in SHARDING:
            raise MeshplanError(
                f"--import {path}: fsdp_config.sharding_strategy {strategy!r} is not one of {', '.join(SHARDING)}"
            )
        values["zero"] = SHARDING[strategy]
        values["recompute"] = "full" if get(fsdp, "activation_checkpointing", False) else "none"
        if get(fsdp, "cpu_offload", False):
            values["offload"] = "cpu"
        mixed = get(fsdp, "mixed_precision", "DEFAULT")
        if isinstance(mixed, dict):  # a custom MixedPrecision: its param_dtype and reduce_dtype
            dtypes = tuple(
                "fp32" if str(get(mixed, key, "float32")) in ("float32", "fp32") else "bf16"
                for key in ("param_dtype", "reduce_dtype")
            )
        elif str(mixed).upper() in MIXED_PRECISION:
            dtypes = MIXED_PRECISION[str(mixed).upper()]
        else:
            raise MeshplanError(
                f"--import {path}: fsdp_config.mixed_precision {mixed!r} is not one of {', '.join(MIXED_PRECISION)}"
            )
        if values["precision"] != "fp32":
            values["fsdp_gather_dtype"], values["fsdp_reduce_dtype"] = dtypes
        prefetch = str(get(fsdp, "backward_prefetch", "BACKWARD_POST")).upper()
        if prefetch not in BACKWARD_PREFETCH:
            raise MeshplanError(
                f"--import {path}: fsdp_config.backward_prefetch {prefetch!r} is not one of "
                f"{', '.join(BACKWARD_PREFETCH)}"
            )
        values["fsdp_unit_buffers"] = BACKWARD_PREFETCH[prefetch]
        hybrid = "HYBRID" in strategy
        if hybrid:
            notes.append("HYBRID_SHARD shards within a node: give --dp-shard (the GPUs per node)")
    else:  # no fsdp_config: Composer wraps the model in DDP
        values.update(zero=0, recompute="none")
    values.update(tp=1, pp=1, cp=1, schedule="1f1b")
    if world is None:
        raise MeshplanError(f"--import {path}: an llm-foundry YAML does not say how many GPUs; give --num-gpus")
    degrees(values, world, str(path))
    if values["zero"] >= 2 and not hybrid:
        values["dp_shard"] = values["dp"]
    return Imported(format="llm-foundry", values=values, notes=notes)

"""A DeepSpeed config JSON read back (train_batch_size, zero_optimization, bf16, tensor_parallel), with the
topology and world size from meshplan's meshplan_deepspeed.py and launch line beside it where present."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from meshplan.errors import MeshplanError
from meshplan.imports.common import Imported, meshplan_header


def recognises(path: Path, text: str) -> bool:
    if path.suffix.lower() != ".json":
        return False
    try:
        data = json.loads(text)
    except ValueError:
        return False
    return isinstance(data, dict) and bool(
        {"train_batch_size", "train_micro_batch_size_per_gpu", "zero_optimization"} & set(data)
    )


def _beside(path: Path, name: str) -> str:
    other = path.parent / name
    return other.read_text() if other.is_file() else ""


def read_offload(zero: dict, stage: int, values: dict[str, Any]) -> None:
    """zero_optimization.offload_optimizer / offload_param as meshplan's offload method: cpu, or NVMe
    (ZeRO-Infinity) with params=true when the parameters are swapped too (ZeRO-3 only)."""
    device = str((zero.get("offload_optimizer") or {}).get("device", "none"))
    param = str((zero.get("offload_param") or {}).get("device", "none"))
    if device == "cpu":
        values["offload"] = "cpu"
    elif device == "nvme":
        values["offload"] = "nvme:params=true" if param == "nvme" and stage == 3 else "nvme"


def read_reduction(zero: dict, stage: int, values: dict[str, Any]) -> None:
    """How the engine reduces, where the file says so: overlap_comm (DeepSpeed's default: on at ZeRO-3
    only, zero/config.py overlap_comm_valid), reduce_bucket_size (--reduce-bucket-elems) and
    use_multi_rank_bucket_allreduce false (ZeRO-2 reduced per partition owner: --zero2-grad-collective
    reduce_scatter). A meshplan export's estimate line, read first, keeps what it says; where it names
    another runtime, that runtime's behaviours are the prediction's and the file's engine settings are not read."""
    if values.get("runtime", "deepspeed") != "deepspeed":
        return
    if zero.get("overlap_comm") is not None or stage in (1, 2):
        values.setdefault("overlap_dp_comm", bool(zero.get("overlap_comm", stage == 3)))
    bucket = _number(zero, "reduce_bucket_size")
    if bucket is not None:
        values.setdefault("reduce_bucket_elems", bucket)
    if zero.get("use_multi_rank_bucket_allreduce") is False:
        values.setdefault("zero2_grad_collective", "reduce_scatter")


def read_pipeline(data: dict, values: dict[str, Any]) -> None:
    """pipeline.pipe_partitioned false: the pipeline engine sends each stage boundary whole from every
    tensor-parallel rank (--no-pp-scatter-gather; DeepSpeed's default splits it over them). Not read where
    a meshplan estimate line names another runtime (read_reduction)."""
    if values.get("runtime", "deepspeed") != "deepspeed":
        return
    if (data.get("pipeline") or {}).get("pipe_partitioned") is False:
        values.setdefault("pp_scatter_gather", False)


def autotp_size(data: dict) -> int:
    """tensor_parallel.autotp_size (1 where absent or 0)."""
    return int((data.get("tensor_parallel") or {}).get("autotp_size", 0) or 0) or 1


def read_precision(data: dict, values: dict[str, Any], notes: list[str]) -> None:
    """The bf16 / fp16 sections as meshplan's precision: bf16 where either is enabled, else fp32."""
    bf16, fp16 = (data.get("bf16") or {}).get("enabled"), (data.get("fp16") or {}).get("enabled")
    values["precision"] = "bf16" if bf16 is True or fp16 is True else "fp32"
    if fp16 is True:
        notes.append("fp16: predicted as bf16 (the same bytes and tensor-core rate)")


def _number(data: dict, key: str) -> int | None:
    value = data.get(key)
    return None if value in (None, "auto") else int(value)


def _batch(data: dict, dp: int | None, values: dict[str, Any], notes: list[str], path: Path) -> int | None:
    """train_batch_size = micro x gradient_accumulation_steps x dp, the rule DeepSpeed completes from any two and
    the data-parallel size (runtime/config.py _set_batch_related_parameters; "auto" is the trainer's to fill in):
    microbatch and global_batch where the file and the world (--num-gpus or the launch line) fix them; the dp."""
    total, micro = _number(data, "train_batch_size"), _number(data, "train_micro_batch_size_per_gpu")
    accumulation = _number(data, "gradient_accumulation_steps")
    if total and micro and accumulation:
        if total % (micro * accumulation) or (dp and total != micro * accumulation * dp):
            raise MeshplanError(
                f"--import {path}: train_batch_size {total} is not micro {micro} x accumulation {accumulation} x dp"
                + (f" {dp} (world / (tp x pp))" if dp else "")
            )
        dp = total // (micro * accumulation)
    elif dp and total and micro:
        accumulation = total // (micro * dp)
    elif dp and total and accumulation:
        micro = total // (accumulation * dp)
    elif dp and micro:
        total = micro * (accumulation or 1) * dp
    elif dp and total:
        micro = total // dp
    elif total and micro and not dp:
        dp = total // micro
        notes.append("gradient_accumulation_steps not given and no world size: predicted with 1 (give --num-gpus)")
    if not (total and micro):
        notes.append(
            "the batch is not fixed by the file ('auto', or too few of train_batch_size, micro and accumulation with "
            "the world): give --microbatch and --global-batch"
        )
        return dp
    values.update(microbatch=micro, global_batch=total)
    return dp


def read_topology(topology: str, pp: int, values: dict[str, Any]) -> None:
    """What meshplan_deepspeed.py's pipeline_module() builds (pp > 1): the layers of each pipeline rank
    (LAYERS_PER_STAGE, the PipelineModule's parts) and activation_checkpoint_interval, which checkpoints every
    layer in chunks of that many (0: none)."""
    if pp == 1:
        return
    hit = re.search(r"^LAYERS_PER_STAGE = \[([\d, ]+)\]", topology, re.M)
    if hit and len(counts := [int(n) for n in hit[1].split(",")]) == pp:
        values["stage_layers"] = ",".join(str(n) for n in counts)
    hit = re.search(r"^ACTIVATION_CHECKPOINT_INTERVAL = (\d+)", topology, re.M)
    if hit:
        interval = int(hit[1])
        values["recompute"] = "full" if interval else "none"
        if interval:
            values["recompute_num_layers"] = interval


def read(path: Path, text: str, world: int | None = None) -> Imported:
    data = json.loads(text)
    values: dict[str, Any] = {}
    notes: list[str] = []
    launch, topology = _beside(path, "launch_deepspeed.sh"), _beside(path, "meshplan_deepspeed.py")
    meshplan_header(launch or topology, values)
    if world:
        values.setdefault("num_gpus", world)
    tp = autotp_size(data)
    hit = re.search(r"PIPELINE_PARALLEL_SIZE = (\d+)", topology)
    pp = int(hit[1]) if hit else 1
    hit = re.search(r"TENSOR_PARALLEL_SIZE = (\d+)", topology)
    tp = max(tp, int(hit[1]) if hit else 1)
    if not topology:
        notes.append("a DeepSpeed JSON names no pipeline stages: predicted with pp=1 (give --pp for a PipelineModule)")
    zero = data.get("zero_optimization", {})
    stage = int(zero.get("stage", 0))
    dp = _batch(data, (world or values.get("num_gpus") or 0) // (tp * pp) or None, values, notes, path)
    values.update(tp=tp, pp=pp, zero=stage, schedule="1f1b")
    if dp:
        values["dp"] = dp
        values.setdefault("num_gpus", dp * tp * pp)
    if stage >= 2 and dp:
        values["dp_shard"] = dp
    read_offload(zero, stage, values)
    read_reduction(zero, stage, values)
    read_pipeline(data, values)
    read_precision(data, values, notes)
    values["recompute"] = "full" if data.get("activation_checkpointing") else "none"
    read_topology(topology, pp, values)
    if data.get("activation_checkpointing") and "recompute_num_layers" not in values:
        notes.append(
            "activation_checkpointing: DeepSpeed checkpoints what the model code wraps; predicted as every block"
        )
    values["sequence_parallel"] = False
    values.setdefault("runtime", "deepspeed")
    return Imported(format="deepspeed", values=values, notes=notes)

"""offload=cpu (ZeRO-Offload): optimizer states and the optimizer step on the host.

- ZeRO-2/3: FSDP2 CPUOffloadPolicy: the sharded parameters, gradients and the optimizer step
  live on the host; each gather copies the shard to the device first. Pinned host memory needs
  an accelerator (CPUOffloadPolicy() on a CPU-only run fails: "Cannot access accelerator
  device"), so it is pinned only on CUDA; the shards are materialised
  on the host (torchtitan does the same). The collectives and their bytes are FSDP2's.
- ZeRO-0/1 and tensor-parallel replicas, where the policy does not fit (it belongs to
  fully_shard), and every stage with delayed_update: meshplan's own HostOptimizer
  (host_optimizer.py): gradients down, the run's torch optimizer on host masters, parameters up;
  ZeRO-1 hands it to ZeroRedundancyOptimizer as its optimizer_class, so each rank offloads
  only its partition.
"""

from __future__ import annotations

import torch
from torch.distributed.fsdp import CPUOffloadPolicy

from meshplan.executor.methods import device as on_device
from meshplan.executor.methods.host_optimizer import host_optimizer_class


def _policy(params: dict, zero: int) -> bool:
    return zero >= 2 and not params.get("delayed_update")


def fsdp_kwargs(params: dict, device: torch.device, zero: int = 3) -> dict:
    if not _policy(params, zero):
        return {}
    return {"offload_policy": CPUOffloadPolicy(pin_memory=device.type == "cuda")}


def shard_device(params: dict, device: torch.device, zero: int = 3) -> torch.device:
    return torch.device("cpu") if _policy(params, zero) else device


def optimizer_class(cls: type, params: dict, *, zero: int, counter, folder: str, optimizer: str) -> type:
    """The torch optimizer class this rank builds: FSDP2's policy steps `cls` on the host by itself."""
    if _policy(params, zero):
        return cls
    return host_optimizer_class(cls, counter=counter, delayed=bool(params.get("delayed_update")))


check = on_device.check
prepare_part = on_device.prepare_part

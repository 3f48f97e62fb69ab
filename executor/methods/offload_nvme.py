"""offload=nvme (ZeRO-Infinity's NVMe tier): the optimizer states in preallocated, memory-mapped
files under `meshplan run --offload-dir DIR` (default: <out-dir>/offload), one folder per rank
and model part, prefetched one parameter ahead and streamed through the host optimizer step
(host_optimizer.py, nvme_store.py). Parameters and gradients stay on the device, as DeepSpeed's
offload_optimizer device nvme; every ZeRO stage (FSDP2 shards are stepped shard by shard).
The files are removed at the end of the run, also after an error; DCP checkpoints carry the
offloaded states (read from the files on save, written into the new run's files on resume:
executor/checkpoint.py).
"""

from __future__ import annotations

import torch

from meshplan.executor.methods.host_optimizer import host_optimizer_class
from meshplan.executor.methods.nvme_store import store_factory


def fsdp_kwargs(params: dict, device: torch.device, zero: int = 3) -> dict:
    return {}


def shard_device(params: dict, device: torch.device, zero: int = 3) -> torch.device:
    return device


def optimizer_class(cls: type, params: dict, *, zero: int, counter, folder: str, optimizer: str) -> type:
    return host_optimizer_class(cls, counter=counter, store_factory=store_factory(folder, optimizer))

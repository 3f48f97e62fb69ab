"""offload=nvme (ZeRO-Infinity's NVMe tier): the optimizer states in preallocated files, read and
written around the page cache (cold_io.py), under `meshplan run --offload-dir DIR` (default: <out-dir>/offload), one folder per rank
and model part, prefetched one parameter ahead and streamed through the host optimizer step
(host_optimizer.py, nvme_store.py). Parameters and gradients stay on the device, as DeepSpeed's
offload_optimizer device nvme; every ZeRO stage (FSDP2 shards are stepped shard by shard).
The files are removed at the end of the run, also after an error; DCP checkpoints carry the
offloaded states (read from the files on save, written into the new run's files on resume:
executor/checkpoint.py).
params=true (ZeRO-3 only): the parameter shards live in files too (param_pager.py), read before
each unit's all-gather and freed after it, stepped and written back by the host step.
"""

from __future__ import annotations

import torch

from meshplan.errors import MeshplanError
from meshplan.executor.methods.host_optimizer import host_optimizer_class
from meshplan.executor.methods.nvme_store import store_factory
from meshplan.executor.methods.param_pager import ParamPager


def fsdp_kwargs(params: dict, device: torch.device, zero: int = 3) -> dict:
    return {}


def shard_device(params: dict, device: torch.device, zero: int = 3) -> torch.device:
    return device


def optimizer_class(cls: type, params: dict, *, zero: int, counter, folder: str, optimizer: str) -> type:
    return host_optimizer_class(cls, counter=counter, store_factory=store_factory(folder, optimizer))


def check(params: dict, zero: int, checkpoint_every: int = 0) -> None:
    """One line for what parameter offload cannot run with."""
    if params.get("params") and zero != 3:
        raise MeshplanError(
            f"offload=nvme params=true needs ZeRO-3 (the plan has zero_stage {zero}): only "
            "fully sharded parameters are paged to NVMe; use zero 3 or params=false"
        )
    if params.get("params") and checkpoint_every:
        raise MeshplanError(
            "offload=nvme params=true: checkpoints of NVMe-paged parameter shards are not "
            "supported; run without --checkpoint-every or with params=false"
        )


def prepare_part(part, params: dict, *, zero: int, counter, folder: str) -> None:
    """params=true: page this part's FSDP2 shards out to `folder`/params (param_pager.py)."""
    if params.get("params"):
        check(params, zero)
        ParamPager(part, f"{folder}/params", counter)

"""offload=nvme params=true: ZeRO-Infinity's parameter tier on NVMe for ZeRO-3 (FSDP2) units.

Each rank's FSDP2 parameter shards (`FSDPParam._sharded_param_data`, the padded flat local
shard the all-gather reads) live in one preallocated file per parameter under the rank's
offload folder, read and written around the page cache (cold_io.py); in memory a shard exists
only while it is used:
- before a unit's all-gather (`FSDPParamGroup.unshard`: forward, its prefetch, and backward's
  re-gather) the unit's shards are read from their files into their storage;
- after the unit reshards (after forward; after backward's reduce-scatter) the storage is freed
  (the file already holds the same values: nothing is written);
- the host optimizer step (host_optimizer.py) reads each parameter's shard, steps it, writes it
  back and frees it, parameter by parameter, next to its optimizer states (nvme_store.py).
So between steps and outside the unit in flight the shards occupy no memory, as with
DeepSpeed's offload_param device nvme (Rajbhandari et al., ZeRO-Infinity, SC 2021, Sec. 5).
Gradients stay in memory (FSDP2 holds the reduce-scattered shard until the step).

Bytes: every shard read and written is counted on the "nvme" axis: per step each unit's shard
read twice (forward, backward), then once more and written once by the step: 4 x the shard's
fp32 bytes per parameter (planner/offload.py prices the same).
The FSDP2 hooks used (FSDPParamGroup.unshard / reshard, FSDPParam._sharded_param_data) are
torch internals, checked at start-up: an unknown torch layout fails with one line.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch

from meshplan.comm_bytes import ByteCounter
from meshplan.errors import MeshplanError
from meshplan.executor.memory import storage_freed
from meshplan.executor.methods.cold_io import read_cold, write_through

PAGERS: dict[int, ParamPager] = {}
"""id(sharded parameter) -> its pager, for the host optimizer's step."""


def _groups(part: torch.nn.Module) -> list:
    out = []
    for module in part.modules():
        state = getattr(module, "_get_fsdp_state", None)
        group = state()._fsdp_param_group if state is not None else None
        if group is not None:
            out.append(group)
    return out


class ParamPager:
    """The shards of one model part's FSDP2 units in files under `folder` (module docstring)."""

    def __init__(self, part: torch.nn.Module, folder: str | Path, counter: ByteCounter):
        self.folder, self.counter = Path(folder), counter
        self.groups = _groups(part)
        if not self.groups or not all(hasattr(g, "unshard") and hasattr(g, "reshard") for g in self.groups):
            raise MeshplanError(
                f"offload=nvme params=true: torch {torch.__version__}'s fully_shard units are not "
                "the FSDP2 layout meshplan pages (FSDPParamGroup); use params=false"
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        self.index: dict[int, int] = {}
        self.data: list[torch.Tensor] = []
        for group in self.groups:
            for fp in group.fsdp_params:
                data = fp._sharded_param_data
                if data.device.type != "cpu":
                    raise MeshplanError(
                        "offload=nvme params=true: the shards are paged through host memory; this "
                        f"rank's are on {data.device} (run on CPU ranks or with params=false)"
                    )
                i = len(self.data)
                self.index[id(fp.sharded_param)] = i
                self.data.append(data)
                PAGERS[id(fp.sharded_param)] = self
                with open(self._file(i), "wb") as fh:
                    fh.truncate(data.numel() * data.element_size())
                self._write(i)
            self._wrap(group)
        for i in range(len(self.data)):
            self._free(i)

    def _file(self, i: int) -> Path:
        return self.folder / f"shard{i:05d}.bin"

    def _wrap(self, group) -> None:
        unshard, reshard = group.unshard, group.reshard
        members = [self.index[id(fp.sharded_param)] for fp in group.fsdp_params]

        def paged_unshard(*args, **kwargs):
            if group.is_sharded:
                for i in members:
                    self.page_in(i)
            return unshard(*args, **kwargs)

        def paged_reshard(*args, **kwargs):
            out = reshard(*args, **kwargs)
            if group.is_sharded:
                for i in members:
                    self._free(i)
            return out

        group.unshard, group.reshard = paged_unshard, paged_reshard

    def resident(self, i: int) -> bool:
        return self.data[i].untyped_storage().size() > 0 or self.data[i].numel() == 0

    def page_in(self, i: int) -> None:
        """Read shard i from its file into its storage (a no-op when it is resident)."""
        if self.resident(i):
            return
        data = self.data[i]
        data.untyped_storage().resize_(data.numel() * data.element_size())
        read_cold(self._file(i), [data])
        self.counter.add("nvme", "send_recv", 2, data.numel() * data.element_size())

    def page_out(self, i: int) -> None:
        """Write shard i (the optimizer changed it) to its file and free its storage."""
        data = self.data[i]
        self._write(i)
        self.counter.add("nvme", "send_recv", 2, data.numel() * data.element_size())
        self._free(i)

    def _write(self, i: int) -> None:
        """Shard i into its file, through to the device (cold_io.py)."""
        if self.data[i].numel():
            write_through(self._file(i), [self.data[i]])

    def _free(self, i: int) -> None:
        storage_freed(self.data[i])  # the CPU peak tracker (executor/memory.py) sees no resize_
        self.data[i].untyped_storage().resize_(0)

    def remove(self) -> None:
        for key in [k for k, v in PAGERS.items() if v is self]:
            del PAGERS[key]
        shutil.rmtree(self.folder, ignore_errors=True)


def pager_of(param: torch.nn.Parameter) -> tuple[ParamPager, int] | None:
    pager = PAGERS.get(id(param))
    return None if pager is None else (pager, pager.index[id(param)])

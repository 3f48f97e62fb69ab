"""offload=nvme's state files: one preallocated file per parameter on local disk, read and
written around the page cache (cold_io.py: written through to the device, read back from it, as
ZeRO-Infinity's O_DIRECT async I/O does), so the states cost the disk's rates, not memory's.

Each file holds a parameter's tensor states back to back in a fixed order (Adam: exp_avg then
exp_avg_sq; SGD: momentum_buffer). The whole footprint is allocated up front with
posix_fallocate, so a full disk fails at start-up as one `MeshplanError` naming the directory,
the bytes needed and the bytes free, never as a SIGBUS on a half-written mapping. `remove()`
deletes the rank's folder (train() calls it at the end of a run, also after an error).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import shutil
from pathlib import Path

import torch

from meshplan.errors import MeshplanError
from meshplan.executor.methods.cold_io import read_cold, write_through
from meshplan.executor.shards import local_shard

STATES_PER_PARAM = {"adamw": ("exp_avg", "exp_avg_sq"), "sgd": ("momentum_buffer",)}
"""Parameter-sized tensor states each optimizer keeps, in file order."""


M_MMAP_THRESHOLD = -3
"""glibc mallopt parameter (malloc.h)."""


@functools.cache
def return_large_frees_to_the_os() -> bool:
    """Fix glibc's mmap threshold at its 128 KiB default. Left dynamic, glibc raises it to the size
    of the largest block freed so far (up to 32 MiB), so once the first state tensor is paged out
    every later one is carved from the heap and kept there when freed: the process's resident
    memory then grows towards the whole optimizer state the store exists to keep on disk (measured:
    114 of 128 MiB with, 34 MiB without). False where the C library has no mallopt (not glibc)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, 128 * 1024))


class NvmeStore:
    """The tensor states of a list of fp32 parameters in files under `folder`."""

    def __init__(self, folder: str | Path, numels: list[int], keys: tuple[str, ...], shapes: list[tuple]):
        return_large_frees_to_the_os()
        self.folder, self.keys, self.numels, self.shapes = Path(folder), keys, numels, shapes
        self.written = [False] * len(numels)
        self.moved_bytes = 0
        """Bytes read + written since the last take_bytes()."""
        self._allocate()

    def _allocate(self) -> None:
        need = sum(self.numels) * 4 * len(self.keys)
        self.folder.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(self.folder).free
        if need > free:
            self._full(need, free)
        try:
            for i, n in enumerate(self.numels):
                fd = os.open(self._path(i), os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    if n:
                        os.posix_fallocate(fd, 0, n * 4 * len(self.keys))
                finally:
                    os.close(fd)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                self._full(need, shutil.disk_usage(self.folder).free)
            raise

    def _full(self, need: int, free: int):
        self.remove()
        raise MeshplanError(
            f"--offload-dir {self.folder.parent}: not enough disk space for offload=nvme: the "
            f"optimizer states need {need / 2**20:.1f} MiB on this rank, {free / 2**20:.1f} MiB "
            "are free; free space there or pass --offload-dir on a larger disk"
        )

    def _path(self, i: int) -> Path:
        return self.folder / f"param{i:05d}.bin"

    def read(self, i: int, count: bool = True) -> dict[str, torch.Tensor]:
        """Parameter i's states as fresh in-memory tensors ({} before its first step); a
        checkpoint's read (count=False) is not training traffic."""
        if not self.written[i]:
            return {}
        out = {k: torch.empty(self.shapes[i], dtype=torch.float32) for k in self.keys}
        moved = read_cold(self._path(i), list(out.values()))
        self.moved_bytes += moved if count else 0
        return out

    def write(self, i: int, states: dict[str, torch.Tensor], count: bool = True) -> None:
        missing = [k for k in self.keys if k not in states]
        assert not missing, f"optimizer state {missing} not kept for parameter {i}"
        moved = write_through(self._path(i), [states[k].to(torch.float32).contiguous() for k in self.keys])
        self.written[i] = True
        self.moved_bytes += moved if count else 0

    def take_bytes(self) -> int:
        moved, self.moved_bytes = self.moved_bytes, 0
        return moved

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


def store_factory(folder: str | Path, optimizer: str):
    """params -> NvmeStore in `folder` for `optimizer` ("adamw" or "sgd")."""

    def make(params) -> NvmeStore:
        locals_ = [local_shard(p) for p in params]
        return NvmeStore(
            folder, [t.numel() for t in locals_], STATES_PER_PARAM[optimizer], [tuple(t.shape) for t in locals_]
        )

    return make

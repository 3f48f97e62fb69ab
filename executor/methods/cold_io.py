"""Tensor I/O that goes to the disk, not the page cache: offload=nvme's files (nvme_store.py,
param_pager.py).

ZeRO-Infinity's NVMe tier reads and writes with O_DIRECT (DeepSpeed's async I/O), so the states
come from the device at its read rate, however much memory the host has free. Buffered I/O would
leave them in the page cache, where the next step reads them at memory speed: offload=nvme would
then be CPU offload with extra copies, and faster than `profile-links` measured the disk.

Here a write is pwrite + fdatasync (the bytes reach the device before the call returns) and then
POSIX_FADV_DONTNEED, which evicts the now-clean pages; a read first drops whatever pages another
reader left and then preads straight into the tensor's storage. This is what profile-links' disk
probe (profiler/host_probe.py) times, so the planner's nvme tier and the executor's files move
the same way. O_DIRECT itself is not used: it needs block-aligned buffers and is refused outright
by tmpfs, while clean-page eviction works on every file system that keeps a page cache (on tmpfs
the pages are the storage and stay, which is right there).
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import torch


def _bytes_of(t: torch.Tensor) -> memoryview:
    """The tensor's bytes as a writable view of its memory (CPU, contiguous; any dtype). Made from
    the data pointer, not `Tensor.numpy()`: a storage numpy has seen can no longer be resized,
    and the parameter pager frees and re-grows its shards' storages every step."""
    assert t.device.type == "cpu" and t.is_contiguous(), "cold I/O needs contiguous CPU tensors"
    nbytes = t.numel() * t.element_size()
    if nbytes == 0:
        return memoryview(b"")
    return memoryview((ctypes.c_char * nbytes).from_address(t.data_ptr())).cast("B")


def _move(fd: int, tensors: list[torch.Tensor], offset: int, step, path: str | Path) -> int:
    """Each tensor's bytes through `step(fd, view, position)` (a pwrite or a pread, which may move
    fewer bytes than asked), back to back from byte `offset`; returns the bytes moved."""
    pos = offset
    for t in tensors:
        view = _bytes_of(t)
        done = 0
        while done < len(view):
            got = step(fd, view[done:], pos + done)
            if got == 0:
                raise EOFError(f"{path}: {len(view) - done} bytes short at offset {pos + done}")
            done += got
        pos += len(view)
    return pos - offset


def write_through(path: str | Path, tensors: list[torch.Tensor], offset: int = 0) -> int:
    """Write `tensors` back to back from byte `offset` of the existing file `path`, flush them to
    the device and evict their pages; returns the bytes written."""
    fd = os.open(path, os.O_WRONLY)
    try:
        moved = _move(fd, tensors, offset, os.pwrite, path)
        os.fdatasync(fd)
        os.posix_fadvise(fd, offset, moved, os.POSIX_FADV_DONTNEED)
        return moved
    finally:
        os.close(fd)


def read_cold(path: str | Path, tensors: list[torch.Tensor], offset: int = 0) -> int:
    """Fill `tensors` (back to back from byte `offset` of `path`) from the device, not from
    pages a writer or an earlier reader left cached; returns the bytes read."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        moved = _move(fd, tensors, offset, lambda f, view, pos: os.preadv(f, [view], pos), path)
        os.posix_fadvise(fd, offset, moved, os.POSIX_FADV_DONTNEED)  # the copy is in the tensor now
        return moved
    finally:
        os.close(fd)

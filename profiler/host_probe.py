"""The host side of `meshplan profile-links`, run on every rank at once inside links_worker: host
memory copy bandwidth, host <-> device copies (pinned and pageable, CUDA only) and the local
disk's sequential write / read bandwidth (the NVMe tier of offload=nvme).

Every rank measures at the same moment (a barrier before each sample), because that is how
training uses these resources: the node's DRAM, PCIe switches and drives are shared by its
ranks, and ClusterSpec's host_memory_gbps, host_device and nvme are *per device*. The slowest
rank decides (max over ranks of each sample's seconds). Rank 0 returns the raw samples; the
parent (profiler/host_links.py) turns them into link tiers.

Disk: each rank writes its own file of `disk_bytes` in 4 MiB chunks of random bytes, fsync'd,
drops the file's pages from the page cache (posix_fadvise DONTNEED: clean pages are evicted on
Linux, so the read comes from the device, not memory), reads it back and removes it. Each pass
stops early after `disk_time_s`, so a slow disk bounds the time, not the bytes. The latency is
the median time of a 4 KiB write + fsync and 4 KiB cold read.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist

CHUNK_BYTES = 4 * 2**20
SMALL_BYTES = 4096
REPEATS = 5


def _slowest(seconds: list[float]) -> list[float]:
    """Each sample's seconds, max over ranks (all ranks took the samples at the same time)."""
    t = torch.tensor(seconds, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def _timed(op, sync) -> float:
    sync()
    dist.barrier()
    start = time.perf_counter()
    op()
    sync()
    return time.perf_counter() - start


def host_copy(nbytes: int, threads: int) -> list[float]:
    """Seconds per host memory copy of nbytes (one tensor copy_, `threads` intra-op threads)."""
    src = torch.ones(nbytes // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)  # first touch
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return [_timed(lambda: dst.copy_(src), lambda: None) for _ in range(REPEATS)]
    finally:
        torch.set_num_threads(before)


def device_copies(nbytes: int, device: torch.device) -> dict[str, list[float]]:
    """Seconds per host <-> device copy, pinned and pageable, of nbytes and of SMALL_BYTES."""
    sync = torch.cuda.synchronize
    out: dict[str, list[float]] = {}
    for size, tag in ((nbytes, ""), (SMALL_BYTES, "_small")):
        dev = torch.empty(size // 4, dtype=torch.float32, device=device)
        for pinned in (True, False):
            host = torch.ones(size // 4, dtype=torch.float32, pin_memory=pinned)
            kind = "pinned" if pinned else "pageable"
            dev.copy_(host, non_blocking=pinned)  # warm-up
            sync()
            h2d = functools.partial(dev.copy_, host, non_blocking=pinned)
            d2h = functools.partial(host.copy_, dev, non_blocking=pinned)
            out[f"h2d_{kind}{tag}"] = [_timed(h2d, sync) for _ in range(REPEATS)]
            out[f"d2h_{kind}{tag}"] = [_timed(d2h, sync) for _ in range(REPEATS)]
    return out


def _write(path: Path, nbytes: int, budget_s: float, chunk: bytes) -> tuple[int, float]:
    """(bytes written, seconds) of a sequential write + fsync, stopped after budget_s."""
    written, start = 0, time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while written < nbytes and (written == 0 or time.perf_counter() - start < budget_s):
            written += os.write(fd, chunk[: min(len(chunk), nbytes - written)])
        os.fsync(fd)
        elapsed = time.perf_counter() - start
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # the read below comes from the disk
    finally:
        os.close(fd)
    return written, elapsed


def _read(path: Path, budget_s: float) -> tuple[int, float]:
    """(bytes read, seconds) of a sequential read, stopped after budget_s."""
    buf = bytearray(CHUNK_BYTES)
    got, start = 0, time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        while time.perf_counter() - start < budget_s or got == 0:
            n = f.readinto(buf)
            if not n:
                break
            got += n
    return got, time.perf_counter() - start


def _disk_rank(folder: Path, nbytes: int, budget_s: float) -> tuple[list[float], str]:
    """This rank's [write bytes, write s, read bytes, read s, small write s, small read s] and
    its error text ("" when it worked). The file is removed whatever happens."""
    path = folder / f"meshplan-links-disk.{os.getpid()}.bin"
    try:
        chunk = os.urandom(CHUNK_BYTES)
        dist.barrier()
        wb, ws = _write(path, nbytes, budget_s, chunk)
        dist.barrier()
        rb, rs = _read(path, budget_s)
        small = [(_write(path, SMALL_BYTES, budget_s, chunk)[1], _read(path, budget_s)[1]) for _ in range(REPEATS)]
        small_w, small_r = (sorted(x)[REPEATS // 2] for x in zip(*small))  # medians; each read is cold
        return [wb, ws, rb, rs, small_w, small_r], ""
    except OSError as exc:
        return [0.0] * 6, f"{exc.strerror or exc} ({path})"
    finally:
        path.unlink(missing_ok=True)


def disk(folder: str, nbytes: int, budget_s: float) -> dict:
    """Every rank's file in `folder` at once: per-rank bytes and the slowest rank's seconds."""
    row, error = _disk_rank(Path(folder), nbytes, budget_s)
    failed = torch.tensor([1.0 if error else 0.0])
    dist.all_reduce(failed, op=dist.ReduceOp.MAX)
    if failed.item():
        return {"error": error or "failed on another rank (disk full or not writable?)"}
    sums = torch.tensor(row, dtype=torch.float64)
    worst = sums.clone()
    dist.all_reduce(sums)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    world = dist.get_world_size()
    return {
        "write_bytes": sums[0].item() / world,
        "write_s": worst[1].item(),
        "read_bytes": sums[2].item() / world,
        "read_s": worst[3].item(),
        "small_write_s": worst[4].item(),
        "small_read_s": worst[5].item(),
        "small_bytes": SMALL_BYTES,
    }


def measure(cfg: dict, device: torch.device, local_world: int) -> dict:
    """The host samples of one profile-links run (cfg: copy_bytes, disk_dir, disk_bytes, disk_time_s)."""
    threads = max(1, (os.cpu_count() or 1) // max(local_world, 1))
    out: dict = {"copy_bytes": cfg["copy_bytes"], "threads_per_rank": threads, "ranks": dist.get_world_size()}
    out["host_copy_s"] = _slowest(host_copy(cfg["copy_bytes"], threads))
    if device.type == "cuda":
        copies = device_copies(cfg["copy_bytes"], device)
        out["device_copy_s"] = {k: _slowest(v) for k, v in sorted(copies.items())}
    if cfg.get("disk_dir") and cfg.get("disk_bytes"):
        out["disk"] = disk(cfg["disk_dir"], cfg["disk_bytes"], cfg.get("disk_time_s", 10.0))
    return out

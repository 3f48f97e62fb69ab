"""The host tiers of `meshplan profile-links`: host memory, host <-> device (PCIe) and the local
disk (offload=nvme's tier), from the samples profiler/host_probe.py takes on every rank at once,
written into the ClusterSpec fields planner/offload.py reads:

- host_memory_gbps: bytes a copy reads + writes (2 x its size) per second per rank, with the
  rank's share of the host's cores as intra-op threads. That is how CPU Adam's 28 bytes per
  parameter are counted (planner/offload.py CPU_ADAM_BYTES_PER_PARAM).
- host_device (CUDA only): bandwidth_gbps the pinned copy (the slower direction; FSDP2's
  CPUOffloadPolicy pins its shards), efficiency "default" pageable / pinned (meshplan's
  HostOptimizer copies into ordinary host tensors), latency the 4 KiB pinned copy. On CPU ranks
  the host is the device: no link exists, host_device stays None and the spec says that the host
  memory copy is what was measured.
- nvme: bandwidth_gbps the faster of write (fsync'd) and cold read, efficiency "read"/"write"
  each direction's share of it, latency the median of a 4 KiB write + fsync and cold read.

Medians over the samples; every sample is the slowest rank's (the shared resource decides).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from meshplan.cluster import ClusterSpec, LinkSpec
from meshplan.errors import MeshplanError

COPY_BYTES = 64 * 2**20
"""Host and host <-> device copies: large enough for bandwidth, small enough for 4 ranks here."""
DISK_BYTES = 64 * 2**20
"""Default file size per rank for the disk probe."""
DISK_TIME_S = 10.0
"""Each disk pass (write, read) stops after this long even if the file is not done."""


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def fs_type(folder: str | Path) -> str:
    """The file system type of the mount holding `folder` ("ext4", "tmpfs", ...; "" if unknown)."""
    path, best = os.path.realpath(folder), ("", "")
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        fields = line.split()
        if len(fields) >= 3 and (path == fields[1] or path.startswith(fields[1].rstrip("/") + "/")):
            if len(fields[1]) >= len(best[0]):
                best = (fields[1], fields[2])
    return best[1]


def host_config(disk_dir: str | None, disk_bytes: int, nproc: int) -> dict:
    """The worker's "host" config; disk_dir None or disk_bytes 0 skips the disk. One-line errors
    for a folder that is not a writable directory or has too little free space."""
    cfg = {"copy_bytes": COPY_BYTES, "disk_dir": None, "disk_bytes": 0, "disk_time_s": DISK_TIME_S}
    if disk_dir is None or disk_bytes <= 0:
        return cfg
    folder = Path(disk_dir or tempfile.gettempdir())
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise MeshplanError(f"--disk-dir {folder}: not a writable directory; create it or pass another")
    need, free = nproc * disk_bytes, shutil.disk_usage(folder).free
    if need * 2 > free:
        raise MeshplanError(
            f"--disk-dir {folder}: the disk probe writes {need / 2**20:.0f} MiB ({nproc} ranks x "
            f"{disk_bytes / 2**20:.0f} MiB) and wants twice that free, {free / 2**20:.0f} MiB are; "
            "lower --disk-mib or pass another --disk-dir"
        )
    return {**cfg, "disk_dir": str(folder.resolve()), "disk_bytes": disk_bytes}


def host_memory_gbps(raw: dict) -> float:
    """Bytes read + written per second per rank by the host copy."""
    return 2 * raw["copy_bytes"] / _median(raw["host_copy_s"]) / 1e9


def host_device_link(raw: dict) -> LinkSpec | None:
    """PCIe from the pinned / pageable copies (None without an accelerator)."""
    copies = raw.get("device_copy_s")
    if not copies:
        return None
    gbps = {k: raw["copy_bytes"] / _median(v) / 1e9 for k, v in copies.items() if not k.endswith("_small")}
    pinned = min(gbps["h2d_pinned"], gbps["d2h_pinned"])
    pageable = min(gbps["h2d_pageable"], gbps["d2h_pageable"])
    latency = min(_median(copies["h2d_pinned_small"]), _median(copies["d2h_pinned_small"]))
    return LinkSpec(
        bandwidth_gbps=pinned, latency_s=latency, efficiency={"default": round(min(1.0, pageable / pinned), 4)}
    )


def _share(gbps: float, peak: float) -> float:
    return min(1.0, max(1e-4, round(gbps / peak, 4)))


def nvme_link(disk: dict) -> LinkSpec:
    """The disk tier from the write / read passes and the 4 KiB latency probes."""
    write = disk["write_bytes"] / disk["write_s"] / 1e9
    read = disk["read_bytes"] / disk["read_s"] / 1e9
    peak = max(write, read)
    latency = 0.5 * (disk["small_write_s"] + disk["small_read_s"])
    return LinkSpec(
        bandwidth_gbps=peak,
        latency_s=latency,
        efficiency={"read": _share(read, peak), "write": _share(write, peak)},
    )


def apply_host(spec: ClusterSpec, raw: dict, disk_dir: str | None = None) -> None:
    """Write the measured host tiers into `spec` (in place) and say in spec.source what was measured."""
    spec.host_memory_gbps = host_memory_gbps(raw)
    link = host_device_link(raw)
    spec.host_device = link  # None on CPU ranks: the host is the device
    if link is not None:
        sources = [f"host<->device copies (pinned, pageable) and host memory copy measured on {raw['ranks']} ranks"]
    else:
        sources = [f"no accelerator: host memory copy measured on {raw['ranks']} ranks (no host<->device link)"]
    disk = raw.get("disk")
    if disk and "error" in disk:
        raise MeshplanError(f"--disk-dir {disk_dir}: the disk probe failed: {disk['error']}; pass another --disk-dir")
    if disk:
        spec.nvme = nvme_link(disk)
        fs = fs_type(disk_dir) if disk_dir else ""
        where = f"{disk_dir} ({fs}{'; memory, not a disk' if fs == 'tmpfs' else ''})" if fs else str(disk_dir)
        sources.append(f"disk (nvme tier) measured under {where}")
    spec.source = "; ".join([spec.source, *sources] if spec.source else sources)


def describe(spec: ClusterSpec) -> list[str]:
    """One line per host tier of a spec, for people (`meshplan profile-links`)."""
    per = f"per rank, {spec.num_devices} ranks at once"
    lines = []
    if spec.host_memory_gbps:
        lines.append(f"host memory     : copy {spec.host_memory_gbps:7.2f} GB/s (read + write) {per}")
    if spec.host_device is not None:
        hd = spec.host_device
        lines.append(
            f"host<->device   : pinned {hd.bandwidth_gbps:.2f} GB/s, pageable {hd.effective_gbps('default'):.2f} "
            f"GB/s, latency {hd.latency_s * 1e6:.1f} us {per}"
        )
    elif spec.device.kind == "cpu":
        lines.append("host<->device   : none (CPU ranks: the host is the device; the host memory copy above instead)")
    if spec.nvme is not None and spec.measured and "disk (nvme tier) measured" in spec.source:
        lines.append(
            f"disk (nvme tier): write {spec.nvme.effective_gbps('write'):.3f} GB/s fsync'd, read "
            f"{spec.nvme.effective_gbps('read'):.3f} GB/s cold, latency {spec.nvme.latency_s * 1e3:.2f} ms {per}"
        )
    return lines

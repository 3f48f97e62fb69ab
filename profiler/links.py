"""`meshplan profile-links`: measure collectives on the local devices and fit alpha-beta curves.

Runs all_reduce, all_gather, reduce_scatter, all_to_all and send/recv over message sizes (powers
of 4 from `min_bytes` to `max_bytes`) and group sizes 2..N with torchrun (gloo on CPU, nccl on
CUDA; the worker is meshplan.profiler.links_worker), then fits, per collective and group size,

    time(bytes) = latency_s + bytes / (bandwidth_gbps * 1e9)

(the alpha-beta / Hockney model; Thakur, Rabenseifner & Gropp 2005, Sec. 3) by a robust (Huber)
fit of log(time) on the per-size medians. The host tiers (host memory, host <-> device, the
local disk for offload=nvme) are measured in the same launch: profiler/host_links.py. Small collectives on a shared CPU vary by up to 9x
run to run, so a few wild medians must move the fit much less
than they would move least squares; log residuals let the 1 KiB points and the 64 MiB points
count alike.
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path

from meshplan.cluster import COLLECTIVES, ClusterSpec, CollectiveFit, DeviceSpec, LinkSpec
from meshplan.errors import MeshplanError, RunError

Progress = bool | Callable[[int, int, str], None]
"""False: quiet; True: the ranks' progress lines on stderr; a callable: told (done, total, label)."""

LARGE_BYTES = 32 * 2**20
"""Messages at least this big get fewer repeats (each call is already long and stable)."""

BUS_FACTOR = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "all_gather": lambda n: (n - 1) / n,
    "reduce_scatter": lambda n: (n - 1) / n,
    "all_to_all": lambda n: (n - 1) / n,
    "send_recv": lambda n: 1.0,
    "gather": lambda n: n - 1,
}
"""Bytes each device moves per message byte in a ring/pairwise algorithm (nccl-tests
PERFORMANCE.md "bus bandwidth"); algorithm bandwidth x factor = bus (link) bandwidth."""


def message_sizes(min_bytes: int, max_bytes: int) -> list[int]:
    """Powers of 4 times min_bytes up to max_bytes; max_bytes itself is always included."""
    sizes, size = [], min_bytes
    while size < max_bytes:
        sizes.append(size)
        size *= 4
    return sizes + [max_bytes]


def _check_args(nproc: int, min_bytes: int, max_bytes: int, collectives, repeats: int, group_sizes: list[int]) -> None:
    if nproc < 2:
        raise MeshplanError(f"--nproc {nproc}: profile-links needs at least 2 ranks")
    if not 4 <= min_bytes <= max_bytes:
        raise MeshplanError(f"message sizes {min_bytes}..{max_bytes} bytes: need 4 <= min_bytes <= max_bytes")
    unknown = [c for c in collectives if c not in COLLECTIVES]
    if unknown or not collectives:
        raise MeshplanError(f"collective {unknown[0] if unknown else None!r} is unknown; use " + ", ".join(COLLECTIVES))
    if repeats < 1:
        raise MeshplanError(f"repeats {repeats}: must be >= 1 (3 or more for a median)")
    bad = [g for g in group_sizes if not 2 <= g <= nproc]
    if bad:
        raise MeshplanError(f"group size {bad[0]}: must be in 2..{nproc} (the number of ranks)")


def sweep_cases(collectives, group_sizes: list[int], sizes: list[int]) -> list[list]:
    """[collective, group_size, bytes] cases; send/recv only runs in pairs (group size 2)."""
    cases = []
    for group_size in sorted(set(group_sizes)):
        for collective in collectives:
            if collective == "send_recv" and group_size != min(group_sizes):
                continue
            cases += [[collective, group_size, size] for size in sizes]
    return cases


def measure(
    nproc: int,
    cases: list[list],
    *,
    repeats: int = 5,
    timeout_s: float = 600,
    progress: Progress = False,
    device: str = "auto",
    host: dict | None = None,
) -> dict:
    """Run the worker on `nproc` local ranks; return its JSON (see links_worker's docstring).
    `host` (profiler/host_links.host_config) also measures the host tiers (profiler/host_probe.py)."""
    config = {
        "host": host,
        "cases": cases,
        "repeats_small": repeats,
        "repeats_large": min(repeats, max(3, repeats // 2)),
        "large_bytes": LARGE_BYTES,
        "progress": bool(progress),
        "device": device,
        "pg_timeout_s": max(60, int(timeout_s)),
    }
    with tempfile.TemporaryDirectory(prefix="meshplan-links-") as tmp:
        cfg_path, out_path = Path(tmp, "config.json"), Path(tmp, "result.json")
        cfg_path.write_text(json.dumps(config))
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={nproc}",
            "-m",
            "meshplan.profiler.links_worker",
            str(cfg_path),
            str(out_path),
        ]
        rc, tail = _launch(cmd, timeout_s, progress)
        # A rank may abort at exit after the results are written (an intermittent SIGABRT after
        # destroy_process_group on gloo, a few launches in a hundred): a complete result file is
        # trusted whatever the exit status.
        if out_path.exists():
            return json.loads(out_path.read_text())
    raise RunError(f"profile-links on {nproc} ranks failed (exit {rc}): {tail}")


_MEASURED = re.compile(r"^profile-links: pass \d+/\d+ done, (\d+)/(\d+) collectives measured$")


def _launch(cmd: list[str], timeout_s: float, progress: Progress) -> tuple[int, str]:
    """Run torchrun in its own session (so a timeout kills every rank); return (rc, error tail).
    A callable `progress(done, total, label)` is told the collectives measured (rank 0's lines);
    True lets the ranks' stderr through to the terminal."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=None if progress is True else subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    err_lines: list[str] = []
    reader = None
    if callable(progress) and proc.stderr is not None:
        reader = threading.Thread(target=_count_lines, args=(proc.stderr, progress, err_lines), daemon=True)
        reader.start()
    try:
        out, err = proc.communicate(timeout=timeout_s) if reader is None else (_wait(proc, timeout_s), None)
    except subprocess.TimeoutExpired:
        _kill_tree(proc)
        return -1, f"timed out after {timeout_s:.0f} s; raise timeout_s or lower max_bytes"
    except BaseException:  # KeyboardInterrupt, SystemExit from a signal handler: no orphaned ranks
        _kill_tree(proc)
        raise
    if reader is not None:
        reader.join(timeout=10)
        err = "".join(err_lines)
    lines = [ln for ln in ((err or "") + (out or "")).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error" in ln]
    return proc.returncode, (errors[-1] if errors else lines[-1] if lines else "no output").strip()[:300]


def _wait(proc: subprocess.Popen, timeout_s: float) -> str:
    """stdout of `proc` once it exits (stderr is read by another thread)."""
    out = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.read() if proc.stdout else ""), daemon=True)
    reader.start()
    proc.wait(timeout=timeout_s)
    reader.join(timeout=10)
    return "".join(out)


def _count_lines(stream, progress: Callable[[int, int, str], None], keep: list[str]) -> None:
    """Tick `progress` at each of rank 0's counts; keep every other line for the error tail."""
    for line in stream:
        found = _MEASURED.match(line.strip())
        if found:
            progress(int(found[1]), int(found[2]), "collectives")
        else:
            keep.append(line)


def _descendants(pid: int) -> list[int]:
    """PIDs below `pid` (torchrun starts each rank in its own session, out of its process group)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_tree(proc: subprocess.Popen) -> None:
    """SIGTERM torchrun (it stops its ranks), then SIGKILL whatever of the tree is left."""
    ranks = _descendants(proc.pid)
    proc.terminate()
    try:
        proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    for pid in [proc.pid] + ranks:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    proc.communicate()


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def _weighted_line(sizes: list[float], times: list[float], weights: list[float]) -> tuple[float, float]:
    """Weighted least squares for t = a + b*s with a >= 0 (2x2 normal equations)."""
    sw = sum(weights)
    ss = sum(w * s for w, s in zip(weights, sizes))
    st = sum(w * t for w, t in zip(weights, times))
    sss = sum(w * s * s for w, s in zip(weights, sizes))
    sst = sum(w * s * t for w, s, t in zip(weights, sizes, times))
    det = sw * sss - ss * ss
    if det > 0:
        a, b = (sss * st - ss * sst) / det, (sw * sst - ss * st) / det
        if a >= 0:
            return a, b
    return 0.0, sst / sss  # the unconstrained optimum has a < 0: fit through the origin


HUBER_DELTA = 0.15
"""Log residuals up to this size (about 15%) count quadratically, larger ones linearly."""


def _huber_line(s: list[float], t: list[float], iterations: int) -> tuple[float, float]:
    """IRLS for sum huber(log((a + b*s) / t)); each step minimises sum w (a + b*s - t)^2 with
    w = min(1, delta / |log(p / t)|) / (p * t), p the previous prediction ((p - t)^2 / (p t) is
    log(p / t)^2 to second order). iterations=0 is plain least squares on relative error."""
    a, b = _weighted_line(s, t, [1.0 / (ti * ti) for ti in t])
    for _ in range(iterations):
        pred = [max(a + b * si, 1e-3 * ti) for si, ti in zip(s, t)]
        weights = [min(1.0, HUBER_DELTA / max(abs(math.log(pi / ti)), 1e-9)) / (pi * ti) for pi, ti in zip(pred, t)]
        a, b = _weighted_line(s, t, weights)
    return a, b


def fit_alpha_beta(sizes_bytes: list[int], times_s: list[float], iterations: int = 60) -> tuple[float, float]:
    """(latency_s, bandwidth_gbps) of a robust fit of time = a + b * bytes to the medians.

    Residuals are logs, so a median 5x too low counts like one 5x too high. The Huber loss
    (Huber 1964) averages the ordinary noise of the medians that agree (quadratic below
    HUBER_DELTA) and counts a wild median only linearly; medians then further off than 3 robust
    standard deviations (1.4826 x median |residual|, at least HUBER_DELTA) are dropped and the
    fit is redone, so a few 9x outliers leave it where the other sizes put it.
    """
    assert len(sizes_bytes) == len(times_s) and sizes_bytes, "one median per size"
    s = [float(x) for x in sizes_bytes]
    t = [max(float(x), 1e-9) for x in times_s]
    a, b = _huber_line(s, t, iterations)
    if iterations > 0 and len(s) > 3:
        resid = [abs(math.log(max(a + b * si, 1e-3 * ti) / ti)) for si, ti in zip(s, t)]
        cut = 3 * max(HUBER_DELTA, 1.4826 * _median(resid))
        keep = [i for i, r in enumerate(resid) if r <= cut]
        if 2 <= len(keep) < len(s):
            a, b = _huber_line([s[i] for i in keep], [t[i] for i in keep], iterations)
    if b <= 0:  # latency-bound everywhere (tiny sizes only): bound the bandwidth by the largest size
        b = max(t[i] / s[i] for i in range(len(s)))
    return a, 1.0 / (b * 1e9)


def fit_samples(samples: list[list]) -> list[CollectiveFit]:
    """One CollectiveFit per (collective, group size) from the worker's raw samples."""
    by_key: dict[tuple[str, int], list] = {}
    for collective, group_size, size, secs in samples:
        by_key.setdefault((collective, group_size), []).append((size, secs))
    fits = []
    for (collective, group_size), rows in sorted(by_key.items()):
        rows.sort()
        sizes = [size for size, _ in rows]
        medians = [_median(secs) for _, secs in rows]
        latency_s, bandwidth_gbps = fit_alpha_beta(sizes, medians)
        fits.append(
            CollectiveFit(
                collective=collective,
                group_size=group_size,
                tier="intra_node",
                latency_s=latency_s,
                bandwidth_gbps=bandwidth_gbps,
                min_s=[min(secs) for _, secs in rows],
                median_s=medians,
                max_s=[max(secs) for _, secs in rows],
                sizes_bytes=sizes,
            )
        )
    return fits


def link_tier(fits: list[CollectiveFit], nproc: int) -> LinkSpec:
    """A link tier from the fits: send/recv gives the point-to-point bandwidth and latency;
    each collective's efficiency is its bus bandwidth (at the largest group) over that."""
    largest: dict[str, CollectiveFit] = {}
    spread = [f for f in fits if f.collective != "gather"]  # a fan-in loads one rank's link only
    for f in spread or fits:
        if f.group_size >= largest.get(f.collective, f).group_size:
            largest[f.collective] = f
    bus = {c: f.bandwidth_gbps * BUS_FACTOR[c](f.group_size) for c, f in largest.items()}
    bandwidth = max(bus.values())
    if "send_recv" in largest:
        latency = largest["send_recv"].latency_s
    else:  # a ring all-reduce is 2(n-1) point-to-point steps (Thakur et al. 2005, Sec. 4.5)
        ar = largest.get("all_reduce") or next(iter(largest.values()))
        latency = ar.latency_s / (2 * (ar.group_size - 1))
    efficiency = {c: round(min(1.0, b / bandwidth), 4) for c, b in bus.items()}
    return LinkSpec(bandwidth_gbps=bandwidth, latency_s=latency, efficiency=efficiency)


def _gpu_cluster(raw: dict, nproc: int) -> ClusterSpec:
    """Spec-sheet device numbers of the preset matching the GPU's name (the fits replace the links)."""
    from meshplan.presets import cluster_preset

    name, memory = raw["device"], raw.get("device_memory_bytes", 0)
    keys = [
        ("H200", "h200-141g"),
        ("H100", "h100-80g"),
        ("B200", "b200-180g"),
        ("A100", "a100-80g" if memory > 45e9 else "a100-40g"),
    ]
    preset = next((p for k, p in keys if k in name.upper()), "h100-80g")
    spec = cluster_preset(preset, nproc)
    device = DeviceSpec(**{**spec.device.__dict__, "name": name, "memory_bytes": memory or spec.device.memory_bytes})
    spec.device, spec.name = device, name
    spec.source = f"measured by meshplan profile-links on {nproc} x {name}; device numbers from preset {preset}"
    return spec


def cluster_from_measurement(raw: dict, nproc: int) -> ClusterSpec:
    """A measured ClusterSpec: local-cpu's device on CPU, the matching preset's on GPU."""
    from meshplan.presets import local_cpu

    fits = fit_samples(raw["samples"])
    if raw["backend"] == "nccl":
        spec = _gpu_cluster(raw, nproc)
    else:
        spec = local_cpu(nproc)
        spec.source = f"measured by meshplan profile-links on {nproc} gloo ranks (torch {raw.get('torch_version')})"
        spec.calibration.source = "links measured by meshplan profile-links; overlaps left at 0"
    tier = link_tier(fits, nproc)
    spec.intra_node = tier
    if raw["backend"] != "nccl":
        spec.inter_node = LinkSpec(**tier.__dict__)  # one host: no second tier exists to measure
    spec.collectives, spec.measured = fits, True
    if raw.get("host"):  # host memory, host <-> device and disk tiers (profiler/host_links.py)
        from meshplan.profiler.host_links import apply_host

        apply_host(spec, raw["host"], (raw["host"].get("disk") or {}).get("dir"))
    spec.validate()
    return spec


def profile_links(
    nproc: int,
    *,
    min_bytes: int = 1024,
    max_bytes: int = 64 * 2**20,
    collectives: tuple[str, ...] = COLLECTIVES,
    repeats: int = 5,
    group_sizes: list[int] | None = None,
    timeout_s: float = 600,
    progress: Progress = False,
    host: bool = True,
    disk_dir: str | None = "",
    disk_bytes: int = 64 * 2**20,
) -> ClusterSpec:
    """Measure collectives on `nproc` local ranks and return the measured ClusterSpec; with
    `host`, also host memory, host <-> device and the disk under `disk_dir` ("" the system temp
    dir, None or disk_bytes 0 skips it) into host_memory_gbps, host_device and nvme."""
    from meshplan.profiler.host_links import host_config

    group_sizes = list(group_sizes) if group_sizes else list(range(2, nproc + 1))
    _check_args(nproc, min_bytes, max_bytes, collectives, repeats, group_sizes)
    cases = sweep_cases(collectives, group_sizes, message_sizes(min_bytes, max_bytes))
    host_cfg = host_config(disk_dir, disk_bytes, nproc) if host else None
    raw = measure(nproc, cases, repeats=repeats, timeout_s=timeout_s, progress=progress, host=host_cfg)
    return cluster_from_measurement(raw, nproc)

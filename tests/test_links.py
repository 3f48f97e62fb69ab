"""profile-links: the alpha-beta fit, the ClusterSpec it writes, and (slow) a real sweep on 2 gloo
ranks. Whether the fit predicts a fresh measurement within 25% is a timing claim on a shared host,
measured by `python -m benchmarks.link_fit`, not asserted here."""

from __future__ import annotations

import pytest

from meshplan import schema
from meshplan.cluster import ClusterSpec
from meshplan.errors import MeshplanError
from meshplan.profiler.links import (
    cluster_from_measurement,
    fit_alpha_beta,
    link_tier,
    measure,
    message_sizes,
    profile_links,
    sweep_cases,
)

MIB = 2**20


def _synthetic(latency_s: float, gbps: float, sizes: list[int]) -> list[float]:
    return [latency_s + s / (gbps * 1e9) for s in sizes]


def test_message_sizes_are_powers_of_four_and_include_the_top():
    assert message_sizes(1024, 64 * MIB) == [1024 * 4**k for k in range(9)]
    assert message_sizes(1024, 5000) == [1024, 4096, 5000]


def test_fit_recovers_clean_alpha_beta_exactly():
    sizes = message_sizes(1024, 64 * MIB)
    latency, gbps = fit_alpha_beta(sizes, _synthetic(5e-3, 0.8, sizes))
    assert latency == pytest.approx(5e-3, rel=1e-3)
    assert gbps == pytest.approx(0.8, rel=1e-3)


def test_fit_is_robust_to_wild_small_message_medians():
    """Small collectives here vary up to 9x: two such medians must barely move the fit,
    where ordinary least squares on relative error is pulled far off."""
    sizes = message_sizes(1024, 64 * MIB)
    times = _synthetic(2e-3, 1.5, sizes)
    times[0] *= 9.0
    times[2] *= 0.2
    latency, gbps = fit_alpha_beta(sizes, times)
    assert latency == pytest.approx(2e-3, rel=0.05)
    assert gbps == pytest.approx(1.5, rel=0.05)
    # the same data through one plain weighted-least-squares step is off by far more
    latency_l2, _ = fit_alpha_beta(sizes, times, iterations=0)
    assert abs(latency_l2 / 2e-3 - 1) > 0.2


def test_fit_never_returns_negative_latency():
    sizes = [2**20, 2**22, 2**24]
    latency, gbps = fit_alpha_beta(sizes, [s / 1e9 * 1.3 - 1e-4 for s in sizes])
    assert latency >= 0 and gbps > 0


def test_sweep_runs_send_recv_only_in_pairs():
    cases = sweep_cases(("all_reduce", "send_recv"), [2, 3, 4], [1024, 4096])
    assert sorted({(c, g) for c, g, _ in cases}) == [
        ("all_reduce", 2),
        ("all_reduce", 3),
        ("all_reduce", 4),
        ("send_recv", 2),
    ]
    assert len(cases) == 8


def _raw(backend: str = "gloo") -> dict:
    sizes = message_sizes(1024, 16 * MIB)
    truth = {
        ("all_reduce", 2): (1e-3, 1.0),
        ("all_reduce", 4): (5e-3, 0.8),
        ("all_gather", 4): (2e-3, 1.2),
        ("send_recv", 2): (1e-4, 2.0),
    }
    samples = []
    for (coll, g), (a, b) in truth.items():
        for s, t in zip(sizes, _synthetic(a, b, sizes)):
            samples.append([coll, g, s, [t * 0.9, t, t * 1.3]])
    return {"device": "cpu", "backend": backend, "world_size": 4, "samples": samples}


def test_cluster_from_measurement_is_a_measured_local_cpu_spec(tmp_path):
    spec = cluster_from_measurement(_raw(), 4)
    assert spec.measured and spec.name == "local-cpu" and spec.device.kind == "cpu"
    assert spec.num_devices == 4
    ar4 = spec.fit("all_reduce", 4)
    assert ar4.group_size == 4 and ar4.bandwidth_gbps == pytest.approx(0.8, rel=1e-3)
    assert ar4.min_s[0] < ar4.median_s[0] < ar4.max_s[0]
    assert spec.fit("all_gather", 2).group_size == 4  # nearest measured group size
    # tiers: send/recv gives bandwidth and latency; all_reduce bus bandwidth is 2(n-1)/n x 0.8
    assert spec.intra_node.latency_s == pytest.approx(1e-4, rel=1e-3)
    assert spec.intra_node.bandwidth_gbps == pytest.approx(2.0, rel=1e-3)
    assert spec.intra_node.effective_gbps("all_reduce") == pytest.approx(1.2, rel=1e-2)
    path = tmp_path / "cluster.json"
    schema.save(spec, path)
    assert schema.load(ClusterSpec, path).collectives == spec.collectives


def test_a_gather_fit_is_kept_but_does_not_set_the_link_tier():
    """A fan-in's algorithm bandwidth times g - 1 is what the root's link took in, not what every
    rank's link carries: the tier stays what the spread collectives say, the fit is still there."""
    raw = _raw()
    sizes = message_sizes(1024, 16 * MIB)
    raw["samples"] += [["gather", 4, s, [t, t, t]] for s, t in zip(sizes, _synthetic(2e-4, 1.5, sizes))]
    spec = cluster_from_measurement(raw, 4)
    assert spec.intra_node.bandwidth_gbps == pytest.approx(2.0, rel=1e-3)  # not 3 x 1.5
    assert spec.fit("gather", 4).bandwidth_gbps == pytest.approx(1.5, rel=1e-3)


def test_link_tier_without_send_recv_uses_ring_steps():
    fits = [f for f in cluster_from_measurement(_raw(), 4).collectives if f.collective != "send_recv"]
    tier = link_tier(fits, 4)
    assert tier.latency_s == pytest.approx(5e-3 / 6, rel=1e-3)  # 2(n-1) steps at n = 4


@pytest.mark.parametrize(
    "kwargs, word",
    [
        ({"nproc": 1}, "nproc"),
        ({"nproc": 2, "collectives": ("bcast",)}, "bcast"),
        ({"nproc": 2, "group_sizes": [3]}, "group size"),
        ({"nproc": 2, "min_bytes": 10, "max_bytes": 5}, "message sizes"),
    ],
)
def test_bad_arguments_are_one_line_errors(kwargs, word):
    with pytest.raises(MeshplanError, match=word):
        profile_links(**kwargs)


def _host_raw(cuda: bool = False) -> dict:
    """Host samples as host_probe.measure returns them: 64 MiB copies, 2 ranks."""
    copy = 64 * MIB
    raw = {"copy_bytes": copy, "threads_per_rank": 1, "ranks": 2, "host_copy_s": [0.05, 0.02, 0.025]}
    if cuda:  # pinned 25 / 20 GB/s, pageable 10 / 8 GB/s, 4 KiB copies 9 / 11 us
        gb = {"h2d_pinned": 25, "d2h_pinned": 20, "h2d_pageable": 10, "d2h_pageable": 8}
        raw["device_copy_s"] = {k: [copy / (g * 1e9)] * 3 for k, g in gb.items()}
        raw["device_copy_s"] |= {"h2d_pinned_small": [9e-6] * 3, "d2h_pinned_small": [11e-6] * 3}
        raw["device_copy_s"] |= {"h2d_pageable_small": [2e-5] * 3, "d2h_pageable_small": [2e-5] * 3}
    raw["disk"] = {
        "write_bytes": copy,
        "write_s": copy / 0.5e9,
        "read_bytes": copy,
        "read_s": copy / 2e9,
        "small_write_s": 3e-3,
        "small_read_s": 1e-3,
        "small_bytes": 4096,
        "dir": "/proc",
    }
    return raw


def test_host_tiers_go_where_the_planner_reads_them_cpu_labelled_as_host_copy():
    from meshplan.profiler.host_links import describe

    spec = cluster_from_measurement({**_raw(), "host": _host_raw()}, 4)
    assert spec.host_memory_gbps == pytest.approx(2 * 64 * MIB / 0.025 / 1e9)  # median copy, read + write
    assert spec.host_device is None  # CPU ranks: the host is the device, no link to measure
    assert "no accelerator: host memory copy measured" in spec.source
    nvme = spec.nvme  # planner/methods/offload.py: effective_gbps("read") / ("write") and latency_s
    assert nvme.effective_gbps("read") == pytest.approx(2.0, rel=1e-3)
    assert nvme.effective_gbps("write") == pytest.approx(0.5, rel=1e-3)
    assert nvme.latency_s == pytest.approx(2e-3) and "disk (nvme tier) measured under /proc (proc)" in spec.source
    assert any("host memory copy above instead" in line for line in describe(spec))


def test_host_device_link_is_the_slower_pinned_direction_and_pageable_is_its_efficiency():
    spec = cluster_from_measurement({**_raw(), "host": _host_raw(cuda=True)}, 4)
    hd = spec.host_device
    assert hd.bandwidth_gbps == pytest.approx(20, rel=1e-6) and hd.latency_s == pytest.approx(9e-6)
    assert hd.effective_gbps("default") == pytest.approx(8, rel=1e-3)  # HostOptimizer: pageable copies
    assert "host<->device copies (pinned, pageable)" in spec.source


def test_disk_probe_folder_errors_are_one_line(tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    from meshplan.profiler.host_links import host_config

    with pytest.raises(MeshplanError, match="not a writable directory"):
        host_config(str(tmp_path / "missing"), MIB, 2)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10 * MIB, 7 * MIB, 3 * MIB))
    with pytest.raises(MeshplanError, match="lower --disk-mib or pass another --disk-dir"):
        host_config(str(tmp_path), MIB, 2)
    assert host_config(None, MIB, 2)["disk_bytes"] == 0  # skipped


@pytest.mark.slow
def test_profile_links_end_to_end_on_two_ranks(tmp_path):
    ticks: list = []  # the CLI's progress bar: collectives measured, one count per pass
    spec = profile_links(
        2,
        min_bytes=4096,
        max_bytes=2**20,
        collectives=("all_reduce", "send_recv"),
        repeats=3,
        timeout_s=300,
        disk_dir=str(tmp_path),
        disk_bytes=8 * MIB,
        progress=lambda done, total, label: ticks.append((done, total, label)),
    )
    assert len(ticks) == 3 and {label for *_, label in ticks} == {"collectives"}
    assert [d for d, *_ in ticks] == sorted(d for d, *_ in ticks) and ticks[-1][0] == ticks[-1][1] > ticks[0][0] > 0
    # the host tiers: measured host memory and disk, no file left behind
    assert spec.host_memory_gbps > 0 and spec.host_device is None and list(tmp_path.iterdir()) == []
    assert spec.nvme.latency_s > 0 and f"measured under {tmp_path}" in spec.source
    assert spec.measured and spec.name == "local-cpu" and spec.num_devices == 2
    assert [(f.collective, f.group_size, len(f.sizes_bytes)) for f in spec.collectives] == [
        ("all_reduce", 2, 5),
        ("send_recv", 2, 5),
    ]
    assert all(f.min_s[i] <= f.median_s[i] <= f.max_s[i] for f in spec.collectives for i in range(5))
    schema.save(spec, tmp_path / "cluster.json")
    loaded = schema.load(ClusterSpec, tmp_path / "cluster.json")
    assert loaded.intra_node == spec.intra_node and loaded.nvme == spec.nvme


@pytest.mark.slow
def test_a_gather_is_measured_as_a_fan_in_on_three_ranks():
    raw = measure(3, sweep_cases(("gather",), [3], [64 * 1024, MIB]), repeats=3, timeout_s=120)
    assert [(c, g, b) for c, g, b, _ in raw["samples"]] == [("gather", 3, 64 * 1024), ("gather", 3, MIB)]
    assert all(len(secs) == 3 and min(secs) > 0 for *_, secs in raw["samples"])
    assert cluster_from_measurement(raw, 3).fit("gather", 3).bandwidth_gbps > 0


@pytest.mark.slow
def test_a_timeout_is_a_run_error_and_leaves_no_rank_behind():
    import os

    from meshplan.errors import RunError
    from meshplan.profiler.links import _descendants

    cases = sweep_cases(("all_reduce",), [2], message_sizes(1024, 64 * MIB))
    # Processes this worker already had (another test file's compile workers, say) are not ranks.
    before = set(_descendants(os.getpid()))
    with pytest.raises(RunError, match="timed out after 6 s"):
        measure(2, cases, repeats=50, timeout_s=6)
    assert sorted(set(_descendants(os.getpid())) - before) == []


def test_a_gather_without_its_own_efficiency_takes_send_recvs():
    """A fan-in is point-to-point flows into one link: where a tier states no gather efficiency
    (every preset), it is send/recv's, not the collectives' default (A100 at scale: 0.74, not 0.34)."""
    from meshplan.cluster import LinkSpec

    link = LinkSpec(bandwidth_gbps=25.0, latency_s=2e-5, efficiency={"default": 0.34, "send_recv": 0.74})
    assert link.effective_gbps("gather") == pytest.approx(25.0 * 0.74)
    assert link.effective_gbps("all_gather") == pytest.approx(25.0 * 0.34)
    assert LinkSpec(bandwidth_gbps=25.0, latency_s=0, efficiency={"gather": 0.5}).effective_gbps("gather") == 12.5
    assert LinkSpec(bandwidth_gbps=25.0, latency_s=0, efficiency={"default": 0.9}).effective_gbps("gather") == 22.5


def test_an_interrupted_launch_leaves_no_process_behind(monkeypatch):
    """The ranks run in their own session, out of reach of the terminal's Ctrl-C: when the caller
    is interrupted while waiting (KeyboardInterrupt, or SystemExit from a signal handler), the
    launcher and everything under it are killed before the exception goes on."""
    import sys
    import time
    from pathlib import Path

    from meshplan.profiler import links

    started: list = []
    below: list[int] = []
    real_popen = links.subprocess.Popen

    def popen(*args, **kwargs):
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    def interrupted(proc, timeout_s):
        deadline = time.monotonic() + 20
        while not below and time.monotonic() < deadline:  # the launcher has started its "rank"
            below.extend(links._descendants(proc.pid))
            time.sleep(0.05)
        raise KeyboardInterrupt

    def alive(pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return False
        return state != "Z"

    monkeypatch.setattr(links.subprocess, "Popen", popen)
    monkeypatch.setattr(links, "_wait", interrupted)
    rank = "import time; time.sleep(60)"
    script = f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {rank!r}]); time.sleep(60)"
    with pytest.raises(KeyboardInterrupt):
        links._launch([sys.executable, "-c", script], 30.0, lambda *a: None)
    (proc,) = started
    assert below, "the launcher never started its child"
    assert proc.poll() is not None
    deadline = time.monotonic() + 5
    while any(alive(pid) for pid in below) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in below)

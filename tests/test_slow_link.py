"""benchmarks/slow_link.py: the throttled network namespace is always removed (normal run,
failing command, timeout, SIGTERM, the Python API), a gloo all_reduce inside it is bounded by
the wire time bytes/rate, profile-links measures the slow link, and where namespaces or tc are
unavailable one line says why and the tests skip."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import slow_link as sl

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20
CLI = [sys.executable, "-m", "benchmarks.slow_link"]


def _require_slow_link() -> None:
    """pytest.skip with the one-line reason where no throttled namespace can be made."""
    reason = sl.available()
    if reason:
        print(reason)
        pytest.skip(reason)


@pytest.fixture
def netns():
    _require_slow_link()


def _cli(*args: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout, **kw)


def _name_of(proc: subprocess.CompletedProcess, pid: int | None = None) -> str:
    """The namespace name the command printed with `ip netns identify`."""
    name = proc.stdout.split()[0]
    assert re.fullmatch(rf"{sl.PREFIX}{pid or r'[0-9]+'}-[0-9]+", name), name
    return name


def test_rates_and_qdiscs():
    assert sl.parse_rate_bits("1gbit") == 1e9
    assert sl.parse_rate_bits("200mbit") == 2e8
    with pytest.raises(ValueError, match="gbit"):
        sl.parse_rate_bits("1 GB/s")
    assert sl.qdisc_args(2e8, 0) == ["tbf", "rate", "200000000bit", "burst", "50000b", "latency", "50ms"]
    assert sl.qdisc_args(1e8, 0)[4] == "25000b" and sl.qdisc_args(1e9, 0)[4] == "250000b"  # 2 ms of line rate
    assert sl.qdisc_args(1e6, 0)[4] == "16384b"  # never below 16 KiB (> the 1500 B MTU)
    assert sl.qdisc_args(1e9, 0.1)[:5] == ["netem", "rate", "1000000000bit", "delay", "100us"]


def test_normal_run_sets_the_link_up_and_removes_the_namespace(netns):
    proc = _cli(
        "--rate",
        "200mbit",
        "--",
        "sh",
        "-c",
        "ip netns identify; ip link show lo; tc qdisc show dev lo; echo IF=$GLOO_SOCKET_IFNAME",
    )
    assert proc.returncode == 0, proc.stderr
    name = _name_of(proc)
    assert "mtu 1500" in proc.stdout and "UP" in proc.stdout
    assert "tbf" in proc.stdout and "200Mbit" in proc.stdout and "IF=lo" in proc.stdout
    assert name not in sl.list_namespaces()


def test_failing_command_keeps_its_exit_code_and_removes_the_namespace(netns):
    proc = _cli("--", "sh", "-c", "ip netns identify; exit 3")
    assert proc.returncode == 3
    assert _name_of(proc) not in sl.list_namespaces()


def test_timeout_kills_the_whole_tree_and_removes_the_namespace(netns):
    start = time.monotonic()
    proc = _cli("--timeout-s", "1", "--", "sh", "-c", "ip netns identify; setsid sleep 60 & echo $!; sleep 60")
    assert proc.returncode == sl.EXIT_TIMEOUT
    assert time.monotonic() - start < 20
    name, orphan = proc.stdout.split()[:2]
    assert name not in sl.list_namespaces()
    # the rank-like grandchild in its own session is gone (or a zombie awaiting its reaper)
    stat = Path(f"/proc/{orphan}/stat")
    assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"


def test_sigterm_removes_the_namespace(netns):
    proc = subprocess.Popen(
        [*CLI, "--", "sh", "-c", "ip netns identify; sleep 60"], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        name = proc.stdout.readline().strip()
        assert name.startswith(f"{sl.PREFIX}{proc.pid}-") and name in sl.list_namespaces()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 128 + signal.SIGTERM
    finally:
        proc.kill()
        proc.wait()
    assert name not in sl.list_namespaces()


def test_context_manager_removes_the_namespace_also_on_error(netns):
    with pytest.raises(RuntimeError, match="boom"):
        with sl.slow_link(rate_gbit=0.5) as prefix:
            assert prefix[-1] == "GLOO_SOCKET_IFNAME=lo"
            name = subprocess.run(
                prefix + ["ip", "netns", "identify"], capture_output=True, text=True, timeout=30
            ).stdout.strip()
            assert name == prefix[3] and name in sl.list_namespaces()
            raise RuntimeError("boom")
    assert name not in sl.list_namespaces()


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_all_reduce_in_a_throttled_namespace_takes_at_least_the_wire_time(netns):
    """2 ranks, 4 MiB at 200 Mbit/s. Any all-reduce moves >= 2(n-1)/n x bytes per rank (Patarasuk &
    Yuan 2009, Sec. 2), and all ranks share the one loopback qdisc: wire bytes = 2(n-1) x bytes,
    0.34 s here; plain loopback takes ~5 ms."""
    num_bytes, nproc, rate_bits = 4 * MIB, 2, 200e6
    with sl.slow_link(rate_gbit=rate_bits / 1e9) as prefix:
        proc = subprocess.run(
            prefix + [*CLI, "--all-reduce-mib", "4", "--iters", "3", "--json"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=45,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    seconds = json.loads(proc.stdout.strip().splitlines()[-1])["seconds"]
    wire_s = 2 * (nproc - 1) * num_bytes * 8 / rate_bits
    assert min(seconds) >= 0.8 * wire_s, (seconds, wire_s)


@pytest.mark.slow
@pytest.mark.timeout(90)
def test_profile_links_inside_the_namespace_measures_the_slow_link(netns, tmp_path):
    """At 1 Gbit/s shared by 2 ranks an all_reduce's algorithm bandwidth is at most
    1e9 / 8 / (2(n-1)) = 0.0625 GB/s (plain loopback here: ~0.4 GB/s); the burst (2 ms of line rate)
    lets small messages through faster, hence the 1.5x."""
    from meshplan import schema
    from meshplan.cluster import ClusterSpec

    out = tmp_path / "links.json"
    with sl.slow_link(rate_gbit=1.0) as prefix:
        proc = subprocess.run(
            prefix
            + [
                sys.executable,
                "-m",
                "meshplan",
                "profile-links",
                "--nproc",
                "2",
                "--max-bytes",
                str(4 * MIB),
                "-o",
                str(out),
                "-q",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=80,
        )
    assert proc.returncode == 0, proc.stderr[-2000:]
    spec = schema.load(ClusterSpec, out)
    fit = next(f for f in spec.collectives if f.collective == "all_reduce" and f.group_size == 2)
    assert fit.bandwidth_gbps <= 1.5 * 1e9 / 8 / 2 / 1e9, fit
    assert fit.median_s[-1] >= 0.8 * 2 * fit.sizes_bytes[-1] * 8 / 1e9
    assert spec.intra_node.bandwidth_gbps <= 1.5 * 1e9 / 8 / 1e9


def test_unavailable_prints_one_line_and_skips(monkeypatch, capsys):
    env = dict(os.environ, PATH="/nonexistent")
    proc = _cli("--", "true", env=env, timeout=30)
    assert proc.returncode == sl.EXIT_UNAVAILABLE
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("slow link unavailable") and "`ip` not found" in lines[0]
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(pytest.skip.Exception, match="not found"):
        _require_slow_link()
    assert capsys.readouterr().out.count("\n") == 1


def test_framing_model_counts_headers_per_segment_and_up_to_one_ack_per_two():
    from benchmarks import kernel_bytes as kb

    assert kb.MSS == 1448 and kb.HEADER_BYTES == 52
    assert kb.framed_band(1448) == (1500, 1526)  # one full segment; at most half an ACK
    assert kb.framed_band(1449) == (1449 + 104, 1449 + 156)  # a second, partial segment


def test_retransmissions_come_out_as_an_interval_of_header_to_full_segment():
    from benchmarks import kernel_bytes as kb

    assert kb.without_resends(10_000, 0) == (10_000, 10_000)
    assert kb.without_resends(10_000, 2) == (10_000 - 2 * 1500, 10_000 - 2 * 52)
    assert kb.without_resends(10_000, -1) == (10_000 + 52, 10_000 + 1500)  # the short launch resent more
    low, high = kb.framed_band(1448 * 4)
    row = {"framed_low": low, "framed_high": high, "retrans_segments": 3}
    assert kb._meets({**row, "kernel_bytes": high + 3 * 1000})  # resends of 1000-byte segments
    assert not kb._meets({**row, "kernel_bytes": high + 3 * 1500 + 1})  # more than three full ones


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_kernel_counted_bytes_land_in_the_framed_prediction(netns):
    """The namespace's loopback counters (the kernel's, sharing no code with the cost model)
    over four steady-state steps of DDP and QSGD on 2 gloo ranks: the TCP payload the kernel
    carried (its bytes less one header per counted packet) equals the predicted payload, the
    bytes are at least the payload in full segments (benchmarks/kernel_bytes.py), and QSGD sits
    well below DDP. A cost model that priced QSGD's all-gather as an all-reduce (or counted one
    rank, not both) misses."""
    from benchmarks import kernel_bytes as kb

    methods = [m for m in kb.METHODS if m[0] in ("none", "qsgd")]
    # launches of 2 and 6 steps: what differs between two launches besides their steps (teardown,
    # a burst of retransmissions in one of them) is divided by 4 steps, not 2 (at (2, 4) the
    # shorter launch once resent 63 segments more and QSGD's step came out 2.5 KB under the bound)
    result = kb.run_bench("1gbit", 2, (2, 6), methods, timeout_s=150)
    rows = {r["method"]: r for r in result["rows"]}
    for r in rows.values():
        # what differs between the two launches besides the steps: the store's control traffic
        # (rendezvous, keep-alive; a few KiB, timing-dependent) and retransmissions
        slack = 0.005 * r["framed_high"] + 4096 / 2
        # retransmitted segments (counted by the kernel, load-dependent) carry up to one MSS again;
        # the count is a difference of two launches, so it can come out negative (the shorter
        # launch retransmitted more) and then widens the band downwards instead
        resent = r["retrans_segments"] * kb.MSS
        resent_up, resent_down = max(resent, 0.0), min(resent, 0.0)
        # the payload travels in at least ceil(W / MSS) segments, each with its header; how many
        # more packets it takes (a partial last segment and an ACK per message, delayed ACKs)
        # depends on the message count and the receiver's timing, which the model does not state,
        # so the total is bounded from below only (the two launches' packet counts differ by a
        # few segments of teardown under load, within the slack). Segments the shorter launch
        # retransmitted (resent_down < 0) shrink the difference by their bytes and headers, as
        # they widen the carried-payload band below.
        resent_framed_down = resent_down * (1 + kb.HEADER_BYTES / kb.MSS)
        why = {k: r.get(k) for k in ("method", "kernel_bytes", "kernel_packets", "data_segments", "retrans_segments")}
        assert r["kernel_bytes"] >= r["framed_low"] + resent_framed_down - slack, why
        # TCP payload the kernel carried: every counted packet has one 52-byte IPv4+TCP header,
        # however many segments it coalesced
        carried = r["kernel_bytes"] - kb.HEADER_BYTES * r["kernel_packets"]
        assert r["payload_bytes"] + resent_down - slack <= carried <= r["payload_bytes"] + resent_up + slack, r
        assert r["kernel_bytes"] == r["kernel_rx_bytes"]  # loopback: every packet sent is received
    assert rows["qsgd"]["kernel_bytes"] < rows["none"]["kernel_bytes"] / 4
    assert not sl.list_namespaces() or not any(n.startswith(f"{sl.PREFIX}{os.getpid()}-") for n in sl.list_namespaces())

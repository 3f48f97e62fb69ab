"""A slow link on one machine: run a command inside a rate-limited network namespace.

    python -m benchmarks.slow_link --rate 1gbit [--delay-ms 0.1] [--timeout-s 600] -- CMD ARGS...
    python -m benchmarks.slow_link --all-reduce-mib 16 [--nproc 2]     # time all_reduce here

The namespace (`mpslow-<pid>-<n>`) holds only its own loopback: MTU 1500 (tbf drops packets
larger than its burst, and lo's MTU is 65536), brought up, with a tbf qdisc (rate R, a burst of
2 ms at rate R, at least 16 KiB; latency 50 ms) or, when a delay is asked for, netem (rate R,
delay D). CMD runs as `ip netns exec NAME env GLOO_SOCKET_IFNAME=lo CMD`, bounded by a
timeout; every process left in the namespace is killed and the namespace deleted afterwards,
also on failure, timeout, SIGINT or SIGTERM. Only 127.0.0.1 is ever used: no veth, no other address.

Every byte between every pair of ranks passes the one loopback qdisc, so the namespace is a
*shared* medium of rate R (both directions and all ranks together), not a per-rank NIC.
Exit codes: CMD's own, 124 on timeout, 77 where namespaces or
tc are unavailable (one line on stderr says why).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

EXIT_UNAVAILABLE = 77
"""Exit status when `ip netns` or `tc` is missing or refused (the automake "skipped" code)."""
EXIT_TIMEOUT = 124
"""Exit status when the command ran past its timeout (as coreutils `timeout` exits)."""
DEFAULT_TIMEOUT_S = 600.0
PREFIX = "mpslow-"
BURST_S = 0.002
"""tbf's bucket holds this long at the line rate. A NIC has no bucket: a payload that fits in one
goes out at loopback speed, so a bucket of fixed bytes makes small payloads faster than the rate at
low rates only (256 KB is 2 ms at 1 Gbit/s but 20 ms at 100 Mbit/s, where it let PowerSGD's and
top-k's few hundred KB a step through 14-22 ms faster than the rate allows)."""
MIN_BURST_BYTES = 16 * 1024
"""Floor of the bucket: well above the MTU (tbf drops a packet larger than its burst)."""
MTU_BYTES = 1500
_counter = itertools.count()


class Unavailable(RuntimeError):
    """Network namespaces or tc cannot be used here; str() is the one-line reason."""


def _ip(*args: str, netns: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    """`ip ARGS` (in namespace `netns` if given; "tc ..." args run tc there)."""
    if netns is None:
        cmd = ["ip", *args]
    else:
        cmd = ["ip", "netns", "exec", netns, *args] if args[0] == "tc" else ["ip", "-n", netns, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    if check and proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        reason = lines[-1] if lines else f"exit {proc.returncode}"
        raise Unavailable(f"slow link unavailable: `{' '.join(cmd)}` failed: {reason}")
    return proc


def parse_rate_bits(rate: str) -> float:
    """Bits per second of a tc rate such as "1gbit", "200mbit", "500kbit" or "1e9" (bit/s)."""
    match = re.fullmatch(r"\s*([0-9.eE+]+)\s*(|bit|kbit|mbit|gbit)\s*", rate.lower())
    if not match:
        raise ValueError(f"rate {rate!r}: use a number with bit, kbit, mbit or gbit (e.g. 1gbit)")
    scale = {"": 1, "bit": 1, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9}[match.group(2)]
    bits = float(match.group(1)) * scale
    if bits <= 0:
        raise ValueError(f"rate {rate!r}: must be positive")
    return bits


def qdisc_args(rate_bits: float, delay_ms: float) -> list[str]:
    """tc arguments after `qdisc add dev lo root`: tbf for a rate alone, netem with a delay."""
    rate = f"{rate_bits:.0f}bit"
    if delay_ms > 0:
        return ["netem", "rate", rate, "delay", f"{delay_ms * 1e3:.0f}us"]
    burst = max(MIN_BURST_BYTES, round(rate_bits / 8 * BURST_S))
    return ["tbf", "rate", rate, "burst", f"{burst}b", "latency", "50ms"]


def _pids_in(name: str) -> list[int]:
    proc = _ip("netns", "pids", name, check=False)
    return [int(p) for p in proc.stdout.split()] if proc.returncode == 0 else []


def _kill_all_in(name: str) -> None:
    """SIGKILL every process whose network namespace is `name` (ranks may sit in own sessions)."""
    for _ in range(20):
        pids = _pids_in(name)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def delete(name: str) -> None:
    """Kill what runs in namespace `name` and delete it (a no-op when it is already gone)."""
    if name in list_namespaces():
        _kill_all_in(name)
        _ip("netns", "del", name, check=False)


def list_namespaces() -> list[str]:
    """Names of the network namespaces `ip netns list` shows."""
    proc = _ip("netns", "list", check=False)
    return [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]


def create(rate_bits: float, delay_ms: float = 0.0, one_segment: bool = False) -> str:
    """Make a throttled namespace; return its name. Raises Unavailable (and leaves nothing).
    one_segment: loopback's gso_max_segs 1, so every packet the kernel counts carries at most
    one MSS of TCP payload, as packets on an MTU-1500 wire do (lo otherwise hands the stack
    64 KiB segmentation-offload packets and counts their headers once)."""
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            raise Unavailable(f"slow link unavailable: `{tool}` not found (install iproute2)")
    name = f"{PREFIX}{os.getpid()}-{next(_counter)}"
    delete(name)  # left by a killed process whose pid this one reuses
    _ip("netns", "add", name)
    try:
        _ip("link", "set", "lo", "mtu", str(MTU_BYTES), netns=name)
        _ip("link", "set", "lo", "up", netns=name)
        if one_segment:
            _ip("link", "set", "lo", "gso_max_segs", "1", netns=name)
        qdisc = qdisc_args(rate_bits, delay_ms)
        proc = _ip("tc", "qdisc", "add", "dev", "lo", "root", *qdisc, netns=name, check=False)
        if proc.returncode != 0 and qdisc[0] == "netem":
            print(
                f"slow_link: netem refused ({proc.stderr.strip()}); delay {delay_ms} ms ignored, rate set with tbf",
                file=sys.stderr,
            )
            _ip("tc", "qdisc", "add", "dev", "lo", "root", *qdisc_args(rate_bits, 0.0), netns=name)
        elif proc.returncode != 0:
            raise Unavailable(f"slow link unavailable: tc refused ({proc.stderr.strip()})")
    except BaseException:
        delete(name)
        raise
    return name


def available() -> str:
    """ "" when a throttled namespace can be made here, else a one-line reason why not."""
    try:
        delete(create(1e9))
    except (Unavailable, OSError, subprocess.TimeoutExpired) as exc:
        reason = str(exc).strip().splitlines()
        return reason[0] if isinstance(exc, Unavailable) else f"slow link unavailable: {exc}"
    return ""


def _raise_exit(signum, frame):
    """SIGINT/SIGTERM as SystemExit(128 + signal), so that every finally-block runs."""
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def slow_link(rate_gbit: float = 1.0, delay_ms: float = 0.0, one_segment: bool = False):
    """A throttled namespace for the with-block; yields the command prefix for subprocess:
    ["ip", "netns", "exec", NAME, "env", "GLOO_SOCKET_IFNAME=lo"]. Deleted on exit, SIGTERM
    included (SIGTERM raises SystemExit inside the block when entered on the main thread).
    one_segment: as create()'s."""
    name = create(rate_gbit * 1e9, delay_ms, one_segment)
    main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_exit) if main else None
    try:
        yield ["ip", "netns", "exec", name, "env", "GLOO_SOCKET_IFNAME=lo"]
    finally:
        delete(name)
        if main:
            signal.signal(signal.SIGTERM, previous)


def run(cmd: list[str], prefix: list[str], timeout_s: float) -> int:
    """Run prefix + cmd in its own process group; on timeout kill the group, return 124."""
    proc = subprocess.Popen(prefix + cmd, start_new_session=True)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        print(f"slow_link: `{' '.join(cmd)}` timed out after {timeout_s:g} s; killed", file=sys.stderr)
        return EXIT_TIMEOUT
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _all_reduce_rank(rank: int, world: int, port: int, numel: int, iters: int, out) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    buf = torch.ones(numel)  # fp32
    dist.all_reduce(buf)  # warm-up: connections and first touch
    times = []
    for _ in range(iters):
        dist.barrier()
        start = time.perf_counter()
        dist.all_reduce(buf)
        times.append(time.perf_counter() - start)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # a collective ends when its slowest rank does
    if rank == 0:
        out.put(slowest.tolist())
    dist.destroy_process_group()


def all_reduce_seconds(num_bytes: int, nproc: int = 2, iters: int = 5, port: int = 0) -> list[float]:
    """Per-call seconds of a gloo all_reduce of `num_bytes` fp32 on `nproc` local ranks
    (max over ranks per call), in the current network namespace at 127.0.0.1."""
    import torch.multiprocessing as mp

    port = port or _free_port()
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    procs = [
        ctx.Process(target=_all_reduce_rank, args=(r, nproc, port, num_bytes // 4, iters, out)) for r in range(nproc)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    if any(p.exitcode != 0 for p in procs):
        raise RuntimeError(f"all_reduce ranks exited {[p.exitcode for p in procs]}")
    return out.get()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bus_gbit(num_bytes: int, nproc: int, seconds: float) -> float:
    """nccl-tests bus bandwidth of an all_reduce: bytes x 2(n-1)/n / time, in Gbit/s."""
    return num_bytes * 2 * (nproc - 1) / nproc * 8 / seconds / 1e9


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    cmd = argv[argv.index("--") + 1 :] if "--" in argv else []
    own = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks.slow_link", description=__doc__.split("\n")[0])
    parser.add_argument("--rate", default="1gbit", help="link rate, as tc spells it (default 1gbit)")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one-way delay; uses netem (default 0: tbf)")
    parser.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S, help="kill CMD after this")
    parser.add_argument("--all-reduce-mib", type=float, help="without CMD: time a gloo all_reduce here")
    parser.add_argument("--nproc", type=int, default=2, help="ranks for --all-reduce-mib (default 2)")
    parser.add_argument("--iters", type=int, default=5, help="timed calls for --all-reduce-mib")
    parser.add_argument("--json", action="store_true", help="--all-reduce-mib: print the seconds as JSON")
    args = parser.parse_args(own)
    if not cmd and args.all_reduce_mib is None:
        parser.error("give a command after -- (or --all-reduce-mib to measure the current network)")
    return args, cmd


def _measure(args: argparse.Namespace) -> int:
    num_bytes = int(args.all_reduce_mib * 2**20)
    times = sorted(all_reduce_seconds(num_bytes, args.nproc, args.iters))
    median = times[len(times) // 2]
    if args.json:
        print(json.dumps({"bytes": num_bytes, "nproc": args.nproc, "seconds": times}))
        return 0
    print(
        f"all_reduce {args.all_reduce_mib:g} MiB fp32, {args.nproc} ranks: median {median * 1e3:.0f} ms "
        f"(min {times[0] * 1e3:.0f}, max {times[-1] * 1e3:.0f}), bus bandwidth "
        f"{bus_gbit(num_bytes, args.nproc, median):.2f} Gbit/s"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    args, cmd = _parse(sys.argv[1:] if argv is None else argv)
    if not cmd:
        return _measure(args)
    signal.signal(signal.SIGINT, _raise_exit)
    try:
        with slow_link(parse_rate_bits(args.rate) / 1e9, args.delay_ms) as prefix:
            return run(cmd, prefix, args.timeout_s)
    except Unavailable as exc:
        print(str(exc).splitlines()[0], file=sys.stderr)
        return EXIT_UNAVAILABLE
    except ValueError as exc:
        print(f"slow_link: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

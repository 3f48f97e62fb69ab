"""Bytes on the wire as the kernel counts them, against the cost model's prediction.

    python -m benchmarks.kernel_bytes [--rate 1gbit] [--nproc 4] [--steps 4,8] [--methods none,fp16,...]
                                      [--out F.json] [--markdown]

The executor's byte counter and the planner both turn payloads into wire bytes through
meshplan/comm_bytes.py, so "counted = predicted" checks one formula against itself. This
measurement shares no code with either: it reads the Linux interface counters of a throttled
network namespace (benchmarks/slow_link.py) in which the ranks run.

- One namespace per call, loopback only, MTU 1500, tbf at --rate, and gso_max_segs 1 so every
  packet the kernel counts carries at most one TCP segment (as on an MTU-1500 wire; lo would
  otherwise count one header per 64 KiB offload packet).
- Per method, `meshplan run` of the same plan twice in that namespace, S1 and S2 steps; the
  namespace's counters (/sys/class/net/lo/statistics: tx_bytes, tx_packets; /proc/net/snmp: TCP
  RetransSegs) are read before and after each launch. Both launches do the same rendezvous,
  initial parameter broadcast, final loss all-reduce and teardown, so
  (delta(S2) - delta(S1)) / (S2 - S1) is the steady-state traffic of one step, all ranks
  together. Loopback carries each packet once (its tx and rx counters are equal).

Framing model (TCP over IPv4, Linux defaults: timestamps on, no other options):
- every packet carries H = 20 (IPv4) + 20 (TCP) + 12 (timestamp option) = 52 bytes of header;
  lo counts the IP packet (a physical Ethernet wire adds 38 bytes per frame: header, FCS,
  preamble, gap; not counted here)
- MSS = MTU - H = 1448 payload bytes per full data segment
- payload W bytes need at least ceil(W / MSS) data segments
- ACKs: 52 bytes each, at most one per two full segments (RFC 1122's delayed ACK; Linux often
  acknowledges less often when the receiver reads late)
So the framed bytes lie in [W + H ceil(W / MSS), W + 1.5 H ceil(W / MSS)], plus per message a
partial last segment and its ACK that the model does not count (it knows no message count):
rows whose payload comes in many small messages sit above the band by that.

W = N x the cost model's per-rank wire bytes per step (estimate()'s comm_bytes_per_step, its
network axes; host_device and nvme are not on the network). Each row: predicted payload, framed
band, measured bytes and packets per step, retransmitted segments per step (a retransmission
repeats bytes the model does not predict: such a row is flagged), measured / band midpoint.
Bounded: --timeout-s per launch. Exit 77 with one line where namespaces are unavailable.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks import slow_link

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEADER_BYTES = 20 + 20 + 12
"""IPv4 + TCP + timestamp option, per packet."""
MSS = slow_link.MTU_BYTES - HEADER_BYTES
ACKS_PER_SEGMENT_MAX = 0.5
"""Delayed ACK: at most one ACK per two full segments (RFC 1122 4.2.3.2)."""
NETWORK_FREE_AXES = ("host_device", "nvme")
METHODS = [
    ("none", {}),
    ("fp16", {}),
    ("powersgd", {"rank": 2}),
    ("accordion", {"window": 3}),
    ("topk", {"density": 0.01}),
    ("topk", {"density": 0.001}),
    ("qsgd", {"bits": 4}),
    ("nuqsgd", {"bits": 4}),
    ("alq", {"bits": 3, "refit_every": 4}),
]


def framed_band(payload: float) -> tuple[float, float]:
    """(low, high) bytes the kernel counts for `payload` bytes of TCP payload (module docstring)."""
    segments = math.ceil(payload / MSS)
    return payload + HEADER_BYTES * segments, payload + HEADER_BYTES * segments * (1 + ACKS_PER_SEGMENT_MAX)


def without_resends(kernel_bytes: float, retrans_segments: float) -> tuple[float, float]:
    """(low, high) of the bytes the kernel carried less its retransmissions: each resent segment
    is a packet of at least a header (H, a probe of one byte rounds to it) and at most a full
    segment (MSS + H). RetransSegs counts segments, not bytes, hence an interval; both ends come
    from the kernel's own counters, none from the cost model. The count is a difference of two
    launches' and can be negative (the shorter launch resent more): the bytes then go back in."""
    ends = (kernel_bytes - retrans_segments * (MSS + HEADER_BYTES), kernel_bytes - retrans_segments * HEADER_BYTES)
    return min(ends), max(ends)


def read_counters(netns: str) -> dict[str, int]:
    """The namespace's loopback tx/rx bytes and packets and TCP RetransSegs, from the kernel."""
    stats = "/sys/class/net/lo/statistics/"
    files = [stats + f for f in ("tx_bytes", "tx_packets", "rx_bytes")] + ["/proc/net/snmp"]
    proc = subprocess.run(
        ["ip", "netns", "exec", netns, "cat", *files], capture_output=True, text=True, timeout=30, check=True
    )
    lines = proc.stdout.splitlines()
    tcp = [line.split() for line in lines if line.startswith("Tcp:")]
    retrans = int(tcp[1][tcp[0].index("RetransSegs")])
    return {"tx_bytes": int(lines[0]), "tx_packets": int(lines[1]), "rx_bytes": int(lines[2]), "retrans": retrans}


def _plan(nproc: int, name: str, params: dict):
    sys.path.insert(0, os.path.join(ROOT, "tests"))
    from executor_plans import make_plan

    return make_plan(dp=nproc, microbatch=4, compression=name, compression_params=params)


def predicted_payload(plan) -> float:
    """All ranks' predicted network bytes per step: N x estimate()'s per-rank network axes."""
    from meshplan.planner import PlanRequest, estimate
    from meshplan.presets import local_cpu
    from meshplan.profiler import profile_model

    profile = profile_model(plan.model_name, dict(plan.model_config), device="meta")
    req = PlanRequest(
        num_gpus=plan.world_size,
        global_batch=plan.global_batch_size,
        precision=plan.precision,
        dp=plan.data_parallel_degree,
        dp_shard=plan.data_parallel_shard_degree,
        microbatch=plan.microbatch_size,
        zero=plan.zero_stage,
        methods={axis: (c.name, dict(c.params)) for axis, c in plan.dp_methods.items()},
    )
    per_rank = estimate(profile, local_cpu(plan.world_size), req).prediction.comm_bytes_per_step
    return plan.world_size * sum(v for axis, v in per_rank.items() if axis not in NETWORK_FREE_AXES)


def _launch(prefix: list[str], plan_path: str, steps: int, out_dir: str, timeout_s: float) -> None:
    cmd = [sys.executable, "-m", "meshplan", "run", plan_path, "--steps", str(steps), "--optimizer", "sgd"]
    cmd += ["--out-dir", out_dir, "--overwrite", "--quiet", "--json", "--timeout", str(timeout_s)]
    proc = subprocess.run(prefix + cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s + 60)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"meshplan run exited {proc.returncode}: {' | '.join(tail)}")


def per_step(netns: str, steps: tuple[int, int], launch) -> dict:
    """Steady-state kernel counters per step: `launch(s)` runs s steps in the namespace `netns`, once
    for each of the two step counts; the counters read around each launch, differenced (module docstring)."""
    deltas = []
    for s in steps:
        before = read_counters(netns)
        launch(s)
        after = read_counters(netns)
        deltas.append({k: after[k] - before[k] for k in after})
    extra = steps[1] - steps[0]
    return {k: (deltas[1][k] - deltas[0][k]) / extra for k in deltas[0]}


def measure(plan, prefix: list[str], steps: tuple[int, int], timeout_s: float) -> dict:
    """Steady-state kernel counters per step of `plan` in the namespace `prefix` runs in."""
    from meshplan import schema

    with tempfile.TemporaryDirectory(prefix="meshplan-kbytes-") as tmp:
        path = os.path.join(tmp, "plan.json")
        with open(path, "w") as fh:
            fh.write(schema.dumps(plan))
        return per_step(prefix[3], steps, lambda s: _launch(prefix, path, s, os.path.join(tmp, f"run{s}"), timeout_s))


def run_bench(
    rate: str = "1gbit",
    nproc: int = 4,
    steps: tuple[int, int] = (4, 8),
    methods: list[tuple[str, dict]] | None = None,
    timeout_s: float = 300,
) -> dict:
    rows = []
    with slow_link.slow_link(slow_link.parse_rate_bits(rate) / 1e9, one_segment=True) as prefix:
        for name, params in methods or METHODS:
            plan = _plan(nproc, name, params)
            payload = predicted_payload(plan)
            got = measure(plan, prefix, steps, timeout_s)
            low, high = framed_band(payload)
            rows.append(
                {
                    "method": name,
                    "params": params,
                    "payload_bytes": payload,
                    "framed_low": low,
                    "framed_high": high,
                    "kernel_bytes": got["tx_bytes"],
                    "kernel_rx_bytes": got["rx_bytes"],
                    "kernel_packets": got["tx_packets"],
                    "data_segments": math.ceil(payload / MSS),
                    "retrans_segments": got["retrans"],
                    "ratio_to_mid": got["tx_bytes"] / ((low + high) / 2),
                    "in_band": low <= got["tx_bytes"] <= high,
                }
            )
    load = list(os.getloadavg())
    return {"rate": rate, "nproc": nproc, "steps": list(steps), "rows": rows, "load_average": load}


def bench_section(quick: bool, say) -> dict:
    """benchmarks/run.py's section: 2 ranks, DDP and QSGD when quick; else 4 ranks, every row."""
    reason = slow_link.available()
    if reason:
        say(f"  kernel_bytes skipped: {reason}")
        return {"skipped": reason}
    if quick:
        return run_bench("1gbit", 2, (2, 4), [m for m in METHODS if m[0] in ("none", "qsgd")])
    return run_bench("1gbit", 4, (3, 6))


def _meets(row: dict) -> bool:
    """The bytes less retransmissions (an interval) overlap the framed band."""
    lo, hi = without_resends(row["kernel_bytes"], row["retrans_segments"])
    return lo <= row["framed_high"] and hi >= row["framed_low"]


def _label(row: dict) -> str:
    params = ",".join(f"{k}={v}" for k, v in row["params"].items())
    return f"{row['method']}" + (f" ({params})" if params else "")


def markdown(result: dict) -> str:
    """The benchmark table (reports/benchmarks.md)."""
    if "skipped" in result:
        return f"Not measured: {result['skipped']}.\n"
    head = (
        f"gpt-tiny, {result['nproc']} gloo ranks in one namespace at {result['rate']} (tbf, MTU 1500, "
        f"gso_max_segs 1); steady state = launches of {result['steps'][0]} and {result['steps'][1]} steps, "
        "differenced; bytes are all ranks together per step"
        + (
            f"; load average {result['load_average'][0]:.1f} on {os.cpu_count()} cores"
            if "load_average" in result
            else ""
        )
        + " (bytes do not depend on it).\n\n"
        "| method | predicted payload | framed band (H 52 B, MSS 1448, ACKs 0..1/2) | kernel tx bytes "
        "| measured / band mid | packets (data segments predicted) | retransmitted segments "
        "| less retransmissions | meets the band then |\n"
        "|---|---:|---:|---:|---:|---:|---:|---:|---|\n"
    )
    lines = []
    for r in result["rows"]:
        lo, hi = without_resends(r["kernel_bytes"], r["retrans_segments"])
        flag = "" if r["in_band"] else (" (above)" if r["kernel_bytes"] > r["framed_high"] else " (below)")
        lines.append(
            f"| {_label(r)} | {r['payload_bytes']:,.0f} | {r['framed_low']:,.0f} .. {r['framed_high']:,.0f} "
            f"| {r['kernel_bytes']:,.0f}{flag} | {r['ratio_to_mid']:.3f} | {r['kernel_packets']:,.0f} "
            f"({r['data_segments']:,}) | {r['retrans_segments']:,.1f} | {lo:,.0f} .. {hi:,.0f} "
            f"| {'yes' if _meets(r) else 'no'} |"
        )
    errors = [abs(r["ratio_to_mid"] - 1) for r in result["rows"]]
    tail = f"\nMean |measured / band mid - 1|: {statistics.fmean(errors):.1%}; in band: " + (
        f"{sum(r['in_band'] for r in result['rows'])} of {len(result['rows'])}; meeting it once the "
        f"kernel's retransmissions are taken out: {sum(_meets(r) for r in result['rows'])} of "
        f"{len(result['rows'])}.\n"
    )
    reading = (
        "\nReading: a row above the band sends its payload as many small messages (PowerSGD's "
        "factors, top-k at 0.1%, Accordion's per-tensor exchanges): each message adds a partial last "
        "segment, gloo's message preamble and an ACK, which the framing model does not count (it knows "
        "no message count); the packets column shows them beyond the predicted data segments. "
        "Retransmitted segments are bytes the kernel really carried and the model does not predict "
        "(on this loopback mostly tail-loss probes: the last segment of a small message re-sent when "
        "a busy rank acknowledges it late, so their count moves with the host's scheduling); the last "
        "two columns take them out, from the kernel's own counters, as an interval (a resent segment "
        "is a header to a full segment). Large payloads (DDP, fp16, the quantizers) land in the "
        "band: the cost model's wire bytes are what the kernel carries, to within the framing.\n"
    )
    note = f"\nNote: {result['repriced']}.\n" if result.get("repriced") else ""
    return head + "\n".join(lines) + "\n" + tail + reading + note


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.kernel_bytes", description=__doc__.split("\n")[0])
    ap.add_argument("--rate", default="1gbit")
    ap.add_argument("--nproc", type=int, default=4)
    ap.add_argument("--steps", default="4,8", help="S1,S2: the two launches' step counts (S2 > S1)")
    ap.add_argument("--methods", help="comma-separated registry names (default: the module's list)")
    ap.add_argument("--timeout-s", type=float, default=300, help="per launch")
    ap.add_argument("--out", help="write the JSON result here")
    ap.add_argument("--markdown", action="store_true", help="print the table")
    args = ap.parse_args(argv)
    s1, s2 = (int(x) for x in args.steps.split(","))
    if not 1 <= s1 < s2:
        print(f"--steps {args.steps}: need 1 <= S1 < S2", file=sys.stderr)
        return 2
    methods = None
    if args.methods:
        wanted = args.methods.split(",")
        methods = [m for m in METHODS if m[0] in wanted] or [(n, {}) for n in wanted]
    try:
        result = run_bench(args.rate, args.nproc, (s1, s2), methods, args.timeout_s)
    except slow_link.Unavailable as exc:
        print(str(exc).splitlines()[0], file=sys.stderr)
        return slow_link.EXIT_UNAVAILABLE
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)
    print(markdown(result) if args.markdown else json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

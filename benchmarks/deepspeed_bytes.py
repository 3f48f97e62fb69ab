"""Bytes real DeepSpeed puts on the wire per step, counted by the kernel, against meshplan's
--runtime deepspeed prediction.

    python -m benchmarks.deepspeed_bytes [--nproc 2] [--steps 2,6] [--rate 1gbit] [--out F.json]

meshplan prices DeepSpeed's gradient reduction from its source (docs/runtimes.md: stage 0's
all-reduce, ZeRO-1's all-reduce and 16-bit weight gather, ZeRO-2's whole-bucket all-reduce every
micro-step and its one gather after the step). This checks those byte counts against DeepSpeed
itself: benchmarks/deepspeed_worker.py runs the installed DeepSpeed (the export tools' venv,
.venv-exports: `make export-tools`) on CPU ranks over gloo, training benchmarks/deepspeed_model.py,
inside a throttled loopback namespace (benchmarks/slow_link.py) whose interface counters the
kernel keeps, as benchmarks/kernel_bytes.py does for meshplan's own executor. Nothing here shares
code with the cost model but the model's definition.

Per row, one launch of S2 optimizer steps (M micro-steps each); the namespace's lo counters are
read after step S1 and after step S2, with every rank held at a barrier (deepspeed_worker.py), and
their difference over S2 - S1 is one steady-state step, all ranks together (two gloo barriers
beside it: a few hundred bytes). The TCP
payload the kernel carried is its bytes less one 52-byte header per counted packet
(kernel_bytes.HEADER_BYTES); the prediction is N x estimate()'s per-rank network bytes per step
(`comm_bytes_per_step`), for the same model, batch, accumulation and ZeRO stage. Besides the
priced collectives a DeepSpeed step sends a few scalars (the gradient norm, the loss) and gloo its
store's keep-alives: a few KiB, which the comparison allows.

Exit 77 with one line where namespaces or the tools' venv are unavailable.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

from benchmarks import kernel_bytes, slow_link

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS_PYTHON = os.path.join(ROOT, ".venv-exports", "bin", "python")
WORKER = os.path.join(ROOT, "benchmarks", "deepspeed_worker.py")
MODEL = os.path.join(ROOT, "benchmarks", "deepspeed_model.py") + ":build"
MICRO_BATCH, ACCUMULATION = 4, 2
PORT = 29600
ROWS = [
    ("stage 0", 0, {}, []),
    ("ZeRO-1", 1, {}, []),
    ("ZeRO-2", 2, {}, []),
    ("ZeRO-3", 3, {}, []),
    (
        "ZeRO-2, use_multi_rank_bucket_allreduce false",
        2,
        {"use_multi_rank_bucket_allreduce": False},
        ["--zero2-grad-collective", "reduce_scatter"],
    ),
]
"""(label, zero stage, DeepSpeed zero_optimization keys beyond the defaults, the meshplan flags that
price them)."""


def predicted_payload(stage: int, nproc: int, flags: list[str]) -> float:
    """All ranks' predicted network bytes per step (N x the per-rank network axes)."""
    from meshplan.inputs import from_argv, resolve
    from meshplan.planner import estimate

    argv = ["--model", MODEL, "--cluster", "a100-80g", "--num-gpus", str(nproc)]
    argv += ["--global-batch", str(nproc * MICRO_BATCH * ACCUMULATION), "--runtime", "deepspeed", "--tp", "1"]
    argv += ["--pp", "1", "--dp", str(nproc), "--zero", str(stage), "--microbatch", str(MICRO_BATCH)]
    argv += ["--schedule", "1f1b", "--recompute", "none", "--precision", "bf16", *flags]
    got = resolve(from_argv(argv, "estimate"))
    per_rank = estimate(got.profile, got.cluster, got.request).prediction.comm_bytes_per_step
    return nproc * sum(v for axis, v in per_rank.items() if axis not in kernel_bytes.NETWORK_FREE_AXES)


def measure(prefix: list[str], spec: dict, steps: tuple[int, int], nproc: int, timeout_s: float) -> dict:
    """Steady-state kernel counters per step of one launch, with rank 0's last report: the nproc
    DeepSpeed ranks run in the namespace for steps[1] steps, and its counters are read when rank 0
    marks steps[0] and steps[1] done. Kills them all on timeout or when a rank fails."""
    env = ["MASTER_ADDR=127.0.0.1", f"MASTER_PORT={PORT}", f"WORLD_SIZE={nproc}", "OMP_NUM_THREADS=1"]
    env += ["PYTHONPATH=", "PYTHONWARNINGS=ignore"]
    procs = []
    counters: list[dict[str, int]] = []
    with tempfile.TemporaryDirectory(prefix="meshplan-dsbytes-") as tmp:
        try:
            for rank in range(nproc):
                cmd = [*prefix, *env, f"RANK={rank}", f"LOCAL_RANK={rank}", TOOLS_PYTHON, WORKER]
                cmd += [json.dumps(spec), ",".join(map(str, steps)), tmp]
                out = open(os.path.join(tmp, f"rank{rank}.log"), "w")
                procs.append((subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True), out))
            deadline = time.monotonic() + timeout_s
            while any(p.poll() is None for p, _ in procs):
                if any(p.returncode not in (None, 0) for p, _ in procs):
                    break
                if time.monotonic() > deadline:
                    raise subprocess.TimeoutExpired(WORKER, timeout_s)
                k = len(counters)
                if os.path.exists(os.path.join(tmp, f"mark{k}")):
                    counters.append(kernel_bytes.read_counters(prefix[3]))
                    open(os.path.join(tmp, f"ack{k}"), "w").close()
                time.sleep(0.02)
        finally:
            for proc, out in procs:
                if proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                out.close()
        logs = [open(os.path.join(tmp, f"rank{r}.log")).read() for r in range(nproc)]
    failed = [(r, p.returncode) for r, (p, _) in enumerate(procs) if p.returncode != 0]
    if failed:
        rank, code = failed[0]
        tail = " | ".join(logs[rank].strip().splitlines()[-3:])
        raise RuntimeError(f"DeepSpeed rank {rank} exited {code}: {tail}")
    if len(counters) != 2:
        raise RuntimeError(f"DeepSpeed's ranks exited after {len(counters)} of 2 counter marks")
    lines = [line for line in logs[0].splitlines() if line.startswith("{")]
    extra = steps[1] - steps[0]
    per_step = {k: (counters[1][k] - counters[0][k]) / extra for k in counters[0]}
    return {**per_step, **(json.loads(lines[-1]) if lines else {})}


def build_cpu_ops(timeout_s: float) -> None:
    """Compile DeepSpeed's CPU shared-memory comm op once, in one process, before the ranks start:
    each rank's TorchBackend loads it (deepspeed/comm/torch.py build_shm_op), and two ranks compiling
    it at once into the same torch_extensions folder can abort one of them. Cached after the first
    build (about 30 s on 2 cores); it carries no training traffic (inference_all_reduce only)."""
    code = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
    proc = subprocess.run(
        [TOOLS_PYTHON, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**os.environ, "PYTHONPATH": ""},
    )
    if proc.returncode != 0:
        tail = " | ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise RuntimeError(f"building DeepSpeed's CPU comm op exited {proc.returncode}: {tail}")


def unavailable() -> str:
    """'' where the benchmark can run, else the one-line reason."""
    if not os.path.exists(TOOLS_PYTHON):
        return f"DeepSpeed bytes unavailable: {TOOLS_PYTHON} missing (run `make export-tools`)"
    return slow_link.available()


def run_bench(
    nproc: int = 2, steps: tuple[int, int] = (2, 6), rate: str = "1gbit", rows=None, timeout_s: float = 300
) -> dict:
    out = []
    build_cpu_ops(timeout_s)
    with slow_link.slow_link(slow_link.parse_rate_bits(rate) / 1e9, one_segment=True) as prefix:
        for label, stage, zero, flags in rows or ROWS:
            spec = {"stage": stage, "micro_batch": MICRO_BATCH, "accumulation": ACCUMULATION, "zero": zero}
            payload = predicted_payload(stage, nproc, flags)
            got = measure(prefix, spec, steps, nproc, timeout_s)
            carried = got["tx_bytes"] - kernel_bytes.HEADER_BYTES * got["tx_packets"]
            out.append(
                {
                    "row": label,
                    "zero_stage": stage,
                    "zero_optimization": zero,
                    "meshplan_flags": flags,
                    "deepspeed_optimizer": got.get("optimizer"),
                    "predicted_payload_bytes": payload,
                    "kernel_bytes": got["tx_bytes"],
                    "kernel_packets": got["tx_packets"],
                    "carried_payload_bytes": carried,
                    "retrans_segments": got["retrans"],
                    "carried_over_predicted": carried / payload if payload else None,
                }
            )
    return {"nproc": nproc, "steps": list(steps), "rate": rate, "rows": out, "load_average": list(os.getloadavg())}


def bench_section(quick: bool, say) -> dict:
    """benchmarks/run.py's section: 2 ranks; quick: stage 0 and ZeRO-2 only."""
    reason = unavailable()
    if reason:
        say(f"  deepspeed_bytes skipped: {reason}")
        return {"skipped": reason}
    rows = [r for r in ROWS if r[0] in ("stage 0", "ZeRO-2")] if quick else ROWS
    return run_bench(2, (2, 6), rows=rows)


def markdown(result: dict) -> str:
    """The benchmark table (reports/benchmarks.md)."""
    if "skipped" in result:
        return f"Not measured: {result['skipped']}.\n"
    lines = [
        f"DeepSpeed on {result['nproc']} CPU ranks (gloo), counters read after steps {result['steps']} of one launch, "
        f"{ACCUMULATION} micro-steps each, {result['rate']} loopback; bytes per step, all ranks. Carried payload = "
        "kernel bytes less one 52-byte header per packet; less resends = that less one MSS (1448 B) per "
        "segment the kernel retransmitted (tbf drops under bursts):",
        "",
        "| run | DeepSpeed optimizer | predicted payload | kernel bytes | carried payload | retransmitted segments "
        "| carried less resends | (carried less resends) / predicted |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        net = r["carried_payload_bytes"] - r["retrans_segments"] * kernel_bytes.MSS
        lines.append(
            f"| {r['row']} | {r['deepspeed_optimizer']} | {r['predicted_payload_bytes']:,.0f} | {r['kernel_bytes']:,.0f} "
            f"| {r['carried_payload_bytes']:,.0f} | {r['retrans_segments']:,.1f} | {net:,.0f} "
            f"| {net / r['predicted_payload_bytes']:.4f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.deepspeed_bytes", description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--steps", default="2,6", help="the steps after which the counters are read, e.g. 2,6")
    parser.add_argument("--rate", default="1gbit")
    parser.add_argument("--timeout-s", type=float, default=300)
    parser.add_argument("--out", help="write the result JSON here")
    args = parser.parse_args(argv)
    reason = unavailable()
    if reason:
        print(reason, file=sys.stderr)
        return slow_link.EXIT_UNAVAILABLE
    s1, s2 = (int(x) for x in args.steps.split(","))
    result = run_bench(args.nproc, (s1, s2), args.rate, timeout_s=args.timeout_s)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=2)
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

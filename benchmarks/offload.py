"""Offload and scheduling methods on 2 gloo ranks (gpt-tiny, few steps): measured vs predicted
step time and bytes per step for DDP, offload=cpu, offload=nvme (state files on the local disk
under the run directory) and bytescheduler; and the local disk's write/read bandwidth, which the
local-cpu preset's nominal nvme link (0.5 GB/s) stands in for.

    python -m benchmarks.offload [--steps 6] [--out runs/bench_offload]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path


def disk_gbps(folder: Path, nbytes: int = 64 * 2**20) -> tuple[float, float]:
    """(write, read) GB/s of one file of nbytes, fsynced; the read may come from the page cache."""
    data = os.urandom(nbytes)
    path = folder / "disk_probe.bin"
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    write = nbytes / (time.perf_counter() - t0) / 1e9
    t0 = time.perf_counter()
    path.read_bytes()
    read = nbytes / (time.perf_counter() - t0) / 1e9
    path.unlink()
    return write, read


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from executor_plans import make_plan

    from meshplan import dp_methods
    from meshplan.executor.launch import LaunchOptions, run_plans
    from meshplan.plan import MethodChoice
    from meshplan.planner import PlanRequest, estimate
    from meshplan.presets import local_cpu
    from meshplan.profiler import profile_model

    def with_(plan, axis, name, params=None):
        setattr(
            plan.dp_methods,
            axis,
            MethodChoice(name=name, params=dp_methods.method(axis, name).resolve(params or {}, axis)),
        )
        return plan

    plans = {
        "ddp": make_plan(dp=2),
        "offload=cpu": with_(make_plan(dp=2), "offload", "cpu"),
        "offload=nvme": with_(make_plan(dp=2), "offload", "nvme"),
        "bytescheduler": with_(make_plan(dp=2), "comm_schedule", "bytescheduler"),
    }
    out = Path(args.out or tempfile.mkdtemp(prefix="bench_offload_"))
    out.mkdir(parents=True, exist_ok=True)
    write, read = disk_gbps(out)
    print(f"local disk under {out}: write {write:.2f} GB/s (fsync), read {read:.2f} GB/s")
    results = run_plans(
        list(plans.values()),
        LaunchOptions(steps=args.steps, out_dir=str(out), quiet=True, timeout_s=300, optimizer="adamw"),
    )
    profile = profile_model("gpt-tiny", {}, device="meta")
    print(f"{'method':16} {'measured s':>11} {'predicted s':>12} {'measured bytes/step':>40}")
    for (name, plan), r in zip(plans.items(), results):
        methods = {a: (c.name, dict(c.params)) for a, c in plan.dp_methods.items()}
        req = PlanRequest(
            num_gpus=2,
            global_batch=plan.global_batch_size,
            precision="fp32",
            tp=1,
            pp=1,
            dp=2,
            microbatch=plan.microbatch_size,
            zero=plan.zero_stage,
            methods=methods,
        )
        pred = estimate(profile, local_cpu(2), req).prediction
        ok = "=" if pred.comm_bytes_per_step == r.comm_bytes_per_step else "!= predicted"
        print(f"{name:16} {r.step_time_s:11.4f} {pred.step_time_s:12.4f} {str(r.comm_bytes_per_step):>40} {ok}")
    left = list(out.rglob("*.bin"))
    print(f"state files left after the runs: {len(left)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

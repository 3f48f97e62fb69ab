"""Offload and scheduling methods on 4 gloo ranks: predicted vs measured step time and
memory for DDP, offload=cpu, offload=nvme, ZeRO-3 with each (and with the parameter shards on
NVMe too: offload=nvme params=true), and bytescheduler.

    python -m benchmarks.offload [--steps 6] [--quick] [--out DIR] [--json F.json]
    from benchmarks import offload as o; print(o.markdown(o.run_bench(steps=6)))

Model: the zoo's gpt family at hidden 384 (4 blocks, heads 6, vocab 256, seq 32: ~7.2M
parameters, 57 MiB of fp32 Adam states per unsharded rank, enough to show in a process's resident
memory), AdamW, microbatch 2. First the links are measured on 4 ranks with `profile_links`
(collectives, host memory copy, and the disk under the run directory, where offload=nvme's state
files go), then the model is profiled on this CPU as 4 ranks share it; every plan is predicted
by estimate() on that measured ClusterSpec with that profile, and run in its own 4-rank launch
(its own processes, so each rank's peak resident set is its own): the NVMe files on the local
disk under the run directory. Per method: median step time after the first two steps and the
prediction; the peak memory the executor's live-tensor tracker saw (max over ranks) and the
prediction's peak; each rank's peak resident set (VmHWM, sampled from /proc while it runs) and
its difference from DDP's; bytes per step and rank counted vs predicted (host_device, nvme
included). Entry points: `run_bench(steps, quick, out, say) -> dict`, `markdown(result) -> str`,
`bench_section(quick, say)` for benchmarks/run.py (quick: DDP, cpu, nvme, 4 steps).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NUM_RANKS = 4
CONFIG = {"layers": 4, "hidden": 384, "heads": 6, "vocab": 256, "seq": 32}
MICROBATCH = 2
PLANS = [
    # (label, make_plan kwargs, {axis: (name, params)})
    ("ddp", {"dp": NUM_RANKS}, {}),
    ("offload=cpu", {"dp": NUM_RANKS}, {"offload": ("cpu", {})}),
    ("offload=nvme", {"dp": NUM_RANKS}, {"offload": ("nvme", {})}),
    ("zero3", {"dp_shard": NUM_RANKS, "zero": 3}, {}),
    ("zero3 offload=cpu", {"dp_shard": NUM_RANKS, "zero": 3}, {"offload": ("cpu", {})}),
    ("zero3 offload=nvme", {"dp_shard": NUM_RANKS, "zero": 3}, {"offload": ("nvme", {})}),
    ("zero3 offload=nvme params", {"dp_shard": NUM_RANKS, "zero": 3}, {"offload": ("nvme", {"params": True})}),
    ("bytescheduler", {"dp": NUM_RANKS}, {"comm_schedule": ("bytescheduler", {})}),
]
QUICK = ("ddp", "offload=cpu", "offload=nvme")
PROFILES = "before and after the launches"
"""The host is shared and its load moves over the minutes the launches take: the CPU profile is
taken right before them and again right after, and each row is predicted with both (the mean is
`predicted_step_s`, the two `predicted_step_s_profiles`), so the calibration brackets the load the
runs saw instead of one moment of it."""


def _plan(kwargs: dict, methods: dict):
    sys.path.insert(0, str(ROOT / "tests"))
    from executor_plans import make_plan

    from meshplan import dp_methods
    from meshplan.plan import MethodChoice

    plan = make_plan("gpt", config=CONFIG, microbatch=MICROBATCH, **kwargs)
    for axis, (name, params) in methods.items():
        resolved = dp_methods.method(axis, name).resolve(params, axis)
        setattr(plan.dp_methods, axis, MethodChoice(name=name, params=resolved))
    plan.validate()
    return plan


def _predict(plan, profile, cluster):
    from meshplan.planner import PlanRequest, estimate

    req = PlanRequest(
        num_gpus=plan.world_size,
        global_batch=plan.global_batch_size,
        precision="fp32",
        tp=1,
        pp=1,
        dp=plan.world_size,
        dp_shard=plan.world_size if plan.zero_stage >= 2 else None,
        microbatch=plan.microbatch_size,
        zero=plan.zero_stage,
        methods={a: (c.name, dict(c.params)) for a, c in plan.dp_methods.items()},
    )
    return estimate(profile, cluster, req)


class RssSampler:
    """Peak resident set (VmHWM) of every executor rank below this process, sampled every 50 ms."""

    def __init__(self):
        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from meshplan.profiler.links import _descendants

        while not self._stop.wait(0.05):
            for pid in _descendants(os.getpid()):
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    if b"meshplan.executor.worker" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                        continue
                except OSError:
                    continue
                hwm = next((line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")), None)
                if hwm is not None:
                    self.peaks[pid] = max(self.peaks.get(pid, 0), int(hwm) * 1024)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        return False


def _run(plan, steps: int, out: Path, timeout_s: float):
    from meshplan.executor.launch import LaunchOptions, run_plans

    opts = LaunchOptions(steps=steps, out_dir=str(out), quiet=True, timeout_s=timeout_s, optimizer="adamw")
    with RssSampler() as rss:
        result = run_plans([plan], opts)[0]
    return result, sorted(rss.peaks.values())


def _row(label, plan, result, rss, prediction, steps, predicted_steps: list[float] | None = None) -> dict:
    pred = prediction.prediction
    times = result.step_times_s[2:] if len(result.step_times_s) > 2 else result.step_times_s
    predicted_steps = predicted_steps or [pred.step_time_s]
    return {
        "method": label,
        "measured_step_s": statistics.median(times),
        "predicted_step_s": statistics.fmean(predicted_steps),
        "predicted_step_s_profiles": predicted_steps,
        "measured_tensor_peak_bytes": result.peak_memory_bytes,
        "predicted_peak_bytes": pred.peak_memory_bytes,
        "rss_peak_bytes": max(rss) if rss else 0,
        "rss_ranks": len(rss),
        "measured_bytes": result.comm_bytes_per_step,
        "predicted_bytes": pred.comm_bytes_per_step,
        "loss": result.losses[-1],
        "steps": steps,
        "load_avg_1min": os.getloadavg()[0],
    }


def _links(out: Path, say):
    from meshplan.profiler.links import profile_links

    start = time.perf_counter()
    cluster = profile_links(NUM_RANKS, max_bytes=4 * 2**20, repeats=3, disk_dir=str(out), disk_bytes=64 * 2**20)
    say(f"  links on {NUM_RANKS} ranks ({time.perf_counter() - start:.0f} s): {cluster.source}")
    return cluster, time.perf_counter() - start


def _profile(say):
    from meshplan.profiler import profile_model

    start = time.perf_counter()
    profile = profile_model(
        "gpt", dict(CONFIG), device="cpu", microbatch_sizes=[MICROBATCH], concurrent=NUM_RANKS, in_place=False
    )
    say(f"  profiled gpt h{CONFIG['hidden']} on this CPU ({time.perf_counter() - start:.0f} s)")
    return profile, time.perf_counter() - start


def run_bench(steps: int = 6, quick: bool = False, out: str | None = None, say=print, timeout_s: float = 600) -> dict:
    """The benchmark (module docstring); wall seconds in `runtime_s`."""
    start = time.perf_counter()
    root = Path(out or tempfile.mkdtemp(prefix="bench_offload_"))
    root.mkdir(parents=True, exist_ok=True)
    cluster, links_s = _links(root, say)
    profile, profile_s = _profile(say)
    profile_load = os.getloadavg()[0]  # the host is shared: a profile taken under load predicts slow steps
    runs = []
    for label, kwargs, methods in PLANS:
        if quick and label not in QUICK:
            continue
        plan = _plan(kwargs, methods)
        say(f"  {label}: {steps} steps on {NUM_RANKS} ranks")
        result, rss = _run(plan, steps, root / label.replace(" ", "_").replace("=", "-"), timeout_s)
        runs.append((label, plan, result, rss, os.getloadavg()[0]))
    # the launches ran between two profiles: each prediction is the mean of the two (PROFILES)
    after, after_s = _profile(say)
    profile_loads = [profile_load, os.getloadavg()[0]]
    rows = []
    for label, plan, result, rss, load in runs:
        predictions = [_predict(plan, p, cluster) for p in (profile, after)]
        row = _row(label, plan, result, rss, predictions[0], steps, [p.prediction.step_time_s for p in predictions])
        row["load_avg_1min"] = load
        rows.append(row)
    profile_s += after_s
    left = [str(p) for p in root.rglob("*.bin")]
    return {
        "steps": steps,
        "ranks": NUM_RANKS,
        "model": {"family": "gpt", **CONFIG, "num_params": profile.num_params, "microbatch": MICROBATCH},
        "links": {
            "host_memory_gbps": cluster.host_memory_gbps,
            "host_device": None if cluster.host_device is None else cluster.host_device.bandwidth_gbps,
            "disk_read_gbps": cluster.nvme.effective_gbps("read") if cluster.nvme else None,
            "disk_write_gbps": cluster.nvme.effective_gbps("write") if cluster.nvme else None,
            "disk_latency_s": cluster.nvme.latency_s if cluster.nvme else None,
            "source": cluster.source,
        },
        "rows": rows,
        "state_files_left": left,
        "links_s": links_s,
        "profile_s": profile_s,
        "profile_load_avg_1min": profile_load,
        "profile_loads_avg_1min": profile_loads,
        "cpu_count": os.cpu_count(),
        "runtime_s": time.perf_counter() - start,
    }


def bench_section(quick: bool, say) -> dict:
    """benchmarks/run.py's section: DDP, cpu and nvme for 4 steps when quick, else every plan, 6 steps."""
    return run_bench(steps=4 if quick else 6, quick=quick, say=say)


def _mib(value: float) -> str:
    return f"{value / 2**20:.1f}"


def markdown(result: dict) -> str:
    """The result as markdown: the measured links, then one row per method."""
    links, m = result["links"], result["model"]
    ddp = next((r for r in result["rows"] if r["method"] == "ddp"), None)
    loads = result.get("profile_loads_avg_1min")
    when = (
        f"taken {PROFILES}, 1-min load average after each {', '.join(f'{x:.1f}' for x in loads)}"
        if loads
        else f"1-min load average after it {result.get('profile_load_avg_1min', 0):.1f}"
    )
    lines = [
        f"gpt h{m['hidden']} x {m['layers']} blocks ({m['num_params']:,} parameters), AdamW, microbatch "
        f"{m['microbatch']}, {result['ranks']} gloo ranks, {result['steps']} steps per plan, one launch each; "
        f"whole run {result['runtime_s']:.0f} s (links {result['links_s']:.0f} s, CPU profile "
        f"{result['profile_s']:.0f} s, {when} "
        f"on {result.get('cpu_count', '?')} cores). Links measured by profile_links: host memory "
        f"{links['host_memory_gbps']:.2f} GB/s per rank, disk write {links['disk_write_gbps']:.3f} / read "
        f"{links['disk_read_gbps']:.3f} GB/s per rank, latency {links['disk_latency_s'] * 1e3:.1f} ms "
        f"({links['source']}). State files left after the runs: {len(result['state_files_left'])}.",
        "",
        "| method | measured s/step | predicted s/step | tensor peak MiB (measured / predicted) | "
        "resident peak MiB (vs DDP) | bytes per step and rank (measured; = predicted?) | load |",
        "|---|---:|---:|---:|---:|---|---:|",
    ]
    for r in result["rows"]:
        same = "=" if r["measured_bytes"] == r["predicted_bytes"] else f"!= {r['predicted_bytes']}"
        vs = f" ({(r['rss_peak_bytes'] - ddp['rss_peak_bytes']) / 2**20:+.1f})" if ddp and r is not ddp else ""
        measured = ", ".join(f"{k} {v:,}" for k, v in r["measured_bytes"].items())
        lines.append(
            f"| {r['method']} | {r['measured_step_s']:.3f} | {r['predicted_step_s']:.3f} | "
            f"{_mib(r['measured_tensor_peak_bytes'])} / {_mib(r['predicted_peak_bytes'])} | "
            f"{_mib(r['rss_peak_bytes'])}{vs} | {measured} {same} | {r.get('load_avg_1min', 0):.1f} |"
        )
    lines += ["", gap_lines(result["rows"])]
    return "\n".join(lines)


def gap_lines(rows: list[dict]) -> str:
    """Step-time MAPE, the faster/slower-than-DDP verdicts, and each row's gap beyond DDP's own
    (the method's terms: host step, PCIe/disk traffic, FSDP collectives)."""
    ddp = next((r for r in rows if r["method"] == "ddp"), None)
    if ddp is None:
        return ""
    errs = [abs(r["predicted_step_s"] / r["measured_step_s"] - 1) for r in rows]
    base = ddp["measured_step_s"] - ddp["predicted_step_s"]
    others = [r for r in rows if r is not ddp]
    right = [
        (r["measured_step_s"] > ddp["measured_step_s"]) == (r["predicted_step_s"] > ddp["predicted_step_s"])
        for r in others
    ]
    extra = ", ".join(
        f"{r['method']} {1e3 * (r['measured_step_s'] - r['predicted_step_s'] - base):+.0f}" for r in others
    )
    peaks = [
        abs(r["predicted_peak_bytes"] / r["measured_tensor_peak_bytes"] - 1)
        for r in rows
        if r["measured_tensor_peak_bytes"]
    ]
    return (
        f"Step-time MAPE {statistics.fmean(errs):.0%}; tensor-peak MAPE {statistics.fmean(peaks):.0%}; "
        f"predicted faster/slower than DDP holds for {sum(right)}/{len(right)}. DDP's own gap "
        f"{1e3 * base:+.0f} ms (layers and the all-reduce, shared); each method's gap beyond it, in ms: {extra}."
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--quick", action="store_true", help="DDP, offload=cpu and offload=nvme only")
    ap.add_argument("--out", default=None, help="run directory (default: a new temporary one)")
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args(argv)
    result = run_bench(steps=args.steps, quick=args.quick, out=args.out)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""waves=2's launcher side (executor/waves.py has the design and the rank side): the two wave jobs,
the one-wave baseline, and the summary of the ranks' memory timelines (waves.json)."""

from __future__ import annotations

import dataclasses
import json
import statistics
import threading
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from meshplan.errors import MeshplanError
from meshplan.executor.launch import run_plans
from meshplan.executor.waves import ALONE_ENV, DIR_ENV, MALLOC_ENV, STEPS_ENV, STORE_ENV, WAVE_ENV
from meshplan.plan import MethodChoice, Plan
from meshplan.run_result import RunResult


def check(plan: Plan) -> None:
    if plan.tensor_parallel_degree * plan.pipeline_parallel_degree * plan.context_parallel_degree != 1:
        raise MeshplanError(
            "waves=2 runs on data-parallel plans only (tensor, pipeline and context parallel degree 1); "
            "use waves=1 for this layout"
        )
    if plan.zero_stage != 0 or plan.microbatch_size % 2:
        raise MeshplanError(
            f"waves=2 needs ZeRO-0 and an even microbatch size (got zero {plan.zero_stage}, microbatch "
            f"{plan.microbatch_size}); use waves=1"
        )


def wave_plan(plan: Plan) -> Plan:
    """What each wave's job runs: the plan at half the microbatch and half the global batch, one wave."""
    half = dataclasses.replace(
        plan,
        microbatch_size=plan.microbatch_size // 2,
        global_batch_size=plan.global_batch_size // 2,
        dp_methods=dataclasses.replace(plan.dp_methods, waves=MethodChoice(name="1", params={})),
    )
    half.validate()
    return half


def one_wave_plan(plan: Plan) -> Plan:
    out = dataclasses.replace(
        plan, dp_methods=dataclasses.replace(plan.dp_methods, waves=MethodChoice(name="1", params={}))
    )
    out.validate()
    return out


def run(plan: Plan, opts, *, baseline: bool = True) -> dict:
    """Both waves of `plan` on N devices, and (baseline) one wave in the same budget: the
    measurements of the module docstring, also written to out_dir/waves.json."""
    check(plan)
    out = Path(opts.out_dir)
    half = wave_plan(plan)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=600))
    results: dict[int, RunResult] = {}
    errors: dict[int, BaseException] = {}

    def launch(w: int) -> None:
        env = {
            **(opts.env or {}),
            **MALLOC_ENV,
            WAVE_ENV: str(w),
            STORE_ENV: f"127.0.0.1:{store.port}",
            DIR_ENV: str(out / "timelines"),
            STEPS_ENV: str(opts.steps),
        }
        try:
            (results[w],) = run_plans([half], dataclasses.replace(opts, out_dir=str(out / f"wave{w}"), env=env))
        except BaseException as exc:  # re-raised below, in the caller's thread
            errors[w] = exc

    threads = [threading.Thread(target=launch, args=(w,)) for w in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise next(iter(errors.values()))
    report = summarise(out / "timelines", plan, half)
    report["losses"] = {f"wave{w}": results[w].losses for w in (0, 1)}
    if baseline:
        one = run_one_wave(plan, opts, out)
        report["one_wave"] = one
    (out / "waves.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def run_one_wave(plan: Plan, opts, out: Path) -> dict:
    """The plan with one wave (microbatch b, one task a device), pinned the same way: its median
    step, throughput and peak resident memory above the baseline."""
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=600))
    env = {
        **(opts.env or {}),
        **MALLOC_ENV,
        WAVE_ENV: "0",
        STORE_ENV: f"127.0.0.1:{store.port}",
        DIR_ENV: str(out / "one_wave"),
    }
    env[ALONE_ENV] = "1"
    (result,) = run_plans([one_wave_plan(plan)], dataclasses.replace(opts, out_dir=str(out / "one_wave_run"), env=env))
    per_device = []
    for path in sorted((out / "one_wave").glob("wave0.rank*.json")):
        t = json.loads(path.read_text())
        ends = t["step_ends"]
        lo, hi = ends[min(2, len(ends) - 1)] - 1e-9, ends[-1]
        rss = [m for s, m in t["samples"] if lo <= s <= hi] or [m for _, m in t["samples"]]
        per_device.append({"peak_bytes": max(rss), "dynamic_peak_bytes": max(rss) - min(rss)})
    samples = plan.global_batch_size / plan.world_size
    return {
        "step_s": result.step_time_s,
        "samples_per_s_per_device": samples / result.step_time_s,
        "devices": per_device,
    }


def _step_value(series: list[tuple[float, int]], t: float) -> int:
    """The last sample at or before t (the first after, before the series starts)."""
    lo, hi = 0, len(series) - 1
    if t <= series[0][0]:
        return series[0][1]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if series[mid][0] <= t:
            lo = mid
        else:
            hi = mid - 1
    return series[lo][1]


def summarise(directory: Path, plan: Plan, half: Plan) -> dict:
    """Each device's two timelines summed over the window where both waves train (from the tock's
    second step end to the first of the two waves' last step ends)."""
    devices = []
    per_task = half.global_batch_size / half.world_size  # samples per task and step
    for rank in range(plan.world_size):
        tick, tock = (json.loads((directory / f"wave{w}.rank{rank}.json").read_text()) for w in (0, 1))
        if len(tock["step_ends"]) < 3:
            raise MeshplanError("waves=2: run at least 4 steps so both waves overlap in steady state")
        lo = tock["step_ends"][1]
        hi = min(tick["step_ends"][-1], tock["step_ends"][-1])
        times = sorted({s for s, _ in tick["samples"] + tock["samples"] if lo <= s <= hi})
        ticks = [(s, m) for s, m in tick["samples"]]
        tocks = [(s, m) for s, m in tock["samples"]]
        summed = [(t, _step_value(ticks, t) + _step_value(tocks, t)) for t in times]
        if not summed:
            raise MeshplanError(
                f"waves=2: on device {rank} the two waves never trained at the same time (the tock's second "
                "step ended after the tick's last); run more steps"
            )
        own = {w: [m for s, m in (ticks if w == 0 else tocks) if lo <= s <= hi] for w in (0, 1)}
        steps = sum(1 for e in tick["step_ends"] + tock["step_ends"] if lo < e <= hi)
        peak = max(m for _, m in summed)
        base = min(own[0]) + min(own[1])  # both processes' resident floor in the window
        devices.append(
            {
                "device": rank,
                "cores": [tick["core"], tock["core"]],
                "window_s": hi - lo,
                "summed_peak_bytes": peak,
                "summed_dynamic_peak_bytes": peak - base,
                "wave_dynamic_peaks_bytes": [max(own[w]) - min(own[w]) for w in (0, 1)],
                "wave_peaks_bytes": [max(own[w]) for w in (0, 1)],
                "samples_per_s": steps * per_task / (hi - lo) if hi > lo else 0.0,
                "tock_offset_s": _offset(tick["step_ends"], tock["step_ends"]),
                "cross_wave_averages": [tick["averaged"], tock["averaged"]],
                "timeline": summed[:: max(1, len(summed) // 400)],
            }
        )
    return {"devices": devices}


def _offset(tick: list[float], tock: list[float]) -> float:
    """Median over the tock's steps that end while the tick trains of (its step end - the tick's
    latest step end before it), as a fraction of the tick's median step: 0.5 = half an
    iteration late (both waves sharing a core drift from the offset they started with)."""
    period = statistics.median([b - a for a, b in zip(tick[1:], tick[2:])]) if len(tick) > 2 else 0.0
    if period <= 0:
        return 0.0
    gaps = [e - max(t for t in tick if t <= e) for e in tock[1:] if tick[0] <= e <= tick[-1]]
    return statistics.median(gaps) / period if gaps else 0.0

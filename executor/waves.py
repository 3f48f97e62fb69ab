"""waves=2: Wavelet's tick-tock scheduling (Wang et al., Wavelet, MLSys 2021) on real ranks.

Wavelet runs a data-parallel job as 2N training tasks in two waves on the same N devices: the
tock wave launched half a forward-backward cycle after the tick wave, so one wave's memory peak
(the end of forward) falls in the other's valley (backward frees activations). Here:

- Two jobs of N ranks each, launched together (`run`): wave 0 (tick) and wave 1 (tock), each the
  plan's data parallelism over its own N ranks at half the plan's microbatch and global batch
  (2N tasks, each b/2: the global batch is the plan's), each wave's gradients all-reduced within
  the wave (DDP), each wave on its own data (the synthetic batches of another seed; a user
  dataset's shuffle of another seed).
- Device d hosts task d of both waves. On CPU a device is emulated by pinning both ranks to one
  core (os.sched_setaffinity, core d mod the host's cores) with one thread each; the pair shares
  that core and one memory budget (the plan's device memory; the run reports whether the pair's
  summed timeline stays under it). On CUDA both processes use GPU d.
- The tock starts half an iteration late: before its first forward, rank d of the tock waits for
  the tick's rank d to finish its second step and sleeps half that step's duration.
- Agreement between the waves: within a wave the replicas are identical (DDP). Across waves the
  two tasks of a device average their models without waiting for each other: after every
  optimizer step a task sends its parameters to its partner (a 2-rank gloo group of its own)
  and averages with the newest partner model that has arrived, x <- (x + y) / 2. Blocking on the
  partner would realign the waves every step and undo the offset; so the models agree only
  approximately (registry: waves=2 is not exact).
- Every rank samples its memory (CPU: the resident set, /proc/self/statm, with glibc's mmap
  threshold at 64 KiB so freed tensors leave it; CUDA: memory_allocated) every MEM_PERIOD_S, and its step
  ends; `run` sums each device's two timelines on the common clock over the window where both
  waves train, and reports the summed peak (its dynamic part above the pair's baseline, i.e.
  what activations and transients add) beside each wave's own, the throughput (samples per
  second per device) and, from a one-wave run of the plan in the same budget (microbatch b,
  one task a device), its throughput and peak; `benchmarks/dp_paper_methods.py` puts the
  planner's prediction (planner/waves.py) beside them.
Environment of a wave rank: MESHPLAN_WAVE (0 or 1), MESHPLAN_WAVE_STORE (host:port of the
launcher's TCPStore), MESHPLAN_WAVE_DIR (where timelines go).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook

from meshplan.errors import MeshplanError
from meshplan.plan import MethodChoice, Plan

WAVE_ENV, STORE_ENV, DIR_ENV = "MESHPLAN_WAVE", "MESHPLAN_WAVE_STORE", "MESHPLAN_WAVE_DIR"
STEPS_ENV, ALONE_ENV = "MESHPLAN_WAVE_STEPS", "MESHPLAN_WAVE_ALONE"
MEM_PERIOD_S = 0.002
DATA_SEED_OFFSET = 7_919
"""Added to the run's seed for the tock wave's data (not its model: both waves start equal)."""


def wave() -> int | None:
    text = os.environ.get(WAVE_ENV, "")
    return int(text) if text else None


def data_seed(seed: int) -> int:
    """The data seed of this rank's wave (the run's seed outside waves=2 and on the tick wave)."""
    return seed + DATA_SEED_OFFSET * (wave() or 0)


MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
"""glibc: tensors of 64 KiB and more in mappings of their own, unmapped when freed, so the
resident size follows the tensors' (the CPU timeline's measure)."""


def _memory_bytes() -> int:
    """CUDA: the allocator's allocated bytes; CPU: the resident set (/proc/self/statm)."""
    if torch.cuda.is_available():
        return torch.cuda.memory_allocated()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class WaveRank:
    """One wave rank's side (module docstring): pinning, the tock's late start, the cross-wave
    averaging after every optimizer step, and the memory timeline."""

    def __init__(self, rank: int, wave_index: int):
        self.rank, self.wave = rank, wave_index
        self.partner = 1 - wave_index
        if torch.cuda.is_available():
            self.core = None
        else:
            cores = sorted(os.sched_getaffinity(0))
            self.core = cores[rank % len(cores)]
            os.sched_setaffinity(0, {self.core})
        self.alone = os.environ.get(ALONE_ENV) == "1"  # the one-wave baseline: pinned and sampled only
        self.messages = int(os.environ.get(STEPS_ENV, "0"))
        """Models each side sends (one per step, the same step count on both waves)."""
        host, _, port = os.environ[STORE_ENV].rpartition(":")
        self.store = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=600))
        self.pg = None
        if not self.alone:
            pair = dist.PrefixStore(f"device{rank}", self.store)
            self.pg = dist.ProcessGroupGloo(pair, wave_index, 2, timedelta(seconds=600))
        self.received = 0
        self.newest: torch.Tensor | None = None
        self.lock = threading.Lock()
        self.receiver: threading.Thread | None = None
        self.samples: list[tuple[float, int]] = []
        self.step_ends: list[float] = []
        self.averaged = 0
        self.sends: list = []
        self.stop = threading.Event()
        self.sampler = threading.Thread(target=self._sample, daemon=True)
        self.sampler.start()
        self.hooks = [register_optimizer_step_post_hook(self._after_step)]
        if not self.alone:
            self.hooks.append(torch.nn.modules.module.register_module_forward_pre_hook(self._start))

    def _sample(self) -> None:
        while not self.stop.is_set():
            self.samples.append((time.time(), _memory_bytes()))
            time.sleep(MEM_PERIOD_S)

    def _start(self, module, args) -> None:
        """Once, before the first forward: the tick waits until its tock is ready; the tock says so,
        waits for the tick's second step and sleeps half of it (half an iteration late)."""
        self.hooks.pop().remove()
        ready = f"tock{self.rank}.ready"
        if self.wave == 0:
            self.store.wait([ready], timedelta(seconds=600))
            return
        self.store.set(ready, "1")
        keys = [f"tick{self.rank}.step{k}" for k in (1, 2)]
        self.store.wait(keys, timedelta(seconds=600))
        t1, t2 = (float(self.store.get(k)) for k in keys)
        time.sleep(max(0.0, (t2 - t1) / 2 - (time.time() - t2)))

    @torch.no_grad()
    def _after_step(self, optimizer, args, kwargs) -> None:
        now = time.time()
        self.step_ends.append(now)
        if self.wave == 0:
            self.store.set(f"tick{self.rank}.step{len(self.step_ends)}", repr(now))
        if self.pg is None:
            return
        params = [p for group in optimizer.param_groups for p in group["params"]]
        x = torch.cat([p.detach().reshape(-1).float().cpu() for p in params])
        if self.receiver is None:
            self.receiver = threading.Thread(target=self._receive, args=(x.numel(),), daemon=True)
            self.receiver.start()
        with self.lock:
            newest, self.newest = self.newest, None
        if newest is not None:
            x = (x + newest) / 2
            offset = 0
            for p in params:
                p.copy_(x[offset : offset + p.numel()].view_as(p).to(p.dtype))
                offset += p.numel()
            self.averaged += 1
        self.sends.append(self.pg.send([x.clone()], self.partner, 0))  # type: ignore[attr-defined]

    def _receive(self, numel: int) -> None:
        """The partner's models, one a step, as they land; the step takes the newest."""
        assert self.pg is not None
        for _ in range(self.messages):
            buf = torch.empty(numel)
            self.pg.recv([buf], self.partner, 0).wait()  # type: ignore[attr-defined]
            with self.lock:
                self.newest = buf
                self.received += 1

    def close(self, out_dir: str) -> None:
        """Stop sampling; receive the partner's remaining models (so both sides' sends land:
        the wave that finishes first waits here for the other), write the timeline."""
        for h in self.hooks:
            h.remove()
        self.stop.set()
        self.sampler.join()
        if self.receiver is not None:
            self.receiver.join()
        for work in self.sends:
            work.wait()
        path = Path(out_dir) / f"wave{self.wave}.rank{self.rank}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        step = max(1, len(self.samples) // 20000)
        path.write_text(
            json.dumps(
                {
                    "wave": self.wave,
                    "rank": self.rank,
                    "core": self.core,
                    "samples": self.samples[::step],
                    "step_ends": self.step_ends,
                    "averaged": self.averaged,
                }
            )
        )


_RANK: WaveRank | None = None


def rank_setup(rank: int) -> None:
    """Called by the worker after init_process_group: a no-op outside waves=2."""
    global _RANK
    w = wave()
    if w is not None and _RANK is None:
        _RANK = WaveRank(rank, w)


def rank_close() -> None:
    if _RANK is not None:
        _RANK.close(os.environ[DIR_ENV])


# --- the launcher side ---------------------------------------------------------------------------


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
    from meshplan.executor.launch import run_plans

    check(plan)
    out = Path(opts.out_dir)
    half = wave_plan(plan)
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=600))
    results: dict[int, object] = {}
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
    report["losses"] = {f"wave{w}": results[w].losses for w in (0, 1)}  # type: ignore[attr-defined]
    if baseline:
        one = run_one_wave(plan, opts, out)
        report["one_wave"] = one
    (out / "waves.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def run_one_wave(plan: Plan, opts, out: Path) -> dict:
    """The plan with one wave (microbatch b, one task a device), pinned the same way: its median
    step, throughput and peak resident memory above the baseline."""
    from meshplan.executor.launch import run_plans

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

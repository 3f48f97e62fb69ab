"""waves=2: Wavelet's tick-tock scheduling (Wang et al., Wavelet, MLSys 2021) on real ranks.

Wavelet runs a data-parallel job as 2N training tasks in two waves on the same N devices: the
tock wave launched half a forward-backward cycle after the tick wave, so one wave's memory peak
(the end of forward) falls in the other's valley (backward frees activations). Here:

- Two jobs of N ranks each, launched together (executor/waves_launch.py `run`): wave 0 (tick) and wave 1 (tock), each the
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
  approximately (registry: waves=2 is not exact). Staleness is bounded: a task that has taken
  k steps waits for its partner's model of step k - MAX_LAG before it sends. In steady state the
  tock is half a step behind and nothing waits; a wave the scheduler starves cannot fall further
  back than that (unbounded, one wave ran 8 steps behind the other on a quiet host, and the
  two barely overlapped).
- Every rank samples its memory (CPU: the resident set, /proc/self/statm, with glibc's mmap
  threshold at 64 KiB so freed tensors leave it; CUDA: memory_allocated) every MEM_PERIOD_S, and its step
  ends; waves_launch.run sums each device's two timelines on the common clock over the window where both
  waves train, and reports the summed peak (its dynamic part above the pair's baseline, i.e.
  what activations and transients add) beside each wave's own, the throughput (samples per
  second per device) and, from a one-wave run of the plan in the same budget (microbatch b,
  one task a device), its throughput and peak; `benchmarks/dp_paper_methods.py` puts the
  planner's prediction (planner/waves.py) beside them.
Environment of a wave rank: MESHPLAN_WAVE (0 or 1), MESHPLAN_WAVE_STORE (host:port of the
launcher's TCPStore), MESHPLAN_WAVE_DIR (where timelines go).
"""

from __future__ import annotations

import json
import os
import threading
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.optim.optimizer import register_optimizer_step_post_hook

WAVE_ENV, STORE_ENV, DIR_ENV = "MESHPLAN_WAVE", "MESHPLAN_WAVE_STORE", "MESHPLAN_WAVE_DIR"
STEPS_ENV, ALONE_ENV = "MESHPLAN_WAVE_STEPS", "MESHPLAN_WAVE_ALONE"
MEM_PERIOD_S = 0.002
MAX_LAG = 2
"""Steps a task may run ahead of its partner's newest model (two: the late start needs one)."""
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
        self.lock = threading.Condition()
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
            if not self.lock.wait_for(lambda: self.received >= len(self.step_ends) - MAX_LAG, timeout=600):
                raise RuntimeError(f"waves=2: no model from the partner wave for step {len(self.step_ends) - MAX_LAG}")
            newest, self.newest = self.newest, None
        if newest is not None:
            x.add_(newest).mul_(0.5)  # in place: no model-sized temporaries beside x
            offset = 0
            for p in params:
                p.copy_(x[offset : offset + p.numel()].view_as(p).to(p.dtype))
                offset += p.numel()
            self.averaged += 1
        # a gloo send's work holds its tensor until dropped: keep only the sends still in flight,
        # or every step's model copy stays resident to the end of the run
        self.sends = [work for work in self.sends if not work.is_completed()]
        # x is this step's own flat copy, never written again: it is sent as it is (a clone would be
        # one more model-sized transient at every step end, the memory timeline's largest term)
        # the Backend stub has no send/recv, which ProcessGroupGloo's binding has
        self.sends.append(self.pg.send([x], self.partner, 0))  # type: ignore[attr-defined]

    def _receive(self, numel: int) -> None:
        """The partner's models, one a step, as they land; the step takes the newest."""
        assert self.pg is not None
        for _ in range(self.messages):
            buf = torch.empty(numel)
            self.pg.recv([buf], self.partner, 0).wait()  # type: ignore[attr-defined]  # Backend stub: no recv
            with self.lock:
                self.newest = buf
                self.received += 1
                self.lock.notify_all()

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

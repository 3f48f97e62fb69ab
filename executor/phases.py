"""Per-phase wall time of each training step, beside the cost model's terms (meshplan report).

`PhaseTimer.phase(name)` times a block; phases nest and each keeps its own (exclusive) time, so
the phases of a step add up to the step's time, less the loop's own bookkeeping. On CUDA the
device is synchronised at each boundary (what the GPU did, not what the host queued); on CPU it
is wall time. Timing never changes what a step computes. The phases (train.py, parallelize.py):
- "data": fetching the step's batch (inside the step's timed span, as it always was);
- "forward": each microbatch's forward and loss (a pipeline stage's forward_one_chunk);
- "backward": each microbatch's backward, recompute included, and under DDP / FSDP the wait for
  the gradient collectives at its end (exposed data-parallel communication);
- "pipeline": what the pipeline schedule spent outside its stages' forward and backward: the p2p
  transfers and the bubble (waiting for a neighbour), and the last stage's loss;
- "dp_comm": explicit gradient reductions after backward (DTensor stages' reducers, tied weights);
- "grad_clip": the global gradient norm (one all-reduce) and the scaling;
- "optimizer": zero_grad and the optimizer step (ZeRO-1's parameter all-gather included);
- "sync": a replica-synchronisation method's own work outside forward and backward (its
  optimizer step and averaging rounds; executor/methods/sync.py).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Iterator

import torch

PHASES = ("data", "forward", "backward", "pipeline", "dp_comm", "grad_clip", "optimizer", "sync")


class PhaseTimer:
    """Exclusive seconds per phase within the current step; `end_step()` returns and resets them."""

    def __init__(self, device: torch.device):
        self.device = device
        self.totals: dict[str, float] = {}
        self.nested: list[float] = []  # per open phase: the seconds its nested phases took

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self._sync()
        t0 = time.perf_counter()
        self.nested.append(0.0)
        try:
            yield
        finally:
            self._sync()
            elapsed = time.perf_counter() - t0
            inner = self.nested.pop()
            self.totals[name] = self.totals.get(name, 0.0) + elapsed - inner
            if self.nested:
                self.nested[-1] += elapsed

    def end_step(self) -> dict[str, float]:
        out, self.totals = self.totals, {}
        return out

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def time_stages(stages: list, timer: PhaseTimer) -> None:
    """Time each pipeline stage's forward and backward chunks (torch.distributed.pipelining's
    _PipelineStageBase methods) as "forward" / "backward" phases."""
    for stage in stages:
        for method, name in (
            ("forward_one_chunk", "forward"),
            ("backward_one_chunk", "backward"),
            ("backward_weight_one_chunk", "backward"),
        ):
            if hasattr(stage, method):
                setattr(stage, method, _timed(getattr(stage, method), timer, name))


def _timed(fn, timer: PhaseTimer, name: str):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with timer.phase(name):
            return fn(*args, **kwargs)

    return wrapper

"""Once-per-step work on a layer's parameters, and the host share of the CPU timings.

Optimizer step: what the executor's training loop does once per step for every parameter
(executor/train.py): global-norm gradient clipping (the executor's own, DTensor-aware), AdamW (betas 0.9/0.95, weight decay 0.1, as
executor/data_parallel.optimizer_spec) and zero_grad. Timed on the real layer with gradients of
its own forward+backward; its per-step cost is what the planner charges per layer a rank holds.

Host share (CPU only): N ranks on C < N cores, and other load on a shared host, stretch wall time
by wall / CPU time. A pass of well under a scheduler time slice is rarely preempted, so the median
wall time of short passes misses the sharing, and single preempted passes look like outliers
(e.g. 14.6 ms against 1.35 ms). CPU times (process_time: gloo's threads count) are free of both; the timings then are
median CPU time x (total wall / total CPU over every timed pass, while the busy neighbours run),
which is what the ranks pay on average when they share the cores the same way. Ranks pausing
between passes (concurrency.SYNC_PAUSE_S) are favoured by the scheduler over CPU-bound load, so
the measured share can fall below ranks / cores, which N busy ranks cannot beat: that is its floor.
"""

from __future__ import annotations

import copy
import os
import statistics
import time

import torch

from meshplan.executor.wrappers import clip_grad_norm, optimizer_spec
from meshplan.profiler.runner import backward_ones, call


def cores_available() -> int:
    """CPU cores this process may run on (affinity mask), at least 1."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):
        return max(os.cpu_count() or 1, 1)


class HostShare:
    """Running sums of wall and CPU seconds over the timed passes."""

    def __init__(self, floor: float = 1.0) -> None:
        self.wall_s = 0.0
        self.cpu_s = 0.0
        self.floor = floor
        """Physical lower bound: N always-busy ranks on C < N cores get at most C/N of a core."""

    def add(self, wall_s: float, cpu_s: float) -> None:
        self.wall_s += wall_s
        self.cpu_s += cpu_s

    @property
    def factor(self) -> float:
        """Wall seconds per CPU second, at least `floor`; `floor` before anything was timed."""
        return max(self.floor, self.wall_s / self.cpu_s) if self.cpu_s > 0 else self.floor


def clip_step_zero(params, grads, optimizer, clock=time.process_time, clip: bool = True) -> float:
    """Seconds on `clock` (CPU time by default) of one clip + optimizer step + zero_grad, as the
    executor's loop runs them, on fresh copies of `grads` (without the clip if not `clip`)."""
    for p, g in zip(params, grads):
        p.grad = g.clone()
    start = clock()
    if clip:
        clip_grad_norm(params, 1.0, None, params[0].device)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return clock() - start


def _params_and_grads(layer: torch.nn.Module, x: torch.Tensor):
    params = [p for p in layer.parameters() if p.requires_grad]
    for p in params:
        p.grad = None
    backward_ones(call(layer, x))
    return params, [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]


def _adamw(params):
    """The executor's default optimizer (executor/data_parallel.optimizer_spec, lr 3e-4)."""
    cls, kwargs = optimizer_spec("adamw", 3e-4, 0.1)
    return cls(params, **kwargs)


def optimizer_step_cpu_s(
    layer: torch.nn.Module, x: torch.Tensor, warmup: int = 3, repeats: int = 15
) -> tuple[float, float]:
    """(per-layer, per-call) CPU seconds of clip + AdamW step + zero_grad: steps over the layer's
    parameters (one) and over them plus a twin's (two) alternate, so that each pair sees the same
    host state; the layer's share is the median of two - one, the fixed cost of a call (Python,
    foreach grouping), paid once per optimizer, the median of one less that share. Two separate
    timing runs differed by more than the layer's share on a shared host (a negative share)."""
    params, grads = _params_and_grads(layer, x)
    if not params:
        return 0.0, 0.0
    saved = [p.detach().clone() for p in params]
    sets = [(params, grads)]
    try:
        sets.append(tuple(a + b for a, b in zip(sets[0], _params_and_grads(copy.deepcopy(layer), x))))
    except Exception:  # a wrapped layer that cannot be copied: the whole call counts per layer
        pass
    steps = [(ps, gs, _adamw(ps)) for ps, gs in sets]
    times = [[clip_step_zero(*step) for step in steps] for _ in range(warmup + repeats)][warmup:]
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.copy_(s)
    one = statistics.median(t[0] for t in times)
    if len(steps) == 1:
        return one, 0.0
    share = max(statistics.median(t[1] - t[0] for t in times), 0.0)
    return share, max(one - share, 0.0)

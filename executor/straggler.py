"""Straggler injection for tests and benchmarks: MESHPLAN_SLOW_RANK="RANK:FACTOR" makes that rank
FACTOR times slower. Methods that run their own compute loop slow it themselves (sync=dabmd
sleeps after each microbatch, so its time budget sees the slow compute: `SLOWS_ITSELF`); for the
others (DDP and every method on train.py's step) `install` hooks the optimizer step: before it
the rank sleeps (FACTOR - 1) x the time since its previous step ended (its forward, backward and
what of the gradient exchange it waited for), so the whole step runs about FACTOR x slower."""

from __future__ import annotations

import os
import time

from torch.optim.optimizer import register_optimizer_step_pre_hook

SLOW_ENV = "MESHPLAN_SLOW_RANK"


def slowdown(rank: int) -> float:
    """This rank's factor (1.0 when it is not the slow one or no straggler is set)."""
    text = os.environ.get(SLOW_ENV, "")
    if not text:
        return 1.0
    who, _, factor = text.partition(":")
    return float(factor) if int(who) == rank else 1.0


def install(rank: int):
    """The optimizer-step hook on the slow rank (None elsewhere); returns its handle."""
    factor = slowdown(rank)
    if factor <= 1:
        return None
    last = [time.perf_counter()]

    def pre_step(optimizer, args, kwargs):
        now = time.perf_counter()
        time.sleep((factor - 1) * (now - last[0]))
        last[0] = time.perf_counter()

    return register_optimizer_step_pre_hook(pre_step)

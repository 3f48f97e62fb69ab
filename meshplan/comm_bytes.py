"""Bytes on the wire per rank: the one convention the cost model predicts and the executor counts.

Every data-parallel collective is counted where it is issued, as (mesh axis, collective, group
size, payload bytes this rank hands it), and turned into the bytes each rank sends under the ring
algorithms (Thakur et al. 2005; Patarasuk & Yuan 2009):
- all_reduce of B bytes: 2 (g-1)/g B  (reduce-scatter then all-gather)
- reduce_scatter of an input of B bytes: (g-1)/g B
- all_gather of a B-byte shard from every rank: (g-1) B
- broadcast of B bytes (pipelined chain): (g-1)/g B on average over the ranks
- send/recv of B bytes: B
Sums are kept as exact fractions and rounded once per step, so a prediction from the totals and a
count call by call give the same integer. Axes are the mesh's ("dp_replicate", "dp_shard").
The gradient-clipping norm scalars are not counted (a few bytes, not a method's traffic).
"""

from __future__ import annotations

from collections import defaultdict
from fractions import Fraction
from typing import Protocol

COLLECTIVES = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "send_recv")
DP_AXES = ("dp_replicate", "dp_shard")


def wire_bytes(collective: str, group: int, payload_bytes: int | float) -> Fraction:
    """Bytes one rank sends for one collective (module docstring)."""
    if group <= 1 or payload_bytes <= 0:
        return Fraction(0)
    b = Fraction(payload_bytes)
    if collective == "all_reduce":
        return 2 * (group - 1) * b / group
    if collective in ("reduce_scatter", "broadcast"):
        return (group - 1) * b / group
    if collective == "all_gather":
        return (group - 1) * b
    if collective == "send_recv":
        return b
    raise ValueError(f"unknown collective {collective!r}")


class Notes(Protocol):
    """A method's object that says what it did over the run (a codec, ByteScheduler's wrapper)."""

    def notes(self) -> list[str]:
        """Lines for the run's notes (RankResult.method_notes)."""
        ...


class ByteCounter:
    """Accumulates one rank's counted collectives; `end_step()` closes a step."""

    def __init__(self) -> None:
        self.current: dict[str, Fraction] = defaultdict(Fraction)
        self.steps: list[dict[str, int]] = []
        self.warmup_steps = 1
        """Steps left out of the steady-state mean: the first (DDP's bucket rebuild), or more where
        a method warms up (PowerSGD sends dense before start_iter); methods raise it."""
        self.period = 1
        """Steps after which the traffic repeats (local SGD averages every `period` steps): the
        steady state is the mean over a whole number of periods."""
        self.notes_from: list[Notes] = []
        """The methods' objects whose notes() the run reports, as they were built."""

    def add(self, axis: str, collective: str, group: int, payload_bytes: int) -> None:
        self.current[axis] += wire_bytes(collective, group, payload_bytes)

    def end_step(self) -> dict[str, int]:
        step = {axis: round(v) for axis, v in sorted(self.current.items()) if v}
        self.steps.append(step)
        self.current = defaultdict(Fraction)
        return step

    def mean_after_first(self) -> dict[str, int]:
        """Mean per step over the steps after the warm-up (the first step, and PowerSGD's start
        iterations: `warmup_steps`), rounded: the steady state the cost model predicts. With a
        `period`, over the last whole periods of those steps (any `period` consecutive steps
        hold the same traffic), or all of them when less than one period remains. The last
        step alone when the run was no longer than the warm-up."""
        steps = self.steps[self.warmup_steps :] or self.steps[-1:]
        whole = len(steps) // self.period * self.period
        steps = steps[len(steps) - whole :] if whole else steps
        axes = sorted({a for s in steps for a in s})
        return {a: round(Fraction(sum(s.get(a, 0) for s in steps), len(steps))) for a in axes} if steps else {}

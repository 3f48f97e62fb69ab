"""compression=accordion / accordion_topk: Accordion (Agarwal et al., MLSys 2021) switches each
tensor between a low-compression setting in critical regimes and a high-compression one
elsewhere: PowerSGD's critical_rank vs rank (lowrank.py), or top-k's critical_density vs
density (topk.py).

Rule (`critical`, the paper's auto_scale.py): over each window of `window` steps accumulate the
tensor's gradient; at the window's end ratio = |‖acc_prev‖ - ‖acc_now‖| / ‖acc_prev‖, critical
when ratio >= eta (or at a learning-rate decay; or when there is no previous window: training
starts in the low-compression setting). The decision holds for the next window.
Where meshplan differs: the accumulated gradient is the exchanged one (the group's average after
decompression), identical on every rank, so every rank takes the same decisions with no
broadcast; the paper accumulates rank 0's local gradient and broadcasts its choices.
The run's notes report the share of tensor-steps at each setting (`notes()`).
"""

from __future__ import annotations

import torch

from meshplan.comm_bytes import ByteCounter
from meshplan.executor.methods import compressed
from meshplan.executor.methods.lowrank import LowRank
from meshplan.executor.methods.topk import TopK


def critical(prev_norm: float | None, now_norm: float, eta: float, lr_decayed: bool = False) -> bool:
    """Accordion's switching rule (module docstring)."""
    if lr_decayed or prev_norm is None:
        return True
    if prev_norm == 0.0:
        return now_norm != 0.0
    return abs(prev_norm - now_norm) / prev_norm >= eta


class Regimes:
    """Per tensor: the accumulated gradient of the current window and the decision in force."""

    def __init__(self, window: int, eta: float):
        self.window, self.eta = window, eta
        self.acc: dict[int, torch.Tensor] = {}
        self.prev: dict[int, float] = {}
        self.in_critical: dict[int, bool] = {}
        self.steps = {True: 0, False: 0}

    def is_critical(self, key: int) -> bool:
        return self.in_critical.get(key, True)

    def observe(self, key: int, step: int, grad: torch.Tensor) -> None:
        """Count this step's setting, accumulate the exchanged gradient, decide at a window's end."""
        self.steps[self.is_critical(key)] += 1
        held = self.acc.get(key)
        self.acc[key] = grad.clone() if held is None else held.add_(grad)
        if (step + 1) % self.window == 0:
            now = float(self.acc.pop(key).norm())
            self.in_critical[key] = critical(self.prev.get(key), now, self.eta)
            self.prev[key] = now

    def notes(self, low: str, high: str) -> list[str]:
        total = self.steps[True] + self.steps[False]
        if not total:
            return []
        share = self.steps[True] / total
        return [f"accordion: {share:.1%} of tensor-steps at {low} (critical), {1 - share:.1%} at {high}"]


class AccordionPowerSGD(LowRank):
    def __init__(self, params: dict, world: int, rank: int):
        super().__init__(params, world, rank)
        self.regimes = Regimes(params["window"], params["eta"])

    def rank_for(self, key: int) -> int:
        return self.params["critical_rank"] if self.regimes.is_critical(key) else self.params["rank"]

    def exchange(self, comm, items) -> None:
        super().exchange(comm, items)
        for key, grad, _ in items:
            self.regimes.observe(key, self._steps[key] - 1, grad)

    def notes(self) -> list[str]:
        return self.regimes.notes(f"rank {self.params['critical_rank']}", f"rank {self.params['rank']}")


class AccordionTopK(TopK):
    def __init__(self, params: dict, world: int, rank: int):
        super().__init__(params, world, rank)
        self.regimes = Regimes(params["window"], params["eta"])

    def density(self, key: int, step: int) -> float:
        return self.params["critical_density"] if self.regimes.is_critical(key) else self.params["density"]

    def exchange(self, comm, items) -> None:
        super().exchange(comm, items)
        for key, grad, _ in items:
            self.regimes.observe(key, self._steps[key] - 1, grad)

    def notes(self) -> list[str]:
        return self.regimes.notes(f"density {self.params['critical_density']:g}", f"density {self.params['density']:g}")


def powersgd_hook(group, params: dict, counter: ByteCounter, axis: str):
    return compressed.comm_hook(AccordionPowerSGD, group, params, counter, axis)


def topk_hook(group, params: dict, counter: ByteCounter, axis: str):
    return compressed.comm_hook(AccordionTopK, group, params, counter, axis)

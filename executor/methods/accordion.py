"""compression=accordion / accordion_topk: Accordion (Agarwal et al., MLSys 2021) switches each
tensor between a low-compression setting in critical regimes and a high-compression one
elsewhere: PowerSGD's critical_rank vs rank (lowrank.py), or top-k's critical_density vs
density (topk.py).

Rule (`critical`, the paper's auto_scale.py): over each window of `window` steps accumulate the
tensor's gradient; at the window's end ratio = |‖acc_prev‖ - ‖acc_now‖| / ‖acc_prev‖, critical
when ratio >= eta (or when there is no previous window: training starts in the low-compression
setting). The decision holds for the next window. A learning-rate decay is critical too (the
paper switches to the low-compression setting after each decay): `lr_changed(old, new)` with
new < old puts every tensor in the critical setting for its next `window` steps, whatever the
norms say. meshplan's executor trains at a constant learning rate (executor/train.py has no
schedule), so nothing calls it there yet; a training loop with a scheduler calls it after each
scheduler step. Accordion over PowerSGD may start dense (`start_iter`, lowrank.py).
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
        self.forced: dict[int, int] = {}
        """Steps a tensor has left in the critical setting after a learning-rate decay."""
        self.steps = {True: 0, False: 0}
        self.dense_steps = 0

    def is_critical(self, key: int) -> bool:
        return self.forced.get(key, 0) > 0 or self.in_critical.get(key, True)

    def lr_decayed(self) -> None:
        """Every tensor seen so far critical for its next `window` steps (module docstring)."""
        for key in set(self.in_critical) | set(self.acc) | set(self.prev):
            self.forced[key] = self.window

    def observe(self, key: int, step: int, grad: torch.Tensor, dense: bool = False) -> None:
        """Count this step's setting (or a dense start step), accumulate the exchanged gradient,
        decide at a window's end."""
        if dense:
            self.dense_steps += 1
        else:
            self.steps[self.is_critical(key)] += 1
        if self.forced.get(key, 0) > 0:
            self.forced[key] -= 1
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
        dense = f"; {self.dense_steps} tensor-steps dense before start_iter" if self.dense_steps else ""
        return [f"accordion: {share:.1%} of tensor-steps at {low} (critical), {1 - share:.1%} at {high}{dense}"]


class AccordionPowerSGD(LowRank):
    def __init__(self, params: dict, world: int, rank: int):
        super().__init__(params, world, rank)
        self.regimes = Regimes(params["window"], params["eta"])

    def rank_for(self, key: int) -> int:
        return self.params["critical_rank"] if self.regimes.is_critical(key) else self.params["rank"]

    def exchange(self, comm, items) -> None:
        dense = bool(items) and self._steps.get(items[0][0], 0) < self.params.get("start_iter", 0)
        super().exchange(comm, items)
        for key, grad, _ in items:
            self.regimes.observe(key, self._steps[key] - 1, grad, dense=dense)

    def lr_changed(self, old_lr: float, new_lr: float) -> None:
        """Call after the learning rate moved from old_lr to new_lr: a decay is critical."""
        if new_lr < old_lr:
            self.regimes.lr_decayed()

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

    def lr_changed(self, old_lr: float, new_lr: float) -> None:
        """Call after the learning rate moved from old_lr to new_lr: a decay is critical."""
        if new_lr < old_lr:
            self.regimes.lr_decayed()

    def notes(self) -> list[str]:
        return self.regimes.notes(f"density {self.params['critical_density']:g}", f"density {self.params['density']:g}")


def powersgd_hook(group, params: dict, counter: ByteCounter, axis: str):
    """(codec, hook); the dense start steps are left out of the steady state."""
    counter.warmup_steps = max(counter.warmup_steps, params.get("start_iter", 0))
    return compressed.comm_hook(AccordionPowerSGD, group, params, counter, axis)


def topk_hook(group, params: dict, counter: ByteCounter, axis: str):
    return compressed.comm_hook(AccordionTopK, group, params, counter, axis)

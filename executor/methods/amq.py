"""compression=amq: adaptive multiplier (Faghri et al., NeurIPS 2020, AMQ): levels {0, p^(L-2),
..., p, 1} whose p is re-fitted per tensor every refit_every steps to minimise the expected
variance on the gathered histogram of normalised magnitudes (levels.fit_amq); p starts at 1/2
(NUQSGD). Bit-packed and all-gathered (quantize.py)."""

from __future__ import annotations

from meshplan.executor.methods import allreduce, levels, quantize


class AMQ(quantize.Quantizer):
    adaptive = True

    def __init__(self, params: dict, world: int, rank: int):
        super().__init__(params, world, rank)
        self.multiplier: dict[int, float] = {}

    def initial_levels(self, count: int):
        return levels.exponential(count, 0.5)

    def refit(self, key: int, hist):
        self.multiplier[key], self.fitted[key] = levels.fit_amq(self.fixed.numel(), hist, self.multiplier.get(key, 0.5))


comm_hook, replica_reducer = quantize.module_hook(AMQ)
check_optimizer = allreduce.check_optimizer
optimizer_kwargs = allreduce.optimizer_kwargs
TIMED_CODEC = AMQ

"""compression=alq: adaptive levels (Faghri et al., NeurIPS 2020, ALQ): per tensor, the levels
are re-fitted every refit_every steps by coordinate descent to minimise the expected variance on
the histogram of normalised magnitudes all ranks gathered (levels.fit_alq); they start at
NUQSGD's exponential levels. Bit-packed and all-gathered (quantize.py)."""

from __future__ import annotations

from meshplan.executor.methods import allreduce, levels, quantize


class ALQ(quantize.Quantizer):
    adaptive = True

    def initial_levels(self, count: int):
        return levels.exponential(count, 0.5)

    def refit(self, key: int, hist):
        self.fitted[key] = levels.fit_alq(self.fixed.numel(), hist, self.fitted.get(key))


comm_hook, replica_reducer = quantize.module_hook(ALQ)
check_optimizer = allreduce.check_optimizer
optimizer_kwargs = allreduce.optimizer_kwargs
TIMED_CODEC = ALQ

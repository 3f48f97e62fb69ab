"""compression=nuqsgd: QSGD's unbiased stochastic rounding on exponentially spaced levels
{0, 2^-(L-2), ..., 1/2, 1} (Ramezani-Kebrya et al., NUQSGD, JMLR 2021), finer where most
normalised coordinates lie (near 0). Bit-packed and all-gathered (quantize.py)."""

from __future__ import annotations

from meshplan.executor.methods import allreduce, levels, quantize


class NUQSGD(quantize.Quantizer):
    def initial_levels(self, count: int):
        return levels.exponential(count, 0.5)


comm_hook, replica_reducer = quantize.module_hook(NUQSGD)
check_optimizer = allreduce.check_optimizer
optimizer_kwargs = allreduce.optimizer_kwargs
TIMED_CODEC = NUQSGD

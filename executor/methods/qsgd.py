"""compression=qsgd: unbiased stochastic rounding onto s = 2^(bits-1) - 1 uniform levels of
|v_i| / ||v_bucket|| (Alistarh et al., QSGD, NeurIPS 2017), bit-packed and all-gathered
(quantize.py). torch's quantization hooks are deterministic 8-bit min-max and fail on gloo
on CPU ranks: this is meshplan's own. Variance per bucket <= min(d / s^2, sqrt(d) / s)
||v||^2 (QSGD Lemma 3.1)."""

from __future__ import annotations

from meshplan.executor.methods import allreduce, levels, quantize


class QSGD(quantize.Quantizer):
    def initial_levels(self, count: int):
        return levels.uniform(count)


comm_hook, replica_reducer = quantize.module_hook(QSGD)
check_optimizer = allreduce.check_optimizer
optimizer_kwargs = allreduce.optimizer_kwargs
TIMED_CODEC = QSGD

"""Measured peak memory of one layer's forward+backward, and the analytic prediction beside it.

CPU has no allocator statistics, so `LiveBytes` (a TorchDispatchMode) counts the bytes of every
storage an op creates and subtracts them when the storage is freed (a weakref finalizer), keeping
the maximum: a live-tensor tracker in the spirit of torch.distributed._tools.MemTracker. On CUDA
the allocator's `max_memory_allocated` is used instead.
"""
from __future__ import annotations

import os
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveBytes(TorchDispatchMode):
    """Live and peak bytes of storages created while the mode is active (plus `baseline_bytes`)."""

    def __init__(self, baseline_bytes: int = 0):
        super().__init__()
        self.live_bytes = baseline_bytes
        self.peak_bytes = baseline_bytes
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {id(a.untyped_storage()) for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and id(t.untyped_storage()) not in inputs:
                self._track(t.untyped_storage())
        return out

    def _track(self, storage: torch.UntypedStorage) -> None:
        key = storage._cdata  # the C++ storage: views and re-wrapped Python objects share it
        if key in self._seen:
            return
        self._seen.add(key)
        size = storage.nbytes()
        self.live_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        weakref.finalize(storage, self._free, key, size)

    def _free(self, key: int, size: int) -> None:
        self._seen.discard(key)
        self.live_bytes -= size


def predict_peak_bytes(param_bytes: list[int], capture, batch: int, dtype: torch.dtype,
                       input_bytes: int) -> int:
    """Analytic peak of one forward+backward of `layer` for `batch` samples in `dtype`.

    At the end of forward, live are: parameters P, the input, the saved activations A (profile's
    activation bytes rescaled from bf16 to `dtype`) and the output. Backward then adds the output
    gradient, the gradient of the largest saved intermediate (the first big GEMM's input gradient)
    and that GEMM's weight gradient (at most the largest parameter) before the saved tensors it
    consumed are released. So peak = P + max_param + x + b * (A + 2 * out + largest_saved).
    """
    scale = torch.finfo(dtype).bits / 16 if dtype.is_floating_point else 1.0
    rescale = lambda n, d: n * scale if d == "torch.bfloat16" else n  # noqa: E731
    saved = sum(rescale(n, d) for d, n in capture.saved_bytes_by_dtype.items())
    largest = rescale(*capture.largest_saved)
    out = capture.output_bytes * (scale if capture.output.is_floating_point() else 1.0)
    per_sample = saved + 2 * out + largest
    return int(sum(param_bytes) + max(param_bytes, default=0) + input_bytes + batch * per_sample)


def layer_param_bytes(layer: torch.nn.Module, dtype: torch.dtype) -> list[int]:
    """Bytes of each floating parameter of `layer` once cast to `dtype` (works on meta layers)."""
    size = torch.finfo(dtype).bits // 8
    return [p.numel() * (size if p.is_floating_point() else p.element_size()) for p in layer.parameters()]


def available_memory_bytes() -> int:
    """RAM available to a new allocation now (MemAvailable), else installed RAM, else 0."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0

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


def predict_peak_bytes(
    param_bytes: list[int], capture, batch: int, dtype: torch.dtype, input_bytes: int, input_has_grad: bool = True
) -> int:
    """Analytic peak of one forward+backward of a layer for `batch` samples in `dtype`.

    Two candidate moments, the larger wins:
    - early backward: parameters P, the input x, the saved activations A (the profile's activation
      bytes rescaled from bf16 to `dtype`), the output and its gradient (2 out), plus the first
      backward step's new tensors: the gradient of the largest saved intermediate and one weight
      gradient (at most the largest parameter): P + max_param + x + b (A + 2 out + largest_saved);
    - end of backward: every parameter has its gradient, x has its gradient, the output and its
      gradient are still held by the caller: 2P + 2x + 2 b out (x once if it takes no gradient).
    """
    scale = torch.finfo(dtype).bits / 16 if dtype.is_floating_point else 1.0
    rescale = lambda n, d: n * scale if d == "torch.bfloat16" else n  # noqa: E731
    saved = sum(rescale(n, d) for d, n in capture.saved_bytes_by_dtype.items())
    largest = rescale(*capture.largest_saved)
    first = capture.output[0] if isinstance(capture.output, tuple) else capture.output  # tuple: the crossing tensors
    out = capture.output_bytes * (scale if first.is_floating_point() else 1.0)
    params = sum(param_bytes)
    early = params + max(param_bytes, default=0) + input_bytes + batch * (saved + 2 * out + largest)
    late = 2 * params + (2 if input_has_grad else 1) * input_bytes + 2 * batch * out
    return int(max(early, late))


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

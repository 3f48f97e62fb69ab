"""Peak memory per rank: CUDA's allocator statistic on GPU, a live-tensor tracker on CPU.

The CPU tracker is a TorchDispatchMode that registers the storage of every tensor an operator
returns (by weakref, so it is forgotten when freed) and keeps the running maximum of live bytes.
It starts from the bytes already held by the parameters, gradients and optimizer states it is
told about. It does not see buffers allocated inside communication libraries (gloo, DDP's
reducer buckets), so it is a lower bound of the process's true tensor memory. Code that frees a
storage in place (`untyped_storage().resize_(0)`, which no operator reports: offload=nvme's
parameter pager) tells the trackers with `storage_freed(tensor)`.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch
from torch.distributed.tensor import DTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

_TRACKERS: weakref.WeakSet = weakref.WeakSet()


def storage_freed(t: torch.Tensor) -> None:
    """Before `t.untyped_storage().resize_(0)`: every live tracker forgets that storage's bytes."""
    key = t.untyped_storage().data_ptr()
    for tracker in list(_TRACKERS):
        tracker._free(key, tracker.live.get(key, 0))


class LiveTensorTracker(TorchDispatchMode):
    """`with LiveTensorTracker(existing) as t: ...; t.peak_bytes`."""

    def __init__(self, existing: Iterable[torch.Tensor] = ()):
        super().__init__()
        _TRACKERS.add(self)
        self.live: dict[int, int] = {}
        self.current_bytes = 0
        for t in existing:
            self._track(t)
        self.peak_bytes = self.current_bytes

    def _track(self, t: torch.Tensor) -> None:
        if isinstance(t, DTensor):
            t = t._local_tensor
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return
        key = storage.data_ptr()
        if key == 0 or key in self.live:
            return
        nbytes = storage.nbytes()
        self.live[key] = nbytes
        self.current_bytes += nbytes
        weakref.finalize(storage, self._free, key, nbytes)

    def _free(self, key: int, nbytes: int) -> None:
        if self.live.pop(key, None) is not None:
            self.current_bytes -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        try:
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and not t.is_meta:
                    self._track(t)
            self.peak_bytes = max(self.peak_bytes, self.current_bytes)
        except Exception:  # an exception escaping a dispatch mode aborts the interpreter
            pass
        return out


def held_tensors(params: list[torch.Tensor], optimizers: list) -> list[torch.Tensor]:
    """Parameters, their gradients and the optimizer states: what a step starts with."""
    held = list(params) + [p.grad for p in params if p.grad is not None]
    for opt in optimizers:
        inner = getattr(opt, "optim", opt)  # ZeroRedundancyOptimizer keeps its shard in .optim
        for state in inner.state.values():
            held += [v for v in state.values() if isinstance(v, torch.Tensor)]
    return held

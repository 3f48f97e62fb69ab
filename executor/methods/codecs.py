"""The compressors' codecs by registry name, and a stand-in group, for timing them off a run
(`meshplan profile`: profiler/codecs.py, through executor/wrappers.py).

`codec(name, params, world)` builds the codec the executor runs for compression=name (each
compression module's TIMED_CODEC: the codec classes of topk.py, accordion.py, quantize.py's
subclasses), with two stand-ins where the executor calls a torch hook instead of a codec of its own:
- powersgd runs torch's `powerSGD_hook` (powersgd.py), which needs a process group: timed as
  lowrank.LowRank, the same algorithm per tensor (Vogels et al. 2019 Alg. 1: P = M Q, QR,
  Q = M^T P, M ~ P Q^T, error feedback, warm start); torch orthogonalises by Gram-Schmidt and
  batches the bucket's tensors, so this is its compute up to those two choices;
- fp16 runs torch's `fp16_compress_hook` (fp16.py): its `Fp16Cast` does the hook's tensor work
  (cast to fp16, divide by the group size, cast back) around the all-reduce.

`LoopbackComm(world)` answers the collectives locally: `all_gather` returns `world` copies of
this rank's payload (so a codec decodes `world` payloads, as in a real group) and `all_reduce`
scales the buffer by `world` (the sum of `world` equal buffers). No bytes move: what is timed is
the codec's compute.
"""

from __future__ import annotations

import torch

from meshplan.executor.methods import MODULES, compressed

CODECS: dict[str, type[compressed.Codec]] = {
    name: module.TIMED_CODEC for name, module in MODULES.compression.items() if module.TIMED_CODEC is not None
}
"""Registry name -> the codec class timed for it: each compression module's TIMED_CODEC (the
registry's, executor/methods/__init__.py; module docstring for the two stand-ins)."""


def codec(name: str, params: dict, world: int) -> compressed.Codec:
    """The codec of compression=`name` with resolved `params`, as rank 0 of `world` ranks."""
    return CODECS[name](params, world, 0)


class LoopbackComm:
    """A group of `world` ranks that all hold this rank's data (module docstring)."""

    def __init__(self, world: int):
        self.world, self.rank = world, 0

    def all_gather(self, payload: torch.Tensor) -> list[torch.Tensor]:
        return list(payload.repeat(self.world).view(self.world, -1).unbind(0))  # one buffer, as DistComm's

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.mul_(self.world)

"""compression=topk: top-k sparsification with error feedback, values and int32 indices
all-gathered (Lin et al., Deep Gradient Compression, ICLR 2018; Stich et al., NeurIPS 2018).

Per tensor and step (meshplan/compression_wire.py for k and the bytes):
  1. DGC local clipping (clip_norm > 0): g scaled to norm <= clip_norm / sqrt(N)
  2. accumulate: acc = g + e (error feedback), or with DGC momentum correction u = m u + g,
     acc = v = v + u (velocity accumulated, then sparsified)
  3. S = top-k |acc| with k = ceil(density_t n) (density_t: DGC's warm-up, else density)
  4. send (acc[S] fp32, S int32); e = acc with S zeroed (DGC also zeroes u at S: momentum masking)
  5. every rank scatters every rank's (values, indices) into zeros and divides by N.
One all-gather per bucket carries all its tensors' payloads. density = 1 with error feedback
sends everything: the average of the dense gradients, i.e. DDP.

With momentum correction the velocity v is the momentum (DGC's update is w -= lr * mean_i
sparse(v_i)), so the optimizer must not add its own: `optimizer_kwargs` builds SGD with
momentum 0, and `check_optimizer` refuses AdamW (its first moment would be a second momentum).
"""

from __future__ import annotations

import math

import torch

from meshplan.comm_bytes import ByteCounter
from meshplan.compression_wire import dgc_density, topk_k
from meshplan.errors import MeshplanError
from meshplan.executor.methods import compressed
from meshplan.executor.methods.error_feedback import ErrorFeedback


class TopK(compressed.Codec):
    def __init__(self, params: dict, world: int, rank: int):
        super().__init__(params, world, rank)
        mc = params.get("momentum_correction", False)
        self.feedback = ErrorFeedback(params.get("error_feedback", True) or mc)
        self.velocity: dict[int, torch.Tensor] = {}
        """DGC momentum correction's u per tensor."""

    def density(self, key: int, step: int) -> float:
        return dgc_density(step, self.params["density"], self.params.get("warmup_steps", 0))

    def _accumulate(self, key: int, grad: torch.Tensor) -> torch.Tensor:
        clip = self.params.get("clip_norm", 0.0)
        if clip > 0:
            grad = grad * min(1.0, clip / math.sqrt(self.world) / (float(grad.norm()) + 1e-12))
        if self.params.get("momentum_correction", False):
            u = self.velocity.get(key)
            u = grad.clone() if u is None else u.mul_(self.params["momentum"]).add_(grad)
            self.velocity[key] = u
            grad = u
        return self.feedback.accumulate(key, grad)

    def encode(self, key: int, grad: torch.Tensor, density: float) -> torch.Tensor:
        """This rank's payload for one tensor: k fp32 values then k int32 indices, as bytes."""
        acc = self._accumulate(key, grad)
        k = topk_k(acc.numel(), density)
        index = (
            torch.topk(acc.abs(), k, sorted=False).indices
            if k < acc.numel()
            else torch.arange(acc.numel(), device=acc.device)
        )
        values = acc[index]
        self.feedback.keep(key, acc, index)
        if key in self.velocity:
            self.velocity[key][index] = 0  # DGC momentum factor masking
        return torch.cat([values.float().view(torch.uint8), index.to(torch.int32).view(torch.uint8)])

    def exchange(self, comm, items: list[tuple[int, torch.Tensor, tuple]]) -> None:
        densities = [self.density(key, self.step_of(key)) for key, *_ in items]
        ks = [topk_k(grad.numel(), d) for (_, grad, _), d in zip(items, densities)]
        gathered = comm.all_gather(
            torch.cat([self.encode(key, grad, d) for (key, grad, _), d in zip(items, densities)])
        )
        for (_key, grad, _), k, offset in zip(items, ks, _offsets(ks)):
            total = torch.zeros_like(grad)
            for part in gathered:  # rank order: the same sum on every rank
                chunk = part[offset : offset + 8 * k]
                total.index_add_(0, chunk[4 * k :].view(torch.int32).long(), chunk[: 4 * k].view(torch.float32))
            grad.copy_(total.div_(comm.world))


def _offsets(ks: list[int]) -> list[int]:
    out, at = [], 0
    for k in ks:
        out.append(at)
        at += 8 * k
    return out


def momentum_corrected(params: dict) -> bool:
    return bool(params.get("momentum_correction", False))


def check_optimizer(params: dict, optimizer: str) -> None:
    """One line for the optimizers DGC's momentum correction cannot sit under."""
    if momentum_corrected(params) and optimizer != "sgd":
        raise MeshplanError(
            f"compression=topk momentum_correction=true with optimizer {optimizer}: DGC's "
            "velocity replaces the optimizer's momentum; run with --optimizer sgd (applied "
            "without momentum) or set momentum_correction=false"
        )


def optimizer_kwargs(params: dict, optimizer: str, kwargs: dict) -> dict:
    """The executor optimizer's kwargs under this codec: no momentum of its own under DGC."""
    check_optimizer(params, optimizer)
    return {**kwargs, "momentum": 0.0} if momentum_corrected(params) else kwargs


def comm_hook(group, params: dict, counter: ByteCounter, axis: str):
    """(codec, hook) for DDP.register_comm_hook; warm-up steps are left out of the steady state."""
    counter.warmup_steps = max(counter.warmup_steps, params.get("warmup_steps", 0))
    return compressed.comm_hook(TopK, group, params, counter, axis)


replica_reducer = compressed.replica_reducer(TopK, warmup_param="warmup_steps")
TIMED_CODEC = TopK

"""A per-tensor PowerSGD codec (Vogels et al., NeurIPS 2019, Alg. 1 with error feedback and warm
start), so Accordion can give each tensor its own rank; torch's powerSGD_hook (powersgd.py) has
one rank per hook state.

Per bucket, for each tensor M (n = dim 0 by m = the rest) + its residual E, with
r = min(n, m, rank) and compression_wire.lowrank_split's rule (else sent dense):
  P = (M + E) Q;  all-reduce [P..., dense...] / N;  P = orthonormal(P) (reduced QR)
  Q = (M + E)^T P;  all-reduce [Q...] / N;  M^ = P Q^T;  E = M + E - M^
Q starts as a seeded normal matrix (the tensor's ordinal: the same on every rank) and is kept
between steps (warm start); a rank change restarts it. Bytes: the two all-reduces carry
compression_wire.lowrank_elems fp32 elements per tensor. With `start_iter` (Accordion's
parameter) the first start_iter steps all-reduce the bucket dense, as torch's powerSGD_hook does
before start_powerSGD_iter (the ByteCounter leaves them out of the steady state: warmup_steps).
"""

from __future__ import annotations

import torch

from meshplan.compression_wire import lowrank_split, matrix_of
from meshplan.executor.methods import compressed
from meshplan.executor.methods.error_feedback import ErrorFeedback


class LowRank(compressed.Codec):
    def __init__(self, params: dict, world: int, rank: int):
        super().__init__(params, world, rank)
        self.feedback = ErrorFeedback(True)
        self.q: dict[int, torch.Tensor] = {}

    def rank_for(self, key: int) -> int:
        return self.params["rank"]

    def _q(self, key: int, m: int, r: int, device: torch.device) -> torch.Tensor:
        q = self.q.get(key)
        if q is None or q.shape != (m, r):
            gen = torch.Generator().manual_seed(self.ordinal(key))  # on the host: the same on every rank
            q = self.q[key] = torch.randn((m, r), generator=gen).to(device)
        return q

    def exchange(self, comm, items: list[tuple[int, torch.Tensor, tuple]]) -> None:
        if items and self._steps.get(items[0][0], 0) < self.params.get("start_iter", 0):
            self._dense(comm, items)
            return
        packed, dense = [], []
        for key, grad, shape in items:
            self.step_of(key)
            n, m = matrix_of(shape)
            r = lowrank_split(n, m, self.rank_for(key), self.params["min_compression_rate"])
            if r:
                acc = self.feedback.accumulate(key, grad).view(n, m)
                packed.append((key, grad, acc, acc @ self._q(key, m, r, acc.device)))  # P: (n, r)
            else:
                dense.append(grad)
        first = torch.cat([p.reshape(-1) for *_, p in packed] + [g.reshape(-1) for g in dense] or [torch.zeros(0)])
        comm.all_reduce(first).div_(comm.world)
        offset = 0
        ps = []
        for _key, _grad, _acc, p in packed:
            ps.append(torch.linalg.qr(first[offset : offset + p.numel()].view_as(p)).Q)  # (n, r)
            offset += p.numel()
        for g in dense:
            g.copy_(first[offset : offset + g.numel()].view_as(g))
            offset += g.numel()
        if not packed:
            return
        second = comm.all_reduce(torch.cat([(acc.T @ p).reshape(-1) for (_, _, acc, _), p in zip(packed, ps)]))
        second.div_(comm.world)
        offset = 0
        for (key, grad, acc, _), p in zip(packed, ps):
            q = second[offset : offset + acc.shape[1] * p.shape[1]].view(acc.shape[1], p.shape[1]).clone()
            offset += q.numel()
            approx = p @ q.T  # (n, m)
            self.feedback.residual[key] = (acc - approx).reshape(-1)
            self.q[key] = q
            grad.copy_(approx.reshape(-1))

    def _dense(self, comm, items) -> None:
        """Before start_iter: the bucket's gradients all-reduced as they are (torch's
        powerSGD_hook before start_powerSGD_iter); no residual or factors are kept yet."""
        for key, _, _ in items:
            self.step_of(key)
        flat = comm.all_reduce(torch.cat([g for _, g, _ in items])).div_(comm.world)
        offset = 0
        for _, g, _ in items:
            g.copy_(flat[offset : offset + g.numel()])
            offset += g.numel()

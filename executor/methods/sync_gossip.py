"""sync=gossip: decentralised SGD on a ring (BAGUA's decentralized / low_precision_decentralized).

After its local optimizer step, every period steps, each replica exchanges its parameters with
its two ring neighbours (rank +- 1 mod N; the one other rank when N = 2) and mixes them with
the doubly stochastic ring matrix W (1/3 self and each neighbour; 1/2 and 1/2 for N = 2):
  x_i <- x_i + gamma (sum_j W_ij x^_j - x^_i)
where x^ are the public copies. Full precision: x^ = x (gamma = 1 is plain ring averaging,
x <- W x). low_precision (CHOCO-gossip, Koloskova et al. 2019; BAGUA keeps the same three
copies): each rank sends q_i = Q(x_i - x^_i), 8-bit min-max quantised per `chunk` elements,
and every rank adds the q it sends and receives to the copies it keeps (its own and its two
neighbours'). Both preserve the replicas' mean exactly (W is doubly stochastic); consensus
error shrinks at the ring's spectral gap per round (|lambda_2| = (1 + 2 cos(2 pi / N)) / 3; a step
size gamma < 1 turns each eigenvalue lambda of W into 1 - gamma + gamma lambda).
The 8-bit variant's stated error: after a round every public copy is its replica up to half a
quantisation level, |x_j - x^_j| <= h_j = (max - min) / 510 of x_j - x^_j's chunk that round, so
each replica ends within gamma (sum_j W_ij h_j + h_i) per element of the full-precision round
x_i + gamma (sum_j W_ij x_j - x_i) from the same replicas (tests/test_sync_async_safety.py).

Bytes ("send_recv" per neighbour): fp32 vector of the parameters, or P uint8 + 8 bytes of
(min, max) per chunk.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from meshplan.executor.methods.sync import SyncMethod, flat, no_ddp_comm_hook, tensor_bytes, trainable, unflat

USES_DDP = False
ddp_comm_hook = no_ddp_comm_hook
LEVELS = 255


def quantize(v: torch.Tensor, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """8-bit min-max: (uint8 codes, (min, max) per chunk as fp32). Error <= (max - min) / 510."""
    pad = (-v.numel()) % chunk
    rows = torch.nn.functional.pad(v, (0, pad)).view(-1, chunk)
    lo, hi = rows.min(1).values, rows.max(1).values
    scale = torch.where(hi > lo, (hi - lo) / LEVELS, torch.ones_like(hi))
    codes = torch.round((rows - lo[:, None]) / scale[:, None]).clamp(0, LEVELS).to(torch.uint8)
    return codes.view(-1)[: v.numel()].contiguous(), torch.stack([lo, hi], 1).contiguous()


def dequantize(codes: torch.Tensor, ranges: torch.Tensor, chunk: int) -> torch.Tensor:
    n = codes.numel()
    pad = (-n) % chunk
    rows = torch.nn.functional.pad(codes.float(), (0, pad)).view(-1, chunk)
    lo, hi = ranges[:, 0], ranges[:, 1]
    scale = torch.where(hi > lo, (hi - lo) / LEVELS, torch.ones_like(hi))
    return (rows * scale[:, None] + lo[:, None]).view(-1)[:n]


def neighbours(rank: int, world: int) -> list[int]:
    """Ring neighbours (group ranks): left and right, one when N = 2."""
    return sorted({(rank - 1) % world, (rank + 1) % world} - {rank})


def ring_weight(world: int) -> float:
    """W_ij of each neighbour (and of self)."""
    return 1.0 / (len(neighbours(0, world)) + 1)


def spectral_rate(world: int) -> float:
    """|lambda_2| of the ring's W: the factor by which one round shrinks the consensus error."""
    if world <= 2:
        return 0.0
    w = ring_weight(world)
    return max(abs(w + 2 * w * math.cos(2 * math.pi * k / world)) for k in range(1, world))


class GossipRing:
    """One replica's gossip rounds on flat vectors over `group` (no model: tests drive it with
    plain tensors). `count(nbytes)` is told every message this rank sends."""

    def __init__(self, group, params: dict, count=lambda nbytes: None):
        self.group, self.params, self.count = group, params, count
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.peers = neighbours(self.rank, self.world)
        self.w = ring_weight(self.world)
        self.copies: dict[int, torch.Tensor] | None = None  # low precision: x^ of self and peers

    @torch.no_grad()
    def round(self, x: torch.Tensor) -> torch.Tensor:
        """x after one gossip round (every rank of the group calls it together)."""
        if self.params["low_precision"]:
            return self._choco(x)
        got = self._exchange([x])
        mixed = self.w * (x + sum(g[0] for g in got.values()))
        return x + self.params["gamma"] * (mixed - x)

    def _choco(self, x: torch.Tensor) -> torch.Tensor:
        chunk = self.params["chunk"]
        if self.copies is None:
            self.copies = {r: torch.zeros_like(x) for r in [self.rank, *self.peers]}
        codes, ranges = quantize(x - self.copies[self.rank], chunk)
        self.copies[self.rank] += dequantize(codes, ranges, chunk)
        for r, (c, rg) in self._exchange([codes, ranges]).items():
            self.copies[r] += dequantize(c, rg, chunk)
        mixed = self.w * sum(self.copies.values())
        return x + self.params["gamma"] * (mixed - self.copies[self.rank])

    def _exchange(self, tensors: list[torch.Tensor]) -> dict[int, list[torch.Tensor]]:
        """Send `tensors` to every neighbour and receive theirs (batched isend/irecv)."""
        inbox = {r: [torch.empty_like(t) for t in tensors] for r in self.peers}
        ops = []
        for r in self.peers:
            peer = dist.get_global_rank(self.group, r)
            for t in tensors:
                self.count(tensor_bytes(t))
                ops.append(dist.P2POp(dist.isend, t, peer, self.group))
            ops += [dist.P2POp(dist.irecv, buf, peer, self.group) for buf in inbox[r]]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return inbox


class Gossip(SyncMethod):
    def __init__(self, par, params, counter):
        super().__init__(par, params, counter)
        self.ring = GossipRing(
            self.group, params, lambda nbytes: counter.add("dp_replicate", "send_recv", self.world, nbytes)
        )
        self.steps = 0

    def after_step(self) -> None:
        self.steps += 1
        if self.steps % self.params["period"] == 0:
            params = trainable(self.par.parameters())
            unflat(self.ring.round(flat(params)), params)


def build(par, params, counter):
    return Gossip(par, params, counter)

"""Unbiased stochastic quantization of bucket-normalised gradients (QSGD, NUQSGD, ALQ, AMQ),
bit-packed and all-gathered. The level sets are in levels.py; this is the common codec.

Per tensor (n coordinates, buckets of d = bucket_size, L = 2^(bits-1) magnitude levels
0 = l_0 < ... < l_{L-1} = 1):
  r_i = |v_i| / ||v_bucket||_2;  l_j <= r_i < l_{j+1}:  up to l_{j+1} with probability
  (r_i - l_j) / (l_{j+1} - l_j), else l_j  (Alistarh et al. 2017 Sec 3.1; unbiased:
  E[Q(v_i)] = v_i, per-coordinate variance (l_{j+1} - r)(r - l_j) ||v||^2)
  code_i = 2 * level index + sign bit, packed `bits` bits per coordinate (little-endian bits)
Payload per tensor: packed codes, the fp32 norms, and (adaptive level sets) the fp32 histogram
of the normalised magnitudes (meshplan/compression_wire.py: quant_bytes, HIST_BINS). Every rank
decodes every rank's payload with the levels in force and averages; adaptive codecs then, every
refit_every steps, fit the next levels from the sum of the gathered histograms: the same data
on every rank, so the same levels, with no extra collective. quantize=false sends fp32 values.
Random numbers: one generator per rank (seed 1000003 rank + 17), so ranks draw independently.
"""

from __future__ import annotations

import math

import torch

from meshplan.comm_bytes import ByteCounter
from meshplan.compression_wire import HIST_BINS, NORM_BYTES, magnitude_levels, quant_bytes
from meshplan.executor.methods import compressed, levels


def normalise(v: torch.Tensor, bucket_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(r, norms): r = |v| / its bucket's norm, shaped (num_buckets, bucket_size) with zero
    padding; norms (num_buckets,) fp32."""
    pad = (-v.numel()) % bucket_size
    rows = torch.nn.functional.pad(v.float(), (0, pad)).view(-1, bucket_size)  # (nb, d)
    norms = rows.norm(dim=1)  # (nb,)
    r = rows.abs() / torch.where(norms > 0, norms, torch.ones_like(norms)).unsqueeze(1)
    return r.clamp_(max=1.0), norms


def stochastic_round(r: torch.Tensor, lv: torch.Tensor, gen: torch.Generator | None) -> torch.Tensor:
    """Level index of each r in [0, 1] rounded up or down between its two neighbours of `lv`."""
    low = (torch.searchsorted(lv, r.contiguous(), right=True) - 1).clamp_(0, lv.numel() - 2)
    a, b = lv[low], lv[low + 1]
    up = torch.rand(r.shape, generator=gen, device=r.device) < (r - a) / (b - a)
    return low + up.long()


def histogram(r: torch.Tensor) -> torch.Tensor:
    """HIST_BINS fp32 counts of normalised magnitudes (compression_wire.HIST_BINS's bins)."""
    edges = levels.hist_edges(r.device)
    return torch.bincount(torch.bucketize(r, edges, right=True), minlength=HIST_BINS).float()


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """`bits` low bits of each code, concatenated little-endian into ceil(n bits / 8) bytes."""
    shifts = torch.arange(bits, device=codes.device)
    flat = ((codes.unsqueeze(1) >> shifts) & 1).to(torch.uint8).reshape(-1)  # (n bits,)
    flat = torch.nn.functional.pad(flat, (0, (-flat.numel()) % 8)).view(-1, 8)
    return (flat << torch.arange(8, device=codes.device, dtype=torch.uint8)).sum(1, dtype=torch.uint8)


def unpack(data: torch.Tensor, bits: int, n: int) -> torch.Tensor:
    flat = ((data.unsqueeze(1) >> torch.arange(8, device=data.device, dtype=torch.uint8)) & 1).reshape(-1)
    flat = flat[: n * bits].view(n, bits).long()
    return (flat << torch.arange(bits, device=data.device)).sum(1)


class Quantizer(compressed.Codec):
    """The common codec; `levels_for(key)` is the level set (subclasses: levels.py policies)."""

    adaptive = False

    def __init__(self, params: dict, world: int, rank: int):
        super().__init__(params, world, rank)
        self.bits, self.d = params["bits"], params["bucket_size"]
        self.seed = 1000003 * rank + 17
        self.gens: dict[torch.device, torch.Generator] = {}
        """One generator per device the gradients live on (torch.rand needs one of the tensor's device)."""
        self.fixed = self.initial_levels(magnitude_levels(self.bits))
        self.fitted: dict[int, torch.Tensor] = {}

    def initial_levels(self, count: int) -> torch.Tensor:
        raise NotImplementedError

    def _gen(self, device: torch.device) -> torch.Generator:
        gen = self.gens.get(device)
        if gen is None:
            gen = self.gens[device] = torch.Generator(device=device).manual_seed(self.seed)
        return gen

    def levels_for(self, key: int) -> torch.Tensor:
        return self.fitted.get(key, self.fixed)

    def refit(self, key: int, hist: torch.Tensor) -> None:
        """Adaptive codecs: fit this tensor's next levels from the gathered histogram."""

    def encode(self, key: int, v: torch.Tensor) -> torch.Tensor:
        if not self.params.get("quantize", True):
            return v.float().view(torch.uint8)
        r, norms = normalise(v, self.d)
        lv = self.levels_for(key).to(v.device)
        sign = (v.float() < 0).long()
        codes = stochastic_round(r.reshape(-1)[: v.numel()], lv, self._gen(v.device)) * 2 + sign
        parts = [pack(codes, self.bits), norms.view(torch.uint8)]
        if self.adaptive:
            parts.append(histogram(r.reshape(-1)[: v.numel()]).view(torch.uint8))
        return torch.cat(parts)

    def decode(self, key: int, chunk: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(values, histogram or None) of one rank's payload for one tensor."""
        if not self.params.get("quantize", True):
            return chunk.clone().view(torch.float32), None
        packed = math.ceil(n * self.bits / 8)
        nb = math.ceil(n / self.d)
        codes = unpack(chunk[:packed], self.bits, n)
        norms = chunk[packed : packed + NORM_BYTES * nb].clone().view(torch.float32)
        mags = self.levels_for(key).to(chunk.device)[codes >> 1] * norms.repeat_interleave(self.d)[:n]
        values = torch.where((codes & 1).bool(), -mags, mags)
        hist = chunk[packed + NORM_BYTES * nb :].clone().view(torch.float32) if self.adaptive else None
        return values, hist

    def exchange(self, comm, items: list[tuple[int, torch.Tensor, tuple]]) -> None:
        sizes = [self.payload_bytes(g.numel()) for _, g, _ in items]
        gathered = comm.all_gather(torch.cat([self.encode(key, g) for key, g, _ in items]))
        offset = 0
        for (key, grad, _), size in zip(items, sizes):
            total, hist = torch.zeros(grad.numel(), device=grad.device), torch.zeros(HIST_BINS, device=grad.device)
            for part in gathered:  # rank order: the same sums (and levels) on every rank
                values, h = self.decode(key, part[offset : offset + size], grad.numel())
                total += values
                if h is not None:
                    hist += h
            grad.copy_(total.div_(comm.world))
            step = self.step_of(key)
            if self.adaptive and step % self.params["refit_every"] == 0:
                self.refit(key, hist.cpu())  # 32 counts: the fit runs on the host (levels.py)
            offset += size

    def payload_bytes(self, n: int) -> int:
        return quant_bytes(
            n, bits=self.bits, bucket_size=self.d, quantize=self.params.get("quantize", True), adaptive=self.adaptive
        )


def module_hook(codec: type):
    """`comm_hook` and `replica_reducer` for one quantizer's executor module."""

    def comm_hook(group, params: dict, counter: ByteCounter, axis: str):
        return compressed.comm_hook(codec, group, params, counter, axis)

    return comm_hook, compressed.replica_reducer(codec)

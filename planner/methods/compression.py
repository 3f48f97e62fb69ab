"""Gradient compressors' cost objects (the compression axis of meshplan/dp_methods.py): what each
one's once-per-step gradient exchange carries per layer, the state it keeps, the compute it adds.

These reduce by all-reduce (their payloads can be summed). A compressor whose payload cannot
be summed (top-k's values and indices, quantized codes) is exchanged by all-gather
(`collective = "all_gather"`, payload = this rank's contribution) and pays only below a density
of about 1/N: planner/methods/compression_quant.py, registered in COMPRESSORS below.
"""

from __future__ import annotations

import math

from meshplan.model_profile import LayerProfile
from meshplan.planner.cost.compute import gemm_efficiency

GRAD_BYTES = 4
"""DDP's gradients are fp32 (the parameters' dtype; bf16 runs under autocast)."""


def shard_shapes(layer: LayerProfile, split: int) -> list[list[int]] | None:
    """Each trainable tensor's shape on one tensor-parallel rank of `split`, as the executor
    shards it (executor/tensor_parallel.py through torch's ColwiseParallel / RowwiseParallel): a
    column child's weight and bias on dim 0 (an nn.Embedding's weight, in an "embedding" layer,
    on dim 1), a row child's weight on dim 1 (an nn.Embedding's on dim 0) and its bias whole;
    norms and other replicated tensors whole. A shard holds ceil(size / split) (torch.chunk's
    first shards). None when the profile has no parameter names (older profiles)."""
    if split == 1:
        return [list(s) for s in layer.param_shapes]
    if len(layer.param_names) != len(layer.param_shapes):
        return None
    column, row, embedding = set(layer.tp.column), set(layer.tp.row), layer.tp.kind == "embedding"
    out = []
    for name, shape in zip(layer.param_names, layer.param_shapes):
        child, _, leaf = name.rpartition(".")
        dim = None
        if child in column:
            dim = 1 if embedding and leaf == "weight" else 0
        elif child in row and leaf == "weight":
            dim = 0 if embedding else 1
        local = list(shape)
        if dim is not None and dim < len(local):
            local[dim] = math.ceil(local[dim] / split)
        out.append(local)
    return out


def matrices(layer: LayerProfile, split: int) -> list[tuple[int, int]]:
    """(rows, cols) of each parameter as a DDP hook or the replica reducer sees it (dim 0 by the
    rest; 1-D tensors as (n, 1)): its tensor-parallel shard (shard_shapes; the whole tensor when
    the profile cannot say); from the GEMM weight shapes when the profile has no parameter shapes."""
    if layer.param_shapes:
        out = []
        for shape in shard_shapes(layer, split) or layer.param_shapes:
            numel = math.prod(shape) if shape else 1
            rows = shape[0] if len(shape) > 1 else numel
            out.append((rows, numel // rows if len(shape) > 1 else 1))
        return out
    gemms = [(int(g[1]), int(g[2])) for g in layer.gemm_shapes]
    rest = layer.num_params / split - sum(n * k for n, k in gemms)
    return gemms + ([(int(max(rest, 0)), 1)] if rest > 0 else [])


class Compressor:
    """No compression: the fp32 gradients are the payload."""

    name = "none"
    collective = "all_reduce"
    """How the payload is exchanged: "all_reduce" (summable) or "all_gather" (per-rank payloads)."""
    group = 1
    """Ranks exchanging (planner/rank/dp_cost.py sets it): the gathered buffers of all-gather compressors."""
    banded = False
    """True where the bytes vary between steps (Accordion): priced as a band as well."""
    rounds = 1
    """Collectives one after another per step (the second waits for the first's result): each
    round beyond the first adds the collective's latency (planner/rank/dp_cost.py)."""

    def __init__(self, **params):
        self.params = params

    def payload_bytes(self, layer: LayerProfile, split: int) -> float:
        return GRAD_BYTES * layer.num_params / split

    def state_bytes(self, layer: LayerProfile, split: int) -> float:
        """Bytes the compressor keeps between steps on each rank."""
        return 0.0

    def compute_s(self, ctx, layer: LayerProfile, split: int) -> float:
        """Compression + decompression seconds per step and rank: measured where the profile has
        this compressor's codec timed on this kind of device (ModelProfile.codec_timings,
        profiler/codecs.py), else `modelled_s`. A measurement is at the timed setting on the whole
        tensors: the model's ratio (these settings and shards over the timed ones) carries it to
        this setting and TP split (1/split where the model says 0); the group's decodes are
        added per rank (decode_s x group) and adaptive levels' re-fit once per refit_every."""
        timing = ctx.profile.codec_timings.get(self.name) if ctx.measured else None
        if timing is None or layer.name not in timing.encode_s:
            return self.modelled_s(ctx, layer, split)
        timed = type(self)(**{**self.params, **timing.params})
        timed.group = self.group
        base, now = timed.modelled_s(ctx, layer, 1), self.modelled_s(ctx, layer, split)
        scale = now / base if base > 0 else 1.0 / split
        measured = timing.encode_s[layer.name] + self.group * timing.decode_s.get(layer.name, 0.0)
        refit = (
            timing.refit_s.get(layer.name, 0.0) / self.params["refit_every"] if "refit_every" in self.params else 0.0
        )
        return measured * scale + refit

    def modelled_s(self, ctx, layer: LayerProfile, split: int) -> float:
        """Compression + decompression seconds per step, from the model alone."""
        return 0.0


class Fp16(Compressor):
    """torch default_hooks.fp16_compress_hook: the bucket cast to fp16, all-reduced, cast back
    (half the bytes; the cast is memory-bound and hidden in the hook)."""

    name = "fp16"

    def payload_bytes(self, layer: LayerProfile, split: int) -> float:
        return 2 * layer.num_params / split


class PowerSGD(Compressor):
    """Vogels et al. 2019 Alg. 1, as torch's powerSGD_hook runs it: each n x m gradient matrix
    with (n + m) r' x min_compression_rate < n m (r' = min(n, m, rank)) is sent as P (n x r')
    and Q (m x r'), two all-reduces; vectors and small matrices go uncompressed in a third.
    Q = M^T P needs the all-reduced P, so P's and Q's all-reduces run one after the other (the
    uncompressed one is issued before P's and overlaps it): two rounds, two latencies."""

    name = "powersgd"
    rounds = 2

    def _split(self, layer: LayerProfile, split: int) -> tuple[int, list[tuple[int, int, int]]]:
        """(uncompressed elements, [(n, m, r')] of the compressed matrices)."""
        dense, packed = 0, []
        rank, rate = self.params["rank"], self.params["min_compression_rate"]
        for n, m in matrices(layer, split):
            r = min(n, m, rank)
            if m > 1 and (n + m) * r * rate < n * m:
                packed.append((n, m, r))
            else:
                dense += n * m
        return dense, packed

    def payload_bytes(self, layer: LayerProfile, split: int) -> float:
        dense, packed = self._split(layer, split)
        return GRAD_BYTES * (dense + sum((n + m) * r for n, m, r in packed))

    def state_bytes(self, layer: LayerProfile, split: int) -> float:
        """Error feedback keeps the whole bucket's residual (fp32); P and Q per matrix stay
        allocated (warm start reuses Q)."""
        _, packed = self._split(layer, split)
        residual = GRAD_BYTES * layer.num_params / split if self.params["error_feedback"] else 0.0
        return residual + GRAD_BYTES * sum((n + m) * r for n, m, r in packed)

    def modelled_s(self, ctx, layer: LayerProfile, split: int) -> float:
        """P = M Q, Q = M^T P and M ~ P Q^T (2 n m r' FLOPs each) and P's orthogonalisation
        (~2 n r'^2), in fp32 at the device's GEMM efficiency for that size."""
        _, packed = self._split(layer, split)
        peak = ctx.cluster.device.peak_flops.get("fp32") or max(ctx.cluster.device.peak_flops.values())
        curve = ctx.cluster.device.gemm_efficiency
        total = 0.0
        for n, m, r in packed:
            gemm = 2.0 * n * m * r
            total += 3 * gemm / (peak * gemm_efficiency(curve, gemm)) + 2.0 * n * r * r / peak
        return total

"""Cost objects of the all-gather and adaptive compressors (registered in planner/methods/compression.py's COMPRESSORS):
top-k, the quantizers (QSGD, NUQSGD, ALQ, AMQ) and Accordion over PowerSGD or top-k.

Bytes per tensor come from meshplan/compression_wire.py, the formulas the executor's codecs send
by, so the prediction equals the count. Top-k and the quantizers cannot be summed: their payload
is all-gathered (`collective = "all_gather"`, payload = this rank's contribution, (N-1) x on the
wire), so they pay only below about 2/N of the dense bytes (top-k: density < 1/N). Accordion
is priced as a band: every step at the high-compression setting (f = 0) up to every step at the
low-compression one (f = 1), `band_params()`; the expected value sits at f = critical_fraction
where the user set it (e.g. the share a run's notes report) and at the band's top (f = 1)
where not: the rule starts critical and a run shorter than its first windows stays there, so
the top is what is certain, not a guess of the mix.

Compute is measured where the profile has the codecs timed on this kind of device
(`meshplan profile` on a real device: profiler/codecs.py; Compressor.compute_s scales it to the
setting and TP shards by the model below); `modelled_s` is the model: every compressor is a chain
of memory-bound elementwise passes plus a fixed cost per op (kernel launch / framework dispatch,
OP_S), encode once and decode once per rank of the group.
"""

from __future__ import annotations

import math

from meshplan import compression_wire as wire
from meshplan.model_profile import LayerProfile
from meshplan.planner.methods.compression import GRAD_BYTES, Compressor, PowerSGD, matrices, shard_shapes

OP_S = 8e-6
"""Seconds of fixed cost per elementwise op (a CUDA kernel launch; a torch op's dispatch on CPU)."""


def _numels(layer: LayerProfile, split: int) -> list[int]:
    """Elements per tensor one rank exchanges: its tensor-parallel shard (compression.shard_shapes:
    exact); in a profile without parameter names each tensor is taken as 1/split of itself."""
    shards = shard_shapes(layer, split) if layer.param_shapes else None
    if shards is not None:
        return [math.prod(s) for s in shards]
    return [math.ceil(n * m / split) for n, m in matrices(layer, split)]


def _pass_s(ctx, ops: float, bytes_touched: float) -> float:
    return ops * OP_S + bytes_touched / (ctx.cluster.device.hbm_gbps * 1e9)


class TopK(Compressor):
    """Top-k values + int32 indices per tensor, all-gathered (executor/methods/topk.py)."""

    name = "topk"
    collective = "all_gather"

    def density(self) -> float:
        return self.params["density"]

    def payload_bytes(self, layer: LayerProfile, split: int) -> float:
        return sum(wire.topk_bytes(n, self.density()) for n in _numels(layer, split))

    def state_bytes(self, layer: LayerProfile, split: int) -> float:
        """The fp32 residual (error feedback), DGC's velocity, the accumulated tensor and the
        gathered payloads of the group (transient, at the peak)."""
        local = layer.num_params / split
        kept = (self.params.get("error_feedback", True) or self.params.get("momentum_correction")) * GRAD_BYTES
        kept += GRAD_BYTES * bool(self.params.get("momentum_correction"))
        return local * (kept + GRAD_BYTES) + self.group * self.payload_bytes(layer, split)

    def modelled_s(self, ctx, layer: LayerProfile, split: int) -> float:
        """Per tensor: accumulate, |.|, top-k, gather values, residual clone + scatter (~12 passes
        of fp32); decode: zeros + an index_add per rank + the copy."""
        total = 0.0
        for n in _numels(layer, split):
            k = wire.topk_k(n, self.density())
            total += _pass_s(ctx, 12 + 3 * self.group, GRAD_BYTES * n * 12 + self.group * 12 * k)
        return total


class Quantizer(Compressor):
    """Sign + level index bit-packed per coordinate, one norm per bucket, all-gathered
    (executor/methods/quantize.py)."""

    collective = "all_gather"
    adaptive = False

    def _bytes(self, n: int) -> int:
        p = self.params
        return wire.quant_bytes(
            n, bits=p["bits"], bucket_size=p["bucket_size"], quantize=p.get("quantize", True), adaptive=self.adaptive
        )

    def payload_bytes(self, layer: LayerProfile, split: int) -> float:
        return sum(self._bytes(n) for n in _numels(layer, split))

    def state_bytes(self, layer: LayerProfile, split: int) -> float:
        """No residual (unbiased): the gathered payloads and one decoded fp32 tensor, transient."""
        return self.group * self.payload_bytes(layer, split) + GRAD_BYTES * layer.num_params / split

    def modelled_s(self, ctx, layer: LayerProfile, split: int) -> float:
        """Encode: norms, |v|/norm, random numbers, searchsorted, rounding, bit expansion and
        packing (~25 ops, ~16 fp32 passes + bits bytes per coordinate); decode per rank: unpack,
        level lookup, scale, sign, add (~8 ops, ~6 fp32 passes + bits bytes)."""
        bits, total = self.params["bits"], 0.0
        for n in _numels(layer, split):
            total += _pass_s(
                ctx, 25 + 8 * self.group, n * (16 * GRAD_BYTES + bits) + self.group * n * (6 * GRAD_BYTES + bits)
            )
        return total


class QSGD(Quantizer):
    name = "qsgd"


class NUQSGD(Quantizer):
    name = "nuqsgd"


class ALQ(Quantizer):
    """Adds the HIST_BINS-bin histogram per tensor; the refit (every refit_every steps) is small."""

    name = "alq"
    adaptive = True


class AMQ(ALQ):
    name = "amq"


def critical_share(params: dict) -> float:
    """Accordion's expected share of steps at the low-compression setting (module docstring)."""
    f = params.get("critical_fraction")
    return 1.0 if f is None else float(f)


def band_params(params: dict) -> tuple[dict, dict]:
    """The band's ends: every step at the high-compression setting, every step at the low one."""
    return {**params, "critical_fraction": 0.0}, {**params, "critical_fraction": 1.0}


class Accordion(Compressor):
    """PowerSGD (per-tensor ranks, executor/methods/lowrank.py) at critical_rank for a share
    critical_fraction of the steps, at rank otherwise; all-reduced."""

    name = "accordion"
    banded = True
    rounds = 2
    """lowrank.py: P's (with the uncompressed tensors) all-reduce, then Q's."""
    """Bytes vary between steps: planner/rank/dp_cost.comm_bytes_band prices both ends."""

    def _at(self, rank: int) -> PowerSGD:
        return PowerSGD(rank=rank, min_compression_rate=self.params["min_compression_rate"], error_feedback=True)

    def _mix(self, what: str, *args) -> float:
        f = critical_share(self.params)
        low, high = self._at(self.params["critical_rank"]), self._at(self.params["rank"])
        return f * getattr(low, what)(*args) + (1 - f) * getattr(high, what)(*args)

    def payload_bytes(self, layer: LayerProfile, split: int) -> float:
        return sum(
            GRAD_BYTES * wire.lowrank_elems(n, m, r, self.params["min_compression_rate"]) * w
            for n, m in matrices(layer, split)
            for r, w in self._weights()
        )

    def _weights(self) -> list[tuple[int, float]]:
        f = critical_share(self.params)
        return [(self.params["critical_rank"], f), (self.params["rank"], 1 - f)]

    def state_bytes(self, layer: LayerProfile, split: int) -> float:
        """PowerSGD's residual and factors at the larger rank, and the window's accumulator."""
        big = self._at(max(self.params["critical_rank"], self.params["rank"]))
        return big.state_bytes(layer, split) + GRAD_BYTES * layer.num_params / split

    def modelled_s(self, ctx, layer: LayerProfile, split: int) -> float:
        return self._mix("modelled_s", ctx, layer, split)


class AccordionTopK(TopK):
    """Top-k at critical_density for a share critical_fraction of the steps, density otherwise."""

    name = "accordion_topk"
    banded = True

    def payload_bytes(self, layer: LayerProfile, split: int) -> float:
        f, p = critical_share(self.params), self.params
        return sum(
            f * wire.topk_bytes(n, p["critical_density"]) + (1 - f) * wire.topk_bytes(n, p["density"])
            for n in _numels(layer, split)
        )

    def density(self) -> float:
        f, p = critical_share(self.params), self.params
        return f * p["critical_density"] + (1 - f) * p["density"]

    def state_bytes(self, layer: LayerProfile, split: int) -> float:
        return super().state_bytes(layer, split) + GRAD_BYTES * layer.num_params / split


COMPRESSORS = {c.name: c for c in (TopK, QSGD, NUQSGD, ALQ, AMQ, Accordion, AccordionTopK)}

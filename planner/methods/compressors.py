"""The compression axis' registry: every compressor cost object by name (methods/compression.py's
fp32, fp16 and PowerSGD; methods/compression_quant.py's sparsifiers and quantisers)."""

from __future__ import annotations

from meshplan.planner.methods import compression_quant
from meshplan.planner.methods.axes import CompressionCost
from meshplan.planner.methods.compression import Compressor, Fp16, PowerSGD

COMPRESSORS: dict[str, type[Compressor]] = {c.name: c for c in (Compressor, Fp16, PowerSGD)}
COMPRESSORS.update(compression_quant.COMPRESSORS)


def compressor(name: str, params: dict) -> CompressionCost:
    return COMPRESSORS[name](**params)

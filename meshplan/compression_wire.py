"""What the gradient compressors put on the wire, per gradient tensor: the torch-free
formulas the planner's cost objects (planner/compression_quant.py) and the executor's codecs
(executor/methods/topk.py, quantize.py, lowrank.py) both call, so a prediction and a count agree
to the byte (meshplan/comm_bytes.py's convention does the rest).

A DDP comm hook sees a bucket as its parameters' flat gradients; every compressor here works per
tensor (n = numel), so what a step sends does not depend on how DDP packs its buckets.
- top-k (Lin et al. 2018; Stich et al. 2018): k = ceil(density n) (1 <= k <= n) fp32 values and
  k int32 indices, all-gathered: 8 k bytes.
- quantizers (QSGD, NUQSGD, ALQ, AMQ): each coordinate as a sign bit and a (bits - 1)-bit level
  index, bit-packed: ceil(n bits / 8) bytes; one fp32 norm per bucket of `bucket_size`
  coordinates; ALQ/AMQ add their HIST_BINS-bin fp32 histogram of the normalised magnitudes (the
  statistics every rank fits the same levels from); `quantize=false` sends the fp32 values (4 n).
- low rank (PowerSGD, Vogels et al. 2019, as torch's hook splits it): a tensor viewed as
  n = dim 0 by m = the rest is sent as P (n r) and Q (m r) with r = min(n, m, rank) when
  (n + m) r min_compression_rate < n m, else as itself; all-reduced.
"""

from __future__ import annotations

import math

INDEX_BYTES = 4
"""int32 indices (torch.topk's int64 cast down: a tensor above 2^31 elements is not sent whole)."""
VALUE_BYTES = 4
NORM_BYTES = 4
HIST_BINS = 32
"""ALQ/AMQ statistics: bin 0 holds r < 2^-15, bins 1..30 are log2-spaced up to r < 1, bin 31 r = 1."""
HIST_LOG2_LOW = -15.0


def topk_k(numel: int, density: float) -> int:
    """Elements top-k sends of a tensor of `numel` elements at `density`."""
    return max(1, min(numel, math.ceil(density * numel)))


def topk_bytes(numel: int, density: float) -> int:
    return (VALUE_BYTES + INDEX_BYTES) * topk_k(numel, density)


def dgc_density(step: int, density: float, warmup_steps: int) -> float:
    """DGC's exponential sparsity warm-up (Lin et al. 2018 Sec 3.3: 75%, 93.75%, ... 99.9% over
    four epochs): density 0.25 at step 0 falling geometrically to `density` at `warmup_steps`."""
    if step >= warmup_steps or density >= 0.25:
        return density
    return 0.25 * (density / 0.25) ** (step / warmup_steps)


def magnitude_levels(bits: int) -> int:
    """Levels of |v_i| / ||v_bucket|| (0 and 1 included) a `bits`-bit code (one sign bit) indexes."""
    return 2 ** (bits - 1)


def quant_bytes(numel: int, *, bits: int, bucket_size: int, quantize: bool = True, adaptive: bool = False) -> int:
    """Bytes one rank contributes to the all-gather for one tensor."""
    if not quantize:
        return VALUE_BYTES * numel
    packed = math.ceil(numel * bits / 8)
    norms = NORM_BYTES * math.ceil(numel / bucket_size)
    return packed + norms + (4 * HIST_BINS if adaptive else 0)


def lowrank_split(rows: int, cols: int, rank: int, min_compression_rate: float) -> int:
    """r of a (rows x cols) tensor: the factors' rank when compressed, 0 when sent dense."""
    r = min(rows, cols, rank)
    return r if cols > 1 and (rows + cols) * r * min_compression_rate < rows * cols else 0


def lowrank_elems(rows: int, cols: int, rank: int, min_compression_rate: float) -> int:
    """Elements all-reduced per step for one tensor (P and Q, or the tensor itself)."""
    r = lowrank_split(rows, cols, rank, min_compression_rate)
    return (rows + cols) * r if r else rows * cols


def matrix_of(shape: tuple[int, ...]) -> tuple[int, int]:
    """(n, m) of a parameter as a DDP hook sees it: dim 0 by the rest; a vector as (n, 1)."""
    numel = math.prod(shape) if shape else 1
    if len(shape) < 2:
        return numel, 1
    return shape[0], numel // shape[0]

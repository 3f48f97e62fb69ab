"""The once-per-step tail of a rank: the exposed gradient sync (priced by the candidate's
data-parallel cost object, rank/dp_cost.py) and the optimizer step."""

from __future__ import annotations

from meshplan.planner.rank.dp_cost import DDP_BUCKET_BYTES, DataParallelCost


def last_bucket_params(first_layer_kind: str, first_layer_local_params: float) -> float:
    """Parameters whose gradient sync cannot overlap backward: the bucket finished last. A rank
    that starts with the embedding finishes with its (often huge) gradient; otherwise the last
    bucket is DDP's bucket cap of fp32 gradients."""
    cap = DDP_BUCKET_BYTES / 4
    return max(first_layer_local_params, cap) if first_layer_kind == "embedding" else cap


def tail_s(
    data: DataParallelCost,
    fixed_s: float,
    local_params: float,
    payload_bytes: float,
    compress_s: float,
    backward_window_s: float,
    last_bucket: float = 0.0,
    optimizer_s: float = 0.0,
) -> tuple[float, float]:
    """(exposed gradient sync, optimizer step) seconds of one rank, once per step: the
    candidate's data-parallel cost object prices the sync (planner/rank/dp_cost.py); `optimizer_s` is the sum
    of the rank's layer_optimizer_s, `fixed_s` the candidate's step_fixed_s."""
    sync = data.sync_s(local_params, payload_bytes, compress_s, backward_window_s, last_bucket)
    return sync, optimizer_s + fixed_s

"""Training-state bytes per parameter: what the weights, gradients and optimizer states of one
parameter take, unsharded, under each runtime's state layout (sharding is rank/dp_cost.py's)."""

from __future__ import annotations

from meshplan.planner.context import Context

_STATE = {"torch": (4, 4, 8), "megatron": (2, 4, 12), "zero": (2, 2, 12)}
"""(weights, grads, optimizer) bytes per parameter, unsharded."""


def state_bytes(ctx: Context) -> tuple[int, int, int]:
    return _STATE[ctx.request.state_layout]

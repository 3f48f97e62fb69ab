"""Training-state bytes per parameter: what the weights, gradients and optimizer states of one
parameter take, unsharded, under the runtime's state layout (meshplan/runtimes.py STATE_LAYOUTS;
sharding is rank/dp_cost.py's)."""

from __future__ import annotations

from meshplan.planner.context import Context


def state_bytes(ctx: Context) -> tuple[int, int, int]:
    """(weights, grads, optimizer) bytes per parameter, unsharded."""
    return ctx.spec.state.state_bytes

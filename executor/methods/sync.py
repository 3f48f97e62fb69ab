"""What the replica-synchronisation methods other than all-reduce share (executor/methods/sync_*.py).

A sync method (meshplan/dp_methods.py, axis "sync") decides how replicas agree; the ones here run
on plain, un-wrapped replicas (no DDP: zero_stage 0, no tensor or pipeline parallelism, as
feasibility.py requires), except local SGD, which keeps torch's DDP + post-local SGD hook. How
train.py's step loop calls one (executor/train.py, parallelize.py):
- `apply()` builds it after the parts (`Parallelized.sync`, None for sync=allreduce);
- `make_optimizers()` hands it the optimizers to wrap or multiply (`wrap_optimizers`);
- every step is `sync.train_step(par, optimizers, batch, grad_clip)` instead of train.py's plain
  step, because these methods change the step itself (local steps, master updates, k learners,
  a time budget, a background averaging round);
- `close(aborted)` after the last step, and always: train.py calls it in a finally, with
  aborted=True when the step loop raised (an error, SIGINT's KeyboardInterrupt): a method then
  stops without waiting on its peers (sync_async.py's thread).
Every collective a method issues is counted into the rank's ByteCounter on "dp_replicate"
(meshplan/comm_bytes.py), the axis the cost model (planner/sync.py) predicts.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence

import torch
import torch.distributed as dist
from torch import nn

from meshplan.comm_bytes import ByteCounter

STATS_DIR_ENV = "MESHPLAN_SYNC_STATS_DIR"
"""When set, a method writes its per-step statistics (DABMD's batch sizes, a gossip round's
consensus error, the async rounds) to DIR/`stats_name(...)` at close(), for tests and
benchmarks."""


class SyncMethod:
    """Base class: the plain local step (no gradient exchange) and no-op hooks."""

    SLOWS_ITSELF = False
    """True: the method applies MESHPLAN_SLOW_RANK itself (executor/straggler.py)."""

    def __init__(self, par, params: dict, counter: ByteCounter):
        self.par, self.params, self.counter = par, params, counter
        self.group = par.dims.dp_mesh().get_group()
        self.world = dist.get_world_size(self.group)
        self.rank = dist.get_rank(self.group)
        self.stats: list[dict] = []

    def wrap_optimizers(self, optimizers: list, name: str, lr: float, weight_decay: float) -> list:
        return optimizers

    def train_step(self, par, optimizers, batch, grad_clip: float):
        """One optimizer step: (this rank's loss share, gradient norm before clipping)."""
        loss, norm = local_step(par, optimizers, batch, grad_clip)
        self.after_step()
        return loss, norm

    def after_step(self) -> None:
        """Exchange after the local optimizer step (averaging methods)."""

    def close(self, aborted: bool = False) -> None:
        """End of training (aborted: the step loop raised; wait on no peer)."""
        directory = os.environ.get(STATS_DIR_ENV)
        if directory and self.stats:
            os.makedirs(directory, exist_ok=True)
            with open(os.path.join(directory, stats_name(self.par.plan.dp_methods.sync, dist.get_rank())), "w") as f:
                json.dump(self.stats, f)


def no_ddp_comm_hook(group, params: dict, counter: ByteCounter, axis: str) -> None:
    """`ddp_comm_hook` (axes.Sync) of the methods that run without DDP (USES_DDP False)."""
    return None


def stats_name(choice, rank: int) -> str:
    """sync_stats.NAME.HASH.rankR.json: one file per method, parameters and rank."""
    key = hashlib.sha1(json.dumps(choice.params, sort_keys=True).encode()).hexdigest()[:8]
    return f"sync_stats.{choice.name}.{key}.rank{rank}.json"


def local_step(par, optimizers, batch, grad_clip: float):
    """Forward, backward, clip and step on this replica alone (train.py's step without DDP)."""
    for opt in optimizers:
        opt.zero_grad(set_to_none=True)
    loss = par.step_local(*batch)
    norm = par.clip_grad_norm_(grad_clip)
    for opt in optimizers:
        opt.step()
    return loss, norm


def trainable(module_or_params) -> list[nn.Parameter]:
    params = module_or_params.parameters() if isinstance(module_or_params, nn.Module) else module_or_params
    return [p for p in params if p.requires_grad]


def flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """One fp32 vector of the tensors (a copy)."""
    return torch.cat([t.detach().reshape(-1).float() for t in tensors])


@torch.no_grad()
def unflat(vector: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy `vector` back into `tensors` (flat's inverse)."""
    offset = 0
    for t in tensors:
        t.copy_(vector[offset : offset + t.numel()].view_as(t))
        offset += t.numel()


def tensor_bytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()

"""Checkpoints with torch.distributed.checkpoint (DCP), every K steps, crash-safe.

Layout: out_dir/checkpoints/step_000010/ (a DCP directory: model and optimizer state of every
part, sharded as the plan shards them) plus, for ZeRO-1, one optimizer-shard file per rank.
`latest` names the newest complete checkpoint and is written (atomically, by rank 0) only after
every rank finished saving, so a rank dying mid-save leaves the previous checkpoint as latest.
"""
from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)
from torch.distributed.optim import ZeroRedundancyOptimizer

from meshplan.schema import write_text_atomic


def checkpoint_root(out_dir: str | Path) -> Path:
    return Path(out_dir) / "checkpoints"


def latest_step(out_dir: str | Path) -> int:
    """Steps completed by the newest complete checkpoint (0 if none)."""
    marker = checkpoint_root(out_dir) / "latest"
    return int(marker.read_text().strip()) if marker.exists() else 0


def _step_dir(out_dir, step: int) -> Path:
    return checkpoint_root(out_dir) / f"step_{step:06d}"


def _state(parts, optimizers, stage_ids) -> dict:
    state = {}
    for sid, part, opt in zip(stage_ids, parts, optimizers):
        state[f"model.{sid}"] = get_model_state_dict(part)
        if not isinstance(opt, ZeroRedundancyOptimizer):
            state[f"optim.{sid}"] = get_optimizer_state_dict(part, opt)
    return state


def save(out_dir, step: int, parts, optimizers, stage_ids) -> None:
    """Collective: every rank saves its shards of model and optimizer after `step` steps."""
    path = _step_dir(out_dir, step)
    dcp.save(_state(parts, optimizers, stage_ids), checkpoint_id=str(path))
    for sid, opt in zip(stage_ids, optimizers):
        if isinstance(opt, ZeroRedundancyOptimizer):
            torch.save(opt.optim.state_dict(), path / f"zero1.{sid}.rank{dist.get_rank()}.pt")
    dist.barrier()
    if dist.get_rank() == 0:
        write_text_atomic(checkpoint_root(out_dir) / "latest", f"{step}\n")
    dist.barrier()


def load(out_dir, parts, optimizers, stage_ids) -> int:
    """Collective: restore the newest complete checkpoint; returns its step (0 if none)."""
    step = latest_step(out_dir)
    if step == 0:
        return 0
    path = _step_dir(out_dir, step)
    state = _state(parts, optimizers, stage_ids)
    dcp.load(state, checkpoint_id=str(path))
    for sid, part, opt in zip(stage_ids, parts, optimizers):
        set_model_state_dict(part, state[f"model.{sid}"])
        if isinstance(opt, ZeroRedundancyOptimizer):
            opt.optim.load_state_dict(torch.load(path / f"zero1.{sid}.rank{dist.get_rank()}.pt"))
        else:
            set_optimizer_state_dict(part, opt, state[f"optim.{sid}"])
    return step

"""Checkpoints with torch.distributed.checkpoint (DCP), every K steps, crash-safe, reshardable.

Layout: out_dir/checkpoints/step_000010/ is a DCP directory holding {"model": {fqn: tensor},
"optim": {flattened "state.<fqn>.<key>" / "param_groups.<fqn>.<key>"}} merged over the parts of
every rank. Keys are the single-process model's FQNs, so DCP can load the checkpoint into a
different plan (other degrees, stages, ZeRO stage): it reads each rank's shards by key. ZeRO-1's
ZeroRedundancyOptimizer keeps its state outside (one file per rank), so it resumes only into the
same plan. offload=cpu/nvme's HostOptimizer (executor/methods/host_optimizer.py) is saved in the
same flattened layout as a torch optimizer, its states gathered from its inner optimizers and the
NVMe files (and written back to them on load), so an offloaded run resumes exactly. `latest` names the newest complete checkpoint and is written (atomically, by rank 0)
only after every rank finished saving and rank 0 listed every file's size and sha256 in the step's
manifest.json; a rank dying mid-save leaves the previous one as latest, and a damaged one is
skipped for the newest complete one (executor/checkpoint_manifest.py).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    _get_fqns,  # the FQNs get_optimizer_state_dict uses
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.distributed.tensor import DTensor

from meshplan.executor.checkpoint_manifest import checkpoint_root, resume_point, step_dir, write_manifest
from meshplan.executor.methods.host_optimizer import HostOptimizer
from meshplan.schema import write_text_atomic

FLAT = StateDictOptions(flatten_optimizer_state_dict=True)


def latest_step(out_dir: str | Path) -> int:
    """Steps completed by the newest complete checkpoint (0 if none; never a damaged one)."""
    return resume_point(out_dir)[0]


def saved_plan_path(out_dir: str | Path) -> Path:
    """The plan that wrote the latest checkpoint (the launcher compares it on --resume)."""
    return _step_dir(out_dir, latest_step(out_dir)) / "plan.json"


def _step_dir(out_dir, step: int) -> Path:
    return step_dir(out_dir, step)


def _part_states(parts, optimizers, template: bool = False) -> list[tuple[dict, dict]]:
    """(model state, flattened optimizer state) per part, keyed by model FQNs; `template`: a
    fresh optimizer's states created first, to load into."""
    states = []
    for part, opt in zip(parts, optimizers):
        if isinstance(opt, ZeroRedundancyOptimizer):
            optim = {}
        elif isinstance(opt, HostOptimizer):
            optim = _host_state(part, opt, template)
        else:
            optim = get_optimizer_state_dict(part, opt, options=FLAT)
        states.append((get_model_state_dict(part), optim))
    return states


def _host_fqns(part, opt: HostOptimizer) -> list[str]:
    """The FQN of each HostOptimizer entry, as get_optimizer_state_dict names parameters."""
    names = {id(p): next(iter(_get_fqns(part, name))) for name, p in part.named_parameters()}
    return [names[id(p)] for p, *_ in opt.entries]


def _host_state(part, opt: HostOptimizer, template: bool) -> dict:
    """offload=cpu/nvme's host optimizer in get_optimizer_state_dict's flattened layout, so the
    checkpoint loads into any plan: "state.<fqn>.<key>" (a DTensor parameter's states as DTensors
    placed like it) and "param_groups.<fqn>.<key>". torch's own path would see no state (it
    lives in the inner optimizers and the NVMe files) and step the optimizer to make some."""
    if template:
        opt.init_states()
    flat: dict = {}
    for i, (fqn, (p, gi, _, inner)) in enumerate(zip(_host_fqns(part, opt), opt.entries)):
        for key, value in opt.entry_state(i).items():
            if isinstance(p, DTensor) and torch.is_tensor(value) and value.dim() > 0:
                value = DTensor.from_local(
                    value, p.device_mesh, p.placements, run_check=False, shape=p.shape, stride=p.stride()
                )
            flat[f"state.{fqn}.{key}"] = value
        # the inner optimizer's group: every hyperparameter torch's own optimizer would save
        for key, value in {**inner.param_groups[0], **opt.param_groups[gi]}.items():
            if key != "params":
                flat[f"param_groups.{fqn}.{key}"] = value
    return flat


def _set_host_state(part, opt: HostOptimizer, flat: dict) -> None:
    """Inverse of _host_state after dcp.load filled `flat`."""
    for i, (fqn, (_, gi, *_)) in enumerate(zip(_host_fqns(part, opt), opt.entries)):
        prefix = f"state.{fqn}."
        state = {k[len(prefix) :]: v for k, v in flat.items() if k.startswith(prefix)}
        opt.set_entry_state(i, {k: v.to_local() if isinstance(v, DTensor) else v for k, v in state.items()})
        group = f"param_groups.{fqn}."
        opt.param_groups[gi].update({k[len(group) :]: v for k, v in flat.items() if k.startswith(group)})


def _merged(states: list[tuple[dict, dict]]) -> dict:
    model, optim = {}, {}
    for m, o in states:
        model.update(m)
        optim.update(o)
    return {"model": model, "optim": optim}


def save(out_dir, step: int, parts, optimizers, stage_ids, plan=None) -> None:
    """Collective: every rank saves its shards of model and optimizer after `step` steps."""
    path = _step_dir(out_dir, step)
    if dist.get_rank() == 0 and path.exists():  # a damaged save of an earlier run: no stale shards
        import shutil

        shutil.rmtree(path)
    dist.barrier()
    if plan is not None and dist.get_rank() == 0:
        from meshplan.schema import save as save_json

        save_json(plan, path / "plan.json")
    dcp.save(_merged(_part_states(parts, optimizers)), checkpoint_id=str(path))
    for sid, opt in zip(stage_ids, optimizers):
        if isinstance(opt, ZeroRedundancyOptimizer):
            torch.save(opt.optim.state_dict(), path / f"zero1.{sid}.rank{dist.get_rank()}.pt")
    dist.barrier()
    if dist.get_rank() == 0:
        write_manifest(path, step)
        write_text_atomic(checkpoint_root(out_dir) / "latest", f"{step}\n")
    dist.barrier()


def load(out_dir, parts, optimizers, stage_ids) -> int:
    """Collective: restore the newest complete checkpoint; returns its step (0 if none)."""
    step = latest_step(out_dir)
    if step == 0:
        return 0
    path = _step_dir(out_dir, step)
    templates = _part_states(parts, optimizers, template=True)
    merged = _merged(templates)
    dcp.load(merged, checkpoint_id=str(path))
    for sid, part, opt, (m, o) in zip(stage_ids, parts, optimizers, templates):
        set_model_state_dict(part, {k: merged["model"][k] for k in m})
        if isinstance(opt, ZeroRedundancyOptimizer):  # its inner optimizer may be a HostOptimizer
            opt.optim.load_state_dict(torch.load(path / f"zero1.{sid}.rank{dist.get_rank()}.pt"))
        elif isinstance(opt, HostOptimizer):
            _set_host_state(part, opt, {k: merged["optim"][k] for k in o})
        else:
            set_optimizer_state_dict(part, opt, {k: merged["optim"][k] for k in o}, options=FLAT)
    return step

"""Training batches, a pure function of the step number (so resume replays the same data).

Synthetic (default): the global batch of step k is `model.example_batch(global_batch_size,
Generator(seed, k))`; each data-parallel replica takes its contiguous slice, exactly the rows the
single-process model sees in the same positions. A user dataset (`--data module:fn`, fn()
returns a map-style dataset of (input, target) pairs) is read through a DistributedSampler per
data-parallel replica; step k reads batch k mod (batches per epoch) of epoch k // that.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from torch.utils.data import DistributedSampler, default_collate

from meshplan.errors import MeshplanError
from meshplan.models.zoo.base import LayeredModel
from meshplan.plan import Plan

Batches = Callable[[int], tuple[torch.Tensor, torch.Tensor]]


def step_generator(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def synthetic_global_batch(model: LayeredModel, plan: Plan, seed: int, step: int):
    """(inputs, targets) of the whole global batch of `step`."""
    return model.example_batch(plan.global_batch_size, step_generator(seed, step))


def load_dataset(spec: str):
    """`module:fn` -> fn(); MeshplanError naming the spec when it cannot be imported."""
    module_name, _, fn_name = spec.partition(":")
    if not module_name or not fn_name:
        raise MeshplanError(f"--data {spec!r}: expected module:function returning a dataset")
    try:
        fn = getattr(importlib.import_module(module_name), fn_name)
    except (ImportError, AttributeError) as exc:
        raise MeshplanError(f"--data {spec!r}: cannot import ({exc}); check the module path") from None
    return fn()


def make_batches(model: LayeredModel, plan: Plan, dp_rank: int, dp_degree: int, seed: int, data: str | None) -> Batches:
    """Function step -> this replica's (inputs, targets)."""
    per_replica = plan.global_batch_size // dp_degree
    if data is None:

        def synthetic(step: int):
            x, y = synthetic_global_batch(model, plan, seed, step)
            rows = slice(dp_rank * per_replica, (dp_rank + 1) * per_replica)
            return x[rows], None if y is None else y[rows]

        return synthetic
    dataset = load_dataset(data)
    sampler = DistributedSampler(dataset, num_replicas=dp_degree, rank=dp_rank, shuffle=True, seed=seed, drop_last=True)
    per_epoch = len(sampler) // per_replica
    if per_epoch == 0:
        raise MeshplanError(
            f"--data {data!r}: {len(dataset)} samples give no full batch of "
            f"{per_replica} per replica x {dp_degree} replicas; use more data or a smaller batch"
        )

    def from_dataset(step: int):
        sampler.set_epoch(step // per_epoch)
        indices = list(iter(sampler))[(step % per_epoch) * per_replica :][:per_replica]
        x, y = default_collate([dataset[i] for i in indices])
        return x, y

    return from_dataset

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


class Batches:
    """Step -> this replica's (inputs, targets), from `batch_of`. `num_targets`: the labels the
    loss counts in the last global batch given, where some are IGNORE_INDEX (None: none is, or a
    dataset's batches, which are not counted); the loss weights by it (executor/parallelize.py)."""

    def __init__(self, batch_of: Callable[[int], tuple[torch.Tensor, torch.Tensor | None]]):
        self.batch_of = batch_of
        self.num_targets: int | None = None

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        return self.batch_of(step)


def step_generator(seed: int, step: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def synthetic_global_batch(model: LayeredModel, plan: Plan, seed: int, step: int):
    """(inputs, targets) of the whole global batch of `step`."""
    return model.example_batch(plan.global_batch_size, step_generator(seed, step))


def load_dataset(spec: str):
    """`module:fn` -> fn(); MeshplanError naming the spec when it cannot be imported or fn raises."""
    module_name, _, fn_name = spec.partition(":")
    if not module_name or not fn_name:
        raise MeshplanError(f"--data {spec!r}: expected module:function returning a dataset")
    try:
        fn = getattr(importlib.import_module(module_name), fn_name)
    except (ImportError, AttributeError) as exc:
        raise MeshplanError(f"--data {spec!r}: cannot import ({exc}); check the module path") from None
    except (Exception, SystemExit) as exc:
        raise MeshplanError(f"--data {spec!r}: importing {module_name} raised {_one_line(exc)}") from None
    if not callable(fn):
        raise MeshplanError(f"--data {spec!r}: {fn_name} is a {type(fn).__name__}, not a function")
    try:
        return fn()
    except (Exception, SystemExit) as exc:
        raise MeshplanError(f"--data {spec!r}: {fn_name}() raised {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300]


CHECKED_SAMPLES = 64
"""Samples of a --data set the launcher reads before any rank starts (bounded: a set may be large)."""


def check_dataset(spec: str, plan: Plan) -> None:
    """Before launch, what the ranks would otherwise find as a traceback: the set loads, has a
    length and items, holds one global batch, and its first samples are (input, target) pairs
    whose token ids have the plan's sequence length and lie inside the model's vocabulary."""
    dataset = load_dataset(spec)
    try:
        size = len(dataset)
        first = dataset[0] if size else None
    except Exception as exc:
        raise MeshplanError(
            f"--data {spec!r}: the function returned a {type(dataset).__name__}, not a map-style dataset "
            f"({_one_line(exc)}); return a torch Dataset of (input, target) pairs"
        ) from None
    if size < plan.global_batch_size:
        raise MeshplanError(
            f"--data {spec!r}: {size} samples, fewer than one global batch of {plan.global_batch_size}; "
            "use more data or a smaller batch"
        )
    if not (isinstance(first, (tuple, list)) and len(first) == 2):
        raise MeshplanError(f"--data {spec!r}: sample 0 is a {type(first).__name__}, not an (input, target) pair")
    vocab = _vocab(plan)
    for i in range(min(size, CHECKED_SAMPLES)):
        for name, value in zip(("input", "target"), dataset[i] if i else first):
            _check_tokens(spec, i, name, value, plan.seq_len, vocab)


def _vocab(plan: Plan) -> int | None:
    """The model's vocabulary size: the plan's model_config, else the zoo model's default."""
    vocab = plan.model_config.get("vocab", plan.model_config.get("vocab_size"))
    if vocab is None:
        from meshplan.models.zoo import FAMILIES, ZOO, resolve

        if plan.model_name in ZOO or plan.model_name in FAMILIES:
            vocab = getattr(resolve(plan.model_name, plan.model_config)[1], "vocab", None)
    return vocab if isinstance(vocab, int) else None


def _check_tokens(spec: str, i: int, name: str, value, seq_len: int, vocab) -> None:
    """Integer tensors are token ids: their last dim is the sequence, each id < vocab."""
    if not (torch.is_tensor(value) and not value.is_floating_point() and value.dim() >= 1):
        return
    if value.shape[-1] != seq_len:
        raise MeshplanError(
            f"--data {spec!r}: sample {i}'s {name} has {value.shape[-1]} tokens, the plan's seq_len is "
            f"{seq_len}; give sequences of {seq_len} tokens or plan with --seq {value.shape[-1]}"
        )
    low, high = int(value.min()), int(value.max())
    if low < 0 or (isinstance(vocab, int) and high >= vocab):
        raise MeshplanError(
            f"--data {spec!r}: sample {i}'s {name} holds token id {low if low < 0 else high}, outside the "
            f"model's vocabulary 0..{vocab - 1 if isinstance(vocab, int) else '?'}"
        )


IGNORE_INDEX = -100
"""The label cross-entropy skips (torch's default ignore_index; transformers' masked positions)."""


def counted_targets(targets) -> int | None:
    """The global batch's labels the loss counts, where some are IGNORE_INDEX (else None): the
    loss is then the mean over those labels of the whole batch, whatever microbatch or replica
    holds them, as the model's own loss over the batch is (executor/parallelize.py)."""
    if not isinstance(targets, torch.Tensor) or targets.is_floating_point() or targets.dim() == 0:
        return None
    ignored = int((targets == IGNORE_INDEX).sum())
    return int(targets.numel()) - ignored if ignored else None


def make_batches(model: LayeredModel, plan: Plan, dp_rank: int, dp_degree: int, seed: int, data: str | None) -> Batches:
    """Function step -> this replica's (inputs, targets)."""
    per_replica = plan.global_batch_size // dp_degree
    if data is None:

        def synthetic(step: int):
            x, y = synthetic_global_batch(model, plan, seed, step)
            rows = slice(dp_rank * per_replica, (dp_rank + 1) * per_replica)
            batches.num_targets = counted_targets(y)
            return x[rows], None if y is None else y[rows]

        batches = Batches(synthetic)
        return batches
    dataset = load_dataset(data)
    sampler: DistributedSampler = DistributedSampler(
        dataset, num_replicas=dp_degree, rank=dp_rank, shuffle=True, seed=seed, drop_last=True
    )
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

    return Batches(from_dataset)

"""The single-process baseline every plan must reproduce: the unsharded model on the whole
global batch, the same data, weights, optimizer and clipping (the executor's definition of
correct: the same loss, step by step)."""

from __future__ import annotations

import torch

from meshplan.executor.data import synthetic_global_batch
from meshplan.executor.model import build_model_for_plan
from meshplan.executor.optimizers import make_optimizer
from meshplan.plan import Plan


def reference_losses(
    plan: Plan,
    *,
    steps: int = 5,
    optimizer: str = "adamw",
    lr: float = 3e-4,
    weight_decay: float = 0.1,
    grad_clip: float = 1.0,
    seed: int = 0,
) -> list[float]:
    """Per-step global-batch losses of the single-process model (fp32, CPU)."""
    model = build_model_for_plan(plan, "cpu", seed=seed)
    opt = make_optimizer(list(model.parameters()), optimizer, lr, weight_decay)
    losses = []
    for step in range(steps):
        x, y = synthetic_global_batch(model, plan, seed, step)
        opt.zero_grad(set_to_none=True)
        loss = model.loss(model(x), y)
        loss.backward()
        if grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        opt.step()
        losses.append(loss.item())
    return losses

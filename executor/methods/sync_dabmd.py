"""sync=dabmd: distributed any-batch mirror descent (Eshraghi & Liang, ICML 2020).

Each step a worker computes microbatches of its local batch for a fixed time budget (budget_ms;
0 = the whole local batch), at least min_microbatches, so its batch b_i varies with its speed.
The update weights each worker by its batch: one all-reduce of [sum of per-sample gradients,
b_i] gives g = sum_i sum_samples grad / sum_i b_i, a gradient step on the union batch
(Anytime Minibatch's weighting; with the Euclidean mirror map the mirror step is SGD). With equal
speeds and every worker finishing its batch, that is synchronous SGD on the union batch, i.e.
DDP. A slow worker contributes fewer samples instead of holding the step back.

Straggler injection for tests and benchmarks: MESHPLAN_SLOW_RANK="RANK:FACTOR" makes that rank
sleep (FACTOR - 1) x each microbatch's compute time after it, i.e. run FACTOR x slower.
Bytes: one fp32 all-reduce of every trainable gradient plus the sample count per step on
"dp_replicate". Stats (sync.STATS_DIR_ENV): per step this rank's samples, the union's, its
weight b_i / sum b, and the compute seconds.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from meshplan.executor.methods.sync import SyncMethod, tensor_bytes, trainable, unflat

USES_DDP = False
SLOW_ENV = "MESHPLAN_SLOW_RANK"


def _slowdown(rank: int) -> float:
    text = os.environ.get(SLOW_ENV, "")
    if not text:
        return 1.0
    who, _, factor = text.partition(":")
    return float(factor) if int(who) == rank else 1.0


class AnyBatch(SyncMethod):
    def __init__(self, par, params, counter):
        super().__init__(par, params, counter)
        self.budget_s = params["budget_ms"] / 1e3
        self.slow = _slowdown(dist.get_rank())

    def train_step(self, par, optimizers, batch, grad_clip):
        (model,), params = par.parts, trainable(par.parameters())
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        samples, loss_sum, compute_s, last_start_s = self._compute(par, model, *batch)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        vector = torch.cat([g.reshape(-1).float() for g in grads] + [torch.tensor([float(samples)])])
        self.counter.add("dp_replicate", "all_reduce", self.world, tensor_bytes(vector))
        dist.all_reduce(vector, group=self.group)
        union = vector[-1].item()
        for p, g in zip(params, grads):
            p.grad = g
        unflat(vector[:-1] / union, [p.grad for p in params])
        norm = par.clip_grad_norm_(grad_clip)
        for opt in optimizers:
            opt.step()
        self.stats.append(
            {
                "samples": samples,
                "union": union,
                "weight": samples / union,
                "compute_s": compute_s,
                "last_start_s": last_start_s,
            }
        )
        # the loss share: this worker's per-sample mean, weighted so global_losses' mean over ranks
        # is the union batch's mean loss
        return torch.tensor(loss_sum / union * self.world, dtype=torch.float64), norm

    def _compute(self, par, model, inputs, targets) -> tuple[int, float, float, float]:
        """Microbatches until the budget is spent (or the batch is done): (samples, sum of
        per-sample losses, seconds, when the last microbatch started). Gradients accumulate as
        sums over samples. A microbatch starts only while the budget lasts (or below the floor)."""
        targets = torch.empty(inputs.shape[0], 0) if targets is None else targets
        n, floor = par.plan.num_microbatches, self.params["min_microbatches"]
        t0, samples, loss_sum, last_start = time.perf_counter(), 0, 0.0, 0.0
        with par._autocast():
            for i, (x, y) in enumerate(zip(inputs.chunk(n), targets.chunk(n))):
                if self.budget_s and i >= floor and time.perf_counter() - t0 >= self.budget_s:
                    break
                start = time.perf_counter()
                last_start = start - t0
                loss = par.loss_fn(model(x.to(par.device)), y.to(par.device)) * x.shape[0]
                loss.backward()
                loss_sum += loss.item()
                samples += x.shape[0]
                if self.slow > 1:
                    time.sleep((self.slow - 1) * (time.perf_counter() - start))
        return samples, loss_sum, time.perf_counter() - t0, last_start


def build(par, params, counter):
    return AnyBatch(par, params, counter)

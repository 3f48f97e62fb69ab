"""sync=crossbow: k small-batch learners per device and synchronous model averaging (SMA).

Koliousis et al., CROSSBOW, VLDB 2019, as lsds/Crossbow's clib-multigpu/synch/sma.c computes it. K = k x N learners, each its own replica w_j with its own
optimizer, and one central model z (identical on every rank):
  each learner steps on its 1/k share of the local batch  w_j <- step(w_j)
  d_j = w_j - z;  w_j <- w_j - alpha d_j                       (pulled toward the centre)
  Delta = sum_j alpha d_j  (this rank's learners, then all-reduced over the N ranks)
  Delta <- Delta + mu Delta_prev;  z <- z + Delta               (central model with momentum)
alpha = 0 means 1/K. reset=True restarts every learner from z after the sync: with one learner,
alpha = 1/K and mu = 0 that is synchronous SGD on the union batch (z = the learners' mean).

The learners live in one process and train at the same time, as the paper's learners share a
GPU: learner 0 is the plan's part (what checkpoints save), the others deep copies, each driven
by a thread of its own (a pool kept for the run) that runs its forward, backward, clipping and
optimizer step; torch ops release the interpreter lock, so on CPU the learners' kernels run
side by side, and on CUDA each thread issues onto a stream of its own (the device
synchronised before the SMA). `concurrent=False` (the constructor's) runs them one after
another, for the throughput benchmark (benchmarks/dp_paper_methods.py). Memory is k replicas +
z + Delta_prev (+ the flat buffers), what planner/sync.py prices. Bytes: one all-reduce of
Delta (fp32, every trainable parameter) per step on "dp_replicate". Stats (sync.STATS_DIR_ENV):
per step each learner's [start, end] seconds from the step's start.
"""

from __future__ import annotations

import contextlib
import copy
import os
import time
from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist
from torch.nn.utils import clip_grad_norm_

from meshplan.errors import MeshplanError
from meshplan.executor.methods.sync import SyncMethod, flat, no_ddp_comm_hook, tensor_bytes, trainable, unflat
from meshplan.executor.optimizers import make_optimizer

USES_DDP = False
ddp_comm_hook = no_ddp_comm_hook


def sma_update(
    learners: list[torch.Tensor],
    z: torch.Tensor,
    delta_prev: torch.Tensor,
    alpha: float,
    mu: float,
    all_reduce=lambda t: t,
) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """One SMA round on flat vectors: (learners after the correction, new z, Delta). `all_reduce`
    sums this rank's Delta over the ranks (identity in one process)."""
    diffs = [w - z for w in learners]
    corrected = [w - alpha * d for w, d in zip(learners, diffs)]
    delta = all_reduce(alpha * torch.stack(diffs).sum(0))
    delta = delta + mu * delta_prev
    return corrected, z + delta, delta


CONCURRENT_ENV = "MESHPLAN_CROSSBOW_SEQUENTIAL"
"""Set to 1 to run the learners one after another (the benchmark's baseline)."""


class Crossbow(SyncMethod):
    def __init__(self, par, params, counter, concurrent: bool | None = None):
        super().__init__(par, params, counter)
        (part,) = par.parts
        self.k = params["learners"]
        if self.k < 1:
            raise MeshplanError(
                "sync=crossbow learners=0 (auto) reached the executor unresolved; plan it with "
                "`meshplan plan` (which picks k) or pin learners=K"
            )
        self.learners = [part] + [copy.deepcopy(part) for _ in range(self.k - 1)]
        self.alpha = params["alpha"] or 1.0 / (self.k * self.world)
        self.mu, self.reset = params["momentum"], params["reset"]
        self.z = flat(trainable(part))
        self.delta_prev = torch.zeros_like(self.z)
        self.optimizers: list = []
        if concurrent is None:
            concurrent = os.environ.get(CONCURRENT_ENV, "") != "1"
        self.pool = ThreadPoolExecutor(self.k, thread_name_prefix="crossbow") if concurrent and self.k > 1 else None
        cuda = par.device.type == "cuda"
        self.streams = [torch.cuda.Stream(par.device) for _ in range(self.k)] if cuda else [None] * self.k

    def wrap_optimizers(self, optimizers, name, lr, weight_decay):
        self.optimizers = [optimizers] + [
            [make_optimizer(trainable(m), name, lr, weight_decay)] for m in self.learners[1:]
        ]
        return optimizers

    def train_step(self, par, optimizers, batch, grad_clip):
        inputs, targets = batch
        if inputs.shape[0] % self.k:
            raise MeshplanError(
                f"sync=crossbow learners={self.k}: the local batch of {inputs.shape[0]} "
                "samples does not split evenly; use a batch divisible by learners"
            )
        ys = targets.chunk(self.k) if targets is not None else [None] * self.k
        t0 = time.perf_counter()
        jobs = list(zip(self.learners, self.optimizers, inputs.chunk(self.k), ys, self.streams))
        if self.pool is None:
            results = [self._learner_step(par, grad_clip, *job) for job in jobs]
        else:  # every learner at once; result() re-raises a learner's error here
            results = [f.result() for f in [self.pool.submit(self._learner_step, par, grad_clip, *job) for job in jobs]]
        if par.device.type == "cuda":
            torch.cuda.synchronize(par.device)
        self.stats.append({"learners_s": [[start - t0, end - t0] for _, _, start, end in results]})
        self._average()
        return torch.stack([r[0] for r in results]).mean(), results[0][1]

    def _learner_step(self, par, grad_clip, model, opts, x, y, stream):
        """One learner's local step (in its own thread when concurrent): (loss share, grad norm,
        start, end)."""
        start = time.perf_counter()
        with torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext():
            for opt in opts:
                opt.zero_grad(set_to_none=True)
            share = self._forward_backward(par, model, x, y)
            norm = clip_grad_norm_(trainable(model), grad_clip) if grad_clip > 0 else torch.zeros(())
            for opt in opts:
                opt.step()
        return share, norm, start, time.perf_counter()

    def close(self, aborted: bool = False) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=not aborted, cancel_futures=True)
        super().close(aborted)

    def _forward_backward(self, par, model, x, y) -> torch.Tensor:
        """par.step_local's accumulation over the plan's microbatches, on one learner."""
        total = torch.zeros((), dtype=torch.float64)
        y = torch.empty(x.shape[0], 0) if y is None else y
        pieces = list(zip(x.chunk(par.plan.num_microbatches), y.chunk(par.plan.num_microbatches)))
        n = len(pieces)  # fewer than the plan's microbatches when a learner's share is smaller
        with par._autocast():
            for xm, ym in pieces:
                loss = par.loss_fn(model(xm.to(par.device)), ym.to(par.device)) / n
                loss.backward()
                total += loss.detach().double().cpu()
        return total

    @torch.no_grad()
    def _average(self) -> None:
        params = [trainable(m) for m in self.learners]

        def all_reduce(t):
            self.counter.add("dp_replicate", "all_reduce", self.world, tensor_bytes(t))
            dist.all_reduce(t, group=self.group)
            return t

        corrected, self.z, self.delta_prev = sma_update(
            [flat(p) for p in params], self.z, self.delta_prev, self.alpha, self.mu, all_reduce
        )
        for p, w in zip(params, corrected):
            unflat(self.z if self.reset else w, p)


def build(par, params, counter):
    return Crossbow(par, params, counter)

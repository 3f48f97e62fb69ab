"""sync=dabmd: Distributed Any-Batch Mirror Descent (Eshraghi & Liang, ICML 2020).

A round per step, on plain replicas (every node its own model x_i):
1. compute for a fixed time: microbatches of the local batch until budget_ms is spent (0 = the
   whole local batch), at least min_microbatches, so the node's batch b_i varies with its speed
   and no node waits for a slower one to finish its batch;
2. mirror step, each node on its own: g_i = the mean gradient of its b_i samples at x_i, then
   y_i = argmin_x <eta g_i, x> + D_psi(x, x_i) with eta = the run's learning rate (its schedule
   included; the plan's optimizer state is not used). Mirror maps: Euclidean (psi = |x|^2 / 2:
   y = x - eta g, SGD) or, with entropy=true, negative entropy on the probability simplex
   (psi = sum x log x: y = x exp(-eta g) / sum, row by row along each parameter's last
   dimension: the exponentiated gradient), which needs every trainable parameter's rows on the
   simplex (checked at the start);
3. consensus on the primal variables: x_i <- sum_j W_ij y_j, applied consensus_rounds times
   (1: the single-consensus DABMD; more: the multi-consensus version, W^r), W the Metropolis
   weights of a ring of the nodes (1/3 self and each neighbour; 1/2 and 1/2 for N = 2), each
   iteration one exchange of the parameter vector with the two neighbours. time_varying=true
   re-draws the ring every round (a permutation of the ranks from a seed every rank shares, so
   the graph changes between rounds but every rank agrees on it). W is doubly stochastic, so the
   nodes' mean moves as one centralised mirror step would, and a convex combination of simplex
   points stays on the simplex.

gradient_allreduce=true keeps the earlier exact variant (Anytime Minibatch's weighting, Ferdinand
et al., ICLR 2019): one all-reduce of [sum of per-sample gradients, b_i] gives the union batch's
mean gradient and the plan's optimizer steps every replica identically; with budget 0 that is
DDP.

Straggler injection for tests and benchmarks (executor/straggler.py): MESHPLAN_SLOW_RANK=
"RANK:FACTOR" makes that rank sleep (FACTOR - 1) x each microbatch's compute time after it, i.e.
run FACTOR x slower (other methods are slowed at the optimizer step instead).
Bytes on "dp_replicate": consensus_rounds x the fp32 parameter vector to each ring neighbour
("send_recv"), or (gradient_allreduce) one fp32 all-reduce of the gradients plus the sample
count. Stats (sync.STATS_DIR_ENV): per step this rank's samples, compute and consensus seconds,
when the last microbatch started, and (gradient_allreduce) the union's samples and its weight.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from meshplan.errors import MeshplanError
from meshplan.executor import straggler
from meshplan.executor.methods.sync import SyncMethod, flat, no_ddp_comm_hook, tensor_bytes, trainable, unflat

USES_DDP = False
ddp_comm_hook = no_ddp_comm_hook
SLOW_ENV = straggler.SLOW_ENV
SEED = 20200712
"""The time-varying ring's seed (round t draws permutation t of it), the same on every rank."""


def ring_order(world: int, round_index: int, time_varying: bool) -> list[int]:
    """The ring of round `round_index`: ranks in ring order (the identity, or a fresh permutation)."""
    if not time_varying or world <= 3:  # every ring of <= 3 nodes is the same graph
        return list(range(world))
    g = torch.Generator().manual_seed(SEED + round_index)
    return torch.randperm(world, generator=g).tolist()


def ring_peers(rank: int, order: list[int]) -> list[int]:
    """rank's neighbours on the ring `order` (one when N = 2, none when N = 1)."""
    at, n = order.index(rank), len(order)
    return sorted({order[(at - 1) % n], order[(at + 1) % n]} - {rank})


def mixing_matrix(world: int, order: list[int]) -> torch.Tensor:
    """W of a ring in `order` (Metropolis weights: 1 / (degree + 1) with every degree equal)."""
    w = torch.zeros(world, world, dtype=torch.float64)
    for i in range(world):
        peers = ring_peers(i, order)
        for j in [i, *peers]:
            w[i, j] = 1.0 / (len(peers) + 1)
    return w


@torch.no_grad()
def mirror_step(x: torch.Tensor, g: torch.Tensor, eta: float, entropy: bool) -> torch.Tensor:
    """argmin_y <eta g, y> + D_psi(y, x): Euclidean x - eta g, or (entropy) the exponentiated
    gradient along the last dimension (x on the simplex row by row)."""
    if not entropy:
        return x - eta * g
    logits = torch.log(x.clamp_min(1e-30)) - eta * g
    return torch.softmax(logits, dim=-1)


def on_simplex(t: torch.Tensor, tol: float = 1e-4) -> bool:
    rows = t.detach().double()
    return bool((rows >= 0).all() and ((rows.sum(-1) - 1).abs() <= tol).all())


class AnyBatch(SyncMethod):
    SLOWS_ITSELF = True  # executor/straggler.py: the budget must see the slow compute

    def __init__(self, par, params, counter):
        super().__init__(par, params, counter)
        self.budget_s = params["budget_ms"] / 1e3
        self.slow = straggler.slowdown(dist.get_rank())
        self.rounds = 0
        self.entropy = params["entropy"]
        if self.entropy and params["gradient_allreduce"]:
            raise MeshplanError(
                "sync=dabmd entropy=true with gradient_allreduce=true: the exact variant steps the plan's "
                "optimizer (Euclidean); drop one of them"
            )
        if self.entropy:
            off = [n for n, p in par.named_parameters() if p.requires_grad and not on_simplex(p)]
            if off:
                raise MeshplanError(
                    f"sync=dabmd entropy=true: parameter {off[0]!r} is not on the probability simplex "
                    "(every row along the last dimension >= 0 and summing to 1); use a simplex-"
                    "parameterised model or entropy=false"
                )

    def train_step(self, par, optimizers, batch, grad_clip):
        (model,), params = par.parts, trainable(par.parameters())
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        samples, loss_sum, compute_s, last_start_s = self._compute(par, model, *batch)
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        if self.params["gradient_allreduce"]:
            return self._exact(par, optimizers, params, grads, samples, loss_sum, compute_s, last_start_s, grad_clip)
        for p, g in zip(params, grads):
            p.grad = g.div_(samples)  # the node's own minibatch mean
        norm = par.clip_grad_norm_(grad_clip)
        eta = optimizers[0].param_groups[0]["lr"]
        with torch.no_grad():
            for p in params:
                assert p.grad is not None
                p.copy_(mirror_step(p, p.grad, eta, self.entropy))
        start = time.perf_counter()
        self._consensus(params)
        self.stats.append(
            {
                "samples": samples,
                "compute_s": compute_s,
                "last_start_s": last_start_s,
                "consensus_s": time.perf_counter() - start,
            }
        )
        # the loss share: this node's per-sample mean (global_losses averages the nodes)
        return torch.tensor(loss_sum / samples, dtype=torch.float64), norm

    @torch.no_grad()
    def _consensus(self, params) -> None:
        """consensus_rounds iterations of x <- W x with the ring's neighbours (module docstring)."""
        x = flat(params)
        for _ in range(self.params["consensus_rounds"]):
            order = ring_order(self.world, self.rounds, self.params["time_varying"])
            self.rounds += 1
            peers = ring_peers(self.rank, order)
            if not peers:
                continue
            inbox = {r: torch.empty_like(x) for r in peers}
            ops = []
            for r in peers:
                peer = dist.get_global_rank(self.group, r)
                self.counter.add("dp_replicate", "send_recv", self.world, tensor_bytes(x))
                ops += [dist.P2POp(dist.isend, x, peer, self.group), dist.P2POp(dist.irecv, inbox[r], peer, self.group)]
            for work in dist.batch_isend_irecv(ops):
                work.wait()
            x = (x + sum(inbox.values())) / (len(peers) + 1)
        unflat(x, params)

    def _exact(self, par, optimizers, params, grads, samples, loss_sum, compute_s, last_start_s, grad_clip):
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
        # weighted so global_losses' mean over ranks is the union batch's mean loss
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

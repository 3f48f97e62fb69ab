"""sync=local-sgd: H local steps, then the parameters averaged (Stich 2019; Lin et al. 2020).

torch's own recipe, unchanged (verified on gloo):
- DDP keeps its buckets, with `post_localSGD_hook` as the comm hook: it all-reduces the
  gradients while `iter < start_localSGD_iter` (= warmup_steps, post-local SGD's synchronous
  start) and returns them untouched afterwards (post_local_gradient_allreduce=False: no
  intra-node gradient all-reduce);
- each optimizer is a `PostLocalSGDOptimizer` whose averager averages the parameters after the
  step: `PeriodicModelAverager(period, warmup_steps)` (from step warmup_steps, every period), or
  with group_size > 0 `HierarchicalModelAverager({group_period: group_size, period: N})`
  (groups of group_size consecutive ranks every group_period steps, everyone every period;
  where both are due only the larger period averages, as torch does).
Momentum buffers stay local (torch averages parameters only): with SGD + momentum and period 1
the iterates still equal DDP's (heavy-ball momentum is linear); with Adam they do not.

Bytes: the hook's warm-up all-reduces (the bucket) and every averaging all-reduce (one flat fp32
vector of the parameters; torch's model_averaging.utils `dist` is a CountingDist for the
averaging groups), on "dp_replicate". The ByteCounter's warm-up covers the synchronous steps, and its steady state
is averaged over whole periods (4 steps at period 2 report the last 2 after the first, one
averaging: what the cost model predicts per step).
"""

from __future__ import annotations

from collections import OrderedDict

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import post_localSGD_hook
from torch.distributed.algorithms.model_averaging import averagers, hierarchical_model_averager
from torch.distributed.algorithms.model_averaging import utils as averaging_utils
from torch.distributed.optim import PostLocalSGDOptimizer

from meshplan.comm_bytes import ByteCounter
from meshplan.errors import MeshplanError
from meshplan.executor.methods.counting import counting_dist, tensor_bytes
from meshplan.executor.methods.sync import SyncMethod

USES_DDP = True


def ddp_comm_hook(group, params: dict, counter: ByteCounter, axis: str):
    """(PostLocalSGDState, hook): gradients all-reduced (counted) until warmup_steps, then local."""
    state = post_localSGD_hook.PostLocalSGDState(
        process_group=group,
        subgroup=group,
        start_localSGD_iter=params["warmup_steps"],
        post_local_gradient_allreduce=False,
    )

    def local_sgd_counted(state, bucket):  # no annotations: DDP checks them against the class
        if state.iter < state.start_localSGD_iter:
            counter.add(axis, "all_reduce", dist.get_world_size(group), tensor_bytes(bucket.buffer()))
        return post_localSGD_hook.post_localSGD_hook(state, bucket)

    return state, local_sgd_counted


class LocalSGD(SyncMethod):
    def __init__(self, par, params, counter):
        super().__init__(par, params, counter)
        counter.warmup_steps = max(counter.warmup_steps, params["warmup_steps"])
        counter.period = max(counter.period, params["period"])  # one averaging per period
        self.averagers = []

    def _averager(self):
        p, counting = self.params, counting_dist(averaging_utils)
        g, gp = p["group_size"], p["group_period"]
        if not g or g >= self.world:
            averager = averagers.PeriodicModelAverager(
                period=p["period"], warmup_steps=p["warmup_steps"], process_group=self.group
            )
            counting.register(self.group, self.counter, "dp_replicate")
            return averager
        if self.world % g or p["period"] % gp or gp >= p["period"]:
            raise MeshplanError(
                f"sync=local-sgd group_size={g}, group_period={gp}, period={p['period']}: "
                f"group_size must divide the {self.world} replicas and group_period must "
                "divide period and be smaller"
            )
        averager = hierarchical_model_averager.HierarchicalModelAverager(
            period_group_size_dict=OrderedDict([(gp, g), (p["period"], self.world)]),
            warmup_steps=p["warmup_steps"],
            process_group=self.group,
        )
        for group in averager.period_process_group_dict.values():
            counting.register(group, self.counter, "dp_replicate")
        return averager

    def wrap_optimizers(self, optimizers, name, lr, weight_decay):
        self.averagers = [self._averager() for _ in optimizers]
        return [PostLocalSGDOptimizer(opt, averager) for opt, averager in zip(optimizers, self.averagers)]


def build(par, params, counter):
    return LocalSGD(par, params, counter)

"""Data-parallel cost in one place: what a candidate's data parallelism (ZeRO stage, replicate x
shard degrees, and its methods from meshplan/dp_methods.py) costs per layer, per step and in
memory, and the bytes it puts on the wire.

- ZeRO-0/1 (DDP over dp_replicate): the gradients' payload (the compressor's: fp16 or PowerSGD's
  factors; uncompressed, the runtime's reduce width: fp32 under DDP and Megatron, the 16-bit model
  dtype under DeepSpeed) all-reduced once per step in buckets, overlapped with the last microbatch's
  backward except the last bucket; ZeRO-1 then broadcasts each rank's updated fp32 parameters
  (torch ZeroRedundancyOptimizer; Megatron's distributed optimizer reduce-scatters and
  all-gathers the bf16 weights instead, DeepSpeed all-gathers its 16-bit weights).
- ZeRO-2/3 (FSDP2 over dp_shard): per microbatch, each layer's weights all-gathered forward
  (ZeRO-3: again backward) and, after the last microbatch, its gradients reduce-scattered;
  HSDP (dp_replicate > 1) all-reduces the gradient shards over the replicas. Prefetched behind
  the layer's compute: only the excess is exposed (planner/rank/layer_cost.py applies the overlap).
- Memory (Rajbhandari et al. 2020 Sec 3): ZeRO-1 shards the optimizer states over the
  data-parallel group, ZeRO-2 also the gradients, ZeRO-3 also the weights, each over dp_shard
  for ZeRO-2/3; the compressor's state (PowerSGD's error feedback and factors) is added.
- Bytes: meshplan/comm_bytes.py's ring volumes, the same convention the executor counts.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from fractions import Fraction

from meshplan.comm_bytes import wire_bytes
from meshplan.feasibility import SPLIT_BACKWARD
from meshplan.model_profile import LayerProfile
from meshplan.planner.context import Candidate, Context
from meshplan.planner.cost.comm import collective_latency_s, collective_s, group_tier
from meshplan.planner.cost.in_place import in_place_overhead_s
from meshplan.planner.cost.state import state_bytes
from meshplan.planner.methods.comm_schedule import DDP_BUCKET_MB, comm_schedule_cost
from meshplan.planner.methods.compression import GRAD_BYTES, shard_shapes
from meshplan.planner.methods.compression_quant import band_params
from meshplan.planner.methods.compressors import compressor
from meshplan.planner.methods.offload import offload_cost
from meshplan.planner.methods.sync import sync_cost

DDP_BUCKET_BYTES = DDP_BUCKET_MB * 1024**2
"""PyTorch DDP's default bucket (the comm_schedule=buckets default)."""


def unfilled_bucket(elems: float, bucket: int) -> float:
    """Gradient elements left in DeepSpeed's ipg bucket when backward ends: a bucket of `bucket` elements
    is reduced when the next gradient would overflow it, so what is left of `elems` is the part past the
    last full bucket; all of them under one bucket, a whole bucket where they fill buckets exactly."""
    return elems % bucket or min(bucket, elems)


def trainable(layer: LayerProfile) -> LayerProfile:
    """The layer as its gradients see it: frozen parameters (requires_grad=False) are weights
    only: no gradient, no optimizer state, no gradient traffic (DDP buckets, FSDP2's
    reduce-scatter and ZeroRedundancyOptimizer's broadcasts skip them); param_shapes already
    lists only the trainable ones. The layer itself when nothing in it is frozen."""
    if not layer.num_frozen_params:
        return layer
    return dataclasses.replace(layer, num_params=layer.num_params - layer.num_frozen_params, num_frozen_params=0)


def gathered_elems(layer: LayerProfile, split: int, shard: int) -> int:
    """One rank's FSDP2 shard of all of a layer's weights, frozen ones too (each gathered for
    forward): the trainable ones by their shapes (padded_shard_elems), the frozen as one flat
    tensor (their shapes are not profiled)."""
    frozen = math.ceil(layer.num_frozen_params / split / shard) if layer.num_frozen_params else 0
    return padded_shard_elems(trainable(layer), split, shard) + frozen


def fsdp_width(ctx: Context) -> int:
    """Bytes per element FSDP2 gathers and reduce-scatters: the runtime's (meshplan's executor gathers
    fp32, autocast without a MixedPrecisionPolicy), else 2 under bf16 (RuntimeSpec.fsdp_gather_bytes)."""
    return ctx.spec.fsdp_gather_bytes


def reduce_width(ctx: Context) -> int:
    """Bytes per element of the ZeRO-2/3 gradient reduce-scatter and HSDP's replica all-reduce: the
    runtime's reduce dtype, resolved by Context.spec (fp32 under FSDP2's torch layout, bf16 under
    Composer's PURE mixed precision, the gather width where neither says)."""
    return ctx.spec.fsdp_reduce_bytes


def padded_shard_elems(layer: LayerProfile, split: int, shard: int) -> int:
    """One rank's FSDP2 shard of a layer: each parameter split on dim 0 into `shard` equal
    chunks, dim 0 padded up to a multiple of `shard` (FSDP2 FSDPParam); the layer as one flat
    tensor when its shapes are unknown."""
    if not layer.param_shapes:
        return math.ceil(layer.num_params / split / shard)
    total = 0
    for shape in layer.param_shapes:
        rows = math.ceil(shape[0] / (split if len(shape) else 1)) if shape else 1
        rest = math.prod(shape[1:]) if len(shape) > 1 else 1
        total += math.ceil(rows / shard) * rest
    return total


@dataclass(frozen=True)
class LayerDP:
    """One layer's data-parallel terms on one rank."""

    weights_bytes: float
    grads_bytes: float
    optim_bytes: float
    comm_s: float
    """Per microbatch, before overlap: ZeRO-2/3 gathers, 1/m of the reduce-scatter (+ HSDP all-reduce)."""
    measured: bool
    """comm_s is the in-place measurement (it already includes FSDP2's hooks)."""
    payload_bytes: float
    """ZeRO-0/1: what the once-per-step gradient all-reduce carries for this layer."""
    compress_s: float
    """Compression and decompression compute per step."""
    optimizer_shard: int
    """Ranks the optimizer step of this layer is split over."""
    host_step: bool = False
    """The offload method steps this layer on the host (planner/methods/offload.py prices it in sync_s)."""
    exposed_s: float = 0.0
    """Part of comm_s no overlap hides: ZeRO-3 gathers of the layer's parameters beyond what the
    runtime fetches ahead of use (request.zero3_prefetch_elems; DeepSpeed's 5e7 elements)."""
    recompute_gather_s: float = 0.0
    """One more ZeRO-3 gather of the layer for a full recompute's forward (zero3_gather "module":
    DeepSpeed's hooks fetch again), its exposed part in recompute_gather_exposed_s."""
    recompute_gather_exposed_s: float = 0.0


class DataParallelCost:
    """The data-parallel cost object of one candidate."""

    def __init__(self, ctx: Context, cand: Candidate):
        self.ctx, self.cand = ctx, cand
        self.zero = cand.zero
        self.shard = cand.state_shard if cand.zero >= 2 else 1
        """FSDP2 shard group (ZeRO-2/3): dp_shard x cp (Candidate.state_shard)."""
        self.replicas = cand.dp_replicate * (1 if cand.zero >= 2 else cand.cp)
        """Ranks holding the same weights and gradient shard: DDP's group (context-parallel ranks
        included), HSDP's all-reduce."""
        name, params = cand.method("compression")
        self.compressor = compressor(name, params)
        self.compressor.group = self.replicas
        self.uncompressed = name == "none"
        """The gradients go as they are: at the runtime's width (_payload_bytes)."""
        self.replica_tier = group_tier(ctx.cluster, cand.tp * (self.shard if cand.zero >= 2 else 1), self.replicas)
        self.shard_tier = group_tier(ctx.cluster, cand.tp, self.shard)  # dp_shard x cp, stride tp
        self.bucket_bytes = cand.method("comm_schedule")[1].get("bucket_mb", DDP_BUCKET_MB) * 1024**2
        self.offload = cand.method("offload")[0] != "none"
        self.offload_cost = offload_cost(ctx, cand)
        """Where the states live and what moving them costs (planner/methods/offload.py)."""
        self.sync = sync_cost(self, *cand.method("sync"))
        """The sync method's cost object (planner/methods/sync.py); all but allreduce replace DDP's sync."""
        self.schedule = comm_schedule_cost(self, *cand.method("comm_schedule"))
        """The communication schedule's (planner/methods/comm_schedule.py): bytescheduler replaces DDP's buckets."""
        self.unsharded_accumulation = (
            cand.zero >= 2
            and ctx.spec.fsdp_full_grad_accumulation
            and (cand.pp > 1 or not ctx.reduces_every_microbatch(cand))
        )
        """ZeRO-2/3 gradients of every microbatch but the last accumulate unsharded in fp32 and are
        reduce-scattered once per step (FSDP2 with set_requires_gradient_sync(False): meshplan's
        executor, and torch pipelining under any runtime); else every microbatch's backward
        reduce-scatters into the shards (torchtitan without PP, DeepSpeed: the runtime behaviour
        fsdp_reduce_every_microbatch; meshplan's executor where the plan chose it), holding no
        unsharded copy."""
        self.pipeline_deferred = self.unsharded_accumulation and cand.pp > 1
        """FSDP2 under torch.distributed.pipelining: the stage's gradient reduce-scatter runs after
        its last backward, not during it (_deferred_scatter_s)."""
        self.epilogue_share = self._epilogue_share(ctx, cand)
        """Share of a rank's ZeRO-2 gradients reduced only once each backward is over (_epilogue_share)."""

    @staticmethod
    def _epilogue_share(ctx: Context, cand: Candidate) -> float:
        """DeepSpeed's ZeRO-2 collects each backward's gradients in one bucket of reduce_bucket_size
        elements (RuntimeSpec.reduce_bucket_elems) and reduces it when the next gradient would overflow
        it; what has not filled a bucket when backward ends is reduced in the epilogue
        (overlapping_partition_gradients_reduce_epilogue, every micro-step at ZeRO-2), exposed. The
        bucket fills with the rank's whole (TP-local) gradients, before partitioning: a rank holding
        fewer elements than one bucket overlaps none of its reduction. 0 where no such bucket (FSDP2's
        per-layer reduce-scatter) or below ZeRO-2 (ZeRO-1: _last_bucket)."""
        bucket = ctx.spec.reduce_bucket_elems
        if cand.zero != 2 or not bucket:
            return 0.0
        total = sum(trainable(lp).num_params / ctx.tp_split(lp, cand.tp) for lp in ctx.layers)
        return unfilled_bucket(total, bucket) / total if total > 0 else 0.0

    # --- per layer ------------------------------------------------------------------------
    def layer(self, layer: LayerProfile, split: int, b: int, m: int) -> LayerDP:
        local = layer.num_params / split
        train = trainable(layer)  # frozen parameters: weights only
        grad_local = train.num_params / split
        w, g, o = state_bytes(self.ctx)
        weights = local * w / (self.shard if self._shards_weights() else 1)
        if self.zero == 2 and self.shard > 1 and self._shards_weights():
            weights += local * fsdp_width(self.ctx)  # FSDP2 ZeRO-2: the gathered copy stays forward to backward
        grads = grad_local * g / (self.shard if self.zero >= 2 else 1) + grad_local * self._ddp_bucket_bytes_per_param()
        if self.zero >= 2 and self.shard > 1 and m > 1 and self.unsharded_accumulation:
            grads += grad_local * g  # unsharded fp32 gradients accumulated across microbatches
        optim = grad_local * o / self.cand.state_shard
        weights, grads, optim = self.offload_cost.state_bytes(
            local, weights, grads, optim
        )  # planner/methods/offload.py
        comm, measured, exposed = self._fsdp_comm_s(layer, split, local, b, m)
        regather, regather_exposed = self._recompute_gather_s(layer, local, measured)
        layer = train  # what follows is gradient traffic and its compression
        zero01 = self.zero <= 1 and self.replicas > 1
        if zero01 and self.sync.replaces_ddp:  # planner/methods/sync.py: copies, buffers, Crossbow's learners
            weights += self.sync.state_bytes(local)
        return LayerDP(
            weights_bytes=weights,
            grads_bytes=grads + (self.compressor.state_bytes(layer, split) if zero01 else 0.0),
            optim_bytes=optim,
            comm_s=comm,
            measured=measured,
            payload_bytes=self._payload_bytes(layer, split) if zero01 else 0.0,
            compress_s=(
                self.compressor.compute_s(self.ctx, layer, split) + self.sync.extra_compute_s(layer, split, b, m)
            )
            if zero01
            else 0.0,
            optimizer_shard=self.cand.state_shard,
            host_step=self.offload_cost.host_step,
            exposed_s=exposed,
            recompute_gather_s=regather,
            recompute_gather_exposed_s=regather_exposed,
        )

    def _payload_bytes(self, layer: LayerProfile, split: int) -> float:
        """What the ZeRO-0/1 gradient exchange carries for the (trainable) layer on one rank: the
        compressor's payload; uncompressed, the gradients at the runtime's reduce width
        (RuntimeSpec.replica_reduce_bytes: fp32 under torch DDP and Megatron's main grads, the
        16-bit model dtype under DeepSpeed's default communication_data_type), where the
        no-compression cost object counts fp32 (GRAD_BYTES)."""
        payload = self.compressor.payload_bytes(layer, split)
        if not self.uncompressed:
            return payload
        return payload * self.ctx.spec.replica_reduce_bytes / GRAD_BYTES

    def _shards_weights(self) -> bool:
        """ZeRO-3 shards the weights; so does ZeRO-2 run as FSDP2 (fully_shard with
        reshard_after_forward=False: sharded parameters, the gathered copy kept from forward to
        backward; meshplan's executor, torchtitan). DeepSpeed's ZeRO-2 (RuntimeSpec.zero2_shards_weights)
        keeps its 16-bit weights whole and shards gradients and optimizer states only."""
        return self.zero >= 3 or (self.zero == 2 and self.ctx.spec.zero2_shards_weights)

    def _ddp_bucket_bytes_per_param(self) -> float:
        """PyTorch DDP (ZeRO-0/1 without tensor parallelism) allocates its buckets for every
        gradient when built (Reducer::initialize_buckets), a second copy of the fp32 gradients
        (gradient_as_bucket_view=False). Megatron's contiguous grad buffer is the main grads."""
        if (
            self.zero >= 2
            or self.replicas <= 1
            or self.cand.tp > 1
            or not self.ctx.spec.ddp_bucket_copy
            or not self.sync.ddp_buckets
            or not self.schedule.ddp_buckets
        ):
            return 0.0
        return 4.0

    def _fsdp_comm_s(self, layer: LayerProfile, split: int, local: float, b: int, m: int) -> tuple[float, bool, float]:
        """Per microbatch: weight all-gathers (ZeRO-3: forward and backward) every microbatch; the
        gradient reduce-scatter (and HSDP's replica all-reduce) every microbatch, or only after the
        last one where gradients accumulate unsharded (unsharded_accumulation), i.e. 1/m of it.
        ZeRO-3's gathers come from the in-place measurement (profiler/insitu.py "zero3@D") where
        there is one, and its reduce-scatter from the same layer measured with gradient sync on
        ("zero3_sync@D", less the gathers): between ranks busy computing a collective waits for
        its slowest partner, which the idle-rank link fit does not see.
        The third value is the part of the gathers that waits on the critical path
        (_unprefetched_share)."""
        if self.zero < 2 or self.shard <= 1:
            return 0.0, False, 0.0
        grad_local = trainable(layer).num_params / split  # frozen weights are gathered, never reduced
        ctx = self.ctx
        offload = self._offload_s(local) if self.offload else 0.0
        fw = layer.framework_overhead_s if ctx.measured else {}
        measured = in_place_overhead_s(fw, f"zero3@{self.shard}", b) if self.zero == 3 and fw else None
        synced = in_place_overhead_s(fw, f"zero3_sync@{self.shard}", b) if measured is not None else None
        if self.pipeline_deferred:
            scatter = 0.0  # once per step (_deferred_scatter_s)
        elif synced is not None and measured is not None and grad_local > 0:
            # the reduce-scatter as measured between busy ranks, the replicas' all-reduce fitted
            scatter = max(synced - measured, 0.0) + self._replica_reduce_s(grad_local)
        else:
            scatter = self._scatter_s(grad_local)
        scatter /= m if self.unsharded_accumulation else 1
        if measured is not None:
            return measured + scatter + offload, True, 0.0
        gather = self._gather_s(layer, local) if self._shards_weights() else 0.0  # else once a step (sync_s)
        again = self.zero == 3 and (layer.num_params > layer.num_frozen_params or self._after_trainable(layer))
        gathers = (2 if again else 1) * gather
        exposed = gathers * self._unprefetched_share(local) if self.zero == 3 else scatter * self.epilogue_share
        return gathers + scatter + offload, False, exposed

    def _scatter_s(self, grad_params: float) -> float:
        """The ZeRO-2/3 gradient reduce-scatter of `grad_params` unsharded gradients over the shard
        group at the reduce width (under DeepSpeed's ZeRO-2 an all-reduce of the whole bucket:
        _shard_grad_collective), and HSDP's all-reduce of the resulting shard over the replicas."""
        ctx, width = self.ctx, reduce_width(self.ctx)
        scatter = collective_s(
            ctx.cluster, self._shard_grad_collective(), self.shard, grad_params * width, self.shard_tier
        )
        return scatter + self._replica_reduce_s(grad_params)

    def _shard_grad_collective(self) -> str:
        """The collective that reduces ZeRO-2/3 gradients over the shard group: ZeRO-3's
        reduce-scatter, ZeRO-2's as the runtime runs it (RuntimeSpec.zero2_grad_collective)."""
        return self.ctx.spec.zero2_grad_collective if self.zero == 2 else "reduce_scatter"

    def _replica_reduce_s(self, grad_params: float) -> float:
        """HSDP's all-reduce over the replicas of the shard `grad_params` reduce-scatter to."""
        ctx, width = self.ctx, reduce_width(self.ctx)
        return collective_s(
            ctx.cluster, "all_reduce", self.replicas, grad_params * width / self.shard, self.replica_tier
        )

    def _deferred_scatter_s(self, local_params: float) -> float:
        """Exposed once per step under torch.distributed.pipelining with FSDP2: the stage runs every
        backward with gradient sync off and calls FSDP's post_backward for the whole stage only
        after its last microbatch's backward (torch/distributed/pipelining/stage.py
        backward_maybe_with_nosync, last_backward), so the stage's reduce-scatters follow its last
        backward instead of overlapping it. The rank finishing last (rank 0, on the critical path)
        waits for its last chunk's: 1/v of its gradients (an interleaved rank's other chunks
        finished p backward steps earlier and hide theirs behind them)."""
        if not self.pipeline_deferred or self.shard * self.replicas <= 1:
            return 0.0
        return self._scatter_s(local_params / self.cand.virtual_stages)

    def _step_weight_gather_s(self, local_params: float) -> float:
        """A ZeRO-2 that keeps its 16-bit weights whole (DeepSpeed) gathers nothing per microbatch:
        after the optimizer step each rank all-gathers the updated 16-bit partitions of the others
        (zero/stage_1_and_2.py step, all_gather_dp_groups of the bit16 groups), once a step, exposed
        (it follows the step and precedes the next forward). Sharded weights (FSDP2, ZeRO-3) are
        gathered per microbatch instead (_fsdp_comm_s)."""
        if self.zero != 2 or self.shard <= 1 or self._shards_weights():
            return 0.0
        return self._updated_weights_gather_s(local_params, self.shard, self.shard_tier)

    def _updated_weights_gather_s(self, local_params: float, group: int, tier: str) -> float:
        """The all-gather that hands the updated weights, as the ranks keep them (zero1_param_bytes),
        back to the `group` ranks that each stepped a partition of them (ZeRO-1's replicas, DeepSpeed
        ZeRO-2's shard group)."""
        weights = local_params * self.ctx.spec.zero1_param_bytes
        return collective_s(self.ctx.cluster, "all_gather", group, weights, tier)

    def _gather_s(self, layer: LayerProfile, local: float) -> float:
        """One ZeRO-3 gather of the layer's parameters. FSDP2 gathers a wrapped layer in one
        all-gather; DeepSpeed (zero3_gather "module") gathers each submodule holding parameters
        in its own (fetch_sub_module), so a layer pays the collective's latency once per submodule:
        the children of its TP rule (q, k, v, o, the MLP's linears, the norms), at least one. At
        hundreds of ranks that latency (a ring's hops, comm.ring_latency_s) is milliseconds."""
        ctx = self.ctx
        gather = collective_s(ctx.cluster, "all_gather", self.shard, local * fsdp_width(ctx), self.shard_tier)
        if ctx.spec.zero3_gather != "module" or gather <= 0:
            return gather
        rule = layer.tp
        submodules = max(len(rule.column) + len(rule.row) + len(rule.replicated), 1)
        return gather + (submodules - 1) * collective_latency_s(ctx.cluster, "all_gather", self.shard, self.shard_tier)

    def _recompute_gather_s(self, layer: LayerProfile, local: float, measured: bool) -> tuple[float, float]:
        """(seconds, exposed seconds) of the gather DeepSpeed runs again for a full recompute: its
        activation checkpointing re-runs the block's forward inside backward, whose pre-forward
        hooks fetch the released parameters before the pre-backward hooks fetch them once more.
        FSDP2 (zero3_gather "layer") unshards the block in its pre-backward hook, before the
        recompute runs, and gathers nothing more."""
        if self.zero != 3 or self.shard <= 1 or measured or self.ctx.spec.zero3_gather != "module":
            return 0.0, 0.0
        gather = self._gather_s(layer, local)
        return gather, gather * self._unprefetched_share(local)

    def _unprefetched_share(self, local: float) -> float:
        """Share of a layer's ZeRO-3 gathers that cannot be fetched ahead of use: DeepSpeed
        prefetches at most stage3_prefetch_bucket_size parameter elements (default 5e7) beyond the
        submodule running, so a layer larger than that (GPT-3 175B: 1.8e9 per block) waits for the
        rest of its gathers; FSDP2 issues the next layer's all-gather whole (prefetch 0 here)."""
        ahead = self.ctx.spec.zero3_prefetch_elems
        if ahead <= 0 or local <= 0:
            return 0.0
        return max(0.0, 1.0 - ahead / local)

    def _after_trainable(self, layer: LayerProfile) -> bool:
        """A gradient flows into the layer: some layer before it in the model trains (a frozen
        backbone's first layers run no backward: ZeRO-3 gathers them for forward only; the
        bytes also count FSDP2's one prefetched layer, _gathered_in_backward)."""
        names = [lp.name for lp in self.ctx.layers]
        if layer.name not in names:
            return True
        return any(lp.num_params > lp.num_frozen_params for lp in self.ctx.layers[: names.index(layer.name)])

    def _offload_s(self, local: float) -> float:
        """Offload per microbatch (FSDP2's policy: the shard copied up before each gather); the
        once-per-step part (gradients down, the host step, NVMe, parameters up) is in sync_s."""
        return self.offload_cost.per_microbatch_s(local)

    # --- per rank, once per step ----------------------------------------------------------
    def sync_s(
        self, local_params: float, payload_bytes: float, compress_s: float, backward_window_s: float, last_bucket: float
    ) -> float:
        """Once per step: the exposed gradient sync and the offload method's exposed step
        (planner/methods/offload.py)."""
        return self._grad_sync_s(
            local_params, payload_bytes, compress_s, backward_window_s, last_bucket
        ) + self.offload_cost.step_s(local_params, backward_window_s)

    def _grad_sync_s(
        self, local_params: float, payload_bytes: float, compress_s: float, backward_window_s: float, last_bucket: float
    ) -> float:
        """Exposed gradient sync of one rank (ZeRO-0/1): bucketed all-reduce of the payload behind
        the last microbatch's backward except the last bucket, plus ZeRO-1's parameter broadcast
        and what a busy CPU's DDP adds (measured in place)."""
        if self.zero >= 2:
            return self._deferred_scatter_s(local_params) + self._step_weight_gather_s(local_params)
        if self.replicas <= 1:
            return 0.0
        if self.sync.replaces_ddp:  # planner/methods/sync.py: master, local SGD, Crossbow, DABMD, gossip, async
            return self.sync.sync_s(local_params, backward_window_s) + compress_s
        if self.schedule.replaces_ddp:  # planner/methods/comm_schedule.py: ByteScheduler's priority chunks
            return self._contention_s(self.replicas) + self.schedule.sync_s(local_params, backward_window_s)
        ctx, tier, group = self.ctx, self.replica_tier, self.replicas
        hidden = ctx.cluster.calibration.dp_overlap if self._sync_overlaps_backward() else 0.0
        share = payload_bytes / (local_params * 4) if local_params else 0.0
        tail_bytes = min(self._last_bucket(local_params, last_bucket), local_params) * 4 * share
        grads = self._replica_grad_collective()
        wire = group if grads == "all_gather" else 1  # per-rank payloads: the gathered buffer is N x
        rounds = (self.compressor.rounds - 1) * collective_latency_s(ctx.cluster, grads, group, tier)
        comm = collective_s(ctx.cluster, grads, group, wire * payload_bytes, tier) + compress_s + rounds
        last = collective_s(ctx.cluster, grads, group, wire * tail_bytes, tier) + rounds
        sync = self._contention_s(group) + max(comm - hidden * backward_window_s, last if hidden else comm, 0.0)
        if self.zero == 1:
            sync += self._zero1_broadcast_s(local_params, hidden)
        return sync

    def _last_bucket(self, local_params: float, last_bucket: float) -> float:
        """Gradient elements reduced only once backward is over. DDP's: the bucket finished last
        (rank/tail.py last_bucket_params). DeepSpeed's ZeRO-1 fills one bucket of reduce_bucket_size
        elements (RuntimeSpec.reduce_bucket_elems) and reduces it when the next gradient would overflow
        it: what has not filled a bucket when backward ends is reduced after it (the epilogue's
        reduce_ipg_grads), all of a rank's gradients where it holds fewer than one bucket."""
        bucket = self.ctx.spec.reduce_bucket_elems
        if not bucket or self.zero != 1:
            return last_bucket
        return max(last_bucket, unfilled_bucket(local_params, bucket))

    def _replica_grad_collective(self) -> str:
        """The ZeRO-0/1 gradient exchange's collective: a compressor's own where it gathers per-rank
        payloads, else ZeRO-1's as the runtime runs it (RuntimeSpec.zero1_grad_collective: Megatron's
        distributed optimizer reduce-scatters), else the all-reduce; time and bytes_per_step alike."""
        if self.compressor.collective == "all_gather":
            return "all_gather"
        return self.ctx.spec.zero1_grad_collective if self.zero == 1 else "all_reduce"

    def _sync_overlaps_backward(self) -> bool:
        """Whether the ZeRO-0/1 gradient all-reduce runs during backward: the runtime overlaps it,
        and it does not wait for backward to end because DDP cannot wrap the replicas: tensor-
        parallel ones, or a split-backward schedule's stages (RuntimeSpec.replica_sync_after_backward;
        the executor's rule, executor/parallelize.py), nor because the engine reduces only after
        backward at stage 0 (RuntimeSpec.zero0_reduce_after_backward: DeepSpeed) or after a pipeline
        schedule's last backward (RuntimeSpec.pipeline_reduce_after_backward: DeepSpeed's pipe engine)."""
        spec, cand = self.ctx.spec, self.cand
        if self.zero == 0 and spec.zero0_reduce_after_backward:  # DeepSpeed's stage 0
            return False
        if cand.pp > 1 and spec.pipeline_reduce_after_backward:  # DeepSpeed's pipeline engine
            return False
        outside_ddp = cand.tp > 1 or cand.schedule in SPLIT_BACKWARD
        return spec.overlap_dp_comm and not (outside_ddp and spec.replica_sync_after_backward)

    def _zero1_broadcast_s(self, local_params: float, hidden: float) -> float:
        """ZeRO-1's parameter broadcast as measured in place between busy ranks (step_overhead_s
        "zero1@D", whole unsharded model: pp = tp = cp = 1), else ~ an all-gather of the weights."""
        ctx, cand = self.ctx, self.cand
        if ctx.measured and cand.pp * cand.tp * cand.cp == 1:
            got = ctx.profile.step_overhead_s.get(f"zero1@{self.replicas}")
            if got is not None:
                return got
        hidden = hidden if ctx.spec.zero1_gather_overlaps else 0.0  # DeepSpeed: after the step
        return (1 - hidden) * self._updated_weights_gather_s(local_params, self.replicas, self.replica_tier)

    def _contention_s(self, group: int) -> float:
        """What a gradient all-reduce costs between busy ranks beyond its idle-rank link fit: the
        whole model's DDP overhead measured in place (step_overhead_s "ddp@D") minus the fit's
        time for the same bytes; 0 unless measured."""
        table = self.ctx.profile.step_overhead_s if self.ctx.measured else {}
        measured = in_place_overhead_s(table, f"ddp@{group}", self.cand.microbatch) if table else None
        if measured is None:
            return 0.0
        fit = collective_s(self.ctx.cluster, "all_reduce", group, self.ctx.profile.num_params * 4.0, self.replica_tier)
        return max(0.0, measured - fit)

    # --- bytes ------------------------------------------------------------------------------
    def bytes_per_step(self, layers: list[tuple[LayerProfile, int]]) -> dict[str, int]:
        """Bytes one rank sends per step for its (layer, tp split) list, by mesh axis
        (meshplan/comm_bytes.py; steady state: after PowerSGD's start iterations)."""
        out: dict[str, Fraction | float] = {}
        m = self.cand.num_microbatches
        gathered = layers  # frozen weights are gathered (ZeRO-2/3) but have no gradient traffic
        paged = 0.0  # shard elements read from disk at gathers (offload=nvme params=true)
        layers = [(trainable(lp), s) for lp, s in layers]
        if self.zero <= 1 and self.replicas > 1:
            payload = sum(self._payload_bytes(lp, s) for lp, s in layers)
            out["dp_replicate"] = wire_bytes(self._replica_grad_collective(), self.replicas, payload)
            if self.zero == 1:
                width = self.ctx.spec.zero1_param_bytes  # the updated weights, sent back
                out["dp_replicate"] += wire_bytes(
                    "broadcast", self.replicas, sum(width * lp.num_params // s for lp, s in layers)
                )
        elif self.zero >= 2 and self.shard > 1:
            width, reduce = fsdp_width(self.ctx), reduce_width(self.ctx)
            shard_bytes = sum(reduce * padded_shard_elems(lp, s, self.shard) for lp, s in layers)
            if self._shards_weights():
                gathers = [m * (1 + (self.zero == 3 and again)) for again in self._gathered_in_backward(gathered)]
            else:  # whole 16-bit weights: the trainable (bit16) groups gathered once after the step
                width, gathered = self.ctx.spec.zero1_param_bytes, layers  # (_step_weight_gather_s)
                gathers = [1 for _ in gathered]
            gather_bytes = sum(n * width * gathered_elems(lp, s, self.shard) for n, (lp, s) in zip(gathers, gathered))
            paged = sum(n * padded_shard_elems(lp, s, self.shard) for n, (lp, s) in zip(gathers, gathered))
            reductions = 1 if self.unsharded_accumulation else m  # once per step, or every microbatch
            out["dp_shard"] = wire_bytes("all_gather", self.shard, gather_bytes) + reductions * wire_bytes(
                self._shard_grad_collective(), self.shard, self.shard * shard_bytes
            )
            if self.replicas > 1:
                out["dp_replicate"] = reductions * wire_bytes("all_reduce", self.replicas, shard_bytes)
        if (
            self.sync.replaces_ddp and self.zero <= 1 and self.replicas > 1
        ):  # its own exchange (planner/methods/sync.py)
            out["dp_replicate"] = self.sync.bytes(sum(lp.num_params // s for lp, s in layers))
        host_elems = (
            sum(padded_shard_elems(lp, s, self.shard) for lp, s in layers)
            if self.zero >= 2
            else sum(tp_local_elems(lp, s) for lp, s in layers) / self.cand.state_shard
        )
        out.update(
            self.offload_cost.bytes_per_step(host_elems, paged)
        )  # host_device / nvme (planner/methods/offload.py)
        return {axis: round(v) for axis, v in sorted(out.items()) if v}

    def _gathered_in_backward(self, layers: list[tuple[LayerProfile, int]]) -> list[bool]:
        """Per held layer: does ZeRO-3 gather its weights again in backward? FSDP2 does where a
        gradient flows through the layer (it trains, or a layer before it in the model does, or
        the rank is past the first pipeline stage: its inputs come with gradients), and prefetches
        the one layer with weights before the earliest such layer (backward prefetch, in reverse
        forward order) though its backward never runs. A frozen backbone's first layers are
        gathered for forward only. Everything trains: every layer, as before."""
        index = {lp.name: i for i, lp in enumerate(self.ctx.layers)}
        first = next((i for i, lp in enumerate(self.ctx.layers) if lp.num_params > lp.num_frozen_params), None)
        held = [index.get(lp.name, 0) for lp, _ in layers]
        flows = [first is not None and (i >= first or min(held, default=0) > 0) for i in held]
        weighted = [k for k, (lp, _) in enumerate(layers) if lp.num_params]
        earliest = next((k for k in weighted if flows[k]), None)
        before = [k for k in weighted if earliest is not None and k < earliest]
        return [f or (bool(before) and k == before[-1]) for k, f in enumerate(flows)]


def tp_local_elems(layer: LayerProfile, split: int) -> int:
    """Trainable elements one tensor-parallel rank of `split` holds: its shard of each split tensor
    and every replicated one whole (norms, a row child's bias: planner/compression.shard_shapes);
    num_params / split where the profile has no parameter names."""
    shapes = shard_shapes(layer, split) if split > 1 else None
    return sum(math.prod(shape) for shape in shapes) if shapes else layer.num_params // split


def comm_bytes_per_step(ctx: Context, cand: Candidate, ranks: list[list[int]]) -> dict[str, int]:
    """Predicted data-parallel bytes on the wire per step, max over the pipeline ranks (each a
    list of layer indices), by mesh axis."""
    data, out = DataParallelCost(ctx, cand), dict[str, int]()
    for layers in ranks:
        held = [(ctx.layers[i], ctx.tp_split(ctx.layers[i], cand.tp)) for i in layers]
        for axis, value in data.bytes_per_step(held).items():
            out[axis] = max(out.get(axis, 0), value)
    return dict(sorted(out.items()))


def comm_bytes_band(ctx: Context, cand: Candidate, ranks: list[list[int]]) -> dict[str, list[int]]:
    """For a compressor whose bytes vary between steps (Accordion): [every step at the
    high-compression setting, every step at the low one] per mesh axis; {} for the others."""
    name, params = cand.method("compression")
    if not compressor(name, params).banded:
        return {}
    low, high = (comm_bytes_per_step(ctx, cand.with_method("compression", name, p), ranks) for p in band_params(params))
    return {axis: [low.get(axis, 0), high.get(axis, 0)] for axis in sorted(set(low) | set(high))}

"""Per-layer, per-recompute-mode cost of one microbatch on one rank, memoised per layer
signature and Candidate.cost_key (microbatch, tp, sp, cp, ZeRO, dp degrees, methods).

Tensor parallel (Narayanan et al. 2021 Sec 3.3; Korthikanti et al. 2022 Sec 4.2.2): a block runs
2 all-reduces of its `bsh` output forward and 2 backward (`8bsh(t-1)/t` bytes per rank), or the
same volume as reduce-scatter + all-gather with sequence parallelism (Megatron-LM adds one
all-gather per column-parallel linear in backward: _tp_comm_s); full recompute repeats the
forward ones. A vocab-parallel embedding all-reduces forward only, the head backward only.
Context parallel (ring attention): K and V circulate, `(c-1)/c` of them forward, twice backward.
Data parallelism's per-layer terms (ZeRO-2/3 gathers, state bytes, compression payload) come
from the candidate's cost object (planner/rank/dp_cost.py); prefetched behind the layer's compute, only the
excess is exposed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass

from meshplan.model_profile import LayerProfile
from meshplan.planner.context import Candidate, Context
from meshplan.planner.cost import elementwise
from meshplan.planner.cost.comm import all_reduce_s, collective_s, group_tier
from meshplan.planner.cost.compute import layer_compute_s, recompute_overheads_s
from meshplan.planner.cost.in_place import in_place_overhead_s
from meshplan.planner.cost.memory import activation_bytes, fp32_logit_bytes, head_keeps_logits, recompute_modes
from meshplan.planner.cost.optimizer import layer_optimizer_s
from meshplan.planner.rank.dp_cost import DataParallelCost


@dataclass(frozen=True)
class ModeCost:
    time_s: float
    """Everything this layer adds to one microbatch's forward+backward on its rank."""
    act_bytes: float
    compute_s: float
    recompute_s: float
    tp_s: float
    dp_s: float
    cp_s: float


@dataclass(frozen=True)
class LayerCost:
    modes: dict[str, ModeCost]
    weights_bytes: float
    grads_bytes: float
    optim_bytes: float
    local_params: float
    """Parameters held per TP rank before ZeRO sharding (for DP traffic and the optimizer)."""
    backward_s: float
    optimizer_s: float = 0.0
    """Once-per-step optimizer work on this rank's share of the layer (pipeline.optimizer_s)."""
    payload_bytes: float = 0.0
    """ZeRO-0/1: bytes the once-per-step gradient all-reduce carries for this layer (compressed)."""
    compress_s: float = 0.0
    """Gradient compression + decompression seconds per step (planner/rank/dp_cost.py)."""


def _tp_comm_s(ctx: Context, layer: LayerProfile, b: int, tp: int, cp: int, sp: bool) -> tuple[float, float]:
    """(forward, backward) seconds of tensor-parallel collectives. With sequence parallelism
    Megatron-LM keeps only the sequence-sharded input of each column-parallel linear for backward
    and all-gathers it again there for the weight gradient (LinearWithGradAccumulationAnd-
    AsyncCommunication; exposed like every TP collective while tp_overlap is 0): one all-gather
    per column-parallel linear, n per block. torch's DTensor sequence parallelism (meshplan's
    executor) saves the gathered input instead and pays no second gather (runtime behaviour
    sp_regather: the engine's, whatever state layout)."""
    if tp <= 1 or layer.tp.kind not in ("block", "embedding", "head"):
        return 0.0, 0.0
    n = layer.tp.num_allreduce_fwd
    buf = (layer.input_bytes if layer.tp.kind == "head" else layer.output_bytes) * b / cp
    tier = group_tier(ctx.cluster, 1, tp)
    one = all_reduce_s(ctx.cluster, tp, buf, tier, sp)
    fwd = 0 if layer.tp.kind == "head" else n
    bwd = 0 if layer.tp.kind == "embedding" else n
    regather = (
        n * collective_s(ctx.cluster, "all_gather", tp, buf, tier)
        if sp and layer.tp.kind == "block" and ctx.spec.sp_regather
        else 0.0
    )
    return fwd * one, bwd * one + regather


def num_microbatches(ctx: Context, b: int, dp: int) -> int:
    """Microbatches per step of a candidate: the global batch over dp replicas of b samples."""
    return max(ctx.request.global_batch // (dp * b), 1)


def _cp_comm_s(
    ctx: Context, layer: LayerProfile, b: int, tp: int, cp: int, fwd_s: float, bwd_s: float
) -> tuple[float, float]:
    """Exposed ring-attention traffic (forward, backward): K and V circulate once forward (again
    for a full recompute's forward) and twice backward (K/V again, their gradients back). Runtime behaviour cp_kv_exchange says how:
    - "ring" (Megatron-Core / Transformer Engine): one block sent to the next rank per step while
      that step computes, so the whole pass's traffic hides behind the attention core (Liu et al.
      2023), at the model's kv_heads (GQA K/V as they are);
    - "all_gather" (torch context_parallel, rotate_method ALL_GATHER by default): every rank's K/V
      gathered at the first step and waited for at the second, so each pass's gather overlaps only
      that first step, 1/c of the core's work (with load balancing every step holds an equal
      share); and the K/V are as wide as SDPA receives them: torchtitan's and the zoo's Llama
      repeat them to every query head first (repeat_kv), heads/kv_heads times the GQA bytes."""
    if cp <= 1 or layer.tp.kind != "block":
        return 0.0, 0.0
    heads = layer.tp.divisors.get("heads") or ctx.profile.heads or 1
    gathered = ctx.spec.cp_kv_exchange == "all_gather"
    kv_share = 1.0 if gathered else layer.tp.divisors.get("kv_heads", heads) / heads
    kv = 2 * layer.input_bytes * kv_share * b / tp  # K and V of the whole sequence, this rank's heads
    one = collective_s(ctx.cluster, "all_gather", cp, kv, group_tier(ctx.cluster, tp, cp))
    gemm = sum(2.0 * g[0] * g[1] * g[2] for g in layer.gemm_shapes)
    attn_share = max(layer.forward_flops - gemm, 0.0) / layer.forward_flops if layer.forward_flops else 0.0
    if not gathered:
        return max(0.0, one - attn_share * fwd_s), max(0.0, 2 * one - attn_share * bwd_s)
    return max(0.0, one - attn_share * fwd_s / cp), max(0.0, 2 * one - attn_share * bwd_s / cp)


RING_MERGE_BYTES = {"eager": ((20.0, 40.5), (84.0, 58.5)), "compiled": ((14.0, 9.5), (44.0, 28.5))}
"""HBM bytes per element of a rank's query block (b x s/c x the rank's heads x head_dim) that
torch's ring attention (torch/distributed/tensor/experimental/_attention.py, _cp_options
convert_to_f32 = True, enable_load_balance = True) moves outside the SDPA kernels, per elementwise
level: ((forward once per call, per ring step after the first), (backward once, per later step)).
On average over ranks half the later steps run the whole query block against half the K/V and
half run half the queries against all of it (_is_causal_behavior, the round-robin load balance),
so a later step's output averages 3/4 of the block.
- "eager": forward (_templated_ring_attention, _SDPAMerger): K and V made contiguous (8: read +
  write, bf16, both), each step's output upcast to fp32 (6 per element it covers: read 2, write
  4), the merge out - sigmoid(lse_b - lse) * (out - out_b) in fp32 (32: three binary kernels at
  12, 8, 12), a partial step's fp32 output rebuilt whole by torch.cat (_partial_update: 8, every
  second step), K/V concatenated again before every step but the last (8), the result cast back
  (6): 8 + 6 + 6 once, 8 + 0.75 x (6 + 32) + 0.5 x 8 per later step. Backward
  (_templated_ring_attention_backward): three fp32 zero accumulators (12), K and V made
  contiguous (8), step 0's dK, dV and dQ added in fp32 (10 each: read 4 + 2, write 4), dK, dV
  concatenated in fp32 to send on (16), dQ cast back (6), the received dK, dV cast back (12): 84
  once; per later step dK, dV accumulated (20, or a half-size add plus a whole-tensor torch.cat:
  26; 23 on average), dQ (10 or 13: 11.5), the fp32 dK, dV concatenated to send (16), K/V
  concatenated again (8): 58.5.
- "compiled" (inductor traces the ring into the block's graph: one fused kernel per merge, the
  concatenations whose result only the first all-gather reads eliminated as dead code): forward
  K/V made contiguous into the gather buffer (8) and the last merge writing bf16 (6) once, per
  later step a merge reading the fp32 running output and the step's bf16 one and writing fp32
  (10, on 3/4 of the block) plus a partial step's copy of the untouched half (8 on half the
  block, every second step): 14, 9.5. Backward: K/V into the gather buffer (8), step 0's bf16
  gradients written as fp32 accumulators (6 each, 18), dQ and the received dK, dV cast back (6 +
  12): 44 once; per later step dK, dV read as received (8) with the step's bf16 ones (4, or 2)
  and written fp32 to send (8): 19 on average, dQ 10 or 9: 28.5.
"fused" runtimes price as "compiled". Megatron-Core's ring (Transformer Engine, cp_kv_exchange
"ring") merges inside its attention kernels and is not charged."""


def _ring_merge_s(ctx: Context, layer: LayerProfile, b: int, split: int, cp: int) -> tuple[float, float]:
    """(forward, backward) seconds of torch ring attention's merges and copies (RING_MERGE_BYTES)
    on one rank, one microbatch, at the HBM bandwidth; only where the runtime's context parallel is
    torch's (cp_kv_exchange "all_gather", its default rotate method) and the layer is a block."""
    if cp <= 1 or layer.tp.kind != "block" or ctx.spec.cp_kv_exchange != "all_gather":
        return 0.0, 0.0
    elems = layer.input_bytes / (ctx.profile.activation_dtype_bytes or 2) * b / (cp * split)
    hbm = ctx.cluster.device.hbm_gbps * 1e9
    (f_once, f_step), (b_once, b_step) = RING_MERGE_BYTES["eager" if ctx.spec.elementwise == "eager" else "compiled"]
    return (f_once + f_step * (cp - 1)) * elems / hbm, (b_once + b_step * (cp - 1)) * elems / hbm


FWD_PASSES, BWD_PASSES = 2, 3
"""Memory-bound (non-GEMM) kernels move each byte a layer saves for backward about twice in
forward (written, then read by the next kernel) and three times in backward (the saved tensor
read, its gradient written and read): norms, dropout, softmax, activation functions, residuals.
Roofline time = bytes moved / HBM bandwidth (Williams et al. 2009). Not used for measured timings."""


def _memory_bound_s(
    ctx: Context, layer: LayerProfile, b: int, split: int, cp: int, sp: bool
) -> tuple[float, float, float]:
    """(forward, backward, selective-recompute) seconds of a layer's memory-bound kernels; the
    head's fp32 logits at the loss's own pass counts (RuntimeSpec.loss_passes); the extra passes of unfused
    kernels under the runtime's `elementwise` level (planner/cost/elementwise.py)."""
    if ctx.measured and layer.timings:
        return 0.0, 0.0, 0.0
    hbm = ctx.cluster.device.hbm_gbps * 1e9
    saved = activation_bytes(ctx, layer, "none", b, split, cp, sp)
    core = (
        saved - activation_bytes(ctx, layer, "selective", b, split, cp, sp)
        if layer.selective_activation_bytes > 0
        else 0.0
    )
    logits, kept = 0.0, 0.0  # the loss's fp32 logits; the part of them the head's saved bytes hold
    if layer.tp.kind == "head":
        per_sample = fp32_logit_bytes(ctx, layer)
        logits = per_sample * b / cp / split
        kept = min(logits, saved) if head_keeps_logits(layer, per_sample) else 0.0
    loss_fwd, loss_bwd = ctx.spec.loss_passes
    op_sac = ctx.spec.op_level_selective
    un_fwd, un_bwd, un_sel = elementwise.extra_s(
        layer, ctx.spec.elementwise, b * ctx.seq / cp, split, sp, hbm, op_sac, ctx.spec.fp8
    )
    return (
        (FWD_PASSES * (saved - kept) + loss_fwd * logits) / hbm + un_fwd,
        (BWD_PASSES * (saved - kept) + loss_bwd * logits) / hbm + un_bwd,
        FWD_PASSES * max(core, 0.0) / hbm + un_sel,
    )


def wrapper_overheads_s(
    ctx: Context, layer: LayerProfile, split: int, zero: int, dp: int
) -> tuple[float, float, float]:
    """(TP, FSDP2, optimizer) seconds the executor's parallel wrappers add to this layer, from the
    profile's measurements (LayerProfile.framework_overhead_s, on a one-rank mesh; the optimizer's
    in place where measured; measured profiles only): DTensor dispatch per microbatch when tensor
    parallelism splits the layer, FSDP2 hooks and copies per microbatch with ZeRO-2/3, and the
    optimizer over DTensor parameters once per step (the larger of the two: one optimizer runs
    over the parameters)."""
    fw = layer.framework_overhead_s if ctx.measured else {}
    if not fw:
        return 0.0, 0.0, 0.0
    tp_on, fsdp_on = split > 1, zero >= 2 and dp > 1
    opt = max(
        _step_overhead_s(fw, "tp_optimizer", split) if tp_on else 0.0,
        _step_overhead_s(fw, "fsdp_optimizer", dp) if fsdp_on else 0.0,
    )
    return fw.get("tp", 0.0) if tp_on else 0.0, fw.get("fsdp", 0.0) if fsdp_on else 0.0, opt


def _step_overhead_s(fw: dict[str, float], name: str, degree: int) -> float:
    """A wrapper's optimizer-step overhead: measured in place at this degree ("tp_optimizer@2",
    profiler/insitu.py) where the profile has it, else on the one-rank mesh ("tp_optimizer")."""
    return fw.get(f"{name}@{degree}", fw.get(name, 0.0))


def _in_place_tp(
    ctx: Context, layer: LayerProfile, b: int, split: int, sp: bool, cp: int, tp_fwd_s: float
) -> dict[str, float] | None:
    """Tensor-parallel seconds per recompute mode from the in-place measurement: the measured
    overhead (dispatch + collectives + waiting on the partner ranks); full recompute runs the
    forward again, selective the forward's non-collective part (collective outputs are saved)."""
    fw = layer.framework_overhead_s if ctx.measured else {}
    if split <= 1 or cp > 1 or not fw:
        return None
    key = f"{'tp_sp' if sp else 'tp'}@{split}"
    total = in_place_overhead_s(fw, key, b)
    fwd = in_place_overhead_s(fw, key, b, forward_only=True)
    if total is None or fwd is None:
        return None
    return {"none": total, "full": total + fwd, "selective": total + max(0.0, fwd - tp_fwd_s)}


def allowed_modes(ctx: Context, layer: LayerProfile) -> tuple[str, ...]:
    """The layer's recompute choices, or the pinned one (--recompute) where it applies; full or none with
    recompute_blocks (how many of each stage's blocks take full is the partition's, UniformSplit)."""
    modes = recompute_modes(layer)
    pin = ctx.request.recompute
    if pin is None:
        return modes
    if ctx.request.recompute_blocks is not None:
        return tuple(m for m in modes if m in ("none", "full")) or ("none",)
    return (pin,) if pin in modes else ("none",)


FULL_OR_NONE = "full_or_none"
"""The policy of a runtime with one recompute granularity (recompute_assignments "granularity"): full
recompute on some blocks, none on the rest (Megatron's --recompute-granularity full, --recompute-method
block / uniform)."""


def recompute_policies(ctx: Context, pp: int) -> tuple[str | None, ...]:
    """The recompute assignments the search chooses among for a candidate of `pp` pipeline ranks: (None,) is
    each layer its own mode (allowed_modes); under a runtime that runs one mode on every block
    (RuntimeSpec.recompute_assignments "uniform", torchtitan; "interval" with pp > 1, DeepSpeed's
    PipelineModule), each mode a block allows, in RECOMPUTE_ORDER: that mode on every block, none elsewhere;
    under one granularity ("granularity", Megatron: --recompute-granularity selective applies to every block,
    full to the blocks --recompute-method picks), none, selective on every block, or full on any of them."""
    assignments = ctx.spec.recompute_assignments
    if ctx.request.recompute_blocks is not None:  # pinned: full on k blocks of each stage (UniformSplit)
        return (None,)
    if assignments == "interval":
        assignments = "uniform" if pp > 1 else "per_layer"
    if assignments not in ("uniform", "granularity"):
        return (None,)
    modes = {m for layer in ctx.layers if layer.tp.kind == "block" for m in allowed_modes(ctx, layer)}
    uniform = tuple(m for m in ("none", "selective", "full") if m in modes) or ("none",)
    if assignments == "uniform" or "full" not in modes:
        return uniform
    return tuple(m for m in uniform if m != "full") + (FULL_OR_NONE,)


def policy_modes(policy: str | None, modes: Iterable[str]) -> list[str]:
    """The modes of `modes` a block may take under `policy` (None: all; FULL_OR_NONE: full or none)."""
    allowed = set(modes) if policy is None else {"full", "none"} if policy == FULL_OR_NONE else {policy}
    return [m for m in modes if m in allowed]


def restrict(ctx: Context, costs: list[LayerCost], policy: str | None) -> list[LayerCost]:
    """`costs` with only the modes `policy` assigns each layer (recompute_policies; None: all of them)."""
    if policy is None:
        return costs
    out = []
    for layer, cost in zip(ctx.layers, costs):
        kept = policy_modes(policy, cost.modes) if layer.tp.kind == "block" else []
        kept = kept or (["none"] if "none" in cost.modes else [next(iter(cost.modes))])  # a pinned layer keeps its pin
        out.append(dataclasses.replace(cost, modes={m: cost.modes[m] for m in kept}))
    return out


def pinned_block_modes(ctx: Context, stages: list[list[int]], costs: list[LayerCost]) -> dict[int, str]:
    """recompute_blocks k (Megatron's --recompute-method block): full recompute on the first k blocks of each
    stage (model chunk), none on the rest, by layer index; {} without it."""
    k = ctx.request.recompute_blocks
    if k is None:
        return {}
    out = {}
    for stage in stages:
        blocks = [i for i in stage if ctx.layers[i].tp.kind == "block" and {"full", "none"} <= set(costs[i].modes)]
        out.update({i: "full" if j < k else "none" for j, i in enumerate(blocks)})
    return out


def pin_modes(costs: list[LayerCost], modes: dict[int, str]) -> list[LayerCost]:
    """`costs` with the layers of `modes` reduced to that one mode."""
    return [
        dataclasses.replace(cost, modes={modes[i]: cost.modes[modes[i]]}) if i in modes else cost
        for i, cost in enumerate(costs)
    ]


@dataclass(frozen=True)
class BaseCost:
    """The part of a layer's cost that data parallelism does not change, per recompute mode:
    (forward+backward compute, recompute, tensor-parallel seconds, saved bytes)."""

    modes: dict[str, tuple[float, float, float, float]]
    cp_s: dict[str, float]
    """Exposed context-parallel seconds per recompute mode (a full recompute gathers K/V again)."""
    backward_s: float
    split: int


def base_cost(ctx: Context, layer: LayerProfile, b: int, tp: int, sp: bool, cp: int) -> BaseCost:
    split = ctx.tp_split(layer, tp)
    fwd, bwd, sel = layer_compute_s(ctx, layer, b, split, cp)
    tp_fwd, tp_bwd = _tp_comm_s(ctx, layer, b, tp, cp, sp)
    tp_hidden = ctx.cluster.calibration.tp_overlap if ctx.spec.overlap_tp_comm else 0.0
    cp_fwd, cp_bwd = _cp_comm_s(ctx, layer, b, tp, cp, fwd, bwd)
    merge_fwd, merge_bwd = _ring_merge_s(ctx, layer, b, split, cp)
    cp_fwd, cp_bwd = cp_fwd + merge_fwd, cp_bwd + merge_bwd
    mem_fwd, mem_bwd, mem_sel = _memory_bound_s(ctx, layer, b, split, cp, sp)
    fwd, bwd, sel = fwd + mem_fwd, bwd + mem_bwd, sel + mem_sel
    full_machinery, sel_machinery = recompute_overheads_s(ctx, layer, b)
    tp_wrap = wrapper_overheads_s(ctx, layer, split, 0, 1)[0]
    tp_in_place = _in_place_tp(ctx, layer, b, split, sp, cp, tp_fwd)
    modes = {}
    runs = {"none": 1.0, "selective": 1.0 + _selective_tp_rerun(ctx, sp), "full": 2.0}  # forward TP collectives
    for mode in allowed_modes(ctx, layer):
        extra = fwd + full_machinery if mode == "full" else sel + sel_machinery if mode == "selective" else 0.0
        tp_s = (
            tp_in_place[mode]
            if tp_in_place is not None
            else ((1 - tp_hidden) * (tp_fwd * runs[mode] + tp_bwd) + tp_wrap)
        )
        modes[mode] = (fwd + bwd, extra, tp_s, activation_bytes(ctx, layer, mode, b, split, cp, sp))
    cp_s = {mode: cp_fwd * (2 if mode == "full" else 1) + cp_bwd for mode in modes}
    return BaseCost(modes=modes, cp_s=cp_s, backward_s=bwd, split=split)


def _selective_tp_rerun(ctx: Context, sp: bool) -> float:
    """Share of a block's forward tensor-parallel collectives that --recompute selective runs again.
    torchtitan's op-level policy (planner/sac.py) keeps the outputs of reduce_scatter_tensor and
    recomputes every other op of the block, collectives included: under sequence parallelism its two
    all-gathers (half the forward volume: each all-gather moves what its reduce-scatter does),
    without it the all-reduces. The attention-core policy (Megatron) recomputes no collective."""
    if not ctx.spec.op_level_selective:
        return 0.0
    return 0.5 if sp else 1.0


def layer_cost(
    ctx: Context,
    layer: LayerProfile,
    cand: Candidate,
    dp_cost: DataParallelCost | None = None,
    base: BaseCost | None = None,
) -> LayerCost:
    """Time and saved bytes of one microbatch of `layer` per recompute mode, and its state bytes."""
    b = cand.microbatch
    base = base or base_cost(ctx, layer, b, cand.tp, cand.sequence_parallel, cand.cp)
    split = base.split
    local = (layer.num_params - layer.num_frozen_params) / split  # frozen: no sync, no optimizer step
    dp_hidden = ctx.cluster.calibration.dp_overlap if ctx.spec.overlap_dp_comm else 0.0
    data = (dp_cost or DataParallelCost(ctx, cand)).layer(layer, split, b, num_microbatches(ctx, b, cand.dp))
    _, fsdp_wrap, opt_wrap = wrapper_overheads_s(
        ctx, layer, split, cand.zero, data.optimizer_shard if cand.zero >= 2 else cand.dp
    )
    if data.measured:
        fsdp_wrap = 0.0
    modes = {}
    for mode, (compute, extra, tp_s, act) in base.modes.items():
        regather = data.recompute_gather_s if mode == "full" else 0.0  # DeepSpeed gathers for the recompute too
        exposed = data.exposed_s + (data.recompute_gather_exposed_s if mode == "full" else 0.0)
        hideable = data.comm_s + regather - exposed  # gathers beyond the runtime's prefetch wait in line
        dp_s = exposed + max(0.0, hideable - dp_hidden * (compute + extra)) + fsdp_wrap
        modes[mode] = ModeCost(
            time_s=compute + extra + tp_s + dp_s + base.cp_s[mode],
            act_bytes=act,
            compute_s=compute,
            recompute_s=extra,
            tp_s=tp_s,
            dp_s=dp_s,
            cp_s=base.cp_s[mode],
        )
    return LayerCost(
        modes=modes,
        weights_bytes=data.weights_bytes,
        grads_bytes=data.grads_bytes,
        optim_bytes=data.optim_bytes,
        local_params=local,
        backward_s=base.backward_s,
        optimizer_s=(0.0 if data.host_step else layer_optimizer_s(ctx, layer, local, data.optimizer_shard, split))
        + opt_wrap,
        payload_bytes=data.payload_bytes,
        compress_s=data.compress_s,
    )


class CostTable:
    """Memoised LayerCosts: one entry per (layer signature, Candidate.cost_key)."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self._cache: dict[tuple, LayerCost] = {}
        self._dp: dict[tuple, DataParallelCost] = {}
        self._base: dict[tuple, BaseCost] = {}

    def data_parallel(self, cand: Candidate) -> DataParallelCost:
        """The candidate's data-parallel cost object, shared by candidates with equal cost keys."""
        hit = self._dp.get(cand.cost_key)
        if hit is None:
            hit = self._dp[cand.cost_key] = DataParallelCost(self.ctx, cand)
        return hit

    def get(self, index: int, cand: Candidate) -> LayerCost:
        key = (self.ctx.signatures[index],) + cand.cost_key
        hit = self._cache.get(key)
        if hit is None:
            base_key = (self.ctx.signatures[index], cand.microbatch, cand.tp, cand.sequence_parallel, cand.cp)
            base = self._base.get(base_key)
            if base is None:
                base = self._base[base_key] = base_cost(self.ctx, self.ctx.layers[index], *base_key[1:])
            hit = layer_cost(self.ctx, self.ctx.layers[index], cand, self.data_parallel(cand), base)
            self._cache[key] = hit
        return hit

    def for_candidate(self, cand: Candidate) -> list[LayerCost]:
        return [self.get(i, cand) for i in range(len(self.ctx.layers))]

"""PlanRequest: what the user asks the planner (the `plan` / `estimate` flags).

A field left as None is searched; a set field pins that choice (users often fix one axis).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ATTENTION = ("flash", "materialized")


@dataclass(kw_only=True)
class PlanRequest:
    num_gpus: int
    global_batch: int
    seq: int | None = None
    """Sequence length; None keeps the profile's."""
    top_k: int = 5
    tp: int | None = None
    pp: int | None = None
    dp: int | None = None
    cp: int | None = None
    microbatch: int | None = None
    schedule: str | None = None
    """torch.distributed.pipelining name ("GPipe", "1F1B", "Interleaved1F1B"); None searches."""
    virtual_stages: int | None = None
    stage_layers: tuple[int, ...] | None = None
    """Layers per pipeline stage in model order, pp x v of them (the embedding and the head count as
    one each): the boundaries an estimate prices (a config file's own, e.g. torchtitan's
    module_fqns_per_model_part); None: a balanced split (estimate) or searched (plan)."""
    recompute: str | None = None
    """"none" | "selective" | "full" applied to every block; None searches per layer."""
    recompute_num_layers: int = 1
    """Megatron's `--recompute-method uniform --recompute-num-layers N` with recompute "full": the
    blocks of a stage checkpointed in groups of N consecutive layers (planner/search/recompute.py)."""
    recompute_blocks: int | None = None
    """With recompute "full": full recompute on the first k blocks of each pipeline stage (model chunk) and
    none on the rest, Megatron's `--recompute-method block --recompute-num-layers k`; None: every block."""
    zero: int | None = None
    dp_shard: int | None = None
    """FSDP2 shard degree (ZeRO-2/3); with dp, dp_replicate = dp / dp_shard (HSDP when both > 1)."""
    methods: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    """Pinned data-parallel methods: axis -> (registry name, resolved parameters) (--compression,
    --sync, --comm-schedule, --offload, --waves). An unpinned axis searches its exact methods."""
    allow: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """Approximate methods the user lets the search price, per axis (--allow-compression,
    --allow-sync); never chosen otherwise."""
    sequence_parallel: bool | None = None
    allow_cross_node_tp: bool = False
    precision: str = "bf16"
    state_layout: str = "torch"
    """How training state is kept per parameter (unsharded bytes): "torch" = fp32 master weights +
    fp32 grads + Adam m, v (4 + 4 + 8 = 16 B; AMP / FSDP2 mixed precision); "megatron" = bf16
    weights + fp32 main grads + fp32 master copy + Adam (2 + 4 + 12 = 18 B, Megatron-LM); "zero" =
    16-bit weights and grads + fp32 master + Adam (2 + 2 + 12 = 16 B, Rajbhandari et al. 2020 Sec 3.1,
    DeepSpeed)."""
    overlap_dp_comm: bool = True
    """Overlap the gradient all-reduce with backward (PyTorch DDP/FSDP do; Megatron-LM before
    Megatron-Core did not: Korthikanti et al. 2022 Sec 6.3)."""
    overlap_tp_comm: bool = False
    """Overlap tensor-parallel collectives with GEMMs (Megatron-Core --tp-comm-overlap, async TP);
    hides cluster.calibration.tp_overlap of the TP time when on."""
    uniform_stages: bool = False
    """Split the blocks evenly over the pp x v stages instead of searching the boundaries (the
    embedding on the first stage, the head on the last), as Megatron-LM does (it requires the
    layer count to divide evenly); per-layer recompute is still solved."""
    recompute_assignments: str = "per_layer"
    """"per_layer": each layer's recompute mode is searched on its own (meshplan's executor runs any);
    "uniform": one mode on every transformer block and none elsewhere, the search's best over the modes
    (torchtitan's activation checkpointing). A --recompute pin is one such mode either way."""
    runtime: str = "meshplan"
    """The software that will execute the plan (meshplan/runtimes.py); the CLI fills the
    behaviour fields above and below from it unless a behaviour's own flag is given."""
    attention: str | None = None
    """"flash" | "materialized": re-target the blocks' attention core (planner/attention.py);
    None keeps the profile's."""
    zero_stages: tuple[int, ...] | None = None
    """ZeRO stages the runtime implements (the search tries only these); None: 0-3."""
    pipeline_zero_stages: tuple[int, ...] | None = None
    """ZeRO stages the runtime runs beside pipeline parallelism (DeepSpeed's pipeline engine: 0 and 1);
    None: zero_stages."""
    pipeline_schedules: tuple[str, ...] | None = None
    """Pipeline schedules the runtime runs (torch.distributed.pipelining names; Megatron: 1F1B and
    Interleaved1F1B, DeepSpeed: 1F1B); None: every schedule meshplan knows."""
    sequence_parallel_modes: tuple[bool, ...] | None = None
    """Sequence parallelism beside tensor parallelism the runtime runs (DeepSpeed's AutoTP: off only); None:
    off and on."""
    ddp_beside_model_parallel: bool = True
    """ZeRO-0 replicas (DDP) run beside tensor, pipeline or context parallelism; False (torchtitan,
    whose apply_ddp takes a 1-D mesh only): the search tries ZeRO-0 only where tp = pp = cp = 1,
    unless --zero 0 is pinned."""
    hybrid_shard: bool = True
    """ZeRO-2/3 may shard over part of the data-parallel ranks and replicate over the rest (HSDP);
    False (DeepSpeed, whose ZeRO partitions over its whole data-parallel group): the search tries
    only dp_shard = dp, unless --dp-shard is pinned."""
    model_parallel: tuple[str, ...] = ("tp", "pp", "cp")
    """Model-parallel axes the runtime runs beside data parallelism; the search offers no other."""
    also_runs: tuple[str, ...] = ()
    """meshplan/feasibility.py LIMITS the runtime has though meshplan's executor does not (context
    parallelism, 1F1B at any microbatch count): the search offers such layouts for it."""
    offload_methods: tuple[str, ...] | None = None
    """Offload methods the runtime implements: the search's fallback when nothing fits tries only
    these (planner/search/offload_search.py); None: every registry method."""
    fsdp_gather_bytes: int | None = None
    """Bytes per element of FSDP/ZeRO-3 parameter gathers; None: 2 under bf16, else 4."""
    fsdp_reduce_bytes: int | None = None
    """Bytes per element of the ZeRO-2/3 gradient reduce-scatter (FSDP reduce_dtype); None: the
    state layout's (fp32 under the torch layout), else the gather width."""
    fsdp_unit_buffers: str | None = None
    """What a ZeRO-3 unit holds at its backward peak (runtimes.py fsdp_unit_buffers): "fsdp2",
    "backward_pre", "backward_post"; None: fsdp2."""
    sp_regather: bool = False
    """Sequence parallelism all-gathers each column-parallel linear's input again in backward for the
    weight gradient (Megatron's LinearWithGradAccumulationAndAsyncCommunication, Korthikanti et al.
    2022 Sec 4.2.2; planner/rank/layer_cost.py); False: the gathered input is kept (DTensor SP)."""
    pp_scatter_gather: bool = False
    """Without sequence parallelism a pipeline boundary goes as 1/t from each tensor-parallel rank and
    is all-gathered on the receiving node (Megatron-LM's scatter/gather, Narayanan et al. 2021 Sec
    4.1; planner/cost/pipeline.py); False: every tensor-parallel rank sends the whole replica (torch
    pipelining)."""
    free_stage_outputs: bool = False
    """A pipeline stage frees each microbatch's output once sent (Megatron-Core's
    deallocate_output_tensor); False: it holds the output until that microbatch's backward, as
    torch.distributed.pipelining (fwd_cache) and DeepSpeed's pipeline engine do (planner/rank/stages.py
    counts it per in-flight microbatch)."""
    fused_projections: bool = True
    """The runtime's model runs Megatron's fused projections (one QKV GEMM, one gate+up GEMM: the
    closed-form blocks' shapes and the calibration's); False: one GEMM per projection (torchtitan's
    and meshplan's zoo Llama: wq, wk, wv, w1, w3), read at their smaller sizes on the GEMM curve."""
    zero3_prefetch_elems: int = 0
    """ZeRO-3 parameter elements the runtime fetches ahead of use (DeepSpeed's
    stage3_prefetch_bucket_size); 0: a whole layer ahead, as FSDP2 prefetches the next layer. A
    layer's share beyond it waits on the critical path (planner/rank/dp_cost.py)."""
    cp_kv_exchange: str = "ring"
    """How context parallelism moves K and V (planner/rank/layer_cost.py _cp_comm_s): "ring", one
    block per step, sent while the step computes, at the model's kv_heads (Megatron-Core, TE); or
    "all_gather", every rank's K and V gathered at the first step and waited for at the second,
    at all heads' width (torch context_parallel with a model that repeats K/V before SDPA)."""
    zero3_gather: str = "layer"
    """ZeRO-3 all-gather granularity (planner/rank/dp_cost.py): "layer", one per wrapped layer,
    reused by its recompute (FSDP2); "module", one per submodule holding parameters (the layer's TP
    rule children), again for a full recompute's forward (DeepSpeed's parameter coordinator)."""
    zero0_reduce_after_backward: bool = False
    """Without ZeRO the gradient all-reduce runs once backward is over, none of it hidden, whatever
    overlap_dp_comm says (DeepSpeed's stage 0, engine.py buffered_allreduce_fallback); False: DDP's
    buckets reduce during backward."""
    pipeline_reduce_after_backward: bool = False
    """Under pipeline parallelism the ZeRO-0/1 all-reduce runs after the schedule's last backward,
    none of it hidden (DeepSpeed's pipeline engine, _exec_reduce_grads); False: during the last
    microbatch's backward (torch pipelining with DDP, Megatron)."""
    reduce_bucket_elems: int = 0
    """Gradient elements ZeRO-1's optimizer reduces at a time during backward (DeepSpeed's
    reduce_bucket_size): what has not filled a bucket when backward ends is exposed
    (planner/rank/dp_cost.py _last_bucket); 0: DDP's bucket cap (rank/tail.py)."""
    zero1_grad_collective: str = "all_reduce"
    """ZeRO-1's gradient exchange over the replicas (planner/rank/dp_cost.py _replica_grad_collective):
    "all_reduce" (torch ZeroRedundancyOptimizer behind DDP's buckets; DeepSpeed's ZeRO-1 under
    use_multi_rank_bucket_allreduce) or "reduce_scatter" (Megatron's distributed optimizer, which
    all-gathers the updated weights after the step)."""
    zero1_gather_overlaps: bool = False
    """ZeRO-1's updated weights go back to the replicas under the next forward (Megatron-Core's
    --overlap-param-gather); False: synchronously after the step (ZeroRedundancyOptimizer, DeepSpeed)."""
    zero2_shards_weights: bool = True
    """ZeRO-2 shards the weights and gathers them per microbatch (FSDP2, reshard_after_forward
    false); False: DeepSpeed's ZeRO-2 keeps the whole 16-bit weights and all-gathers the updated
    partitions once after the step."""
    fsdp_full_grad_accumulation: bool = True
    """ZeRO-2/3 gradients may accumulate unsharded in fp32 until the last microbatch, then one
    reduce-scatter (FSDP2's set_requires_gradient_sync(False), where fsdp_reduce_every_microbatch is
    off, and under torch pipelining); False: the engine reduce-scatters every microbatch (Megatron,
    DeepSpeed)."""
    ddp_bucket_copy: bool = True
    """ZeRO-0/1 replicas keep a second fp32 copy of the gradients in torch DDP's buckets
    (Reducer::initialize_buckets); False: the engine's buffer is the gradients (Megatron's grad
    buffer, DeepSpeed's own buckets)."""
    replica_sync_after_backward: bool = True
    """ZeRO-0/1 replicas torch DDP cannot wrap (TP DTensors, a split-backward schedule's stages)
    all-reduce after backward, none of it hidden (meshplan's executor); False: during backward
    (Megatron's grad buffer, DeepSpeed's hooks)."""
    zero2_grad_collective: str = "reduce_scatter"
    """ZeRO-2's gradient collective over the shard group: "reduce_scatter" (FSDP2) or "all_reduce"
    (DeepSpeed's whole-bucket all-reduce under use_multi_rank_bucket_allreduce); ZeRO-3 reduce-scatters."""
    fsdp_reduce_every_microbatch: bool | str | None = False
    """ZeRO-2/3 reduce-scatter each microbatch's gradients (torchtitan without PP, DeepSpeed); False:
    unsharded fp32 gradients accumulate until the last microbatch (torch pipelining under any
    runtime); "planned" (runtimes.PLANNED, meshplan's executor): the search picks per candidate
    (Candidate.reduce_every_microbatch); None: not applicable (no ZeRO-2/3)."""
    loss: str = "cross_entropy"
    """The loss kernel (runtimes.LOSSES): "cross_entropy" as the state layout runs it, "fused" a fused
    cross-entropy over the bf16 logits (no fp32 copy; runtimes.FUSED_LOSS_PASSES, FUSED_LOSS_HELD)."""
    elementwise: str = "fused"
    """How the runtime runs a block's memory-bound ops (planner/cost/elementwise.py): "fused" kernels (the
    calibration's: Megatron, Transformer Engine), "compiled" (torch.compile) or "eager" torch ops,
    which move more bytes. Closed-form profiles only; measured timings include them."""
    selective_recompute: str = "attention core"
    """What recompute "selective" keeps (planner/sac.py): "attention core" (Korthikanti et al. 2022
    Sec 5, Megatron) or "op" (torchtitan's op-level policy: every other matmul output and SDPA's)."""

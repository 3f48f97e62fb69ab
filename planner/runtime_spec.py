"""The runtime spec: every behaviour of the software that will run the plan, resolved once from
the request (its --runtime row and behaviour flags, meshplan/runtimes.py) into typed fields the
cost layers read. Nothing below the request reads a behaviour by name or compares a layout string."""

from __future__ import annotations

from dataclasses import dataclass

from meshplan.errors import MeshplanError
from meshplan.runtimes import FUSED_LOSS_HELD, FUSED_LOSS_PASSES, STATE_LAYOUTS, StateLayout


@dataclass(frozen=True, kw_only=True)
class RuntimeSpec:
    runtime: str
    """The runtime's name (meshplan/runtimes.py NAMES)."""
    precision: str
    state: StateLayout
    """Training-state bytes, the loss's passes and transients, ZeRO-1's weight bytes, the reduction
    widths the layout keeps (runtimes.STATE_LAYOUTS)."""
    overlap_dp_comm: bool
    overlap_tp_comm: bool
    uniform_stages: bool
    fsdp_gather_bytes: int
    """Bytes per element of the ZeRO-2/3 parameter gathers: the runtime's, else 2 under bf16 / fp8
    and 4 under fp32."""
    fsdp_reduce_bytes: int
    """Bytes per element of the ZeRO-2/3 gradient reduce-scatter and HSDP's replica all-reduce: the
    runtime's, else the state layout's (StateLayout.fsdp_reduce_bytes), else the gather width."""
    fsdp_unit_buffers: str
    """"fsdp2", "backward_pre" or "backward_post" (planner/cost/memory.fsdp_unit_buffer_bytes)."""
    selective_recompute: str
    recompute_assignments: str
    """"per_layer" or "uniform" (one mode on every block): which recompute assignments the search may pick."""
    loss: str
    """"cross_entropy" (the state layout's loss_passes and loss_transients) or "fused" (bf16 logits)."""
    elementwise: str
    fused_projections: bool
    free_stage_outputs: bool
    sp_regather: bool
    """Sequence parallelism all-gathers the linear inputs again in backward (Megatron); else keeps them."""
    pp_scatter_gather: bool
    """Without SP a pipeline boundary is sent as 1/t per TP rank and gathered on receipt (Megatron-LM)."""
    zero3_prefetch_elems: int
    """ZeRO-3 parameter elements fetched ahead of use (0: the next layer whole, FSDP2)."""
    zero3_gather: str
    """"layer" (FSDP2) or "module" (DeepSpeed): ZeRO-3 all-gathers per layer and per recompute."""
    zero0_reduce_after_backward: bool
    """ZeRO-0's all-reduce waits for backward's end, unhidden (DeepSpeed's stage 0)."""
    pipeline_reduce_after_backward: bool
    """With pp > 1 the ZeRO-0/1 all-reduce waits for the schedule's last backward (DeepSpeed's pipe engine)."""
    reduce_bucket_elems: int
    """ZeRO-1's reduce bucket in gradient elements (0: DDP's bucket cap)."""
    zero1_grad_collective: str
    """"all_reduce" or "reduce_scatter": ZeRO-1's gradient exchange over the replicas."""
    zero1_gather_overlaps: bool
    """ZeRO-1's weights go back under the next forward (else exposed after the step)."""
    zero2_shards_weights: bool
    """ZeRO-2's weights sharded (FSDP2) or whole (DeepSpeed)."""
    fsdp_full_grad_accumulation: bool
    """ZeRO-2/3 gradients may accumulate unsharded until the last microbatch (FSDP2)."""
    ddp_bucket_copy: bool
    """ZeRO-0/1 replicas hold DDP's second fp32 copy of the gradients."""
    replica_sync_after_backward: bool
    """Replicas DDP cannot wrap (TP, split backward) all-reduce after backward, unhidden."""
    zero2_grad_collective: str
    """"reduce_scatter" or "all_reduce": ZeRO-2's gradient collective over the shard group."""
    fsdp_reduce_every_microbatch: bool | str | None
    """ZeRO-2/3 reduce-scatter every microbatch (else once, after unsharded accumulation);
    "planned": chosen per candidate (Candidate.reduce_every_microbatch)."""
    cp_kv_exchange: str
    """"ring" (p2p per step at kv_heads) or "all_gather" (torch context_parallel, all heads)."""
    zero_stages: tuple[int, ...] | None
    pipeline_zero_stages: tuple[int, ...] | None
    """ZeRO stages beside pipeline parallelism; None: zero_stages."""
    pipeline_schedules: tuple[str, ...] | None
    """Pipeline schedules the runtime runs; None: all."""
    sequence_parallel_modes: tuple[bool, ...] | None
    """Sequence parallelism with TP the runtime runs (off, on); None: both."""
    ddp_beside_model_parallel: bool
    hybrid_shard: bool
    """ZeRO-2/3 over dp_replicate x dp_shard (HSDP); else only over every data-parallel rank."""
    offload_methods: tuple[str, ...] | None
    model_parallel: tuple[str, ...]
    """Model-parallel axes the runtime runs ("tp", "pp", "cp"); the search offers no other."""
    also_runs: tuple[str, ...]

    @property
    def op_level_selective(self) -> bool:
        """--recompute selective is torchtitan's op-level policy (every other matmul output kept)."""
        return self.selective_recompute == "op"

    @property
    def loss_passes(self) -> tuple[float, float]:
        """(forward, backward) fp32-logit-sized HBM passes of the loss."""
        return FUSED_LOSS_PASSES if self.loss == "fused" else self.state.loss_passes

    def loss_held(self, head_keeps_logits: bool) -> float:
        """fp32-logit-sized tensors the loss holds at its peak beyond the head's saved bytes: the
        state layout's transients, plus the saved fp32 copy a captured head does not count; a fused
        loss only its bf16 gradient where the head does not already count fp32 logits."""
        if self.loss == "fused":
            return 0.0 if head_keeps_logits else FUSED_LOSS_HELD
        return self.state.loss_transients + (0 if head_keeps_logits else 1)

    @property
    def replica_reduce_bytes(self) -> int:
        """Bytes per element of the uncompressed ZeRO-0/1 gradient all-reduce: the state layout's
        (StateLayout.replica_reduce_bytes: fp32 under DDP and Megatron's main grads, the 16-bit model
        dtype under DeepSpeed), 4 in an fp32 run (runtimes.grad_reduce_bytes)."""
        return max(self.state.replica_reduce_bytes, 4 if self.precision == "fp32" else 0)

    @property
    def zero1_param_bytes(self) -> int:
        """Bytes per parameter ZeRO-1 sends back to the replicas after the step: the state layout's
        (StateLayout.zero1_param_bytes: the 16-bit weights under Megatron and DeepSpeed, fp32 under
        ZeroRedundancyOptimizer), 4 in an fp32 run."""
        return max(self.state.zero1_param_bytes, 4 if self.precision == "fp32" else 0)

    @property
    def fp8(self) -> bool:
        return self.precision == "fp8"


def state_layout(name: str) -> StateLayout:
    if name not in STATE_LAYOUTS:
        *rest, last = STATE_LAYOUTS
        raise MeshplanError(f"state_layout {name!r} is unknown; use {', '.join(rest)} or {last}")
    return STATE_LAYOUTS[name]

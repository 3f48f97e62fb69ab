"""Megatron's uniform activation recompute: `--recompute-granularity full --recompute-method uniform
--recompute-num-layers N`, as Megatron-Core defines it (megatron/core/transformer/transformer_block.py,
TransformerBlock._checkpointed_forward). Torch-free, used by planner/cost/memory.py.

The other Megatron methods need nothing here: `block` with k layers is a per-layer full / none
choice (the recompute solver plans it), `uniform` with N = 1 is full recompute of every block."""

from __future__ import annotations


def uniform_saved_bytes(input_bytes: float, group: int) -> float:
    """Bytes one block keeps for backward under Megatron's `--recompute-method uniform
    --recompute-num-layers N` (recompute granularity full), per microbatch, averaged over its group.
    Megatron-Core TransformerBlock._checkpointed_forward: the stage's layers are cut into chunks of
    N consecutive layers (layer_idx += recompute_num_layers) and each chunk runs under one
    tensor_parallel.checkpoint, which keeps only the chunk's input hidden states: one block input
    per N blocks. N = 1 is full recompute of every block (the block input each). The average is
    exact when N divides the blocks of a stage (or model chunk); otherwise the last chunk is
    shorter and keeps one input more than this counts."""
    return input_bytes / max(group, 1)


def uniform_transient_bytes(block_bytes: float, group: int) -> float:
    """Extra bytes live once per rank while a uniform chunk of N blocks is backpropagated: its
    backward first re-runs the chunk's forward, so all N blocks' activations (`block_bytes` each,
    what a block keeps without recompute) are held together, freed block by block as the
    backward walks back. A block's own recompute transient (N = 1: one block's worth beside its
    input) is planner/rank/stages.py's, so the extra over it is (N - 1) blocks. Once per rank, not per in-flight
    microbatch: one chunk is recomputed at a time."""
    return max(group - 1, 0) * block_bytes

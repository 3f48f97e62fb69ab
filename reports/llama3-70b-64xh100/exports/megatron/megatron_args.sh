#!/usr/bin/env bash
# meshplan plan -> Megatron-LM: llama3-70b on 64 x h100-80g
# plan decisions hash 7e6edff5ae275561; mesh pp=8 dp_replicate=1 dp_shard=2 cp=1 tp=4
# global batch 128 = micro 1 x accumulation 64 x data-parallel 2; seq_len 8192
# WARNING: uneven stage boundaries (blocks per stage [9, 9, 10, 10, 11, 11, 11, 9]) are not expressible: Megatron-LM splits blocks evenly over (virtual) stages; the split below is even
# WARNING: per-layer recompute (full on 8, none on 72 of 80 blocks) is not expressible in Megatron-LM; exported full recompute on every block (slower than predicted, never more memory)
# WARNING: ZeRO-3 maps to --use-torch-fsdp2 (Megatron-Core >= 0.9); older versions cannot shard parameters
# WARNING: the prediction was made for runtime meshplan; megatron runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime megatron-lm or megatron-core
# Megatron derives data-parallel size = 64 / (tp x pp x cp) = 2 and gradient accumulation = 128 / (1 x 2) = 64
MESHPLAN_ARGS=(
    --tensor-model-parallel-size 4
    --pipeline-model-parallel-size 8
    --context-parallel-size 1
    --sequence-parallel
    --micro-batch-size 1
    --global-batch-size 128
    --seq-length 8192
    --max-position-embeddings 8192
    --num-layers 80
    --hidden-size 8192
    --num-attention-heads 64
    --ffn-hidden-size 28672
    --vocab-size 128256
    --group-query-attention
    --num-query-groups 8
    --recompute-granularity full
    --recompute-method uniform
    --recompute-num-layers 1
    --use-torch-fsdp2
    --no-gradient-accumulation-fusion
    --bf16
)
torchrun --nproc_per_node 8 --nnodes 8 "${NODE_ARGS[@]}" pretrain_gpt.py "${MESHPLAN_ARGS[@]}" "$@"

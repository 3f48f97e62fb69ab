#!/usr/bin/env bash
# meshplan plan -> Megatron-LM: llama3-70b on 64 x h100-80g
# plan decisions hash 57bccc0add1bf42d; mesh pp=1 dp_replicate=1 dp_shard=64 cp=1 tp=1
# global batch 128 = micro 2 x accumulation 1 x data-parallel 64; seq_len 8192
# WARNING: per-layer recompute (full on 78, selective on 2 of 80 blocks) is not expressible in Megatron-LM; exported full recompute on every block (slower than predicted, never more memory)
# WARNING: ZeRO-3 maps to --use-torch-fsdp2 (Megatron-Core >= 0.9); older versions cannot shard parameters
# WARNING: the prediction was made for runtime meshplan; megatron runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime megatron-lm or megatron-core
# Megatron derives data-parallel size = 64 / (tp x pp x cp) = 64 and gradient accumulation = 128 / (2 x 64) = 1
MESHPLAN_ARGS=(
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 1
    --context-parallel-size 1
    --micro-batch-size 2
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

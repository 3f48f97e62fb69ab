#!/usr/bin/env bash
# meshplan plan -> Megatron-LM: llama3-70b on 64 x h100-80g
# plan decisions hash bdcb825e4ea342f5; mesh pp=8 dp_replicate=1 dp_shard=2 cp=1 tp=4
# global batch 128 = micro 1 x accumulation 64 x data-parallel 2; seq_len 8192
# predict it: meshplan estimate --import THIS_FILE --model llama3-70b --cluster h100-80g --runtime meshplan --elementwise fused --fused-projections
# WARNING: per-layer recompute (full on 8, none on 72 of 80 blocks): Megatron's --recompute-method block recomputes the same number of blocks in every (virtual) stage; exported the most any stage recomputes, 4 (stages with fewer recompute more than predicted: slower, never more memory)
# WARNING: ZeRO-2 maps to --use-distributed-optimizer, which shards optimizer states and reduce-scatters gradients but keeps a full gradient buffer (ZeRO-1 gradient memory)
# WARNING: the prediction was made for runtime meshplan; megatron runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime megatron-lm or megatron-core
# launch: run this on each of the 8 nodes (8 devices each) with NODE_RANK=0..7 and MASTER_ADDR=<node 0's address> set
# Megatron derives data-parallel size = 64 / (tp x pp x cp) = 2 and gradient accumulation = 128 / (1 x 2) = 64
export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron requires it with tensor or context parallelism
MESHPLAN_ARGS=(
    --tensor-model-parallel-size 4
    --pipeline-model-parallel-size 8
    --context-parallel-size 1
    --pipeline-model-parallel-layout 'Et*9|t*9|t*9|t*10|t*11|t*11|t*11|t*10L'
    --sequence-parallel
    --micro-batch-size 1
    --global-batch-size 128
    --seq-length 8192
    --max-position-embeddings 8192
    --num-layers 80
    --hidden-size 8192
    --ffn-hidden-size 28672
    --num-attention-heads 64
    --group-query-attention
    --num-query-groups 8
    --vocab-size 128256
    --make-vocab-size-divisible-by 64
    --normalization RMSNorm
    --norm-epsilon 1e-05
    --position-embedding-type rope
    --rotary-base 500000
    --swiglu
    --disable-bias-linear
    --untie-embeddings-and-output-weights
    --recompute-granularity full
    --recompute-method block
    --recompute-num-layers 4
    --use-distributed-optimizer
    --bf16
)
torchrun --nnodes 8 --nproc-per-node 8 --node-rank "${NODE_RANK:-0}" --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}" pretrain_gpt.py "${MESHPLAN_ARGS[@]}" "$@"

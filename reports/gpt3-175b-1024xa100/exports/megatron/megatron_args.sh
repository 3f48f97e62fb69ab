#!/usr/bin/env bash
# meshplan plan -> Megatron-LM: gpt3-175b on 1024 x a100-80g
# plan decisions hash f43104560dd747f7; mesh pp=16 dp_replicate=8 dp_shard=2 cp=1 tp=4
# global batch 1536 = micro 1 x accumulation 96 x data-parallel 16; seq_len 2048
# predict it: meshplan estimate --import THIS_FILE --model gpt3-175b --cluster a100-80g --runtime meshplan --elementwise fused --fused-projections
# WARNING: ZeRO-2 maps to --use-distributed-optimizer, which shards optimizer states and reduce-scatters gradients but keeps a full gradient buffer (ZeRO-1 gradient memory)
# WARNING: the prediction was made for runtime meshplan; megatron runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime megatron-lm or megatron-core
# launch: run this on each of the 128 nodes (8 devices each) with NODE_RANK=0..127 and MASTER_ADDR=<node 0's address> set
# Megatron derives data-parallel size = 1024 / (tp x pp x cp) = 16 and gradient accumulation = 1536 / (1 x 16) = 96
export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron requires it with tensor or context parallelism
MESHPLAN_ARGS=(
    --tensor-model-parallel-size 4
    --pipeline-model-parallel-size 16
    --context-parallel-size 1
    --pipeline-model-parallel-layout 'Et|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t*2|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|t|L'
    --sequence-parallel
    --micro-batch-size 1
    --global-batch-size 1536
    --seq-length 2048
    --max-position-embeddings 2048
    --num-layers 96
    --hidden-size 12288
    --ffn-hidden-size 49152
    --num-attention-heads 96
    --vocab-size 51200
    --make-vocab-size-divisible-by 128
    --normalization LayerNorm
    --norm-epsilon 1e-05
    --position-embedding-type learned_absolute
    --untie-embeddings-and-output-weights
    --use-distributed-optimizer
    --num-distributed-optimizer-instances 8
    --bf16
)
torchrun --nnodes 128 --nproc-per-node 8 --node-rank "${NODE_RANK:-0}" --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}" pretrain_gpt.py "${MESHPLAN_ARGS[@]}" "$@"

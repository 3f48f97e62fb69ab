#!/usr/bin/env bash
# meshplan plan -> Megatron-LM: gpt-tiny on 4 x local-cpu
# plan decisions hash 32c85a9c500ae87d; mesh pp=1 dp_replicate=4 dp_shard=1 cp=1 tp=1
# global batch 16 = micro 4 x accumulation 1 x data-parallel 4; seq_len 32
# predict it: meshplan estimate --import THIS_FILE --model gpt-tiny --cluster local-cpu --runtime meshplan
# WARNING: the prediction was made for runtime meshplan; megatron runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime megatron-lm or megatron-core
# launch: one node of 4 devices
# Megatron derives data-parallel size = 4 / (tp x pp x cp) = 4 and gradient accumulation = 16 / (4 x 4) = 1
MESHPLAN_ARGS=(
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 1
    --context-parallel-size 1
    --micro-batch-size 4
    --global-batch-size 16
    --seq-length 32
    --max-position-embeddings 32
    --num-layers 4
    --hidden-size 64
    --ffn-hidden-size 256
    --num-attention-heads 4
    --vocab-size 256
    --make-vocab-size-divisible-by 128
    --normalization LayerNorm
    --norm-epsilon 1e-05
    --position-embedding-type learned_absolute
    --untie-embeddings-and-output-weights
    --use-distributed-optimizer
)
torchrun --nnodes 1 --nproc-per-node 4 --node-rank "${NODE_RANK:-0}" --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}" pretrain_gpt.py "${MESHPLAN_ARGS[@]}" "$@"

#!/usr/bin/env bash
# meshplan plan -> Megatron-LM: gpt-tiny on 4 x local-cpu
# plan decisions hash be93342a9f554b31; mesh pp=2 dp_replicate=2 dp_shard=1 cp=1 tp=1
# global batch 16 = micro 4 x accumulation 2 x data-parallel 2; seq_len 32
# every setting of the plan is expressed below
# Megatron derives data-parallel size = 4 / (tp x pp x cp) = 2 and gradient accumulation = 16 / (4 x 2) = 2
MESHPLAN_ARGS=(
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 2
    --context-parallel-size 1
    --account-for-embedding-in-pipeline-split
    --account-for-loss-in-pipeline-split
    --num-virtual-stages-per-pipeline-rank 3
    --micro-batch-size 4
    --global-batch-size 16
    --seq-length 32
    --max-position-embeddings 32
    --num-layers 4
    --hidden-size 64
    --num-attention-heads 4
    --ffn-hidden-size 256
    --vocab-size 256
    --use-distributed-optimizer
)
torchrun --nproc_per_node 4 --nnodes 1 "${NODE_ARGS[@]}" pretrain_gpt.py "${MESHPLAN_ARGS[@]}" "$@"

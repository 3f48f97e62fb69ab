#!/usr/bin/env bash
# meshplan plan -> Megatron-LM: gpt3-175b on 1024 x a100-80g
# plan decisions hash 2ddaf8e53c89111e; mesh pp=8 dp_replicate=1 dp_shard=32 cp=1 tp=4
# global batch 1536 = micro 2 x accumulation 24 x data-parallel 32; seq_len 2048
# WARNING: uneven stage boundaries (blocks per stage [1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]) are not expressible: Megatron-LM splits blocks evenly over (virtual) stages; the split below is even
# WARNING: ZeRO-3 maps to --use-torch-fsdp2 (Megatron-Core >= 0.9); older versions cannot shard parameters
# Megatron derives data-parallel size = 1024 / (tp x pp x cp) = 32 and gradient accumulation = 1536 / (2 x 32) = 24
MESHPLAN_ARGS=(
    --tensor-model-parallel-size 4
    --pipeline-model-parallel-size 8
    --context-parallel-size 1
    --num-layers-per-virtual-pipeline-stage 1
    --sequence-parallel
    --micro-batch-size 2
    --global-batch-size 1536
    --seq-length 2048
    --max-position-embeddings 2048
    --num-layers 96
    --hidden-size 12288
    --num-attention-heads 96
    --ffn-hidden-size 49152
    --vocab-size 51200
    --use-torch-fsdp2
    --no-gradient-accumulation-fusion
    --bf16
)
torchrun --nproc_per_node 8 --nnodes 128 "${NODE_ARGS[@]}" pretrain_gpt.py "${MESHPLAN_ARGS[@]}" "$@"

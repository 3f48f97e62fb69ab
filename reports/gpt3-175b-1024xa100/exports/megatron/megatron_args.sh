#!/usr/bin/env bash
# meshplan plan -> Megatron-LM: gpt3-175b on 1024 x a100-80g
# plan decisions hash 8c1ba00c32b18cc8; mesh pp=2 dp_replicate=1 dp_shard=64 cp=1 tp=8
# global batch 1536 = micro 6 x accumulation 4 x data-parallel 64; seq_len 2048
# WARNING: uneven stage boundaries (blocks per stage [6, 7, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 5]) are not expressible: Megatron-LM splits blocks evenly over (virtual) stages; the split below is even
# WARNING: ZeRO-3 maps to --use-torch-fsdp2 (Megatron-Core >= 0.9); older versions cannot shard parameters
# Megatron derives data-parallel size = 1024 / (tp x pp x cp) = 64 and gradient accumulation = 1536 / (6 x 64) = 4
MESHPLAN_ARGS=(
    --tensor-model-parallel-size 8
    --pipeline-model-parallel-size 2
    --context-parallel-size 1
    --num-layers-per-virtual-pipeline-stage 6
    --sequence-parallel
    --micro-batch-size 6
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

#!/usr/bin/env bash
# meshplan plan -> Megatron-LM: gpt3-175b on 1024 x a100-80g
# plan decisions hash 953f6a3a4af5da49; mesh pp=4 dp_replicate=1 dp_shard=32 cp=1 tp=8
# global batch 1536 = micro 4 x accumulation 12 x data-parallel 32; seq_len 2048
# WARNING: uneven stage boundaries (blocks per stage [3, 3, 3, 4, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 2]) are not expressible: Megatron-LM splits blocks evenly over (virtual) stages; the split below is even
# WARNING: ZeRO-3 maps to --use-torch-fsdp2 (Megatron-Core >= 0.9); older versions cannot shard parameters
# Megatron derives data-parallel size = 1024 / (tp x pp x cp) = 32 and gradient accumulation = 1536 / (4 x 32) = 12
MESHPLAN_ARGS=(
    --tensor-model-parallel-size 8
    --pipeline-model-parallel-size 4
    --context-parallel-size 1
    --num-layers-per-virtual-pipeline-stage 3
    --sequence-parallel
    --micro-batch-size 4
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

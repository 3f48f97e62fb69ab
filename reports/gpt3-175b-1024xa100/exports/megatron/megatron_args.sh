#!/usr/bin/env bash
# meshplan plan -> Megatron-LM: gpt3-175b on 1024 x a100-80g
# plan decisions hash 6606a7b7e845c8f7; mesh pp=16 dp_replicate=8 dp_shard=2 cp=1 tp=4
# global batch 1536 = micro 1 x accumulation 96 x data-parallel 16; seq_len 2048
# WARNING: uneven stage boundaries (blocks per stage [1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0]) are not expressible: Megatron-LM splits blocks evenly over (virtual) stages; the split below is even
# WARNING: ZeRO-2 maps to --use-distributed-optimizer, which shards optimizer states and reduce-scatters gradients but keeps a full gradient buffer (ZeRO-1 gradient memory)
# WARNING: the prediction was made for runtime meshplan; megatron runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime megatron-lm or megatron-core
# Megatron derives data-parallel size = 1024 / (tp x pp x cp) = 16 and gradient accumulation = 1536 / (1 x 16) = 96
MESHPLAN_ARGS=(
    --tensor-model-parallel-size 4
    --pipeline-model-parallel-size 16
    --context-parallel-size 1
    --num-layers-per-virtual-pipeline-stage 1
    --sequence-parallel
    --micro-batch-size 1
    --global-batch-size 1536
    --seq-length 2048
    --max-position-embeddings 2048
    --num-layers 96
    --hidden-size 12288
    --num-attention-heads 96
    --ffn-hidden-size 49152
    --vocab-size 51200
    --use-distributed-optimizer
    --num-distributed-optimizer-instances 8
    --bf16
)
torchrun --nproc_per_node 8 --nnodes 128 "${NODE_ARGS[@]}" pretrain_gpt.py "${MESHPLAN_ARGS[@]}" "$@"

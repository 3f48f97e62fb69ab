#!/usr/bin/env bash
# meshplan plan -> Megatron-LM: resnet50 on 8 x a100-80g
# plan decisions hash 0fffcd0ba061a2b2; mesh pp=1 dp_replicate=1 dp_shard=8 cp=1 tp=1
# global batch 1024 = micro 128 x accumulation 1 x data-parallel 8; seq_len 1
# predict it: meshplan estimate --import THIS_FILE --model resnet50 --cluster a100-80g --runtime meshplan --elementwise fused --fused-projections
# WARNING: the plan does not record the decoder architecture of resnet50 (family resnet; meshplan records it for the decoders it can name, docs/models.md): only its shape is written, so Megatron builds its default GPT (LayerNorm, GELU, ffn 4 x hidden, no grouped-query attention, tied embeddings); give Megatron's architecture flags yourself
# WARNING: ZeRO-2 maps to --use-distributed-optimizer, which shards optimizer states and reduce-scatters gradients but keeps a full gradient buffer (ZeRO-1 gradient memory)
# WARNING: the prediction was made for runtime meshplan; megatron runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime megatron-lm or megatron-core
# launch: one node of 8 devices
# Megatron derives data-parallel size = 8 / (tp x pp x cp) = 8 and gradient accumulation = 1024 / (128 x 8) = 1
MESHPLAN_ARGS=(
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 1
    --context-parallel-size 1
    --micro-batch-size 128
    --global-batch-size 1024
    --seq-length 1
    --max-position-embeddings 1
    --num-layers 16
    --use-distributed-optimizer
    --bf16
)
torchrun --nnodes 1 --nproc-per-node 8 --node-rank "${NODE_RANK:-0}" --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}" pretrain_gpt.py "${MESHPLAN_ARGS[@]}" "$@"

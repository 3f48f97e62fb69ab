#!/usr/bin/env bash
# meshplan plan -> torchtitan: resnet50 on 8 x a100-80g
# plan decisions hash 0fffcd0ba061a2b2; mesh pp=1 dp_replicate=1 dp_shard=8 cp=1 tp=1
# global batch 1024 = micro 128 x accumulation 1 x data-parallel 8; seq_len 1
# predict it: meshplan estimate --import THIS_FILE --model resnet50 --cluster a100-80g --runtime meshplan --elementwise fused --fused-projections
# launch: one node of 8 devices
torchrun --nnodes 1 --nproc-per-node 8 --node-rank "${NODE_RANK:-0}" --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}" -m torchtitan.train --module meshplan_torchtitan --config meshplan "$@"

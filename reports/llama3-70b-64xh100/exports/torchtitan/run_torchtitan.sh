#!/usr/bin/env bash
# meshplan plan -> torchtitan: llama3-70b on 64 x h100-80g
# plan decisions hash bdcb825e4ea342f5; mesh pp=8 dp_replicate=1 dp_shard=2 cp=1 tp=4
# global batch 128 = micro 1 x accumulation 64 x data-parallel 2; seq_len 8192
# predict it: meshplan estimate --import THIS_FILE --model llama3-70b --cluster h100-80g --runtime meshplan --elementwise fused --fused-projections
# launch: run this on each of the 8 nodes (8 devices each) with NODE_RANK=0..7 and MASTER_ADDR=<node 0's address> set
torchrun --nnodes 8 --nproc-per-node 8 --node-rank "${NODE_RANK:-0}" --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}" -m torchtitan.train --module meshplan_torchtitan --config meshplan "$@"

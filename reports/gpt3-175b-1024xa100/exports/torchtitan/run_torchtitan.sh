#!/usr/bin/env bash
# meshplan plan -> torchtitan: gpt3-175b on 1024 x a100-80g
# plan decisions hash f43104560dd747f7; mesh pp=16 dp_replicate=8 dp_shard=2 cp=1 tp=4
# global batch 1536 = micro 1 x accumulation 96 x data-parallel 16; seq_len 2048
# predict it: meshplan estimate --import THIS_FILE --model gpt3-175b --cluster a100-80g --runtime meshplan --elementwise fused --fused-projections
# launch: run this on each of the 128 nodes (8 devices each) with NODE_RANK=0..127 and MASTER_ADDR=<node 0's address> set
torchrun --nnodes 128 --nproc-per-node 8 --node-rank "${NODE_RANK:-0}" --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}" -m torchtitan.train --module meshplan_torchtitan --config meshplan "$@"

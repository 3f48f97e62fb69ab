#!/usr/bin/env bash
# meshplan plan -> torchtitan: gpt-tiny on 4 x local-cpu
# plan decisions hash 32c85a9c500ae87d; mesh pp=1 dp_replicate=4 dp_shard=1 cp=1 tp=1
# global batch 16 = micro 4 x accumulation 1 x data-parallel 4; seq_len 32
# predict it: meshplan estimate --import THIS_FILE --model gpt-tiny --cluster local-cpu --runtime meshplan
# launch: one node of 4 devices
torchrun --nnodes 1 --nproc-per-node 4 --node-rank "${NODE_RANK:-0}" --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}" -m torchtitan.train --module meshplan_torchtitan --config meshplan "$@"

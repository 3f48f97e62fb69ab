#!/usr/bin/env bash
# meshplan plan -> DeepSpeed: llama3-70b on 64 x h100-80g
# plan decisions hash 57bccc0add1bf42d; mesh pp=1 dp_replicate=1 dp_shard=64 cp=1 tp=1
# global batch 128 = micro 2 x accumulation 1 x data-parallel 64; seq_len 8192
# WARNING: the prediction was made for runtime meshplan; deepspeed runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime deepspeed
# WARNING: recompute (full on 78, selective on 2 of 80 blocks) is chosen in model code with deepspeed.checkpointing.checkpoint; DeepSpeed has no selective (op-level) recompute, so checkpoint the listed blocks fully
# DeepSpeed checks train_batch_size 128 = micro 2 x accumulation 1 x data-parallel 64 (world / (tp x pp))
deepspeed --num_nodes 8 --num_gpus 8 train.py --deepspeed --deepspeed_config ds_config.json "$@"

#!/usr/bin/env bash
# meshplan plan -> DeepSpeed: gpt-tiny on 4 x local-cpu
# plan decisions hash 32c85a9c500ae87d; mesh pp=1 dp_replicate=4 dp_shard=1 cp=1 tp=1
# global batch 16 = micro 4 x accumulation 1 x data-parallel 4; seq_len 32
# predict it: meshplan estimate --import THIS_FILE --model gpt-tiny --cluster local-cpu --runtime meshplan
# WARNING: the prediction was made for runtime meshplan; deepspeed runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime deepspeed
# launch: one node of 4 devices
# in train.py: engine, *_ = meshplan_deepspeed.initialize(model) (builds the TP groups for tp > 1)
# DeepSpeed checks train_batch_size 16 = micro 4 x accumulation 1 x data-parallel 4 (world / (tp x pp))
deepspeed --num_nodes 1 --num_gpus 4 train.py --deepspeed --deepspeed_config ds_config.json "$@"

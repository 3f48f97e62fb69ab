#!/usr/bin/env bash
# meshplan plan -> DeepSpeed: resnet50 on 8 x a100-80g
# plan decisions hash 0fffcd0ba061a2b2; mesh pp=1 dp_replicate=1 dp_shard=8 cp=1 tp=1
# global batch 1024 = micro 128 x accumulation 1 x data-parallel 8; seq_len 1
# predict it: meshplan estimate --import THIS_FILE --model resnet50 --cluster a100-80g --runtime meshplan --elementwise fused --fused-projections
# WARNING: the prediction was made for runtime meshplan; deepspeed runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime deepspeed
# launch: one node of 8 devices
# in train.py: engine, *_ = meshplan_deepspeed.initialize(model) (builds the TP groups for tp > 1)
# DeepSpeed checks train_batch_size 1024 = micro 128 x accumulation 1 x data-parallel 8 (world / (tp x pp))
deepspeed --num_nodes 1 --num_gpus 8 train.py --deepspeed --deepspeed_config ds_config.json "$@"

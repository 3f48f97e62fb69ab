#!/usr/bin/env bash
# meshplan plan -> DeepSpeed: gpt-tiny on 4 x local-cpu
# plan decisions hash 5faa42c01dce0de9; mesh pp=2 dp_replicate=2 dp_shard=1 cp=1 tp=1
# global batch 16 = micro 8 x accumulation 1 x data-parallel 2; seq_len 32
# predict it: meshplan estimate --import THIS_FILE --model gpt-tiny --cluster local-cpu --runtime meshplan
# WARNING: schedule GPipe (virtual stages 1) is not available in DeepSpeed's pipeline engine, which runs 1F1B with one stage per rank
# WARNING: the prediction was made for runtime meshplan; deepspeed runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime deepspeed
# launch: one node of 4 devices
# in train.py: model = meshplan_deepspeed.pipeline_module(layers); engine, *_ = meshplan_deepspeed.initialize(model) (PipeModelDataParallelTopology pp=2 tp=1 dp=2)
# DeepSpeed checks train_batch_size 16 = micro 8 x accumulation 1 x data-parallel 2 (world / (tp x pp))
deepspeed --num_nodes 1 --num_gpus 4 train.py --deepspeed --deepspeed_config ds_config.json "$@"

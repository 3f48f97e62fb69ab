#!/usr/bin/env bash
# meshplan plan -> DeepSpeed: gpt-tiny on 4 x local-cpu
# plan decisions hash d72969d918f67af1; mesh pp=4 dp_replicate=1 dp_shard=1 cp=1 tp=1
# global batch 16 = micro 4 x accumulation 4 x data-parallel 1; seq_len 32
# predict it: meshplan estimate --import THIS_FILE --model gpt-tiny --cluster local-cpu --runtime meshplan
# WARNING: uneven stage boundaries [2, 1, 1, 2] are not expressible in the config: PipelineModule's partition_method='uniform' splits evenly; give the boundaries in code
# WARNING: the prediction was made for runtime meshplan; deepspeed runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime deepspeed
# launch: one node of 4 devices
# in train.py: model = meshplan_deepspeed.pipeline_module(layers); engine, *_ = meshplan_deepspeed.initialize(model) (PipeModelDataParallelTopology pp=4 tp=1 dp=1)
# DeepSpeed checks train_batch_size 16 = micro 4 x accumulation 4 x data-parallel 1 (world / (tp x pp))
deepspeed --num_nodes 1 --num_gpus 4 train.py --deepspeed --deepspeed_config ds_config.json "$@"

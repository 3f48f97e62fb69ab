#!/usr/bin/env bash
# meshplan plan -> DeepSpeed: llama3-70b on 64 x h100-80g
# plan decisions hash 7e6edff5ae275561; mesh pp=8 dp_replicate=1 dp_shard=2 cp=1 tp=4
# global batch 128 = micro 1 x accumulation 64 x data-parallel 2; seq_len 8192
# WARNING: uneven stage boundaries [10, 9, 10, 10, 11, 11, 11, 10] are not expressible in the config: PipelineModule's partition_method='uniform' splits evenly; give the boundaries in code
# WARNING: sequence parallel with TP is not expressible (DeepSpeed AutoTP keeps norm activations replicated): activation memory is higher than predicted
# WARNING: the prediction was made for runtime meshplan; deepspeed runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime deepspeed
# WARNING: recompute (full on 8, none on 72 of 80 blocks) is chosen in model code with deepspeed.checkpointing.checkpoint; DeepSpeed has no selective (op-level) recompute, so checkpoint the listed blocks fully
# pipeline: wrap the model in deepspeed.pipe.PipelineModule(layers=..., num_stages=8); layers per stage [10, 9, 10, 10, 11, 11, 11, 10]
# DeepSpeed checks train_batch_size 128 = micro 1 x accumulation 64 x data-parallel 2 (world / (tp x pp))
deepspeed --num_nodes 8 --num_gpus 8 train.py --deepspeed --deepspeed_config ds_config.json "$@"

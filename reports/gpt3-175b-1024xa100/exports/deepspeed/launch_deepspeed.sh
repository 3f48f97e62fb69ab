#!/usr/bin/env bash
# meshplan plan -> DeepSpeed: gpt3-175b on 1024 x a100-80g
# plan decisions hash 6606a7b7e845c8f7; mesh pp=16 dp_replicate=8 dp_shard=2 cp=1 tp=4
# global batch 1536 = micro 1 x accumulation 96 x data-parallel 16; seq_len 2048
# WARNING: schedule Interleaved1F1B (virtual stages 4) is not available in DeepSpeed's pipeline engine, which runs 1F1B with one stage per rank
# WARNING: uneven stage boundaries [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1] are not expressible in the config: PipelineModule's partition_method='uniform' splits evenly; give the boundaries in code
# WARNING: ZeRO-2 over dp_shard=2 replicated 8x is not expressible; DeepSpeed shards over the whole data-parallel group (less memory, more communication than predicted)
# WARNING: sequence parallel with TP is not expressible (DeepSpeed AutoTP keeps norm activations replicated): activation memory is higher than predicted
# WARNING: the prediction was made for runtime meshplan; deepspeed runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime deepspeed
# pipeline: wrap the model in deepspeed.pipe.PipelineModule(layers=..., num_stages=16); layers per stage [2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]
# DeepSpeed checks train_batch_size 1536 = micro 1 x accumulation 96 x data-parallel 16 (world / (tp x pp))
deepspeed --num_nodes 128 --num_gpus 8 train.py --deepspeed --deepspeed_config ds_config.json "$@"

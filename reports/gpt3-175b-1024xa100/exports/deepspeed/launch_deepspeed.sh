#!/usr/bin/env bash
# meshplan plan -> DeepSpeed: gpt3-175b on 1024 x a100-80g
# plan decisions hash 953f6a3a4af5da49; mesh pp=4 dp_replicate=1 dp_shard=32 cp=1 tp=8
# global batch 1536 = micro 4 x accumulation 12 x data-parallel 32; seq_len 2048
# WARNING: schedule Interleaved1F1B (virtual stages 8) is not available in DeepSpeed's pipeline engine, which runs 1F1B with one stage per rank
# WARNING: uneven stage boundaries [4, 3, 3, 4, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3] are not expressible in the config: PipelineModule's partition_method='uniform' splits evenly; give the boundaries in code
# WARNING: sequence parallel with TP is not expressible (DeepSpeed AutoTP keeps norm activations replicated): activation memory is higher than predicted
# pipeline: wrap the model in deepspeed.pipe.PipelineModule(layers=..., num_stages=4); layers per stage [4, 3, 3, 4, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3]
# DeepSpeed checks train_batch_size 1536 = micro 4 x accumulation 12 x data-parallel 32 (world / (tp x pp))
deepspeed --num_nodes 128 --num_gpus 8 train.py --deepspeed --deepspeed_config ds_config.json "$@"

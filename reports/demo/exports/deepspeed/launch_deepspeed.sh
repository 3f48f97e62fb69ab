#!/usr/bin/env bash
# meshplan plan -> DeepSpeed: gpt-tiny on 4 x local-cpu
# plan decisions hash be93342a9f554b31; mesh pp=2 dp_replicate=2 dp_shard=1 cp=1 tp=1
# global batch 16 = micro 4 x accumulation 2 x data-parallel 2; seq_len 32
# WARNING: schedule Interleaved1F1B (virtual stages 3) is not available in DeepSpeed's pipeline engine, which runs 1F1B with one stage per rank
# pipeline: wrap the model in deepspeed.pipe.PipelineModule(layers=..., num_stages=2); layers per stage [1, 1, 1, 1, 1, 1]
# DeepSpeed checks train_batch_size 16 = micro 4 x accumulation 2 x data-parallel 2 (world / (tp x pp))
deepspeed --num_nodes 1 --num_gpus 4 train.py --deepspeed --deepspeed_config ds_config.json "$@"

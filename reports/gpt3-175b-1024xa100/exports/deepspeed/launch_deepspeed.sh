#!/usr/bin/env bash
# meshplan plan -> DeepSpeed: gpt3-175b on 1024 x a100-80g
# plan decisions hash f43104560dd747f7; mesh pp=16 dp_replicate=8 dp_shard=2 cp=1 tp=4
# global batch 1536 = micro 1 x accumulation 96 x data-parallel 16; seq_len 2048
# predict it: meshplan estimate --import THIS_FILE --model gpt3-175b --cluster a100-80g --runtime meshplan --elementwise fused --fused-projections
# WARNING: ZeRO-2 with pp=16 is refused by DeepSpeed's pipeline engine (ZeRO < 2 only): exported ZeRO-1, so gradients (and parameters) are not sharded and each rank holds more memory than predicted
# WARNING: ZeRO-2 over dp_shard=2 replicated 8x is not expressible; DeepSpeed shards over the whole data-parallel group (less memory, more communication than predicted)
# WARNING: tp=4 inside a PipelineModule has no DeepSpeed config setting (AutoTP shards non-pipeline models): the topology reserves the model axis, so your layers must be tensor-parallel themselves (Megatron-DeepSpeed's mpu layers)
# WARNING: sequence parallel with TP is not expressible (DeepSpeed AutoTP keeps norm activations replicated): activation memory is higher than predicted
# WARNING: schedule Interleaved1F1B (virtual stages 6) is not available in DeepSpeed's pipeline engine, which runs 1F1B with one stage per rank
# WARNING: the prediction was made for runtime meshplan; deepspeed runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime deepspeed
# launch: run this on each of the 128 nodes (8 devices each) with NODE_RANK=0..127 and MASTER_ADDR=<node 0's address> set
# in train.py: model = meshplan_deepspeed.pipeline_module(layers); engine, *_ = meshplan_deepspeed.initialize(model) (PipeModelDataParallelTopology pp=16 tp=4 dp=16)
# DeepSpeed checks train_batch_size 1536 = micro 1 x accumulation 96 x data-parallel 16 (world / (tp x pp))
# hostfile: 128 lines 'HOSTNAME slots=8'; run on node 0
deepspeed --hostfile "${HOSTFILE:-hostfile}" --master_addr "${MASTER_ADDR:-localhost}" --num_nodes 128 --num_gpus 8 train.py --deepspeed --deepspeed_config ds_config.json "$@"

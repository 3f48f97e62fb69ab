#!/usr/bin/env bash
# meshplan plan -> DeepSpeed: llama3-70b on 64 x h100-80g
# plan decisions hash bdcb825e4ea342f5; mesh pp=8 dp_replicate=1 dp_shard=2 cp=1 tp=4
# global batch 128 = micro 1 x accumulation 64 x data-parallel 2; seq_len 8192
# predict it: meshplan estimate --import THIS_FILE --model llama3-70b --cluster h100-80g --runtime meshplan --elementwise fused --fused-projections
# WARNING: ZeRO-2 with pp=8 is refused by DeepSpeed's pipeline engine (ZeRO < 2 only): exported ZeRO-1, so gradients (and parameters) are not sharded and each rank holds more memory than predicted
# WARNING: tp=4 inside a PipelineModule has no DeepSpeed config setting (AutoTP shards non-pipeline models): the topology reserves the model axis, so your layers must be tensor-parallel themselves (Megatron-DeepSpeed's mpu layers)
# WARNING: sequence parallel with TP is not expressible (DeepSpeed AutoTP keeps norm activations replicated): activation memory is higher than predicted
# WARNING: the prediction was made for runtime meshplan; deepspeed runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime deepspeed
# WARNING: per-layer recompute (full on 8, none on 72 of 80 blocks) is not expressible in a PipelineModule, which checkpoints every layer (activation_checkpoint_interval): exported interval 1, every block recomputed (slower than predicted, never more memory)
# launch: run this on each of the 8 nodes (8 devices each) with NODE_RANK=0..7 and MASTER_ADDR=<node 0's address> set
# in train.py: model = meshplan_deepspeed.pipeline_module(layers); engine, *_ = meshplan_deepspeed.initialize(model) (PipeModelDataParallelTopology pp=8 tp=4 dp=2, activation_checkpoint_interval=1)
# DeepSpeed checks train_batch_size 128 = micro 1 x accumulation 64 x data-parallel 2 (world / (tp x pp))
# hostfile: 8 lines 'HOSTNAME slots=8'; run on node 0
deepspeed --hostfile "${HOSTFILE:-hostfile}" --master_addr "${MASTER_ADDR:-localhost}" --num_nodes 8 --num_gpus 8 train.py --deepspeed --deepspeed_config ds_config.json "$@"

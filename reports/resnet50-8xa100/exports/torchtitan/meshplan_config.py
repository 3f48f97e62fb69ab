"""meshplan plan -> torchtitan (Python config): resnet50 on 8 x a100-80g
plan decisions hash d83ae296fbaeac55; mesh pp=1 dp_replicate=1 dp_shard=8 cp=1 tp=1
global batch 1024 = micro 128 x accumulation 1 x data-parallel 8; seq_len 1
WARNING: the prediction was made for runtime meshplan; torchtitan runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime torchtitan
"""


def meshplan_config(job_config):
    """Set the plan's parallelism, activation checkpointing and batch on a torchtitan JobConfig; returns it."""
    job_config.parallelism.data_parallel_replicate_degree = 1
    job_config.parallelism.data_parallel_shard_degree = 8
    job_config.parallelism.fsdp_reshard_after_forward = 'never'
    job_config.parallelism.tensor_parallel_degree = 1
    job_config.parallelism.context_parallel_degree = 1
    job_config.parallelism.pipeline_parallel_degree = 1
    job_config.activation_checkpoint.mode = 'none'
    job_config.training.local_batch_size = 128
    job_config.training.global_batch_size = 1024
    job_config.training.seq_len = 1
    job_config.training.mixed_precision_param = 'bfloat16'
    job_config.training.enable_cpu_offload = False
    return job_config

"""meshplan plan -> torchtitan (Python config): gpt-tiny on 4 x local-cpu
plan decisions hash 0069c8ae36dad82d; mesh pp=1 dp_replicate=4 dp_shard=1 cp=1 tp=1
global batch 16 = micro 4 x accumulation 1 x data-parallel 4; seq_len 32
WARNING: ZeRO-1 (sharded optimizer states only) has no torchtitan setting: FSDP2 shards gradients and parameters too; the degrees below keep the plan's replicate/shard split, so the optimizer states stay replicated over data_parallel_replicate_degree
WARNING: the prediction was made for runtime meshplan; torchtitan runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime torchtitan
"""


def meshplan_config(job_config):
    """Set the plan's parallelism, activation checkpointing and batch on a torchtitan JobConfig; returns it."""
    job_config.parallelism.data_parallel_replicate_degree = 4
    job_config.parallelism.data_parallel_shard_degree = 1
    job_config.parallelism.fsdp_reshard_after_forward = 'default'
    job_config.parallelism.tensor_parallel_degree = 1
    job_config.parallelism.context_parallel_degree = 1
    job_config.parallelism.pipeline_parallel_degree = 1
    job_config.activation_checkpoint.mode = 'none'
    job_config.training.local_batch_size = 4
    job_config.training.global_batch_size = 16
    job_config.training.seq_len = 32
    job_config.training.mixed_precision_param = 'float32'
    job_config.training.enable_cpu_offload = False
    return job_config

"""meshplan plan -> torchtitan (Python config): llama3-70b on 64 x h100-80g
plan decisions hash 57bccc0add1bf42d; mesh pp=1 dp_replicate=1 dp_shard=64 cp=1 tp=1
global batch 128 = micro 2 x accumulation 1 x data-parallel 64; seq_len 8192
WARNING: the prediction was made for runtime meshplan; torchtitan runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime torchtitan
WARNING: per-layer recompute (full on 78, selective on 2 of 80 blocks) is not expressible in torchtitan; exported mode=full on every block, which recomputes more than planned (slower than predicted, never more memory)
"""


def meshplan_config(job_config):
    """Set the plan's parallelism, activation checkpointing and batch on a torchtitan JobConfig; returns it."""
    job_config.parallelism.data_parallel_replicate_degree = 1
    job_config.parallelism.data_parallel_shard_degree = 64
    job_config.parallelism.fsdp_reshard_after_forward = 'default'
    job_config.parallelism.tensor_parallel_degree = 1
    job_config.parallelism.context_parallel_degree = 1
    job_config.parallelism.pipeline_parallel_degree = 1
    job_config.activation_checkpoint.mode = 'full'
    job_config.training.local_batch_size = 2
    job_config.training.global_batch_size = 128
    job_config.training.seq_len = 8192
    job_config.training.mixed_precision_param = 'bfloat16'
    job_config.training.enable_cpu_offload = False
    return job_config

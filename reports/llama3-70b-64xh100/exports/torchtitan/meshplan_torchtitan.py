"""meshplan plan -> torchtitan 0.3: llama3-70b on 64 x h100-80g
plan decisions hash bdcb825e4ea342f5; mesh pp=8 dp_replicate=1 dp_shard=2 cp=1 tp=4
global batch 128 = micro 1 x accumulation 64 x data-parallel 2; seq_len 8192
predict it: meshplan estimate --import THIS_FILE --model llama3-70b --cluster h100-80g --runtime meshplan --elementwise fused --fused-projections
WARNING: per-layer recompute (full on 8, none on 72 of 80 blocks) is not expressible in torchtitan 0.3; exported mode=full on every block, which recomputes more than planned (slower than predicted, never more memory)
WARNING: the prediction was made for runtime meshplan; torchtitan runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime torchtitan
launch: run this on each of the 8 nodes (8 devices each) with NODE_RANK=0..7 and MASTER_ADDR=<node 0's address> set
launch: torchrun --nnodes 8 --nproc-per-node 8 --node-rank "${NODE_RANK:-0}" --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}" -m torchtitan.train --module meshplan_torchtitan --config meshplan
"""

from torchtitan.components.quantization import Float8LinearConverter
from torchtitan.config import CompileConfig
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.config_registry import llama3_70b


def model_spec(converters):
    return model_registry("70B", converters=converters)  # torchtitan's llama3 70B


def meshplan():
    """The plan on a torchtitan Trainer.Config (torchtitan.config.manager: --module/--config)."""
    config = llama3_70b()  # torchtitan's own recipe: optimizer, data, tokenizer
    config.model_spec = model_spec([])
    config.parallelism.data_parallel_replicate_degree = 1
    config.parallelism.data_parallel_shard_degree = 2
    config.parallelism.fsdp_reshard_after_forward = 'never'
    config.parallelism.tensor_parallel_degree = 4
    config.parallelism.context_parallel_degree = 1
    config.parallelism.pipeline_parallel_degree = 8
    config.parallelism.enable_sequence_parallel = True
    config.parallelism.pipeline_parallel_schedule = '1F1B'
    config.parallelism.pipeline_parallel_microbatch_size = 1
    config.parallelism.module_fqns_per_model_part = [['tok_embeddings', 'layers.0', 'layers.1', 'layers.2', 'layers.3', 'layers.4', 'layers.5', 'layers.6', 'layers.7', 'layers.8'], ['layers.9', 'layers.10', 'layers.11', 'layers.12', 'layers.13', 'layers.14', 'layers.15', 'layers.16', 'layers.17'], ['layers.18', 'layers.19', 'layers.20', 'layers.21', 'layers.22', 'layers.23', 'layers.24', 'layers.25', 'layers.26'], ['layers.27', 'layers.28', 'layers.29', 'layers.30', 'layers.31', 'layers.32', 'layers.33', 'layers.34', 'layers.35', 'layers.36'], ['layers.37', 'layers.38', 'layers.39', 'layers.40', 'layers.41', 'layers.42', 'layers.43', 'layers.44', 'layers.45', 'layers.46', 'layers.47'], ['layers.48', 'layers.49', 'layers.50', 'layers.51', 'layers.52', 'layers.53', 'layers.54', 'layers.55', 'layers.56', 'layers.57', 'layers.58'], ['layers.59', 'layers.60', 'layers.61', 'layers.62', 'layers.63', 'layers.64', 'layers.65', 'layers.66', 'layers.67', 'layers.68', 'layers.69'], ['layers.70', 'layers.71', 'layers.72', 'layers.73', 'layers.74', 'layers.75', 'layers.76', 'layers.77', 'layers.78', 'layers.79', 'norm', 'lm_head']]
    config.training.local_batch_size = 64
    config.training.global_batch_size = 128
    config.training.seq_len = 8192
    config.training.mixed_precision_param = 'bfloat16'
    config.training.enable_cpu_offload = False
    config.training.disable_cuda_graphs = True
    config.activation_checkpoint = FullAC.Config()
    config.compile = CompileConfig(enable=False)
    return config

"""meshplan plan -> torchtitan 0.3: gpt3-175b on 1024 x a100-80g
plan decisions hash f43104560dd747f7; mesh pp=16 dp_replicate=8 dp_shard=2 cp=1 tp=4
global batch 1536 = micro 1 x accumulation 96 x data-parallel 16; seq_len 2048
predict it: meshplan estimate --import THIS_FILE --model gpt3-175b --cluster a100-80g --runtime meshplan --elementwise fused --fused-projections
WARNING: torchtitan ships no model of this architecture and shape (96 layers, hidden 12288, 96 heads (96 kv), ffn 49152, vocab 51200, LayerNorm, gelu, learned_absolute positions, untied embeddings): the model section names a custom model (register your model's spec as shown there); the stage module names below are torchtitan's decoder names (tok_embeddings, layers.N, norm and the output layer): give your model's modules those names
WARNING: the prediction was made for runtime meshplan; torchtitan runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime torchtitan
launch: run this on each of the 128 nodes (8 devices each) with NODE_RANK=0..127 and MASTER_ADDR=<node 0's address> set
launch: torchrun --nnodes 128 --nproc-per-node 8 --node-rank "${NODE_RANK:-0}" --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}" -m torchtitan.train --module meshplan_torchtitan --config meshplan
"""

from torchtitan.components.quantization import Float8LinearConverter
from torchtitan.config import CompileConfig
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.trainer import Trainer

# the model: 96 layers, hidden 12288, 96 heads (96 kv), ffn 49152, vocab 51200, LayerNorm, gelu, learned_absolute positions, untied embeddings

def model_spec(converters):
    """Your model as a torchtitan ModelSpec (torchtitan ships none of this architecture): build it like
    torchtitan/models/llama3/__init__.py model_registry does, with the shape above and `converters`."""
    import importlib
    import os

    return importlib.import_module(os.environ.get("MESHPLAN_MODEL_MODULE", "my_model")).model_spec(converters)


def meshplan():
    """The plan on a torchtitan Trainer.Config (torchtitan.config.manager: --module/--config)."""
    config = Trainer.Config()
    config.model_spec = model_spec([])
    config.parallelism.data_parallel_replicate_degree = 8
    config.parallelism.data_parallel_shard_degree = 2
    config.parallelism.fsdp_reshard_after_forward = 'never'
    config.parallelism.tensor_parallel_degree = 4
    config.parallelism.context_parallel_degree = 1
    config.parallelism.pipeline_parallel_degree = 16
    config.parallelism.enable_sequence_parallel = True
    config.parallelism.pipeline_parallel_schedule = 'Interleaved1F1B'
    config.parallelism.pipeline_parallel_microbatch_size = 1
    config.parallelism.module_fqns_per_model_part = [['tok_embeddings', 'layers.0'], ['layers.1'], ['layers.2'], ['layers.3'], ['layers.4'], ['layers.5'], ['layers.6'], ['layers.7'], ['layers.8'], ['layers.9'], ['layers.10'], ['layers.11'], ['layers.12'], ['layers.13'], ['layers.14'], ['layers.15', 'layers.16'], ['layers.17'], ['layers.18'], ['layers.19'], ['layers.20'], ['layers.21'], ['layers.22'], ['layers.23'], ['layers.24'], ['layers.25'], ['layers.26'], ['layers.27'], ['layers.28'], ['layers.29'], ['layers.30'], ['layers.31'], ['layers.32'], ['layers.33'], ['layers.34'], ['layers.35'], ['layers.36'], ['layers.37'], ['layers.38'], ['layers.39'], ['layers.40'], ['layers.41'], ['layers.42'], ['layers.43'], ['layers.44'], ['layers.45'], ['layers.46'], ['layers.47'], ['layers.48'], ['layers.49'], ['layers.50'], ['layers.51'], ['layers.52'], ['layers.53'], ['layers.54'], ['layers.55'], ['layers.56'], ['layers.57'], ['layers.58'], ['layers.59'], ['layers.60'], ['layers.61'], ['layers.62'], ['layers.63'], ['layers.64'], ['layers.65'], ['layers.66'], ['layers.67'], ['layers.68'], ['layers.69'], ['layers.70'], ['layers.71'], ['layers.72'], ['layers.73'], ['layers.74'], ['layers.75'], ['layers.76'], ['layers.77'], ['layers.78'], ['layers.79'], ['layers.80'], ['layers.81'], ['layers.82'], ['layers.83'], ['layers.84'], ['layers.85'], ['layers.86'], ['layers.87'], ['layers.88'], ['layers.89'], ['layers.90'], ['layers.91'], ['layers.92'], ['layers.93'], ['layers.94'], ['layers.95'], ['norm', 'lm_head']]
    config.training.local_batch_size = 96
    config.training.global_batch_size = 1536
    config.training.seq_len = 2048
    config.training.mixed_precision_param = 'bfloat16'
    config.training.enable_cpu_offload = False
    config.training.disable_cuda_graphs = True
    config.activation_checkpoint = None
    config.compile = CompileConfig(enable=False)
    return config

"""meshplan plan -> torchtitan 0.3: gpt-tiny on 4 x local-cpu
plan decisions hash 32c85a9c500ae87d; mesh pp=1 dp_replicate=4 dp_shard=1 cp=1 tp=1
global batch 16 = micro 4 x accumulation 1 x data-parallel 4; seq_len 32
predict it: meshplan estimate --import THIS_FILE --model gpt-tiny --cluster local-cpu --runtime meshplan
WARNING: torchtitan ships no model of this architecture and shape (4 layers, hidden 64, 4 heads (4 kv), ffn 256, vocab 256, LayerNorm, gelu, learned_absolute positions, untied embeddings): the model section names a custom model (register your model's spec as shown there); the stage module names below are torchtitan's decoder names (tok_embeddings, layers.N, norm and the output layer): give your model's modules those names
WARNING: ZeRO-1 (sharded optimizer states only) has no torchtitan setting: FSDP2 shards gradients and parameters too; the degrees below keep the plan's replicate/shard split, so the optimizer states stay replicated over data_parallel_replicate_degree
WARNING: the prediction was made for runtime meshplan; torchtitan runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime torchtitan
launch: one node of 4 devices
launch: torchrun --nnodes 1 --nproc-per-node 4 --node-rank "${NODE_RANK:-0}" --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}" -m torchtitan.train --module meshplan_torchtitan --config meshplan
"""

from torchtitan.components.quantization import Float8LinearConverter
from torchtitan.config import CompileConfig
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.trainer import Trainer

# the model: 4 layers, hidden 64, 4 heads (4 kv), ffn 256, vocab 256, LayerNorm, gelu, learned_absolute positions, untied embeddings

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
    config.parallelism.data_parallel_replicate_degree = 4
    config.parallelism.data_parallel_shard_degree = 1
    config.parallelism.fsdp_reshard_after_forward = 'default'
    config.parallelism.tensor_parallel_degree = 1
    config.parallelism.context_parallel_degree = 1
    config.parallelism.pipeline_parallel_degree = 1
    config.training.local_batch_size = 4
    config.training.global_batch_size = 16
    config.training.seq_len = 32
    config.training.mixed_precision_param = 'float32'
    config.training.enable_cpu_offload = False
    config.activation_checkpoint = None
    config.compile = CompileConfig(enable=False)
    return config

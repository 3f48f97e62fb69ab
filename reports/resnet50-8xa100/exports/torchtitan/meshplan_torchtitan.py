"""meshplan plan -> torchtitan 0.3: resnet50 on 8 x a100-80g
plan decisions hash 0fffcd0ba061a2b2; mesh pp=1 dp_replicate=1 dp_shard=8 cp=1 tp=1
global batch 1024 = micro 128 x accumulation 1 x data-parallel 8; seq_len 1
predict it: meshplan estimate --import THIS_FILE --model resnet50 --cluster a100-80g --runtime meshplan --elementwise fused --fused-projections
WARNING: the plan does not record the decoder architecture of resnet50 (family resnet), so it cannot be matched to a model torchtitan ships (a Llama 3.1 8B/70B/405B is llama3 with that flavour: name it in model_spec() instead): the model section names a custom model (register your model's spec as shown there); the stage module names below are torchtitan's decoder names (tok_embeddings, layers.N, norm and the output layer): give your model's modules those names
WARNING: the prediction was made for runtime meshplan; torchtitan runs this plan with its own behaviours (README, Runtimes), so its step time and memory will differ: re-plan with --runtime torchtitan
launch: one node of 8 devices
launch: torchrun --nnodes 1 --nproc-per-node 8 --node-rank "${NODE_RANK:-0}" --rdzv-backend c10d --rdzv-endpoint "${MASTER_ADDR:-localhost}:${MASTER_PORT:-29500}" -m torchtitan.train --module meshplan_torchtitan --config meshplan
"""

from torchtitan.components.quantization import Float8LinearConverter
from torchtitan.config import CompileConfig
from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
from torchtitan.trainer import Trainer


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
    config.parallelism.data_parallel_replicate_degree = 1
    config.parallelism.data_parallel_shard_degree = 8
    config.parallelism.fsdp_reshard_after_forward = 'never'
    config.parallelism.tensor_parallel_degree = 1
    config.parallelism.context_parallel_degree = 1
    config.parallelism.pipeline_parallel_degree = 1
    config.training.local_batch_size = 128
    config.training.global_batch_size = 1024
    config.training.seq_len = 1
    config.training.mixed_precision_param = 'bfloat16'
    config.training.enable_cpu_offload = False
    config.activation_checkpoint = None
    config.compile = CompileConfig(enable=False)
    return config

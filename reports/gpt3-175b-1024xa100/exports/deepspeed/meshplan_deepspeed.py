"""meshplan plan -> DeepSpeed topology: gpt3-175b on 1024 x a100-80g
plan decisions hash 3feb3faebebf2eec; mesh pp=16 dp_replicate=8 dp_shard=2 cp=1 tp=4
global batch 1536 = micro 1 x accumulation 96 x data-parallel 16; seq_len 2048
predict it: meshplan estimate --import THIS_FILE --model gpt3-175b --cluster a100-80g --runtime meshplan --elementwise fused --fused-projections
"""

import deepspeed

WORLD_SIZE = 1024
PIPELINE_PARALLEL_SIZE = 16
TENSOR_PARALLEL_SIZE = 4
DATA_PARALLEL_SIZE = 16  # what DeepSpeed derives: world / (tp x pp)
LAYERS_PER_STAGE = [7, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 7]


def topology():
    """The process grid for deepspeed.pipe.PipelineModule(topology=...): pipe outermost, model innermost."""
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    return PipeModelDataParallelTopology(
        num_pp=PIPELINE_PARALLEL_SIZE, num_mp=TENSOR_PARALLEL_SIZE, num_dp=DATA_PARALLEL_SIZE
    )


def pipeline_module(layers, **kwargs):
    """Your model's layers as a PipelineModule on the plan's topology (pp > 1)."""
    from deepspeed.pipe import PipelineModule

    kwargs.setdefault("partition_method", "uniform")
    return PipelineModule(layers=layers, topology=topology(), **kwargs)


def tensor_parallel_mpu():
    """deepspeed.utils.groups with the AutoTP groups built (tp > 1, pp = 1): passed as mpu, DeepSpeed's
    batch check then uses world / tp data-parallel ranks instead of the whole world."""
    from deepspeed.utils import groups

    groups._init_tp_mesh_device(tensor_model_parallel_size=TENSOR_PARALLEL_SIZE)
    return groups


def initialize(model, config="ds_config.json", **kwargs):
    """deepspeed.initialize with the plan's topology: pass pipeline_module(...) as model for pp > 1."""
    if PIPELINE_PARALLEL_SIZE == 1 and TENSOR_PARALLEL_SIZE > 1:
        kwargs.setdefault("mpu", tensor_parallel_mpu())
    return deepspeed.initialize(model=model, config=config, **kwargs)

"""meshplan plan -> DeepSpeed topology: resnet50 on 8 x a100-80g
plan decisions hash 72409245394ab8cd; mesh pp=1 dp_replicate=1 dp_shard=8 cp=1 tp=1
global batch 1024 = micro 128 x accumulation 1 x data-parallel 8; seq_len 1
predict it: meshplan estimate --import THIS_FILE --model resnet50 --cluster a100-80g --runtime meshplan --elementwise fused --fused-projections
"""

import deepspeed

WORLD_SIZE = 8
PIPELINE_PARALLEL_SIZE = 1
TENSOR_PARALLEL_SIZE = 1
DATA_PARALLEL_SIZE = 8  # what DeepSpeed derives: world / (tp x pp)
LAYERS_PER_STAGE = [18]


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

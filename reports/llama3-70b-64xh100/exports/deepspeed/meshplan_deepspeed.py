"""meshplan plan -> DeepSpeed topology: llama3-70b on 64 x h100-80g
plan decisions hash 714cd8428b946053; mesh pp=8 dp_replicate=1 dp_shard=2 cp=1 tp=4
global batch 128 = micro 1 x accumulation 64 x data-parallel 2; seq_len 8192
predict it: meshplan estimate --import THIS_FILE --model llama3-70b --cluster h100-80g --runtime meshplan --elementwise fused --fused-projections
"""

import deepspeed

WORLD_SIZE = 64
PIPELINE_PARALLEL_SIZE = 8
TENSOR_PARALLEL_SIZE = 4
DATA_PARALLEL_SIZE = 2  # what DeepSpeed derives: world / (tp x pp)
LAYERS_PER_STAGE = [10, 9, 9, 10, 11, 11, 11, 11]


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

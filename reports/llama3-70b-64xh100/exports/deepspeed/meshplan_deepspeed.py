"""meshplan plan -> DeepSpeed topology: llama3-70b on 64 x h100-80g
plan decisions hash bdcb825e4ea342f5; mesh pp=8 dp_replicate=1 dp_shard=2 cp=1 tp=4
global batch 128 = micro 1 x accumulation 64 x data-parallel 2; seq_len 8192
predict it: meshplan estimate --import THIS_FILE --model llama3-70b --cluster h100-80g --runtime meshplan --elementwise fused --fused-projections
"""

import deepspeed

WORLD_SIZE = 64
PIPELINE_PARALLEL_SIZE = 8
TENSOR_PARALLEL_SIZE = 4
DATA_PARALLEL_SIZE = 2  # what DeepSpeed derives: world / (tp x pp)
LAYERS_PER_STAGE = [10, 9, 9, 10, 11, 11, 11, 11]
RECOMPUTE_BLOCKS = []  # transformer blocks the plan recomputes in backward (pp = 1)
ACTIVATION_CHECKPOINT_INTERVAL = 1  # PipelineModule: checkpoint every layer in chunks of this many (pp > 1)


def topology():
    """The process grid for deepspeed.pipe.PipelineModule(topology=...): pipe outermost, model innermost."""
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    return PipeModelDataParallelTopology(
        num_pp=PIPELINE_PARALLEL_SIZE, num_mp=TENSOR_PARALLEL_SIZE, num_dp=DATA_PARALLEL_SIZE
    )


def stage_bounds():
    """PipelineModule's parts for the plan: the first layer of each pipeline rank, then the layer count."""
    bounds = [0]
    for count in LAYERS_PER_STAGE:
        bounds.append(bounds[-1] + count)
    return bounds


def block_classes(layers):
    """Class names of the transformer blocks (layers[1:-1]; a LayerSpec's typename): the layers the plan
    recomputes. A PipelineModule without checkpointable_layers checkpoints every layer with parameters, the
    embedding and the head too, where a reentrant checkpoint of the embedding (its input ids need no gradient)
    leaves its weight without one. None (DeepSpeed's default) where a block shares a class with either end."""

    def name(layer):
        return getattr(layer, "typename", type(layer)).__name__

    blocks = {name(layer) for layer in layers[1:-1]}
    ends = {name(layers[0]), name(layers[-1])} if layers else set()
    return sorted(blocks) if blocks and not blocks & ends else None


def pipeline_module(layers, **kwargs):
    """Your model's layers as a PipelineModule on the plan's topology (pp > 1), split at the plan's stage
    boundaries: `layers` is the embedding, each transformer block and the head, one entry each; only the blocks
    are checkpointed (block_classes). Pass partition_method= ("uniform", "parameters", "type:...") to let
    DeepSpeed split them instead, checkpointable_layers= to checkpoint other layers."""
    from deepspeed.pipe import PipelineModule

    kwargs.setdefault("activation_checkpoint_interval", ACTIVATION_CHECKPOINT_INTERVAL)
    kwargs.setdefault("checkpointable_layers", block_classes(layers))
    if "partition_method" in kwargs:
        return PipelineModule(layers=layers, topology=topology(), **kwargs)
    if len(layers) != sum(LAYERS_PER_STAGE):
        raise ValueError(
            f"pipeline_module: {len(layers)} layers given, but the plan splits {sum(LAYERS_PER_STAGE)} "
            f"(the embedding, each transformer block and the head, one each) as {LAYERS_PER_STAGE}; pass "
            "those layers, or partition_method='parameters' to let DeepSpeed split them"
        )

    class PlanStages(PipelineModule):
        """A PipelineModule on the plan's boundaries. Its partition methods balance layer or parameter counts,
        not time; PipelineModule.__init__ calls _partition_layers to set self.parts and this rank's layers."""

        def _partition_layers(self, method="uniform"):
            self.parts = stage_bounds()
            stage = self._topo.get_coord(self.global_rank).pipe
            self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])

    return PlanStages(layers=layers, topology=topology(), **kwargs)


def checkpoint_blocks(blocks):
    """Recompute the plan's blocks in backward (pp = 1): each listed block's forward runs under
    deepspeed.checkpointing.checkpoint. `blocks` is your model's list of transformer blocks."""
    import functools

    from deepspeed import checkpointing

    for i in RECOMPUTE_BLOCKS:
        blocks[i].forward = functools.partial(checkpointing.checkpoint, blocks[i].forward)
    return len(RECOMPUTE_BLOCKS)


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
    out = deepspeed.initialize(model=model, config=config, **kwargs)
    if RECOMPUTE_BLOCKS or ACTIVATION_CHECKPOINT_INTERVAL:  # the config's activation_checkpointing section
        deepspeed.checkpointing.configure(checkpointing_mpu(out[0].mpu), deepspeed_config=config)
    return out


class _PipelineGridGroups:
    """A PipelineParallelGrid as deepspeed.checkpointing.configure reads an mpu: the grid has the tensor-parallel
    rank and size but names the group get_slice_parallel_group (configure asks for get_tensor_model_parallel_group)."""

    def __init__(self, grid):
        self.grid = grid

    def __getattr__(self, name):
        return getattr(self.grid, name)

    def get_tensor_model_parallel_group(self):
        return self.grid.get_slice_parallel_group()


def checkpointing_mpu(mpu):
    """The engine's model-parallel groups for deepspeed.checkpointing.configure."""
    return _PipelineGridGroups(mpu) if PIPELINE_PARALLEL_SIZE > 1 else mpu

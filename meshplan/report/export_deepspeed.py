"""Export a plan to DeepSpeed: ds_config.json, the process topology (meshplan_deepspeed.py) and a launch line.

DeepSpeed checks train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x the
data-parallel world size it derives (deepspeed/runtime/config.py _batch_assertion): the full world
without an mpu, the topology's data axis under a PipelineModule (pipe/engine.py asserts it again), and
world / tp under AutoTP once the TP groups exist. meshplan_deepspeed.py builds that topology
(PipeModelDataParallelTopology for pp > 1, deepspeed.utils.groups' TP mesh for tp > 1) so the
derived size is world / (tp x pp) and the batch arithmetic holds.
"""

from __future__ import annotations

import json

from meshplan import runtimes
from meshplan.plan import Plan
from meshplan.report import export_common as ec


def deepspeed_dp(plan: Plan) -> int:
    """The data-parallel size DeepSpeed derives under the exported topology: world / (tp x pp)."""
    return plan.world_size // (plan.tensor_parallel_degree * plan.pipeline_parallel_degree)


def _zero_stage(plan: Plan, warnings: list[str]) -> int:
    if plan.pipeline_parallel_degree > 1 and plan.zero_stage >= 2:
        # deepspeed/runtime/pipe/engine.py: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
        warnings.append(
            f"ZeRO-{plan.zero_stage} with pp={plan.pipeline_parallel_degree} is refused by DeepSpeed's pipeline "
            "engine (ZeRO < 2 only): exported ZeRO-1, so gradients (and parameters) are not sharded and each rank "
            "holds more memory than predicted"
        )
        return 1
    return plan.zero_stage


NVME_PATH = "/local_nvme"
"""nvme_path written for offload=nvme (DeepSpeed's ZeRO-Infinity tutorial's mount; its config refuses
None, partition_parameters.py): the launch script says to point it at the folder `meshplan run
--offload-dir` would use."""


def _offload(plan: Plan, stage: int) -> dict[str, dict]:
    """zero_optimization.offload_optimizer / offload_param (deepspeed/runtime/zero/offload_config.py):
    offload=cpu puts the optimizer (and at ZeRO-3 FSDP2's CPUOffloadPolicy the parameters) on the host;
    offload=nvme (ZeRO-Infinity) the optimizer states in files under nvme_path, and with params=true
    (ZeRO-3 only: offload_param is "valid only with stage 3") the parameter shards too."""
    choice = plan.dp_methods.offload
    if choice.name == "cpu":
        out = {"offload_optimizer": {"device": "cpu", "pin_memory": True}}
        if stage == 3:
            out["offload_param"] = {"device": "cpu", "pin_memory": True}
        return out
    if choice.name != "nvme":
        return {}
    nvme = {"device": "nvme", "nvme_path": NVME_PATH, "pin_memory": True}
    out = {"offload_optimizer": dict(nvme)}
    if stage == 3 and choice.params.get("params"):
        out["offload_param"] = dict(nvme)
    return out


def _behaviours(plan: Plan) -> dict:
    """The behaviours the plan was priced with: its runtime's, with the plan's own on top."""
    return {**runtimes.request_behaviours(plan.runtime, {}), **plan.runtime_behaviours}


def _reduction(plan: Plan, stage: int) -> dict[str, object]:
    """The engine's gradient reduction where a --runtime deepspeed plan was priced with other than
    DeepSpeed's defaults: reduce_bucket_size (--reduce-bucket-elems; 5e8 by default) and, for a
    ZeRO-2 plan priced with a reduce-scatter (--zero2-grad-collective reduce_scatter),
    use_multi_rank_bucket_allreduce false, which reduces each bucket slice to its owner instead of
    all-reducing the whole bucket (zero/stage_1_and_2.py average_tensor)."""
    if plan.runtime not in ec.TARGET_RUNTIMES["deepspeed"]:
        return {}
    behaviours = _behaviours(plan)
    out: dict[str, object] = {}
    bucket = behaviours.get("reduce_bucket_elems")
    if bucket and bucket != runtimes.DEEPSPEED_REDUCE_BUCKET_ELEMS and stage >= 1:
        out["reduce_bucket_size"] = bucket
    if stage == 2 and behaviours.get("zero2_grad_collective") == "reduce_scatter":
        out["use_multi_rank_bucket_allreduce"] = False
    return out


def overlap_comm(plan: Plan) -> bool:
    """zero_optimization.overlap_comm: the plan's priced overlap_dp_comm for a --runtime deepspeed plan
    (--no-overlap-dp-comm prices the reduction after backward, and DeepSpeed then runs it so), else true.
    Written at every stage: DeepSpeed's own default is on at ZeRO-3 only (zero/config.py overlap_comm_valid),
    which is not what a plan priced with the runtime's value (on) assumed."""
    if plan.runtime not in ec.TARGET_RUNTIMES["deepspeed"]:
        return True
    return bool(_behaviours(plan)["overlap_dp_comm"])


def _zero(plan: Plan, warnings: list[str]) -> dict:
    stage = _zero_stage(plan, warnings)
    zero: dict[str, object] = {"stage": stage, "overlap_comm": overlap_comm(plan), "contiguous_gradients": True}
    zero.update(_offload(plan, stage))
    zero.update(_reduction(plan, stage))
    if plan.data_parallel_replicate_degree > 1 and plan.data_parallel_shard_degree > 1:
        # MiCS (zero_optimization.mics_shard_size) was removed from DeepSpeed (its config class refuses
        # the key, tests/test_export_parsers.py); ZeRO++ hpZ shards a secondary copy only
        warnings.append(
            replicated_shards_warning(
                plan.zero_stage, plan.data_parallel_shard_degree, plan.data_parallel_replicate_degree
            )
        )
    return zero


def replicated_shards_warning(zero: int, dp_shard: int, dp_replicate: int) -> str:
    """What DeepSpeed makes of ZeRO over shards that are replicated (HSDP): one group over all of them."""
    return (
        f"ZeRO-{zero} over dp_shard={dp_shard} replicated {dp_replicate}x is not expressible; DeepSpeed shards over "
        "the whole data-parallel group (less memory, more communication than predicted)"
    )


def _pipeline_warnings(plan: Plan, warnings: list[str]) -> None:
    if plan.pipeline_parallel_degree == 1:
        return
    if plan.virtual_stages > 1 or plan.pipeline_schedule != "1F1B":
        warnings.append(
            f"schedule {plan.pipeline_schedule} (virtual stages {plan.virtual_stages}) is not "
            "available in DeepSpeed's pipeline engine, which runs 1F1B with one stage per rank"
        )


def rank_layers(plan: Plan) -> list[int]:
    """Layers on each pipeline rank (its virtual stages together: DeepSpeed runs one stage per rank)."""
    pp = plan.pipeline_parallel_degree
    return [sum(len(s) for i, s in enumerate(plan.stages) if i % pp == r) for r in range(pp)]


def recompute_blocks(plan: Plan) -> list[int]:
    """Indices of the transformer blocks the plan recomputes: what checkpoint_blocks() wraps (pp = 1)."""
    return [i for i, mode in enumerate(ec.recompute_modes(plan)) if mode != "none"]


def checkpoint_interval(plan: Plan, warnings: list[str]) -> int:
    """PipelineModule(activation_checkpoint_interval=k) for pp > 1 (deepspeed/runtime/pipe/module.py: every layer,
    checkpointed in chunks of k; 0 = none); 0 for pp = 1, where checkpoint_blocks() recomputes per block."""
    modes = ec.recompute_modes(plan)
    if "selective" in modes:
        warnings.append(
            f"selective (op-level) recompute has no DeepSpeed setting: the {modes.count('selective')} selective "
            "blocks are recomputed fully with deepspeed.checkpointing (slower than predicted, never more memory)"
        )
    if plan.pipeline_parallel_degree == 1 or not recompute_blocks(plan):
        return 0
    if ec.uniform_recompute(plan) == "full":
        if plan.recompute_num_layers > 1:
            warnings.append(
                f"activation_checkpoint_interval {plan.recompute_num_layers}: a PipelineModule counts its chunks from "
                "each stage's first layer and checkpoints only chunks of blocks, so the first stage's first chunk "
                "(with the embedding) and the last stage's last one (with the head) are not recomputed: more "
                "activation memory there than predicted (the plan's groups start at each stage's first block)"
            )
        return plan.recompute_num_layers
    if len(recompute_blocks(plan)) < len(modes):
        warnings.append(
            f"per-layer recompute ({ec.recompute_text(plan)}) is not expressible in a PipelineModule, which "
            "checkpoints every layer (activation_checkpoint_interval): exported interval 1, every block recomputed "
            "(slower than predicted, never more memory)"
        )
    return 1


def _activation_checkpointing(plan: Plan) -> dict | None:
    """The config's activation_checkpointing section: read by deepspeed.checkpointing.configure, which
    meshplan_deepspeed.initialize() calls when the plan recomputes (the engine itself never does)."""
    if not recompute_blocks(plan):
        return None
    return {
        "partition_activations": plan.tensor_parallel_degree > 1,
        "contiguous_memory_optimization": False,
        "cpu_checkpointing": False,
    }


def communication_data_type(plan: Plan) -> str | None:
    """The config's communication_data_type: the dtype the plan's gradient reduction was priced in
    (runtimes.grad_reduce_bytes at the plan's ZeRO stage; fp16 compression: fp16); None where
    DeepSpeed's default gives it. Unset, DeepSpeed communicates in the model's dtype, fp16 or bf16
    where enabled, else fp32 (deepspeed/runtime/engine.py communication_data_type), and casts every
    gradient bucket to it: ZeRO-0's all-reduce (engine.py allreduce_bucket, BF16_Optimizer's fp32
    accumulation buffers included), ZeRO-1/2's (zero/stage_1_and_2.py allreduce_bucket), ZeRO-3's
    reduce-scatter (zero/stage3.py __avg_scatter_grads). A --runtime deepspeed plan priced at fp32
    gradients in a 16-bit run (--state-layout torch or megatron, --fsdp-reduce-dtype fp32) exports
    fp32; another runtime's plan runs DeepSpeed's defaults (export_common.runtime_warnings says so)."""
    if plan.dp_methods.compression.name == "fp16":
        return "fp16"
    if plan.runtime not in ec.TARGET_RUNTIMES["deepspeed"]:
        return None
    behaviours = _behaviours(plan)
    priced = runtimes.grad_reduce_bytes(behaviours, plan.precision, plan.zero_stage)
    sixteen_bit = plan.precision in ("bf16", "fp8")  # the config's bf16 section: DeepSpeed's default is bf16
    return "fp32" if sixteen_bit and priced == 4 else None  # an fp32 run is priced and run at fp32


def pipe_partitioned(plan: Plan) -> bool:
    """pipeline.pipe_partitioned / grad_partitioned: DeepSpeed's pipeline engine sends a stage boundary (and
    its gradient) split over the tensor-parallel group and gathers it on the receiver by default
    (runtime/pipe/engine.py is_pipe_partitioned); False only where a --runtime deepspeed pipeline with
    tensor parallelism was priced sending the whole replica (--no-pp-scatter-gather)."""
    if plan.runtime not in ec.TARGET_RUNTIMES["deepspeed"]:
        return True
    tp_pipeline = plan.pipeline_parallel_degree > 1 and plan.tensor_parallel_degree > 1
    return not tp_pipeline or bool(_behaviours(plan).get("pp_scatter_gather", True))


def deepspeed_config(plan: Plan, warnings: list[str]) -> dict:
    dp = deepspeed_dp(plan)
    if plan.context_parallel_degree > 1:
        warnings.append(
            f"context parallel cp={plan.context_parallel_degree} has no DeepSpeed config setting (DeepSpeed-Ulysses "
            f"is model code): DeepSpeed counts those ranks as data parallel, train_batch_size "
            f"{plan.microbatch_size * plan.num_microbatches * dp} instead of {plan.global_batch_size}"
        )
    config = {
        "train_batch_size": plan.microbatch_size * plan.num_microbatches * dp,
        "train_micro_batch_size_per_gpu": plan.microbatch_size,
        "gradient_accumulation_steps": plan.num_microbatches,
        "zero_optimization": _zero(plan, warnings),
        "bf16": {"enabled": plan.precision in ("bf16", "fp8")},
    }
    warnings.extend(ec.precision_warnings(plan, "DeepSpeed"))
    if plan.tensor_parallel_degree > 1 and plan.pipeline_parallel_degree > 1:
        warnings.append(
            f"tp={plan.tensor_parallel_degree} inside a PipelineModule has no DeepSpeed config setting (AutoTP shards "
            "non-pipeline models): the topology reserves the model axis, so your layers must be tensor-parallel "
            "themselves (Megatron-DeepSpeed's mpu layers)"
        )
    elif plan.tensor_parallel_degree > 1:
        config["tensor_parallel"] = {"autotp_size": plan.tensor_parallel_degree}
    if plan.tensor_parallel_degree > 1:
        if plan.sequence_parallel:
            warnings.append(
                "sequence parallel with TP is not expressible (DeepSpeed AutoTP keeps norm "
                "activations replicated): activation memory is higher than predicted"
            )
    wire = communication_data_type(plan)
    if wire is not None:
        config["communication_data_type"] = wire
    if not pipe_partitioned(plan):
        config["pipeline"] = {"pipe_partitioned": False, "grad_partitioned": False}
    _pipeline_warnings(plan, warnings)
    warnings.extend(ec.method_warnings(plan, "deepspeed"))
    checkpointing = _activation_checkpointing(plan)
    if checkpointing:
        config["activation_checkpointing"] = checkpointing
    return config


TOPOLOGY = '''
import deepspeed

WORLD_SIZE = {world}
PIPELINE_PARALLEL_SIZE = {pp}
TENSOR_PARALLEL_SIZE = {tp}
DATA_PARALLEL_SIZE = {dp}  # what DeepSpeed derives: world / (tp x pp)
LAYERS_PER_STAGE = {sizes}
RECOMPUTE_BLOCKS = {recompute}  # transformer blocks the plan recomputes in backward (pp = 1)
ACTIVATION_CHECKPOINT_INTERVAL = {interval}  # PipelineModule: checkpoint every layer in chunks of this many (pp > 1)


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

    blocks = {{name(layer) for layer in layers[1:-1]}}
    ends = {{name(layers[0]), name(layers[-1])}} if layers else set()
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
            f"pipeline_module: {{len(layers)}} layers given, but the plan splits {{sum(LAYERS_PER_STAGE)}} "
            f"(the embedding, each transformer block and the head, one each) as {{LAYERS_PER_STAGE}}; pass "
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
'''


def _topology_py(plan: Plan, interval: int) -> str:
    head = '"""' + "\n".join(ec.header_lines(plan, "DeepSpeed topology")) + '\n"""\n'
    sizes = rank_layers(plan)
    return head + TOPOLOGY.format(
        world=plan.world_size,
        pp=plan.pipeline_parallel_degree,
        tp=plan.tensor_parallel_degree,
        dp=deepspeed_dp(plan),
        sizes=sizes,
        recompute=recompute_blocks(plan) if plan.pipeline_parallel_degree == 1 else [],
        interval=interval,
    )


def export_deepspeed(plan: Plan) -> dict[str, str]:
    warnings = ec.common_warnings(plan)
    config = deepspeed_config(plan, warnings)
    interval = checkpoint_interval(plan, warnings)
    dp, nodes = deepspeed_dp(plan), ec.num_nodes(plan)
    notes = ec.launch_notes(plan)
    if plan.pipeline_parallel_degree > 1:
        notes.append(
            "in train.py: model = meshplan_deepspeed.pipeline_module(layers); engine, *_ = "
            "meshplan_deepspeed.initialize(model) (PipeModelDataParallelTopology "
            f"pp={plan.pipeline_parallel_degree} tp={plan.tensor_parallel_degree} dp={dp}"
            + (f", activation_checkpoint_interval={interval})" if interval else ")")
        )
    else:
        if recompute_blocks(plan):
            notes.append(
                "in train.py: meshplan_deepspeed.checkpoint_blocks(model.layers) recomputes the plan's "
                f"{len(recompute_blocks(plan))} of {len(ec.recompute_modes(plan))} blocks (deepspeed.checkpointing)"
            )
        notes.append("in train.py: engine, *_ = meshplan_deepspeed.initialize(model) (builds the TP groups for tp > 1)")
    if plan.dp_methods.offload.name == "nvme":
        notes.append(
            f"ds_config.json nvme_path {NVME_PATH}: set it to a folder on each node's local NVMe (what "
            "`meshplan run --offload-dir` names); DeepSpeed's aio section keeps its defaults"
        )
    launch = "#!/usr/bin/env bash\n" + ec.comment(
        ec.header_lines(plan, "DeepSpeed") + ec.warning_lines(warnings) + notes
    )
    launch += (
        f"# DeepSpeed checks train_batch_size {config['train_batch_size']} = micro {plan.microbatch_size} x "
        f"accumulation {plan.num_microbatches} x data-parallel {dp} (world / (tp x pp))\n"
    )
    hostfile = ""
    if nodes > 1:
        launch += f"# hostfile: {nodes} lines 'HOSTNAME slots={ec.devices_per_node(plan)}'; run on node 0\n"
        hostfile = '--hostfile "${HOSTFILE:-hostfile}" --master_addr "${MASTER_ADDR:-localhost}" '
    launch += (
        f"deepspeed {hostfile}--num_nodes {nodes} --num_gpus {ec.devices_per_node(plan)} train.py "
        '--deepspeed --deepspeed_config ds_config.json "$@"\n'
    )
    return {
        "ds_config.json": json.dumps(config, indent=2) + "\n",
        "launch_deepspeed.sh": launch,
        "meshplan_deepspeed.py": _topology_py(plan, interval),
    }

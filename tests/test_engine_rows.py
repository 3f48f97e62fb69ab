"""Engine properties are runtime behaviours, not state-layout fields: FSDP2's unsharded fp32 accumulation
until the last microbatch (fsdp_full_grad_accumulation), DDP's second fp32 copy of the gradients in its
buckets (ddp_bucket_copy), the after-backward all-reduce of replicas DDP cannot wrap
(replica_sync_after_backward), ZeRO-1's gradient exchange (zero1_grad_collective), sequence parallelism's
second gather of the linear inputs in backward (sp_regather) and the scatter/gather of a pipeline boundary
(pp_scatter_gather). Each runtime's engine decides them, whatever --state-layout keeps the state:
`--runtime deepspeed --state-layout torch` priced torch DDP's and FSDP2's while the first three were layout
fields, and `--runtime deepspeed --state-layout megatron` (Megatron-DeepSpeed) Megatron's distributed
optimizer's reduce-scatter while the fourth was."""

from __future__ import annotations

import pytest
from planner_profiles import candidate, small_gpt
from test_tp_replica_sync import exposed_sync_s

from meshplan import runtimes
from meshplan.planner import PlanRequest
from meshplan.planner.context import Context
from meshplan.planner.cost.pipeline import p2p_per_microbatch_s
from meshplan.planner.rank.dp_cost import DataParallelCost
from meshplan.planner.rank.layer_cost import _tp_comm_s
from meshplan.presets import cluster_preset

ENGINE_ROWS = ("fsdp_full_grad_accumulation", "ddp_bucket_copy", "replica_sync_after_backward")
TORCH_ENGINES = ("meshplan", "torchtitan")
"""Runtimes whose data parallelism is torch DDP / FSDP2 (with torch pipelining)."""


MOVED_ROWS = {
    "zero1_grad_collective": {"megatron-lm": "reduce_scatter", "megatron-core": "reduce_scatter"},
    "sp_regather": {"megatron-lm": True, "megatron-core": True},
    "pp_scatter_gather": {"megatron-lm": True, "megatron-core": True, "deepspeed": True},
}
"""The three engine rows that were StateLayout fields after the first three, and Megatron's value of each
(and DeepSpeed's pipeline engine's: pipe_partitioned splits a boundary over the tensor-parallel group);
every other runtime (torch's engines, DeepSpeed, Composer) has the other one."""
OTHER = {"zero1_grad_collective": "all_reduce", "sp_regather": False, "pp_scatter_gather": False}


def _context(runtime: str, layout: str, world: int, overlap: bool | None = None) -> Context:
    """A small GPT's context under `runtime`'s behaviours, state layout `layout` and overlap_dp_comm `overlap`
    (None: the runtime's) on `world` A100s."""
    behaviours = runtimes.request_behaviours(runtime, {"state_layout": layout, "overlap_dp_comm": overlap})
    request = PlanRequest(num_gpus=world, global_batch=8 * world, **behaviours)
    return Context.build(small_gpt(), cluster_preset("a100-80g", world), request)


def _cost(runtime: str, layout: str, overlap: bool | None = None, **fields) -> DataParallelCost:
    """The data-parallel cost object of a candidate under `runtime`'s behaviours, state layout `layout` and
    overlap_dp_comm `overlap` (None: the runtime's)."""
    world = fields.get("dp_replicate", 1) * fields.get("dp_shard", 1) * fields.get("tp", 1) * fields.get("pp", 1)
    return DataParallelCost(_context(runtime, layout, world, overlap), candidate(**fields))


@pytest.mark.parametrize("name", ENGINE_ROWS)
def test_every_runtime_states_the_engine_rows(name):
    got = {rt: runtimes.runtime(rt).value(name) for rt in runtimes.NAMES}
    for rt in TORCH_ENGINES:
        assert got[rt] is True, (name, rt)
    for rt in ("megatron-lm", "megatron-core", "deepspeed"):
        assert got[rt] is False, (name, rt)


@pytest.mark.parametrize("layout", tuple(runtimes.STATE_LAYOUTS))
def test_ddp_bucket_copy_is_the_engines(layout):
    """4 B a parameter for DDP's buckets beside the fp32 gradients: torch DDP's (the executor), not
    DeepSpeed's or Megatron's, under every state layout."""
    replicas = dict(dp_replicate=4)
    assert _cost("meshplan", layout, **replicas)._ddp_bucket_bytes_per_param() == 4.0
    assert _cost("deepspeed", layout, **replicas)._ddp_bucket_bytes_per_param() == 0.0
    assert _cost("megatron-core", layout, **replicas)._ddp_bucket_bytes_per_param() == 0.0


@pytest.mark.parametrize("layout", tuple(runtimes.STATE_LAYOUTS))
def test_unsharded_accumulation_under_a_pipeline_is_fsdp2s(layout):
    """Under torch pipelining FSDP2's ZeRO-2 gradients accumulate unsharded and reduce-scatter after the
    stage's last backward; DeepSpeed's engine reduces each micro-step into its partitions."""
    sharded = dict(dp_shard=4, pp=2, zero=2, num_microbatches=4)
    torch_cost = _cost("meshplan", layout, **sharded)
    assert torch_cost.unsharded_accumulation and torch_cost.pipeline_deferred
    deepspeed = _cost("deepspeed", layout, **sharded)
    assert not deepspeed.unsharded_accumulation and not deepspeed.pipeline_deferred


@pytest.mark.parametrize("layout", tuple(runtimes.STATE_LAYOUTS))
def test_tensor_parallel_replicas_sync_after_backward_only_under_torch_ddp(layout):
    """The executor all-reduces TP (DTensor) replicas after backward, the whole of it exposed; DeepSpeed's
    hooks and Megatron-Core's grad buffer reduce them during backward, under any state layout."""

    def exposed(runtime: str, overlap: bool = True) -> float:  # ZeRO-1: DeepSpeed's stage 0 waits for backward
        return exposed_sync_s(2, layout, overlap, runtime=runtime, zero=1)

    whole = exposed("meshplan", overlap=False)
    assert whole > 0 and exposed("meshplan") == whole
    assert exposed("megatron-core") < 0.5 * exposed("megatron-core", overlap=False)
    # DeepSpeed hides what fills its 5e8-element buckets during backward; the unfilled remainder waits
    # for backward's end (reduce_bucket_elems): less than the whole, not less than half here
    assert exposed("deepspeed") < 0.7 * exposed("deepspeed", overlap=False)


@pytest.mark.parametrize("name", tuple(MOVED_ROWS))
def test_every_runtime_states_the_moved_engine_rows(name):
    got = {rt: runtimes.runtime(rt).value(name) for rt in runtimes.NAMES}
    assert got == {rt: MOVED_ROWS[name].get(rt, OTHER[name]) for rt in runtimes.NAMES}
    assert all(runtimes.runtime(rt).behaviours[name].known for rt in runtimes.NAMES)


@pytest.mark.parametrize("layout", tuple(runtimes.STATE_LAYOUTS))
def test_zero1s_gradient_collective_is_the_engines(layout):
    """Megatron's distributed optimizer reduce-scatters ZeRO-1's gradients; ZeroRedundancyOptimizer behind
    DDP and DeepSpeed's ZeRO-1 (use_multi_rank_bucket_allreduce) all-reduce them, under any state layout:
    `--runtime deepspeed --state-layout megatron` is DeepSpeed's all-reduce, megatron-core under torch's
    layout still its reduce-scatter."""
    replicas = dict(dp_replicate=4, zero=1)
    assert _cost("deepspeed", layout, **replicas)._replica_grad_collective() == "all_reduce"
    assert _cost("meshplan", layout, **replicas)._replica_grad_collective() == "all_reduce"
    assert _cost("megatron-core", layout, **replicas)._replica_grad_collective() == "reduce_scatter"
    assert _cost("megatron-core", layout, dp_replicate=4)._replica_grad_collective() == "all_reduce"  # ZeRO-0: DDP


def test_deepspeed_under_megatrons_layout_sends_an_all_reduces_bytes():
    """End to end: DeepSpeed's ZeRO-1 under Megatron's layout (fp32 main grads, bf16 weights, as
    Megatron-DeepSpeed keeps them) all-reduces the fp32 gradients (2 (g-1)/g x 4 B an element) and gathers
    the bf16 weights ((g-1)/g x 2), where Megatron-Core's distributed optimizer reduce-scatters ((g-1)/g x 4)."""
    from test_grad_reduce_width import _dp
    from test_runtimes import DP, DP_PINS, _inputs

    params = _inputs(["estimate", *DP, *DP_PINS])[0].num_params
    deepspeed = _dp("deepspeed", 1, "--state-layout", "megatron").comm_bytes_per_step["dp_replicate"]
    assert deepspeed == pytest.approx(15 / 16 * (2 * 4 + 2) * params, rel=1e-6)
    megatron = _dp("megatron-core", 1, "--state-layout", "torch").comm_bytes_per_step["dp_replicate"]
    assert megatron == pytest.approx(15 / 16 * (4 + 4) * params, rel=1e-6)  # torch's layout: fp32 weights back


def _tp_backward_s(runtime: str, layout: str) -> tuple[float, float]:
    """(forward, backward) tensor-parallel collective seconds of one block at tp 2 with sequence parallelism."""
    ctx = _context(runtime, layout, 2)
    return _tp_comm_s(ctx, ctx.profile.layers[1], 1, 2, 1, True)


@pytest.mark.parametrize("layout", tuple(runtimes.STATE_LAYOUTS))
def test_sequence_parallel_regathers_only_in_megatrons_layers(layout):
    """Megatron's LinearWithGradAccumulationAndAsyncCommunication all-gathers each column-parallel input again
    in backward; DTensor SP (the executor, torchtitan) and DeepSpeed keep the gathered input, under any
    state layout."""
    megatron, torch_sp, deepspeed = (_tp_backward_s(rt, layout) for rt in ("megatron-core", "meshplan", "deepspeed"))
    assert megatron[0] == torch_sp[0] == deepspeed[0] > 0  # forward alike
    assert megatron[1] > torch_sp[1] == deepspeed[1] > 0
    assert _tp_backward_s("megatron-lm", layout) == megatron
    assert _tp_backward_s("torchtitan", layout) == torch_sp


def _boundary_s(runtime: str, layout: str, sequence_parallel: bool = False) -> float:
    """One microbatch's pipeline boundary sends of a tp 2 x pp 2 candidate."""
    ctx = _context(runtime, layout, 4)
    cand = candidate(tp=2, pp=2, num_microbatches=4, schedule="1F1B", sequence_parallel=sequence_parallel)
    return p2p_per_microbatch_s(ctx, cand, ctx.profile.layers[1].output_bytes)


@pytest.mark.parametrize("layout", tuple(runtimes.STATE_LAYOUTS))
def test_pipeline_scatter_gather_is_megatrons_p2p(layout):
    """Without sequence parallelism Megatron-LM sends 1/t of a boundary from each TP rank and gathers it on
    receipt, and so does DeepSpeed's pipeline engine (pipe_partitioned, its default: a PartitionedTensor over
    the tensor-parallel group); torch pipelining sends the whole replica, under any layout. With sequence
    parallelism the boundary is split for every engine."""
    megatron, torch_pp, deepspeed = (_boundary_s(rt, layout) for rt in ("megatron-core", "meshplan", "deepspeed"))
    assert megatron > 0 and torch_pp > 0 and megatron != torch_pp
    assert deepspeed == megatron and torch_pp == _boundary_s("torchtitan", layout)
    assert _boundary_s("megatron-lm", layout) == megatron
    split = {_boundary_s(rt, layout, sequence_parallel=True) for rt in ("megatron-core", "meshplan", "deepspeed")}
    assert len(split) == 1


FLAGS = ["--tp", "4", "--pp", "2", "--dp", "4", "--microbatch", "1", "--schedule", "1f1b", "--recompute", "full"]


def _breakdown(runtime: str, *flags: str) -> dict:
    """The step breakdown of a tp 4 x pp 2 x dp 4 ZeRO-1 GPT on 32 A100s under `runtime` and `flags`."""
    import json

    from test_imports import run

    shape = ["--set", "layers=24", "hidden=4096", "heads=32", "vocab=51200", "seq=2048"]
    argv = ["estimate", "--model", "analytic:gpt", *shape, "--cluster", "a100-80g", "--num-gpus", "32"]
    code, out, err = run([*argv, "--global-batch", "64", *FLAGS, "--zero", "1", "--runtime", runtime, *flags, "--json"])
    assert code == 0, err
    return json.loads(out)["breakdown"]


def test_the_engine_rows_have_flags_for_an_engine_between_two():
    """Megatron-DeepSpeed runs DeepSpeed's engine over Megatron's layers: --sp-regather prices Megatron's
    backward re-gather under --runtime deepspeed, --zero1-grad-collective reduce_scatter its distributed
    optimizer, --no-pp-scatter-gather DeepSpeed's pipe_partitioned false."""
    sp = _breakdown("deepspeed", "--sequence-parallel")
    assert _breakdown("deepspeed", "--sequence-parallel", "--sp-regather")["tp_comm"] > sp["tp_comm"]
    whole = _breakdown("deepspeed", "--no-sequence-parallel")
    assert _breakdown("deepspeed", "--no-sequence-parallel", "--no-pp-scatter-gather")["pp_comm"] > whole["pp_comm"]
    assert (
        whole["pp_comm"] == _breakdown("megatron-core", "--no-sequence-parallel", "--state-layout", "zero")["pp_comm"]
    )
    scattered = _breakdown("deepspeed", "--no-sequence-parallel", "--zero1-grad-collective", "reduce_scatter")
    assert scattered["dp_comm"] < whole["dp_comm"]

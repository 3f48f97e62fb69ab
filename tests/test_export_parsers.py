"""Every export of twelve real plans (eleven of the closed-form models, one of an HF config) fed to the target tool's own validation, with the world size and topology
its launch line builds, and every value the tool derives compared with the plan (tests/export_tool_checks.py
runs inside the tools' venv, `make export-tools`: DeepSpeed with ops not built, accelerate, Megatron-Core,
torchtitan). `make test` builds that venv first, so in CI these never skip; elsewhere, without it, they skip
with one line. Megatron's training argument parser is not on the package index: its arguments.py rules are
restated in tests/megatron_rules.py and tested here one by one."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
from pathlib import Path

import megatron_rules
import pytest
from export_plans import ALL_PLAN_ARGS, make_plan

from meshplan import runtimes
from meshplan.plan import Plan
from meshplan.report import export_common as ec
from meshplan.report import export_plan
from meshplan.report.export_deepspeed import rank_layers

ROOT = Path(__file__).resolve().parents[1]
TOOLS_PYTHON = ROOT / ".venv-exports" / "bin" / "python"
TARGETS = ("deepspeed", "accelerate", "megatron", "torchtitan", "torchtitan-0.2")
PLANS = list(ALL_PLAN_ARGS)
FP32_GRADS = {"state_layout": "torch", "fsdp_reduce_bytes": 4}
"""Behaviours that price a --runtime deepspeed plan's gradient reduction at fp32 in its bf16 run (ZeRO-0/1 by the
state layout, ZeRO-2/3 by --fsdp-reduce-dtype): each deepspeed plan so re-priced is exported to DeepSpeed too,
as "<name>+fp32-grads"."""


def warnings_in(files: dict[str, str]) -> str:
    return "\n".join(line for text in files.values() for line in text.splitlines() if "WARNING:" in line)


@pytest.fixture(scope="module")
def plans(tmp_path_factory) -> dict[str, Plan]:
    out = tmp_path_factory.mktemp("plans")
    return {name: make_plan(name, out) for name in PLANS}


@pytest.fixture(scope="module")
def exported(plans, tmp_path_factory) -> dict[tuple[str, str], tuple[Path, dict[str, str]]]:
    root = tmp_path_factory.mktemp("exports")
    out = {}
    for name, plan in plans.items():
        for target in TARGETS:
            folder = root / name / target
            folder.mkdir(parents=True)
            files = export_plan(plan, *target.split("-"))  # torchtitan-0.2: version 0.2
            for fname, text in files.items():
                (folder / fname).write_text(text)
            out[(name, target)] = (folder, files)
        if plan.runtime == "deepspeed":
            variant = dataclasses.replace(plan, runtime_behaviours={**plan.runtime_behaviours, **FP32_GRADS})
            folder = root / f"{name}+fp32-grads" / "deepspeed"
            folder.mkdir(parents=True)
            files = export_plan(variant, "deepspeed")
            for fname, text in files.items():
                (folder / fname).write_text(text)
            out[(f"{name}+fp32-grads", "deepspeed")] = (folder, files)
    return out


@pytest.fixture(scope="module")
def tool(exported) -> dict[tuple[str, str], dict]:
    """What the real tools say of every export (one run of export_tool_checks.py in the tools' venv)."""
    if not TOOLS_PYTHON.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{TOOLS_PYTHON} is missing in CI: `make test` builds it with `make export-tools`")
        pytest.skip("export tools venv missing: run `make export-tools` to check the exports with the real tools")
    cases = [{"id": f"{n}/{t}", "target": t, "dir": str(folder)} for (n, t), (folder, _) in exported.items()]
    # torchtitan 0.2 is imported in a process of its own (0.3 holds the package name): two runs side by side
    groups = [
        [c for c in cases if c["target"] != "torchtitan-0.2"],
        [c for c in cases if c["target"] == "torchtitan-0.2"],
    ]
    procs = [
        subprocess.Popen(
            [str(TOOLS_PYTHON), str(ROOT / "tests" / "export_tool_checks.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": ""},
        )
        for _ in groups
    ]
    results = {}
    for proc, group in zip(procs, groups):
        out, err = proc.communicate(json.dumps(group), timeout=900)
        assert proc.returncode == 0, err[-3000:]
        results.update({tuple(r["id"].split("/")): r for r in json.loads(out)})
    return results


def accepted(tool, name: str, target: str) -> dict:
    result = tool[(name, target)]
    assert result["accepted"], f"{target} refused the {name} export: {result['error']}"
    return result["values"]


def assert_torchrun_launch(launch: dict, plan: Plan) -> None:
    """What torchrun's own parser made of the export's launch line, on the second of the job's nodes."""
    assert (launch["nodes"], launch["nproc_per_node"]) == (ec.num_nodes(plan), ec.devices_per_node(plan))
    assert launch["world"] == plan.world_size and launch["endpoint"] == "10.0.0.1:29500"  # node 0, not localhost


# --- DeepSpeed ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PLANS)
def test_deepspeed_accepts_the_export_under_its_topology(name, plans, exported, tool):
    plan, (_, files) = plans[name], exported[(name, "deepspeed")]
    got = accepted(tool, name, "deepspeed")
    warns = warnings_in(files)
    # DeepSpeed's launcher kept this many hosts and slots of a hostfile with the line's node count
    assert got["world_size"] == plan.world_size and got["nodes"] == ec.num_nodes(plan)
    assert got["nproc_per_node"] == ec.devices_per_node(plan)
    assert got["master_addr"] == ("10.0.0.1" if got["nodes"] > 1 else None)
    # DeepSpeed's own batch check passed with the data-parallel size it derived
    assert got["data_parallel"] == plan.data_parallel_degree
    assert (got["train_batch_size"], got["micro_batch"], got["accumulation"]) == (
        plan.global_batch_size,
        plan.microbatch_size,
        plan.num_microbatches,
    )
    pp, tp = plan.pipeline_parallel_degree, plan.tensor_parallel_degree
    assert (got["pipeline_stages"], got["tensor_parallel"]) == (pp, tp)
    if pp > 1:
        assert (got["topology_pipe"], got["topology_model"]) == (pp, tp)
    assert got["autotp_size"] == (tp if tp > 1 and pp == 1 else 0)
    if pp > 1 and plan.zero_stage >= 2:  # the pipeline engine asserts ZeRO < 2: said, and ZeRO-1 written
        assert got["zero_stage"] == 1 and f"ZeRO-{plan.zero_stage} with pp={pp} is refused" in warns
    else:
        assert got["zero_stage"] == plan.zero_stage
    offload = plan.dp_methods.offload
    host = offload.name in ("cpu", "nvme")  # DeepSpeed's offload devices, meshplan's names
    assert got["offload_optimizer"] == (offload.name if host else "none")
    paged = offload.name == "cpu" or offload.params.get("params", False)
    assert got["offload_param"] == (offload.name if host and paged and got["zero_stage"] == 3 else "none")
    nvme = "/local_nvme" if offload.name == "nvme" else "None"  # DeepSpeed's swappers refuse None
    assert got["optimizer_nvme_path"] == nvme
    assert got["param_nvme_path"] == (nvme if got["offload_param"] == "nvme" else "None")
    if offload.name == "nvme":
        assert "nvme_path /local_nvme: set it" in files["launch_deepspeed.sh"]
    assert got["bf16"] == (plan.precision in ("bf16", "fp8")) and not got["fp16"]
    assert ("precision fp8 has no DeepSpeed config setting" in warns) == (plan.precision == "fp8")
    assert got["activation_checkpointing"] == (ec.strongest_recompute(plan) != "none")
    # recompute happens where the engine is told: PipelineModule's interval (pp > 1), else the wrapped blocks
    modes, uniform = ec.recompute_modes(plan), ec.uniform_recompute(plan)
    if pp > 1:
        interval = plan.recompute_num_layers if uniform == "full" else int(uniform != "none")
        assert got["checkpoint_interval"] == interval
        if "stage_layers" in got:  # the PipelineModule DeepSpeed built: each rank's layers are the plan's
            assert got["stage_layers"] == rank_layers(plan)
            # rank 0 checkpoints its blocks, never the embedding (layer 0); chunks of N > 1 layers start at the
            # embedding, so the first chunk is not checkpointed (warned)
            first = interval or rank_layers(plan)[0]  # interval 0: none
            assert got["checkpointed_layers"] == list(range(first, rank_layers(plan)[0]))
            assert ("first stage's first chunk" in warns) == (interval > 1)
        assert ("not expressible in a PipelineModule" in warns) == (uniform is None and "none" in modes)
    else:
        assert got["checkpointed_blocks"] == [i for i, mode in enumerate(modes) if mode != "none"]
    assert ("selective (op-level) recompute has no DeepSpeed setting" in warns) == ("selective" in modes)
    # the gradients go in the dtype priced: a deepspeed plan's width (runtimes.grad_reduce_bytes, the planner's;
    # tests/test_grad_reduce_width.py), DeepSpeed's own default for another runtime's plan, fp16 compression 2
    if plan.dp_methods.compression.name == "fp16":
        wire = 2
    elif plan.runtime == "deepspeed":
        wire = runtimes.grad_reduce_bytes(plan.runtime_behaviours, plan.precision, plan.zero_stage)
    else:
        wire = 2 if plan.precision in ("bf16", "fp8") else 4
    assert got["communication_bytes"] == wire
    assert_engine_reduction(plan, got, got["zero_stage"])


def assert_engine_reduction(plan: Plan, got: dict, stage: int) -> None:
    """The engine's reduction as priced, at the ZeRO stage DeepSpeed runs: a deepspeed plan's bucket, ZeRO-2
    collective and overlap (--no-overlap-dp-comm: after backward), else DeepSpeed's defaults."""
    behaviours = plan.runtime_behaviours if plan.runtime == "deepspeed" else {}
    bucket = behaviours.get("reduce_bucket_elems") or runtimes.DEEPSPEED_REDUCE_BUCKET_ELEMS
    assert got["reduce_bucket_size"] == (bucket if stage >= 1 else runtimes.DEEPSPEED_REDUCE_BUCKET_ELEMS)
    scatters = stage == 2 and behaviours.get("zero2_grad_collective") == "reduce_scatter"
    assert got["multi_rank_bucket_allreduce"] is not scatters
    assert got["overlap_comm"] is behaviours.get("overlap_dp_comm", True)


@pytest.mark.parametrize("name", [n for n in PLANS if "deepspeed" in n])
def test_deepspeed_reduces_fp32_gradients_where_the_plan_priced_them(name, plans, tool):
    """A deepspeed plan priced at 16-bit gradients runs DeepSpeed's default (bf16); re-priced at fp32 (FP32_GRADS),
    its export makes DeepSpeed reduce fp32."""
    plan = plans[name]
    assert plan.runtime == "deepspeed" and plan.precision == "bf16"
    assert accepted(tool, name, "deepspeed")["communication_bytes"] == 2
    assert accepted(tool, f"{name}+fp32-grads", "deepspeed")["communication_bytes"] == 4


def test_deepspeed_runs_the_bucket_and_zero2_collective_the_flags_priced(plans, tool):
    """--reduce-bucket-elems, --zero2-grad-collective and --no-overlap-dp-comm reach DeepSpeed's own config:
    the bucket as reduce_bucket_size, the reduce-scatter as use_multi_rank_bucket_allreduce false, the
    reduction after backward as overlap_comm false."""
    name = "gpt3-1.3b-zero2-buckets-deepspeed"
    behaviours = plans[name].runtime_behaviours
    assert behaviours["reduce_bucket_elems"] == 200_000_000
    assert behaviours["zero2_grad_collective"] == "reduce_scatter"
    got = accepted(tool, name, "deepspeed")
    assert (got["zero_stage"], got["reduce_bucket_size"], got["multi_rank_bucket_allreduce"]) == (2, 200_000_000, False)
    assert behaviours["overlap_dp_comm"] is False and got["overlap_comm"] is False  # --no-overlap-dp-comm
    default = accepted(tool, "gpt3-1.3b-zero2-deepspeed", "deepspeed")
    assert (default["reduce_bucket_size"], default["multi_rank_bucket_allreduce"]) == (500_000_000, True)
    assert default["overlap_comm"] is True  # on at ZeRO-2 although DeepSpeed's own default is off there


# --- accelerate --------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PLANS)
def test_accelerate_accepts_the_export(name, plans, exported, tool):
    plan, (_, files) = plans[name], exported[(name, "accelerate")]
    got = accepted(tool, name, "accelerate")
    warns = warnings_in(files)
    assert got["num_processes"] == plan.world_size and got["num_machines"] == ec.num_nodes(plan)
    assert got["nproc_per_node"] == ec.devices_per_node(plan)
    if got["num_machines"] > 1:
        assert got["endpoint"] == "10.0.0.1:29500"  # the launch line's MASTER_ADDR, not None
    # a plan priced for DeepSpeed's engine, and a ZeRO-1 plan, run on accelerate's DeepSpeed plugin
    deepspeed = (plan.runtime == "deepspeed" or plan.zero_stage == 1) and plan.context_parallel_degree == 1
    assert (got["accelerator_distributed_type"] == "DEEPSPEED") == deepspeed
    assert (got["tp"], got["cp"]) == (plan.tensor_parallel_degree, plan.context_parallel_degree)
    pure_replication = plan.data_parallel_replicate_degree > 1 and plan.data_parallel_shard_degree == 1
    if deepspeed:
        assert_accelerate_runs_deepspeed(plan, got, warns)
    else:
        # ParallelismConfig's sizes multiply to the launched world (its own _validate_accelerator passed)
        assert got["dp_replicate"] * got["dp_shard"] * got["tp"] * got["cp"] == plan.world_size
        changed = plan.pipeline_parallel_degree > 1 or (plan.tensor_parallel_degree > 1 and pure_replication)
        if not changed:
            assert (got["dp_replicate"], got["dp_shard"]) == (
                plan.data_parallel_replicate_degree,
                plan.data_parallel_shard_degree,
            )
            kind = {0: "MULTI_GPU", 2: "FSDP", 3: "FSDP"}[plan.zero_stage]
            assert got["accelerator_distributed_type"] == kind
            if kind == "FSDP":
                assert got["fsdp_reshard_after_forward"] == str(plan.zero_stage == 3).lower()
        if plan.tensor_parallel_degree > 1 and pure_replication:
            assert "refused by accelerate's ParallelismConfig" in warns
    if plan.pipeline_parallel_degree > 1:
        assert "pipeline_parallel_degree" in warns and "not expressible" in warns
    # neither transformers' TP plans nor DeepSpeed's AutoTP shard norm or residual activations: the plan's
    # sequence parallelism is said, not kept
    sp_kept = got["tp_plan_sequence_parallel"] and not deepspeed
    sp_lost = plan.tensor_parallel_degree > 1 and plan.sequence_parallel and not sp_kept
    assert ("sequence parallel with TP is not expressible" in warns) == sp_lost
    assert got["mixed_precision"] == ("bf16" if plan.precision in ("bf16", "fp8") else "no")
    assert ("precision fp8 has no accelerate config setting" in warns) == (plan.precision == "fp8")


def assert_accelerate_runs_deepspeed(plan: Plan, got: dict, warns: str) -> None:
    """The DeepSpeed engine accelerate's plugin builds from ds_config.json runs the plan's stage, accumulation,
    offload and gradient reduction (a --runtime deepspeed plan's, as priced: the same checks as the DeepSpeed
    export's), with DeepSpeed's batch check passed over every process."""
    pp = plan.pipeline_parallel_degree
    accumulation = plan.num_microbatches // pp if pp > 1 and plan.num_microbatches % pp == 0 else plan.num_microbatches
    assert got["deepspeed_zero_stage"] == str(plan.zero_stage) == str(got["ds_zero_stage"])
    assert got["zero3_init"] is (plan.zero_stage == 3)
    assert got["gradient_accumulation_steps"] == str(accumulation) and got["ds_micro_batch"] == plan.microbatch_size
    assert got["ds_train_batch_size"] == plan.microbatch_size * accumulation * plan.world_size
    assert got["data_parallel"] == plan.world_size // plan.tensor_parallel_degree
    if pp == 1:
        assert got["data_parallel"] == plan.data_parallel_degree
    offload = plan.dp_methods.offload
    assert got["offload_optimizer"] == (offload.name if offload.name in ("cpu", "nvme") else "none")
    assert_engine_reduction(plan, got, got["ds_zero_stage"])
    if plan.runtime == "deepspeed" and plan.dp_methods.compression.name != "fp16":
        wire = runtimes.grad_reduce_bytes(plan.runtime_behaviours, plan.precision, plan.zero_stage)
        assert got["communication_bytes"] == wire
    if plan.tensor_parallel_degree > 1:
        assert "DeepSpeed's AutoTP" in warns


def test_accelerate_yaml_quotes_no(plans):
    """mixed_precision: no read back as the string, not YAML's boolean false; on the DeepSpeed plugin the
    precision is ds_config.json's alone (accelerate refuses a mixed_precision beside deepspeed_config_file)."""
    import yaml

    fsdp = dataclasses.replace(plans["llama3-8b-fsdp-torchtitan"], precision="fp32")
    text = export_plan(fsdp, "accelerate")["accelerate_config.yaml"]
    assert yaml.safe_load(text)["mixed_precision"] == "no"
    zero2 = dataclasses.replace(plans["gpt3-1.3b-zero2-deepspeed"], precision="fp32")
    files = export_plan(zero2, "accelerate")
    assert "mixed_precision" not in yaml.safe_load(files["accelerate_config.yaml"])
    assert json.loads(files["ds_config.json"])["bf16"] == {"enabled": False}


# --- Megatron ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", PLANS)
def test_megatron_core_accepts_the_export(name, plans, exported, tool):
    plan, (_, files) = plans[name], exported[(name, "megatron")]
    got = accepted(tool, name, "megatron")
    assert_torchrun_launch(got["launch"], plan)
    arch = ec.architecture(plan)
    assert arch is not None
    assert (got["tp"], got["pp"], got["cp"]) == (
        plan.tensor_parallel_degree,
        plan.pipeline_parallel_degree,
        plan.context_parallel_degree,
    )
    assert got["virtual_stages"] == plan.virtual_stages
    assert (got["micro_batch"], got["global_batch"], got["accumulation"]) == (
        plan.microbatch_size,
        plan.global_batch_size,
        plan.num_microbatches,
    )
    assert got["sequence_parallel"] == (plan.sequence_parallel and plan.tensor_parallel_degree > 1)
    for key in ("hidden", "ffn_hidden", "heads", "kv_heads", "vocab"):
        assert got[key] == arch[key], key
    assert got["num_layers"] == arch["layers"]
    # the GPTModel Megatron-Core builds from these flags has the plan's parameters, exactly (Llama-3 8B's
    # 8,030,261,248): without the Llama flags it would be a GELU/LayerNorm model with tied embeddings, 1.9 B short
    assert got["num_params"] == plan.model_num_params
    assert got["normalization"] == arch["norm"]
    assert got["gated_linear_unit"] == (arch["activation"] == "swiglu")
    assert got["add_bias_linear"] == arch["bias"]
    assert got["position_embedding"] == arch["position"]
    assert got["untied"] == (not arch["tied"])
    assert got["fsdp2"] == (plan.zero_stage == 3 and plan.pipeline_parallel_degree == 1)
    assert got["distributed_optimizer"] == (plan.zero_stage in (1, 2) or (plan.zero_stage == 3 and not got["fsdp2"]))
    assert got["fp8"] == ("hybrid" if plan.precision == "fp8" else None)
    assert got["bf16"] == (plan.precision in ("bf16", "fp8"))
    uniform = ec.uniform_recompute(plan)
    expected = {"none": None, "selective": "selective", "full": "full"}.get(uniform or ec.strongest_recompute(plan))
    assert got["recompute_granularity"] == expected
    if uniform is None:
        assert "recompute" in warnings_in(files)
    tp_or_cp = plan.tensor_parallel_degree * plan.context_parallel_degree > 1
    assert got["cuda_device_max_connections"] == ("1" if tp_or_cp and not got["fsdp2"] else None)


def _script(plans, name: str) -> str:
    return export_plan(plans[name], "megatron")["megatron_args.sh"]


def test_megatron_virtual_stages_are_the_plans(plans):
    """arguments.py derives v = num_layers / pp / --num-layers-per-virtual-pipeline-stage, which needs even stages:
    interleaved plans with uneven stages are written as an explicit layout, from which Megatron derives the plan's
    virtual stages (the old per-stage count made Megatron build 6 where the GPT-3 175B plan had 4)."""
    interleaved = [name for name, plan in plans.items() if plan.virtual_stages > 1]
    assert "gpt3-175b-1024xa100" in interleaved
    for name in interleaved:
        plan = plans[name]
        args, _ = megatron_rules.parse_script(_script(plans, name))
        assert megatron_rules.virtual_stages(args) == plan.virtual_stages, name
        if len(set(ec.blocks_per_stage(plan))) > 1:  # no one per-stage count can say it
            assert "--num-layers-per-virtual-pipeline-stage" not in args, name
            assert "--pipeline-model-parallel-layout" in args or "--num-virtual-stages-per-pipeline-rank" in args
    args, _ = megatron_rules.parse_script(_script(plans, "gpt3-175b-1024xa100"))
    with pytest.raises(AssertionError, match="No more than one"):
        megatron_rules.virtual_stages({**args, "--num-virtual-stages-per-pipeline-rank": "4"})
    even = {
        "--pipeline-model-parallel-size": "16",
        "--num-layers": "96",
        "--num-layers-per-virtual-pipeline-stage": "1",
    }
    assert megatron_rules.virtual_stages(even) == 6  # 96 / 16 / 1


def test_megatron_fsdp2_exports_untie_and_leave_connections(plans):
    for name in ("llama3-8b-fsdp-torchtitan", "gpt3-13b-zero3-offload-deepspeed"):
        args, env = megatron_rules.parse_script(_script(plans, name))
        assert "--use-torch-fsdp2" in args
        megatron_rules.fsdp2(args, env)
        tied = {k: v for k, v in args.items() if k != "--untie-embeddings-and-output-weights"}
        with pytest.raises(AssertionError, match="requires --untie-embeddings-and-output-weights"):
            megatron_rules.fsdp2(tied, env)
        with pytest.raises(AssertionError, match="CUDA_DEVICE_MAX_CONNECTIONS"):
            megatron_rules.fsdp2(args, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"})


def test_megatron_tensor_parallel_sets_cuda_device_max_connections(plans):
    for name, plan in plans.items():
        args, env = megatron_rules.parse_script(_script(plans, name))
        megatron_rules.device_connections(args, env)
        if plan.tensor_parallel_degree > 1 and "--use-torch-fsdp2" not in args:
            assert env["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
            with pytest.raises(AssertionError, match="CUDA_DEVICE_MAX_CONNECTIONS to 1"):
                megatron_rules.device_connections(args, {})


def test_megatron_llama_architecture_flags(plans):
    """Without these Megatron builds a GELU/LayerNorm model with tied embeddings (about 1.9 B parameters short
    of Llama-3 8B): every Llama plan carries them, with the grouped-query count."""
    for name, plan in plans.items():
        args, _ = megatron_rules.parse_script(_script(plans, name))
        llama = {
            "--swiglu",
            "--disable-bias-linear",
            "--group-query-attention",
            "--untie-embeddings-and-output-weights",
        }
        arch = ec.architecture(plan)
        assert arch is not None, name
        if arch["family"] == "llama":  # the closed-form Llama's, or the HF config's model_type
            assert llama <= set(args), name
            assert (args["--normalization"], args["--position-embedding-type"]) == ("RMSNorm", "rope")
            assert args["--num-query-groups"] == str(arch["kv_heads"]) == "8"
            assert args["--rotary-base"] == "500000"
        else:
            assert not ({"--swiglu", "--disable-bias-linear", "--group-query-attention"} & set(args)), name
            assert (args["--normalization"], args["--position-embedding-type"]) == ("LayerNorm", "learned_absolute")


def without_model_name(text: str) -> list[str]:
    """An export's lines but those naming the model: the header's title, decisions hash and estimate line."""
    named = ("meshplan plan -> ", "plan decisions hash ", "predict it: meshplan estimate")
    return [line for line in text.splitlines() if not any(n in line for n in named)]


def test_an_hf_llama_exports_as_the_closed_form_llama(plans, exported):
    """The HF config's profile records its architecture (kv heads, ffn, RMSNorm, SwiGLU, rope and its base, no
    biases, untied): every file of its five exports is the closed-form Llama-3 8B plan's but for the lines naming
    the model; torchtitan names llama3 8B, Megatron gets the Llama flags (the tools count the parameters above)."""
    hf, closed = "llama3.1-8b-hf-fsdp-torchtitan", "llama3-8b-fsdp-torchtitan"
    assert plans[hf].model_family == "hf" and plans[hf].model_architecture == plans[closed].model_architecture
    for target in TARGETS:
        files, same = exported[(hf, target)][1], exported[(closed, target)][1]
        assert files.keys() == same.keys(), target
        for fname, text in files.items():
            assert without_model_name(text) == without_model_name(same[fname]), (target, fname)
    assert "WARNING: the plan does not record" not in "".join(exported[(hf, "megatron")][1].values())


def test_megatron_batch_rule(plans):
    for name, plan in plans.items():
        assert megatron_rules.batch(megatron_rules.parse_script(_script(plans, name))[0], plan.world_size) == (
            plan.num_microbatches
        )
    with pytest.raises(AssertionError, match="not divisible"):
        megatron_rules.batch({"--micro-batch-size": "3", "--global-batch-size": "64"}, 8)


def test_multi_node_launch_lines(plans):
    plan = plans["gpt3-175b-1024xa100"]
    line = next(x for x in _script(plans, "gpt3-175b-1024xa100").splitlines() if x.startswith("torchrun"))
    assert "--nnodes 128 --nproc-per-node 8" in line and "--node-rank" in line and "--rdzv-endpoint" in line
    assert ec.num_nodes(plan) * ec.devices_per_node(plan) == plan.world_size
    ds = export_plan(plan, "deepspeed")["launch_deepspeed.sh"]
    assert re.search(r"deepspeed --hostfile \S+ --master_addr \S+ --num_nodes 128 --num_gpus 8", ds)


# --- torchtitan --------------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["torchtitan", "torchtitan-0.2"])
@pytest.mark.parametrize("name", PLANS)
def test_torchtitan_accepts_the_export(name, target, plans, exported, tool):
    from meshplan.report.export_torchtitan import HEAD_FQNS, LLAMA3_FLAVORS, ddp_beside_model_parallel, shipped_model

    plan, (_, files) = plans[name], exported[(name, target)]
    got = accepted(tool, name, target)
    warns = warnings_in(files)
    version = got["version"]
    pp, m = plan.pipeline_parallel_degree, plan.num_microbatches
    assert_torchrun_launch(got["launch"], plan)
    assert got["world_size"] == plan.world_size
    mesh = (got["pp"], got["dp_replicate"], got["dp_shard"], got["cp"], got["tp"])
    ddp_replicas = ddp_beside_model_parallel(plan)  # torchtitan's DDP takes a 1-D mesh: FSDP2 shards instead
    pp_, _, _, cp_, tp_ = plan.mesh_shape
    assert mesh == ((pp_, 1, plan.data_parallel_degree, cp_, tp_) if ddp_replicas else plan.mesh_shape)
    assert got["ddp_refused"] is False
    assert got["batch_degree"] == plan.data_parallel_degree and got["global_batch"] == plan.global_batch_size
    if pp > 1:  # the local batch is split into microbatches of the pipeline
        assert (got["pp_microbatch"], got["local_batch"] // got["pp_microbatch"]) == (plan.microbatch_size, m)
        assert got["accumulation"] == 1 and got["schedule"] == plan.pipeline_schedule
        names = {"embed": ["tok_embeddings"], "head": HEAD_FQNS[version]}
        expected = [[n for f in stage for n in names.get(f, [f])] for stage in plan.stages]
        assert got["model_parts"] == expected
    else:
        assert (got["local_batch"], got["accumulation"]) == (plan.microbatch_size, m)
    reshard = {2: "never"}.get(2 if ddp_replicas else plan.zero_stage, "always" if pp > 1 else "default")
    assert got["reshard"] == reshard
    if version == "0.3" and plan.tensor_parallel_degree > 1:
        assert got["sequence_parallel"] == plan.sequence_parallel
    assert got["seq_len"] == plan.seq_len
    assert got["mixed_precision_param"] == ("float32" if plan.precision == "fp32" else "bfloat16")
    assert got["cpu_offload"] == (plan.dp_methods.offload.name == "cpu")
    assert got["compile"] == (plan.runtime_behaviours.get("elementwise") == "compiled")
    shipped = shipped_model(plan)
    if shipped:
        assert (got["model_name"], got["flavor"]) == shipped
        if version == "0.3":  # torchtitan's own model config of that flavour is the plan's shape
            layers, dim, *_, vocab = LLAMA3_FLAVORS[shipped[1]]
            assert (got["n_layers"], got["dim"], got["vocab"], got["tied"]) == (layers, dim, vocab, False)
            assert (got["n_layers"], got["dim"]) == (len(ec.blocks(plan)), plan.model_config["hidden"])
            # the model torchtitan builds: the plan's parameters, exactly, and every stage module name
            assert got["num_params"] == plan.model_num_params
            assert got["missing_fqns"] == []
    else:
        assert "torchtitan ships no model of this architecture" in warns
        assert got.get("custom_model", got["model_name"] == "custom")
    if version == "0.3":  # torchao's Float8Linear in the built model: every block's linears at least
        assert got["float8"] == (plan.precision == "fp8")
        if plan.precision == "fp8":
            assert got["float8_linears"] >= 5 * len(ec.blocks(plan))
    else:
        assert (got["converters"] == ["quantize.linear.float8"]) == (plan.precision == "fp8")
    uniform = ec.uniform_recompute(plan)
    mode = uniform or ec.strongest_recompute(plan)
    if version == "0.3":
        assert got["ac"] == {"none": None, "full": "FullAC.Config", "selective": "SelectiveAC.Config"}[mode]
    elif uniform is not None:
        assert got["ac"] == mode
    if uniform is None:
        assert "per-layer recompute" in warns

"""export_plan: each target carries the plan's degrees and batch arithmetic, and says what it cannot express."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shlex
import tomllib
from types import SimpleNamespace

import pytest
import yaml
from report_fixtures import flat_plan, gpt_plan, searched_plan, split, uneven_plan

from meshplan import schema
from meshplan.errors import MeshplanError
from meshplan.plan import Plan
from meshplan.report import EXPORT_TARGETS, export_plan
from meshplan.report.export_torchtitan import ddp_beside_model_parallel

PLANS = {
    "pipeline": searched_plan,
    "flat": flat_plan,
    "uneven": uneven_plan,
    "hsdp": lambda: gpt_plan(pp=1, dp_replicate=2, dp_shard=4, tp=2, zero=3, num_microbatches=4),
    "even_interleaved": lambda: even_blocks(
        gpt_plan(
            pp=2,
            dp_replicate=2,
            tp=2,
            num_microbatches=4,
            schedule="Interleaved1F1B",
            virtual=2,
            blocks=8,
            recompute="full",
        )
    ),
}


def known_gpt(plan: Plan) -> Plan:
    """The fixture plan as one of meshplan's GPT decoders (its architecture known to the exports)."""
    return dataclasses.replace(plan, model_family="gpt", model_config={**plan.model_config, "vocab": 51200})


def even_blocks(plan: Plan) -> Plan:
    """Stages with equal numbers of transformer blocks (embed joins the first, head the last)."""
    per = len([f for f in plan.layers if f.startswith("layers.")]) // len(plan.stages)
    sizes = [per] * len(plan.stages)
    sizes[0] += 1
    sizes[-1] += 1
    return dataclasses.replace(plan, stages=split(plan.layers, sizes))


def warnings_in(text: str) -> list[str]:
    return [line for line in text.splitlines() if "WARNING:" in line]


def megatron_args(text: str) -> dict[str, str | bool]:
    body = text.split("MESHPLAN_ARGS=(", 1)[1].split(")", 1)[0]
    tokens = shlex.split(body)
    args: dict[str, str | bool] = {}
    for i, tok in enumerate(tokens):
        if tok.startswith("--"):
            nxt = tokens[i + 1] if i + 1 < len(tokens) else "--"
            args[tok] = True if nxt.startswith("--") else nxt
    return args


@pytest.mark.parametrize("name", list(PLANS))
def test_torchtitan(name):
    plan: Plan = PLANS[name]()
    files = export_plan(plan, "torchtitan", "0.2")
    cfg = tomllib.loads(files["meshplan.toml"])
    par, tr = cfg["parallelism"], cfg["training"]
    mesh = (
        par["pipeline_parallel_degree"],
        par["data_parallel_replicate_degree"],
        par["data_parallel_shard_degree"],
        par["context_parallel_degree"],
        par["tensor_parallel_degree"],
    )
    if ddp_beside_model_parallel(plan):  # torchtitan's DDP takes a 1-D mesh: the replicas become FSDP2 shards
        pp, dp_replicate, _, cp, tp = plan.mesh_shape
        assert mesh == (pp, 1, dp_replicate, cp, tp) and par["fsdp_reshard_after_forward"] == "never"
        assert "torchtitan runs DDP on a 1-D mesh only" in files["meshplan.toml"]
    else:
        assert mesh == plan.mesh_shape
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    accumulation = tr["global_batch_size"] // (tr["local_batch_size"] * dp)
    micro = par.get("pipeline_parallel_microbatch_size", tr["local_batch_size"])
    microbatches = tr["local_batch_size"] // micro * accumulation
    assert tr["global_batch_size"] == plan.global_batch_size == micro * microbatches * dp
    assert (micro, microbatches) == (plan.microbatch_size, plan.num_microbatches)
    if plan.pipeline_parallel_degree > 1:
        parts = par["module_fqns_per_model_part"]
        assert len(parts) == len(plan.stages) and [len(p) for p in parts[1:-1]] == [len(s) for s in plan.stages[1:-1]]
        assert parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
        assert par["pipeline_parallel_schedule"] == plan.pipeline_schedule
    # the Python config function sets the same values on a JobConfig-like object
    job = SimpleNamespace(**{section: SimpleNamespace() for section in cfg})
    namespace: dict = {}
    exec(files["meshplan_config.py"], namespace)  # noqa: S102 - our own generated code
    namespace["meshplan_config"](job)
    for section, values in cfg.items():
        assert vars(getattr(job, section)) == values


@pytest.mark.parametrize("name", list(PLANS))
def test_megatron(name):
    plan: Plan = PLANS[name]()
    args = megatron_args(export_plan(plan, "megatron")["megatron_args.sh"])
    tp, pp = int(args["--tensor-model-parallel-size"]), int(args["--pipeline-model-parallel-size"])
    cp = int(args["--context-parallel-size"])
    assert (tp, pp, cp) == (plan.tensor_parallel_degree, plan.pipeline_parallel_degree, plan.context_parallel_degree)
    dp = plan.world_size // (tp * pp * cp)  # what Megatron derives
    micro, global_batch = int(args["--micro-batch-size"]), int(args["--global-batch-size"])
    assert global_batch == plan.global_batch_size == micro * plan.num_microbatches * dp
    assert int(args["--num-layers"]) == sum(1 for f in plan.layers if f.startswith("layers."))
    assert ("--sequence-parallel" in args) == (plan.sequence_parallel and tp > 1)


def test_megatron_expresses_even_interleaving_and_block_recompute():
    plan = known_gpt(dataclasses.replace(PLANS["even_interleaved"](), runtime="megatron-lm"))  # no warning
    text = export_plan(plan, "megatron")["megatron_args.sh"]
    args = megatron_args(text)
    assert args["--num-layers-per-virtual-pipeline-stage"] == "2"
    assert args["--recompute-granularity"] == "full" and args["--recompute-method"] == "uniform"
    assert warnings_in(text) == []
    block = even_blocks(gpt_plan(pp=2, blocks=8, recompute="none"))
    block.recompute = {f: "full" for stage in block.stages for f in [x for x in stage if x.startswith("layers.")][:2]}
    args = megatron_args(export_plan(block, "megatron")["megatron_args.sh"])
    assert (args["--recompute-method"], args["--recompute-num-layers"]) == ("block", "2")


def test_megatron_carries_the_plans_recompute_num_layers(tmp_path):
    """--recompute-num-layers N of a uniform full-recompute plan reaches the Megatron export, also
    after a save and load; a plan written before the field existed loads with 1."""
    plan = dataclasses.replace(gpt_plan(pp=1, blocks=8, recompute="full"), recompute_num_layers=4)
    path = tmp_path / "plan.json"
    schema.save(plan, path)
    loaded = schema.load(Plan, path, "plan")
    args = megatron_args(export_plan(loaded, "megatron")["megatron_args.sh"])
    assert (args["--recompute-method"], args["--recompute-num-layers"]) == ("uniform", "4")
    data = json.loads(path.read_text())
    del data["recompute_num_layers"]
    path.write_text(json.dumps(data))
    old = schema.load(Plan, path, "plan")
    assert old.recompute_num_layers == 1
    assert megatron_args(export_plan(old, "megatron")["megatron_args.sh"])["--recompute-num-layers"] == "1"


@pytest.mark.parametrize("name", list(PLANS))
def test_deepspeed(name):
    plan: Plan = PLANS[name]()
    files = export_plan(plan, "deepspeed")
    cfg = json.loads(files["ds_config.json"])
    dp = plan.world_size // (plan.tensor_parallel_degree * plan.pipeline_parallel_degree)
    assert plan.context_parallel_degree == 1  # fixtures; DeepSpeed has no cp axis in the config
    assert cfg["train_batch_size"] == plan.global_batch_size
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * dp
    assert cfg["zero_optimization"]["stage"] == plan.zero_stage
    assert ("offload_optimizer" in cfg["zero_optimization"]) == (plan.dp_methods.offload.name == "cpu")
    # AutoTP for a plain model; inside a PipelineModule the topology's model axis carries tp
    tp_in_config = plan.tensor_parallel_degree if plan.pipeline_parallel_degree == 1 else 1
    assert cfg.get("tensor_parallel", {}).get("autotp_size", 1) == tp_in_config
    launch = files["launch_deepspeed.sh"]
    nodes = int(re.search(r"--num_nodes (\d+)", launch)[1])
    gpus = int(re.search(r"--num_gpus (\d+)", launch)[1])
    assert nodes * gpus == plan.world_size
    if plan.pipeline_parallel_degree > 1:
        assert "pipeline_module" in launch
        assert f"PIPELINE_PARALLEL_SIZE = {plan.pipeline_parallel_degree}" in files["meshplan_deepspeed.py"]


@pytest.mark.parametrize("name", list(PLANS))
def test_accelerate(name):
    plan: Plan = PLANS[name]()
    files = export_plan(plan, "accelerate")
    cfg = yaml.safe_load(files["accelerate_config.yaml"])
    assert cfg["num_processes"] == plan.world_size
    deepspeed = (plan.runtime == "deepspeed" or plan.zero_stage == 1) and plan.context_parallel_degree == 1
    assert (cfg["distributed_type"] == "DEEPSPEED") == deepspeed
    if deepspeed:  # the DeepSpeed plugin: the engine and its mesh in ds_config.json, none in the YAML
        ds = json.loads(files["ds_config.json"])
        assert cfg["deepspeed_config"]["deepspeed_config_file"] == "ds_config.json"
        assert "parallelism_config" not in cfg and "mixed_precision" not in cfg
        tp = ds.get("tensor_parallel", {}).get("autotp_size", 1)
        sizes = (plan.world_size // tp, 1, 1, tp)  # data parallel over all but the AutoTP groups
        micro, accumulation = ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]
        assert ds["train_batch_size"] == micro * accumulation * plan.world_size  # DeepSpeed's check, no mpu
        assert ds["zero_optimization"]["stage"] == plan.zero_stage
    else:
        par = cfg["parallelism_config"]
        sizes = (
            par["parallelism_config_dp_replicate_size"],
            par["parallelism_config_dp_shard_size"],
            par["parallelism_config_cp_size"],
            par["parallelism_config_tp_size"],
        )
    assert math.prod(sizes) == plan.world_size  # ParallelismConfig checks it against the processes
    pure_replication = plan.data_parallel_replicate_degree > 1 and plan.data_parallel_shard_degree == 1
    tp_refused = plan.tensor_parallel_degree * plan.context_parallel_degree > 1 and pure_replication and not deepspeed
    warns = "\n".join(warnings_in(files["accelerate_config.yaml"]))
    if plan.pipeline_parallel_degree == 1 and not tp_refused:
        dpr, dps, cp, tp = plan.mesh_shape[1:]
        assert (sizes[0] * sizes[1], sizes[2:]) == (dpr * dps, (cp, tp))
        if not deepspeed:
            assert sizes[:2] == (dpr, dps)
            expected = {0: "MULTI_GPU", 2: "FSDP", 3: "FSDP"}[plan.zero_stage]
            assert cfg["distributed_type"] == expected
            if expected == "FSDP":
                assert cfg["fsdp_config"]["fsdp_reshard_after_forward"] == (plan.zero_stage == 3)
    if tp_refused:
        assert "refused by accelerate's ParallelismConfig" in warns
    consts: dict = {}
    exec(files["accelerate_batch.py"], consts)  # noqa: S102 - our own generated code
    dp = sizes[0] * sizes[1]
    assert consts["GLOBAL_BATCH_SIZE"] == (
        consts["PER_DEVICE_TRAIN_BATCH_SIZE"] * consts["GRADIENT_ACCUMULATION_STEPS"] * dp
    )
    if plan.pipeline_parallel_degree == 1:
        assert consts["GLOBAL_BATCH_SIZE"] == plan.global_batch_size
    assert ("pipeline_parallel_degree" in warns) == (plan.pipeline_parallel_degree > 1)
    engine = ("deepspeed",) if deepspeed else ("meshplan", "torchtitan")  # the plugin runs DeepSpeed's engine
    assert ("prediction was made for runtime" in warns) == (plan.runtime not in engine)


@pytest.mark.parametrize("runtime", ["meshplan", "torchtitan", "deepspeed"])
@pytest.mark.parametrize("zero", [1, 3])
def test_accelerate_warns_when_its_engine_is_not_the_priced_one(runtime, zero):
    """A ZeRO-1 plan runs on accelerate's DeepSpeed plugin (FSDP2 has no ZeRO-1), so DeepSpeed's engine
    (16-bit weights and gradient reduction) runs a plan priced for meshplan's executor or torchtitan:
    the export says so and names --runtime deepspeed. A DeepSpeed-priced plan is what the plugin runs;
    a ZeRO-3 plan of torch's runtimes runs on FSDP2, as priced."""
    data = dict(dp_replicate=8, dp_shard=1) if zero == 1 else dict(dp_replicate=1, dp_shard=8)
    plan = dataclasses.replace(gpt_plan(pp=1, tp=1, zero=zero, **data), runtime=runtime)
    files = export_plan(plan, "accelerate")
    warns = [w for w in warnings_in(files["accelerate_config.yaml"]) if "prediction was made for runtime" in w]
    on_deepspeed = zero == 1 or runtime == "deepspeed"
    assert yaml.safe_load(files["accelerate_config.yaml"])["distributed_type"] == (
        "DEEPSPEED" if on_deepspeed else "FSDP"
    )
    if on_deepspeed and runtime != "deepspeed":
        assert len(warns) == 1 and "on deepspeed's engine" in warns[0] and "--runtime deepspeed" in warns[0]
        assert f"runtime {runtime};" in warns[0]
    else:
        assert warns == []


def test_accelerate_drops_the_pipeline_engines_settings():
    """A DeepSpeed pipeline plan priced sending whole boundaries writes pipeline.pipe_partitioned false for
    DeepSpeed's pipeline engine; accelerate runs no PipelineModule (the pipeline ranks become data parallel),
    so its ds_config.json carries none of it."""
    plan = dataclasses.replace(gpt_plan(pp=2, dp_replicate=2, tp=2, zero=1), runtime="deepspeed")
    plan = dataclasses.replace(plan, runtime_behaviours={**plan.runtime_behaviours, "pp_scatter_gather": False})
    assert json.loads(export_plan(plan, "deepspeed")["ds_config.json"])["pipeline"]["pipe_partitioned"] is False
    ds = json.loads(export_plan(plan, "accelerate")["ds_config.json"])
    assert "pipeline" not in ds and "activation_checkpointing" not in ds


def test_what_cannot_be_expressed_is_said_in_every_output():
    plan = uneven_plan()  # uneven stages, per-layer recompute, PowerSGD
    for target in EXPORT_TARGETS:
        text = "\n".join(export_plan(plan, target).values())
        warns = "\n".join(warnings_in(text))
        assert "powersgd" in warns, target
        assert "recompute" in warns, target
    # Megatron-Core takes the boundaries as an explicit layout (E embedding, t block, L output and loss)
    assert megatron_args(export_plan(plan, "megatron")["megatron_args.sh"])["--pipeline-model-parallel-layout"] == (
        "Et*4|t*3|t*3|t*2L"
    )
    # DeepSpeed's PipelineModule is built on them (pipeline_module: the plan's parts), so it does not warn either
    deepspeed_files = export_plan(plan, "deepspeed")
    assert "uneven" not in deepspeed_files["launch_deepspeed.sh"]
    assert "LAYERS_PER_STAGE = [8, 6]" in deepspeed_files["meshplan_deepspeed.py"]  # each rank's two stages
    # torchtitan expresses uneven boundaries exactly, so it does not warn about them
    toml_text = export_plan(plan, "torchtitan", "0.2")["meshplan.toml"]
    assert "uneven" not in toml_text
    assert [len(p) for p in tomllib.loads(toml_text)["parallelism"]["module_fqns_per_model_part"]] == [5, 3, 3, 4]


def test_megatron_counts_embedding_and_loss_when_that_makes_stages_even():
    plan = gpt_plan(pp=4, dp_replicate=1, blocks=6, recompute="none")
    plan = dataclasses.replace(
        plan,
        stages=split(plan.layers, [2, 2, 2, 2]),  # blocks per stage [1, 2, 2, 1]
        runtime="megatron-core",
    )
    text = export_plan(known_gpt(plan), "megatron")["megatron_args.sh"]
    args = megatron_args(text)
    assert args["--account-for-embedding-in-pipeline-split"] is True and warnings_in(text) == []


def test_megatron_warns_when_interleaving_needs_divisible_microbatches():
    plan = even_blocks(
        gpt_plan(
            pp=2,
            dp_replicate=2,
            tp=2,
            num_microbatches=5,
            schedule="Interleaved1F1B",
            virtual=2,
            blocks=8,
            recompute="full",
        )
    )
    text = export_plan(plan, "megatron")["megatron_args.sh"]
    assert any("divisible by pp=2" in w for w in warnings_in(text))
    assert not any(
        "divisible" in w for w in warnings_in(export_plan(PLANS["even_interleaved"](), "megatron")["megatron_args.sh"])
    )


def test_every_k_th_block_recompute_maps_to_torchtitan_selective_k():
    plan = gpt_plan(blocks=8, recompute="none")
    plan.recompute = {f"layers.{i}": "full" for i in (1, 3, 5, 7)}
    ac = tomllib.loads(export_plan(plan, "torchtitan", "0.2")["meshplan.toml"])["activation_checkpoint"]
    assert ac == {"mode": "selective", "selective_ac_option": "2"}


def test_non_transformer_warns():
    plan = gpt_plan(pp=2, blocks=4)
    names = ["stem"] + [f"stage{i}" for i in range(4)] + ["fc"]
    plan = dataclasses.replace(plan, layers=names, stages=[names[:3], names[3:]], recompute={})
    assert any("transformer" in w for w in warnings_in(export_plan(plan, "megatron")["megatron_args.sh"]))
    parts = tomllib.loads(export_plan(plan, "torchtitan", "0.2")["meshplan.toml"])["parallelism"][
        "module_fqns_per_model_part"
    ]
    assert parts == [names[:3], names[3:]]


def test_unknown_target_names_the_choices():
    with pytest.raises(MeshplanError, match="torchtitan, megatron, deepspeed, accelerate"):
        export_plan(gpt_plan(), "colossalai")
    assert set(export_plan(gpt_plan(), "Megatron-LM")) == {"megatron_args.sh"}


def test_exports_are_deterministic():
    for target in EXPORT_TARGETS:
        assert export_plan(searched_plan(), target) == export_plan(searched_plan(), target)


def test_torchtitan_writes_the_current_release_unless_asked_for_0_2(tmp_path):
    plan = PLANS["pipeline"]()
    assert set(export_plan(plan, "torchtitan")) == {"meshplan_torchtitan.py", "run_torchtitan.sh"}
    assert set(export_plan(plan, "torchtitan", "0.3")) == set(export_plan(plan, "torchtitan"))
    assert "meshplan.toml" in export_plan(plan, "torchtitan", "0.2")
    with pytest.raises(MeshplanError, match="only the torchtitan export has versions"):
        export_plan(plan, "megatron", "0.2")
    path = tmp_path / "plan.json"
    schema.save(plan, path)
    from meshplan.cli import main

    assert main(["export", str(path), "--to", "torchtitan", "--target-version", "0.2", "-q", "-o", str(tmp_path)]) == 0
    assert (tmp_path / "meshplan.toml").exists()
    text = export_plan(plan, "torchtitan")["meshplan_torchtitan.py"]
    assert "def meshplan():" in text and "--module meshplan_torchtitan --config meshplan" in text
    compile(text, "meshplan_torchtitan.py", "exec")  # valid Python


def test_torchtitan_names_a_shipped_model_with_its_flavour():
    from meshplan.report.export_torchtitan import shipped_model

    llama = dataclasses.replace(
        gpt_plan(blocks=32),
        model_family="llama",
        model_config={"hidden": 4096, "heads": 32, "kv_heads": 8, "ffn_hidden": 14336, "vocab": 128256},
    )
    assert shipped_model(llama) == ("llama3", "8B")
    toml_text = export_plan(llama, "torchtitan", "0.2")["meshplan.toml"]
    assert tomllib.loads(toml_text)["model"] == {"name": "llama3", "flavor": "8B"}
    assert "llama3_8b()" in export_plan(llama, "torchtitan")["meshplan_torchtitan.py"]
    other = dataclasses.replace(llama, model_config={**llama.model_config, "ffn_hidden": 11008})
    assert shipped_model(other) is None
    assert (
        "torchtitan ships no model of this architecture" in export_plan(other, "torchtitan")["meshplan_torchtitan.py"]
    )
    assert shipped_model(known_gpt(gpt_plan(blocks=32))) is None  # GPT: LayerNorm, GELU, learned positions


def hf_llama_plan(**facts) -> Plan:
    """A plan of hf:meta-llama/Llama-3.1-8B as the profile records it: family hf, the shape in model_config, the
    architecture in model_architecture (with `facts` changed)."""
    from meshplan.models.analytic import llama_architecture

    return dataclasses.replace(
        gpt_plan(blocks=32),
        model_name="hf:meta-llama/Llama-3.1-8B",
        model_family="hf",
        model_config={"layers": 32, "hidden": 4096, "heads": 32, "vocab": 128256, "seq": 8192},
        model_architecture=dataclasses.replace(llama_architecture(8, 14336), **facts),
    )


def test_a_recorded_hf_architecture_is_exported():
    """An HF Llama's recorded architecture: torchtitan's llama3 8B, and Megatron's Llama flags."""
    from meshplan.report.export_torchtitan import shipped_model

    plan = hf_llama_plan()
    assert shipped_model(plan) == ("llama3", "8B")
    args = megatron_args(export_plan(plan, "megatron")["megatron_args.sh"])
    for flag in ("--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights"):
        assert args[flag] is True
    assert (args["--num-query-groups"], args["--ffn-hidden-size"], args["--rotary-base"]) == ("8", "14336", "500000")
    assert (args["--normalization"], args["--position-embedding-type"]) == ("RMSNorm", "rope")
    assert "WARNING: the plan does not record" not in export_plan(plan, "megatron")["megatron_args.sh"]
    # what torchtitan's llama3 is not: another model type, per-head q/k norms, another rotary base
    for facts in ({"model_type": "mistral"}, {"qk_norm": True}, {"rope_theta": 10000.0}):
        assert shipped_model(hf_llama_plan(**facts)) is None, facts
    assert "--qk-layernorm" in export_plan(hf_llama_plan(qk_norm=True), "megatron")["megatron_args.sh"]
    geglu = export_plan(hf_llama_plan(activation="geglu"), "megatron")["megatron_args.sh"]
    assert "WARNING: the MLP's geglu has no Megatron flag" in geglu and "--swiglu" not in megatron_args(geglu)


def test_an_unrecorded_architecture_is_said_so():
    """An HF model meshplan cannot name (Qwen2's q/k/v biases, GPT-NeoX's parallel blocks), or a plan written before
    model_architecture, keeps only its shape: the exports say the architecture is not recorded (so torchtitan's own
    Llama cannot be matched and Megatron would build its default GPT), not that it is none."""
    hf = dataclasses.replace(
        gpt_plan(blocks=32),
        model_name="hf:meta-llama/Llama-3.1-8B",
        model_family="hf",
        model_config={"layers": 32, "hidden": 4096, "heads": 32, "vocab": 128256, "seq": 8192},
    )
    titan = export_plan(hf, "torchtitan")["meshplan_torchtitan.py"]
    assert "does not record the decoder architecture of hf:meta-llama/Llama-3.1-8B" in titan
    assert "torchtitan ships no model" not in titan
    megatron = export_plan(hf, "megatron")["megatron_args.sh"]
    assert "Megatron builds its default GPT" in megatron and "--swiglu" not in megatron

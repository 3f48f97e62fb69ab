"""`meshplan estimate --import` / `plan --import`: configs of DeepSpeed, accelerate, torchtitan and Megatron read
back as options; an export read back predicts the plan's step time (within 0.5%) wherever the target expresses
the whole plan; hand-written configs (tests/fixtures/imports) predict what they say."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from pathlib import Path

import pytest
import yaml
from export_plans import PLAN_ARGS, make_plan

from meshplan.cli import main
from meshplan.errors import MeshplanError
from meshplan.imports import read_config
from meshplan.report import export_plan

FIXTURES = Path(__file__).parent / "fixtures" / "imports"
MAIN_FILE = {
    "deepspeed": "ds_config.json",
    "accelerate": "accelerate_config.yaml",
    "megatron": "megatron_args.sh",
    "torchtitan": "meshplan_torchtitan.py",
    "torchtitan-0.2": "meshplan.toml",
}
RUNTIME_LINE = "the prediction was made for runtime"


def run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def estimate(path: Path, tmp: Path, *flags: str) -> float:
    plan = tmp / f"estimate-{path.parent.name}-{path.stem}.json"
    code, _, err = run(["estimate", "--import", str(path), *flags, "-q", "-o", str(plan)])
    assert code == 0, err
    return json.loads(plan.read_text())["prediction"]["step_time_s"]


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    out = tmp_path_factory.mktemp("plans")
    return {name: make_plan(name, out) for name in PLAN_ARGS}


def test_an_export_read_back_predicts_the_plan(plans, tmp_path):
    """Every (plan, target) whose export has no WARNING but the runtime line (its `meshplan estimate --import`
    line names the plan's runtime) predicts the same step time as the plan within 0.5%."""
    checked = []
    for name, plan in plans.items():
        for target, fname in MAIN_FILE.items():
            files = export_plan(plan, *target.split("-"))
            warns = [x for t in files.values() for x in t.splitlines() if "WARNING:" in x and RUNTIME_LINE not in x]
            if warns:
                continue
            folder = tmp_path / name / target
            folder.mkdir(parents=True)
            for f, text in files.items():
                (folder / f).write_text(text)
            got = estimate(folder / fname, tmp_path)
            assert got == pytest.approx(plan.prediction.step_time_s, rel=0.005), (name, target)
            checked.append((name, target))
    # which exports express their plan whole follows the plans the planner makes (ten of the forty-five
    # of late); every target has at least one
    assert {t for _, t in checked} == set(MAIN_FILE), checked


def test_what_an_export_reads_back_as(plans, tmp_path):
    plan = plans["gpt3-175b-1024xa100"]
    folder = tmp_path / "mg"
    folder.mkdir()
    for f, text in export_plan(plan, "megatron").items():
        (folder / f).write_text(text)
    got = read_config(str(folder / "megatron_args.sh")).values
    assert (got["tp"], got["pp"], got["dp"]) == (
        plan.tensor_parallel_degree, plan.pipeline_parallel_degree, plan.data_parallel_degree,
    )  # fmt: skip
    assert (got["virtual_stages"], got["schedule"]) == (plan.virtual_stages, "interleaved") and plan.virtual_stages > 1
    assert (got["microbatch"], got["global_batch"], got["num_gpus"], got["cluster"]) == (
        plan.microbatch_size, 1536, 1024, "a100-80g",
    )  # fmt: skip
    assert got["zero"] == min(plan.zero_stage, 1)  # ZeRO-1/2: Megatron's distributed optimizer
    if plan.data_parallel_replicate_degree > 1 and plan.data_parallel_shard_degree > 1:  # partial distributed optimizer
        notes = read_config(str(folder / "megatron_args.sh")).notes
        assert any("--num-distributed-optimizer-instances" in note for note in notes), notes
    assert got["model"] == "analytic:gpt" and "layers=96" in got["overrides"]


def test_accelerate_tensor_parallel_reads_back_without_sequence_parallel(plans, tmp_path):
    """accelerate's TP is the model's transformers tp_plan, or on the DeepSpeed plugin (this plan) DeepSpeed's
    AutoTP from ds_config.json; both keep norm activations replicated: a TP export is predicted without sequence
    parallelism, as it would run."""
    for f, text in export_plan(plans["llama3-8b-tp2-deepspeed"], "accelerate").items():
        (tmp_path / f).write_text(text)
    got = read_config(str(tmp_path / "accelerate_config.yaml")).values
    assert (got["tp"], got["sequence_parallel"]) == (2, False)


def test_accelerate_deepspeed_plugin_reads_its_config_file(plans, tmp_path):
    """A --runtime deepspeed plan goes to accelerate's DeepSpeed plugin with ds_config.json beside the YAML: read
    back, the stage and engine settings are the file's (here ZeRO-2, a 2e8 bucket, the reduce-scatter, no
    overlap), and the estimate is the plan's."""
    plan = plans["gpt3-1.3b-zero2-buckets-deepspeed"]
    files = export_plan(plan, "accelerate")
    assert "ds_config.json" in files and "deepspeed_config_file: ds_config.json" in files["accelerate_config.yaml"]
    for f, text in files.items():
        (tmp_path / f).write_text(text)
    got = read_config(str(tmp_path / "accelerate_config.yaml")).values
    assert (got["zero"], got["dp"], got["dp_shard"], got["tp"], got["runtime"]) == (2, 8, 8, 1, "deepspeed")
    assert estimate(tmp_path / "accelerate_config.yaml", tmp_path) == pytest.approx(plan.prediction.step_time_s)
    # a hand-written one (no meshplan header): the engine settings are read from the file it names
    (tmp_path / "foreign").mkdir()
    ds = json.loads(files["ds_config.json"])
    (tmp_path / "foreign" / "engine.json").write_text(json.dumps(ds))
    cfg = yaml.safe_load(files["accelerate_config.yaml"])
    cfg["deepspeed_config"]["deepspeed_config_file"] = "engine.json"
    (tmp_path / "foreign" / "acc.yaml").write_text(yaml.safe_dump(cfg))
    got = read_config(str(tmp_path / "foreign" / "acc.yaml")).values
    assert (got["zero"], got["overlap_dp_comm"], got["reduce_bucket_elems"]) == (2, False, 200_000_000)
    assert (got["zero2_grad_collective"], got["precision"], got["runtime"]) == ("reduce_scatter", "bf16", "deepspeed")
    ds["tensor_parallel"] = {"autotp_size": 2}
    (tmp_path / "foreign" / "engine.json").write_text(json.dumps(ds))
    got = read_config(str(tmp_path / "foreign" / "acc.yaml")).values
    assert (got["tp"], got["dp"]) == (2, 4)
    (tmp_path / "foreign" / "engine.json").unlink()
    with pytest.raises(MeshplanError, match="deepspeed_config_file engine.json is not readable"):
        read_config(str(tmp_path / "foreign" / "acc.yaml"))


def test_nvme_offload_reads_back(plans, tmp_path):
    """DeepSpeed's NVMe offload (ZeRO-Infinity) is meshplan's offload=nvme, params=true when offload_param swaps
    the parameters too; it was read back as no offload at all (a fraction of the step time)."""
    plan = plans["gpt3-13b-zero3-nvme-deepspeed"]
    for f, text in export_plan(plan, "deepspeed").items():
        (tmp_path / f).write_text(text)
    got = read_config(str(tmp_path / "ds_config.json")).values
    assert (got["zero"], got["offload"]) == (3, "nvme:params=true")
    # within 1%: the export's one WARNING is sequence parallelism, which DeepSpeed's AutoTP does not run (+0.7%)
    assert estimate(tmp_path / "ds_config.json", tmp_path) == pytest.approx(plan.prediction.step_time_s, rel=0.01)
    config = json.loads((tmp_path / "ds_config.json").read_text())
    del config["zero_optimization"]["offload_param"]
    (tmp_path / "ds_config.json").write_text(json.dumps(config))
    assert read_config(str(tmp_path / "ds_config.json")).values["offload"] == "nvme"
    fsdp = yaml.safe_load((FIXTURES / "accelerate_fsdp.yaml").read_text())
    ds = {"zero_stage": 3, "offload_optimizer_device": "nvme", "offload_param_device": "nvme"}
    (tmp_path / "acc.yaml").write_text(
        yaml.safe_dump({**fsdp, "distributed_type": "DEEPSPEED", "deepspeed_config": ds})
    )
    assert read_config(str(tmp_path / "acc.yaml")).values["offload"] == "nvme:params=true"


def test_hand_written_megatron_script():
    got = read_config(str(FIXTURES / "pretrain_llama3_8b.sh")).values
    assert (got["tp"], got["pp"], got["dp"], got["num_gpus"]) == (2, 2, 4, 16)
    assert (got["microbatch"], got["global_batch"], got["recompute"], got["zero"]) == (1, 64, "selective", 1)
    assert got["model"] == "analytic:llama" and {"kv_heads=8", "ffn_hidden=14336", "layers=32"} <= set(got["overrides"])
    assert got["sequence_parallel"] and got["precision"] == "bf16" and got["runtime"] == "megatron-core"


def test_deepspeed_batch_is_completed_as_deepspeed_does(tmp_path):
    """DeepSpeed fills in the one of train_batch_size, micro and accumulation a config leaves out from the other two
    and the data-parallel size: so does the import, with --num-gpus; "auto" leaves the batch to the flags."""
    zero = {"zero_optimization": {"stage": 2}}
    cases = [
        ({"train_batch_size": 256, "train_micro_batch_size_per_gpu": 4}, (8, 4, 256)),  # accumulation 8
        ({"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8}, (8, 4, 256)),
        ({"train_batch_size": 256, "gradient_accumulation_steps": 8}, (8, 4, 256)),
        ({"train_batch_size": 64}, (8, 8, 64)),
    ]
    for i, (batch, expected) in enumerate(cases):
        (tmp_path / f"ds{i}.json").write_text(json.dumps({**batch, **zero}))
        got = read_config(str(tmp_path / f"ds{i}.json"), world=8).values
        assert (got["dp"], got["microbatch"], got["global_batch"]) == expected, batch
    (tmp_path / "bad.json").write_text(json.dumps({**cases[0][0], "gradient_accumulation_steps": 2, **zero}))
    with pytest.raises(MeshplanError, match=r"256 is not micro 4 x accumulation 2 x dp 8"):
        read_config(str(tmp_path / "bad.json"), world=8)
    auto = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", **zero}
    (tmp_path / "auto.json").write_text(json.dumps(auto))
    imported = read_config(str(tmp_path / "auto.json"), world=8)
    assert "microbatch" not in imported.values and "give --microbatch and --global-batch" in imported.notes[-1]
    gpt = ["--model", "analytic:gpt", "--set", "layers=4", "hidden=256", "heads=4", "seq=128", "--cluster", "a100-80g"]
    assert (
        estimate(tmp_path / "auto.json", tmp_path, *gpt, "--num-gpus", "8", "--microbatch", "2", "--global-batch", "64")
        > 0
    )


def test_accelerate_fsdp1_sharding_strategies(tmp_path):
    """accelerate's FSDP1 configs name a sharding strategy (fsdp_reshard_after_forward, or the older
    fsdp_sharding_strategy, by name or number) where FSDP2's say true/false: ZeRO-2 for SHARD_GRAD_OP, and
    HYBRID_SHARD shards within each machine and replicates across them."""
    base = yaml.safe_load((FIXTURES / "accelerate_fsdp.yaml").read_text())
    cases = {
        "SHARD_GRAD_OP": (2, 16, 16),
        "FULL_SHARD": (3, 16, 16),
        "HYBRID_SHARD": (3, 16, 8),
        "HYBRID_SHARD_ZERO2": (2, 16, 8),
        4: (3, 16, 8),  # fsdp_sharding_strategy's number for HYBRID_SHARD
    }
    for strategy, (zero, dp, dp_shard) in cases.items():
        key = "fsdp_sharding_strategy" if isinstance(strategy, int) else "fsdp_reshard_after_forward"
        fsdp = {"fsdp_version": 1, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP", key: strategy}
        (tmp_path / "fsdp1.yaml").write_text(
            yaml.safe_dump({**base, "num_machines": 2, "num_processes": 16, "fsdp_config": fsdp})
        )
        got = read_config(str(tmp_path / "fsdp1.yaml")).values
        assert (got["zero"], got["dp"], got["dp_shard"]) == (zero, dp, dp_shard), strategy


def test_megatron_script_with_shell_variables(tmp_path):
    """Launch scripts set their sizes in shell variables (N=8, ${PP:-2}, $((a*b))) and pass them in arrays: read
    after substituting them, the launch line's world included; --num-gpus overrides that world."""
    path = FIXTURES / "train_llama3_70b_vars.sh"
    got = read_config(str(path)).values
    assert (got["tp"], got["pp"], got["cp"], got["dp"], got["num_gpus"]) == (4, 2, 1, 4, 32)
    assert (got["microbatch"], got["global_batch"], got["recompute"], got["recompute_num_layers"]) == (
        1,
        128,
        "full",
        1,
    )
    assert (got["precision"], got["zero"], got["sequence_parallel"]) == ("fp8", 1, True)
    assert got["model"] == "analytic:llama" and {"layers=80", "hidden=8192", "kv_heads=8"} <= set(got["overrides"])
    assert read_config(str(path), world=64).values["dp"] == 8
    assert estimate(path, tmp_path, "--cluster", "h100-80g") > 0
    (tmp_path / "no_world.sh").write_text(path.read_text().replace("--nnodes $NUM_NODES", "--nnodes $NODES"))
    with pytest.raises(MeshplanError, match="no world size .* give --num-gpus"):
        read_config(str(tmp_path / "no_world.sh"))


def test_deepspeed_reduction_settings_read_with_deepspeed_defaults(tmp_path):
    """overlap_comm (DeepSpeed's default: off at ZeRO-1/2, on at ZeRO-3), reduce_bucket_size and
    use_multi_rank_bucket_allreduce false become the behaviours that price them, and the prediction moves
    with them: overlap off costs time, a reduce-scatter instead of the bucket all-reduce saves it."""
    batch = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4}
    configs = {
        "default2": {"stage": 2},
        "overlap2": {"stage": 2, "overlap_comm": True},
        "tuned2": {
            "stage": 2,
            "overlap_comm": True,
            "reduce_bucket_size": 100000000,
            "use_multi_rank_bucket_allreduce": False,
        },
        "default3": {"stage": 3},
    }
    got = {}
    for name, zero in configs.items():
        (tmp_path / f"{name}.json").write_text(json.dumps({**batch, "zero_optimization": zero}))
        got[name] = read_config(str(tmp_path / f"{name}.json"), world=16).values
    assert got["default2"]["overlap_dp_comm"] is False and got["overlap2"]["overlap_dp_comm"] is True
    assert "overlap_dp_comm" not in got["default3"]  # the runtime's own (on), as DeepSpeed's default
    assert (got["tuned2"]["reduce_bucket_elems"], got["tuned2"]["zero2_grad_collective"]) == (
        100000000,
        "reduce_scatter",
    )
    assert "reduce_bucket_elems" not in got["overlap2"] and "zero2_grad_collective" not in got["overlap2"]
    gpt = ["--model", "analytic:gpt", "--set", "layers=24", "hidden=2048", "heads=16", "--cluster", "a100-80g"]
    step = {name: estimate(tmp_path / f"{name}.json", tmp_path, *gpt, "--num-gpus", "16") for name in configs}
    assert step["default2"] > step["overlap2"] > step["tuned2"]


def test_hand_written_deepspeed_accelerate_torchtitan(tmp_path):
    ds = read_config(str(FIXTURES / "ds_zero2.json")).values
    assert (ds["dp"], ds["microbatch"], ds["global_batch"], ds["zero"], ds["dp_shard"]) == (8, 4, 256, 2, 8)
    acc = read_config(str(FIXTURES / "accelerate_fsdp.yaml")).values
    assert (acc["dp"], acc["dp_shard"], acc["zero"], acc["recompute"], acc["num_gpus"]) == (8, 8, 3, "full", 8)
    toml = read_config(str(FIXTURES / "llama3_8b.toml"), world=8).values
    assert (toml["dp"], toml["dp_shard"], toml["zero"], toml["recompute"], toml["microbatch"]) == (
        8,
        8,
        3,
        "selective",
        1,
    )
    assert toml["global_batch"] == 8 and toml["model"] == "analytic:llama"
    py = read_config(str(FIXTURES / "titan_config_registry.py"), world=64).values
    assert (py["tp"], py["dp"], py["dp_shard"], py["microbatch"], py["global_batch"]) == (8, 8, 8, 8, 64)
    assert py["recompute"] == "full" and "layers=80" in py["overrides"]
    # each predicts from the command line (the model where the file names none)
    gpt = ["--model", "analytic:gpt", "--set", "layers=24", "hidden=2048", "heads=16", "seq=2048"]
    assert estimate(FIXTURES / "ds_zero2.json", tmp_path, *gpt, "--cluster", "a100-80g") > 0
    assert estimate(FIXTURES / "accelerate_fsdp.yaml", tmp_path, *gpt, "--microbatch", "2", "--global-batch", "32",
                    "--cluster", "a100-80g") > 0  # fmt: skip
    assert estimate(FIXTURES / "llama3_8b.toml", tmp_path, "--cluster", "h100-80g", "--num-gpus", "8") > 0
    assert estimate(FIXTURES / "titan_config_registry.py", tmp_path, "--cluster", "h100-80g", "--num-gpus", "64") > 0
    assert estimate(FIXTURES / "pretrain_llama3_8b.sh", tmp_path, "--cluster", "h100-80g") > 0


def test_torchtitan_config_function(tmp_path):
    """A config_registry module holds many configs: the one torchtitan's --config names (the file's own, or
    FILE:FUNCTION), after the functions it builds on; never a mix of them all."""
    path = FIXTURES / "titan_config_registry.py"
    tp4 = read_config(f"{path}:my_70b_tp4", world=64).values
    assert (tp4["tp"], tp4["dp"], tp4["microbatch"], tp4["global_batch"], tp4["recompute"]) == (4, 16, 4, 64, "full")
    assert "layers=80" in tp4["overrides"]  # my_70b's model_registry("70B")
    assert read_config(str(path), world=64).values["tp"] == 8  # the module's docstring names --config my_70b
    (tmp_path / "two.py").write_text(path.read_text().replace("--config", "config"))
    with pytest.raises(MeshplanError, match="several config functions .* --import .*:FUNCTION"):
        read_config(str(tmp_path / "two.py"), world=64)
    with pytest.raises(MeshplanError, match="no function 'nope'"):
        read_config(f"{path}:nope", world=64)


def test_a_flag_overrides_the_file(tmp_path):
    base = estimate(FIXTURES / "pretrain_llama3_8b.sh", tmp_path, "--cluster", "h100-80g")
    assert estimate(FIXTURES / "pretrain_llama3_8b.sh", tmp_path, "--cluster", "h100-80g", "--recompute", "full") > base


def test_plan_import_reports_the_speedup(plans, tmp_path):
    plan = plans["gpt3-1.3b-zero2-deepspeed"]  # its DeepSpeed export expresses the whole plan
    for f, text in export_plan(plan, "deepspeed").items():
        (tmp_path / f).write_text(text)
    code, out, err = run(["plan", "--import", str(tmp_path / "ds_config.json"), "-q"])
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("the imported deepspeed configuration"))
    theirs, ours = (float(x) for x in __import__("re").findall(r"([\d.]+) s/step", line))
    assert theirs == pytest.approx(plan.prediction.step_time_s, rel=0.005)
    assert ("as fast as" in line) if ours >= theirs else (f"{theirs / ours:.2f}x as fast" in line)


def test_import_errors_are_one_line(tmp_path):
    code, _, err = run(["estimate", "--import", str(tmp_path / "missing.json"), "-q"])
    assert code == 2 and "no such file" in err and "Traceback" not in err
    code, _, err = run(["estimate", "--import", str(FIXTURES / "ds_zero2.json"), "-q"])
    assert code == 2 and "names no model; give --model" in err
    (tmp_path / "notes.txt").write_text("hello")
    code, _, err = run(["estimate", "--import", str(tmp_path / "notes.txt"), "-q"])
    assert code == 2 and "not a DeepSpeed JSON" in err


def test_llm_foundry_yaml(tmp_path):
    """An llm-foundry YAML: the MPT shape through its ${...} references, the batch, FULL_SHARD without
    checkpointing, --runtime llm-foundry; the GPUs from --num-gpus. Predicted as the same row given as
    flags (tests/test_llm_foundry_runtime.py: the published MPT-1B run on 64 A100 40 GB)."""
    path = FIXTURES / "mpt_1b_foundry.yaml"
    got = read_config(str(path), world=64)
    assert got.format == "llm-foundry"
    v = got.values
    assert (v["dp"], v["dp_shard"], v["zero"], v["recompute"], v["microbatch"], v["global_batch"]) == (
        64,
        64,
        3,
        "none",
        10,
        640,
    )
    assert v["runtime"] == "llm-foundry" and "seq=2048" in v["overrides"] and "layers=24" in v["overrides"]
    # PURE: bf16 gathers and reduce-scatters; no backward_prefetch: Composer's BACKWARD_POST
    assert (v["fsdp_gather_dtype"], v["fsdp_reduce_dtype"], v["fsdp_unit_buffers"]) == ("bf16", "bf16", "backward_post")
    with pytest.raises(MeshplanError, match="does not say how many GPUs; give --num-gpus"):
        read_config(str(path))
    flags = ["--model", "analytic:gpt", "--set", "layers=24", "hidden=2048", "heads=16", "vocab=50368", "seq=2048"]
    flags += "--cluster a100-40g --num-gpus 64 --global-batch 640 --runtime llm-foundry --tp 1 --pp 1".split()
    flags += "--dp 64 --zero 3 --microbatch 10 --recompute none --schedule 1f1b".split()
    out = tmp_path / "flags.json"
    code, _, err = run(["estimate", *flags, "-q", "-o", str(out)])
    assert code == 0, err
    want = json.loads(out.read_text())["prediction"]["step_time_s"]
    assert estimate(path, tmp_path, "--cluster", "a100-40g", "--num-gpus", "64") == pytest.approx(want, rel=1e-12)


def test_llm_foundry_mixed_precision_and_prefetch_are_read(tmp_path):
    """Composer's DEFAULT mixed precision reduces in fp32, FULL keeps fp32 parameters, a custom
    MixedPrecision gives its own dtypes; BACKWARD_PRE holds the next unit beside the current one.
    Each reaches the prediction: DEFAULT's fp32 reduce-scatter moves more bytes than PURE's."""
    text = (FIXTURES / "mpt_1b_foundry.yaml").read_text()
    path = tmp_path / "mpt.yaml"
    cases = {
        "DEFAULT": ("bf16", "fp32"),
        "FULL": ("fp32", "fp32"),
        "{param_dtype: bf16, reduce_dtype: float32}": ("bf16", "fp32"),
    }
    for mixed, dtypes in cases.items():
        path.write_text(text.replace("mixed_precision: PURE", f"mixed_precision: {mixed}"))
        v = read_config(str(path), world=64).values
        assert (v["fsdp_gather_dtype"], v["fsdp_reduce_dtype"]) == dtypes, mixed
    path.write_text(
        text.replace("  limit_all_gathers: true", "  limit_all_gathers: true\n  backward_prefetch: BACKWARD_PRE")
    )
    assert read_config(str(path), world=64).values["fsdp_unit_buffers"] == "backward_pre"
    bytes_ = {}
    for mixed in ("PURE", "DEFAULT"):
        path.write_text(text.replace("mixed_precision: PURE", f"mixed_precision: {mixed}"))
        out = tmp_path / f"{mixed}.json"
        code, _, err = run(
            ["estimate", "--import", str(path), "--cluster", "a100-40g", "--num-gpus", "64", "-q", "-o", str(out)]
        )
        assert code == 0, err
        bytes_[mixed] = json.loads(out.read_text())["prediction"]["comm_bytes_per_step"]["dp_shard"]
    assert bytes_["DEFAULT"] > bytes_["PURE"]


def test_llm_foundry_yaml_refusals(tmp_path):
    text = (FIXTURES / "mpt_1b_foundry.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("mixed_precision: PURE", "mixed_precision: HALF"))
    with pytest.raises(MeshplanError, match="fsdp_config.mixed_precision 'HALF' is not one of"):
        read_config(str(bad), world=8)
    bad.write_text(
        text.replace("  limit_all_gathers: true", "  limit_all_gathers: true\n  backward_prefetch: SIDEWAYS")
    )
    with pytest.raises(MeshplanError, match="fsdp_config.backward_prefetch 'SIDEWAYS' is not one of"):
        read_config(str(bad), world=8)
    bad.write_text(text.replace("FULL_SHARD", "QUARTER_SHARD"))
    with pytest.raises(MeshplanError, match="sharding_strategy 'QUARTER_SHARD' is not one of"):
        read_config(str(bad), world=8)
    bad.write_text(text.replace("${variables.seq}", "${variables.nope}"))
    with pytest.raises(MeshplanError, match=r"\$\{variables.nope\} names no key of the file"):
        read_config(str(bad), world=8)


def test_the_estimate_line_names_fsdp_dtypes_and_reads_back(tmp_path):
    """An export's `meshplan estimate --import` line writes a plan's non-default FSDP behaviours as
    their flags take them (a dtype name, not the bytes the request holds), and reading the line back
    gives the same values: the behaviours reach the re-prediction."""
    from meshplan.imports.common import meshplan_header
    from meshplan.planner import estimate as predict
    from meshplan.report.export_common import estimate_line
    from meshplan.validation.published import cli_inputs

    flags = ["--model", "analytic:gpt", "--set", "layers=4", "hidden=1024", "heads=8", "vocab=50368", "seq=2048"]
    flags += "--cluster a100-40g --num-gpus 16 --global-batch 64 --runtime torchtitan --tp 1 --pp 1".split()
    flags += "--dp 16 --zero 3 --microbatch 4 --recompute none --schedule 1f1b".split()
    flags += "--fsdp-reduce-dtype bf16 --fsdp-unit-buffers backward_post".split()
    plan = predict(*cli_inputs(["estimate", *flags]))
    line = estimate_line(plan)
    assert "--fsdp-reduce-dtype bf16" in line and "--fsdp-unit-buffers backward_post" in line
    assert "--fsdp-gather-dtype" not in line  # torchtitan's own bf16 gathers: its default
    values: dict = {}
    meshplan_header(line.replace("predict it: ", ""), values)
    assert (values["fsdp_reduce_dtype"], values["fsdp_unit_buffers"]) == ("bf16", "backward_post")


def test_a_bf16_reduction_exported_to_torchtitan_is_warned(tmp_path):
    """torchtitan's config takes float32 reduction only: a plan priced with bf16 reduce-scatters says
    so in its torchtitan export (the file still runs, moving twice the planned bytes)."""
    from meshplan.planner import estimate as predict
    from meshplan.validation.published import cli_inputs

    flags = ["--model", "analytic:gpt", "--set", "layers=4", "hidden=1024", "heads=8", "vocab=50368", "seq=2048"]
    flags += "--cluster a100-40g --num-gpus 16 --global-batch 64 --runtime torchtitan --tp 1 --pp 1".split()
    flags += "--dp 16 --zero 3 --microbatch 4 --recompute none --schedule 1f1b".split()
    warned = []
    for extra in ([], ["--fsdp-reduce-dtype", "bf16"]):
        files = export_plan(predict(*cli_inputs(["estimate", *flags, *extra])), "torchtitan")
        warned.append(any("mixed_precision_reduce takes float32 only" in t for t in files.values()))
    assert warned == [False, True]


@pytest.mark.parametrize("target", ["torchtitan", "torchtitan-0.2"])
def test_torchtitan_reads_back_the_stage_boundaries_it_runs(plans, tmp_path, target):
    """torchtitan builds its stages from module_fqns_per_model_part as the export lists them, so the read-back
    prices those boundaries (--stage-layers), not a balanced split: on the uneven searched split of the 70B
    pp 4 x v 8 plan the balanced one is another step time and runs out of memory on the last rank."""
    plan = plans["llama3-70b-pp4-interleaved-torchtitan"]
    counts = [len(stage) for stage in plan.stages]
    assert len(set(counts)) > 1  # uneven: what a balanced split would not reproduce
    folder = tmp_path / target
    folder.mkdir()
    for f, text in export_plan(plan, *target.split("-")).items():
        (folder / f).write_text(text)
    got = read_config(str(folder / MAIN_FILE[target])).values
    assert got["stage_layers"] == ",".join(map(str, counts))
    readback = tmp_path / "readback.json"
    code, _, err = run(["estimate", "--import", str(folder / MAIN_FILE[target]), "-q", "-o", str(readback)])
    assert code == 0, err
    back = json.loads(readback.read_text())
    assert back["stages"] == plan.stages
    assert back["prediction"]["peak_memory_bytes"] == pytest.approx(plan.prediction.peak_memory_bytes, rel=1e-9)


@pytest.mark.parametrize(
    ("sizes", "virtual", "flag"),
    [
        ([4, 2, 2, 2], 1, "--decoder-first-pipeline-num-layers"),  # embed + 3 | 2 | 2 | 1 + head
        ([2, 2, 2, 4], 1, "--decoder-first-pipeline-num-layers"),  # a heavier last stage
        ([2, 3, 3, 2, 1, 1, 1, 3], 2, "--pipeline-model-parallel-layout"),  # interleaved, uneven chunks
    ],
)
def test_megatron_reads_back_its_uneven_pipeline_flags(tmp_path, sizes, virtual, flag):
    """Megatron-LM builds uneven stages from --decoder-first/last-pipeline-num-layers or an explicit
    --pipeline-model-parallel-layout; the read-back prices those stages (--stage-layers), not an even split."""
    from report_fixtures import gpt_plan, split

    schedule = "Interleaved1F1B" if virtual > 1 else "1F1B"
    plan = gpt_plan(pp=4, virtual=virtual, schedule=schedule, blocks=sum(sizes) - 2)
    plan = dataclasses.replace(plan, model_family="gpt", stages=split(plan.layers, sizes))
    files = export_plan(plan, "megatron")
    assert flag in files["megatron_args.sh"]
    (tmp_path / "megatron_args.sh").write_text(files["megatron_args.sh"])
    got = read_config(str(tmp_path / "megatron_args.sh")).values
    assert got["stage_layers"] == ",".join(map(str, sizes))


@pytest.mark.parametrize("partitioned", [True, False])
def test_deepspeed_pipe_partitioning_is_written_and_read_back(tmp_path, partitioned):
    """DeepSpeed's pipeline engine splits a stage boundary over the tensor-parallel group by default
    (pipeline.pipe_partitioned); a plan priced sending it whole (--no-pp-scatter-gather) exports
    pipe_partitioned false, and the read-back prices what the file says."""
    shape = ["--set", "layers=24", "hidden=4096", "heads=32", "vocab=51200", "seq=2048"]
    pins = ["--tp", "4", "--pp", "2", "--dp", "4", "--microbatch", "1", "--schedule", "1f1b", "--recompute", "full"]
    argv = ["estimate", "--model", "analytic:gpt", *shape, "--cluster", "a100-80g", "--num-gpus", "32"]
    argv += ["--global-batch", "64", *pins, "--zero", "1", "--runtime", "deepspeed", "--no-sequence-parallel"]
    flag = [] if partitioned else ["--no-pp-scatter-gather"]
    code, _, err = run([*argv, *flag, "-q", "-o", str(tmp_path / "plan.json")])
    assert code == 0, err
    folder = tmp_path / "ds"
    assert run(["export", str(tmp_path / "plan.json"), "--to", "deepspeed", "-o", str(folder)])[0] == 0
    config = json.loads((folder / "ds_config.json").read_text())
    assert ("pipeline" in config) == (not partitioned)
    if not partitioned:
        assert config["pipeline"] == {"pipe_partitioned": False, "grad_partitioned": False}
    assert read_config(str(folder / "ds_config.json")).values.get("pp_scatter_gather", True) == partitioned
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert estimate(folder / "ds_config.json", tmp_path) == pytest.approx(plan["prediction"]["step_time_s"], rel=1e-9)

"""Bad input at the CLI, as a demanding user gives it: every case runs
in this process through meshplan.cli.main and must exit 2 with exactly one stderr line, no
"Traceback", and leave the working directory exactly as it was (no file written or removed)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from contract_fixtures import LAYERS, make_plan, make_profile

from meshplan import schema
from meshplan.cli import main

GEMM = ["--tp", "1", "--pp", "1", "--dp", "2", "--microbatch", "2", "--schedule", "1f1b", "--recompute", "none"]


def make_inputs(root: Path) -> None:
    """The files the cases name, in the test's working directory."""
    (root / "d").mkdir()
    (root / "afile").write_text("x")
    (root / "bin.json").write_bytes(b"\xff\xfe\x00\x01garbage\x80")
    plan = make_plan(pipeline_parallel_degree=1, data_parallel_replicate_degree=2, world_size=2, stages=[list(LAYERS)])
    schema.save(plan, root / "good.json")
    text = (root / "good.json").read_text()
    (root / "nan.json").write_text(text.replace('"seq_len": 32', '"seq_len": NaN'))
    (root / "inf.json").write_text(text.replace('"step_time_s": 0.5', '"step_time_s": Infinity'))
    for name, config in (("heads3.json", {"heads": 3}), ("nested.json", {"nested": {"a": 1}})):
        data = json.loads(text)
        data["model_config"] = config
        (root / name).write_text(json.dumps(data))
    run = {
        "world_size": 4,
        "steps": 1,
        "losses": [1.0],
        "step_time_s": 0.1,
        "tokens_per_s": 1.0,
        "peak_memory_bytes": 1,
    }
    (root / "run4.json").write_text(json.dumps(run))
    schema.save(make_profile(), root / "prof.json")
    factories = {
        "empty": "torch.nn.Sequential()",
        "noparams": "torch.nn.Sequential(torch.nn.ReLU())",
        "nochain": "torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Linear(4, 2))",
    }
    for name, module in factories.items():
        (root / f"{name}.py").write_text(f"import torch\ndef f():\n    return {module}, torch.randn(2, 8)\n")
    (root / "exit3.py").write_text("import sys\nsys.exit(3)\n")
    (root / "hardexit.py").write_text("import os\ndef f():\n    os._exit(0)\n")
    (root / "pkgdir").mkdir()
    zero = schema.to_dict(make_profile())
    for layer in zero["layers"]:
        layer["num_params"] = 0
    (root / "zero_prof.json").write_text(json.dumps(zero))
    bad_place = json.loads((root / "good.json").read_text())
    bad_place["rank_placement"] = "tp,tp,pp"
    (root / "placement.json").write_text(json.dumps(bad_place))
    (root / "rd" / "checkpoints").mkdir(parents=True)
    (root / "rd" / "checkpoints" / "latest").write_text("garbage\0")
    (root / "empty_run").mkdir()
    os.mkfifo(root / "fifo")
    for name, value in (("sv_str.json", "2"), ("sv_none.json", None)):
        data = json.loads(text)
        data["schema_version"] = value
        data = {k: v for k, v in data.items() if v is not None}
        (root / name).write_text(json.dumps(data))
    (root / "deep.json").write_text('{"a":' * 100000 + "1" + "}" * 100000)
    (root / "bigint.json").write_text(text.replace('"seq_len": 32', '"seq_len": ' + "9" * 5000))
    hf = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 5, "num_hidden_layers": 2}
    (root / "hf5.json").write_text(json.dumps({**hf, "intermediate_size": 128, "vocab_size": 256}))
    (root / "dmg" / "checkpoints" / "step_000002").mkdir(parents=True)  # a save that never finished
    (root / "ckfile").mkdir()
    (root / "ckfile" / "checkpoints").write_text("mine")
    (root / "lockdir" / ".meshplan.lock").mkdir(parents=True)
    (root / "planned").mkdir()  # a plan of a model file given relative to the folder it was planned in
    (root / "planned" / "mm.py").write_text("def f():\n    pass\n")
    (root / "planned" / "rel.json").write_text(text.replace('"model_name": "gpt-tiny"', '"model_name": "mm.py:f"'))


CASES = [
    # -o / --out-dir that cannot be written
    (["plan", "-o", "afile/x.json"], "'afile' is a file"),
    (["plan", "-o", "d"], "is a directory"),
    (["plan", "-o", "/proc/x.json"], "cannot write '/proc/x.json'"),
    (["profile", "-o", "d"], "is a directory"),
    (["estimate", "--num-gpus", "2", *GEMM, "-o", "/proc/p.json"], "/proc/p.json"),
    (["export", "good.json", "--to", "megatron", "-o", "afile"], "'afile' is a file"),
    (["report", "good.json", "-o", "afile"], "'afile' is a file"),
    (["run", "good.json", "--out-dir", "afile"], "--out-dir afile: is a file"),
    # -o never replaces an input, a device or a FIFO (schema.write_text_atomic, schema.check_output)
    (["plan", "--profile", "prof.json", "--num-gpus", "2", "-o", "prof.json"], "is the --profile input"),
    (["plan", "--profile", "prof.json", "--num-gpus", "2", "-o", "./prof.json"], "is the --profile input"),
    (["plan", "-o", "fifo"], "it is a FIFO with no reader"),
    (["plan", "-o", "/dev/full"], "the disk is full"),
    (["profile", "-o", "/proc/x/p.json"], "'/proc' is not writable (it accepts no new files: a kernel filesystem"),
    (["profile", "-o", "/proc/p.json"], "'/proc' is not writable (it accepts no new files: a kernel filesystem"),
    (["profile-links", "-o", "/proc/self/c.json"], "'/proc/self' is not writable (it accepts no new files"),
    # files that are not what they should be
    (["report", "bin.json", "-o", "out"], "not UTF-8"),
    (["plan", "--profile", "bin.json", "-o", "p.json"], "not UTF-8"),
    (["report", "good.json", "--run", "bin.json", "-o", "out"], "not UTF-8"),
    (["run", "bin.json"], "not UTF-8"),
    (["validate", "--csv", "bin.json", "-o", "v.md"], "not UTF-8"),
    (["validate", "--csv", "missing.csv", "-o", "v.md"], "does not exist"),
    (["validate", "--csv", "good.json", "-o", "v.md"], "lacks the columns"),
    (["report", "d", "-o", "out"], "is a directory"),
    (["run", "missing.json"], "does not exist"),
    (["plan", "--profile", "good.json", "-o", "p.json"], "is a Plan (from meshplan plan -o), not a ModelProfile"),
    (["report", "nan.json", "-o", "out"], "NaN"),
    (["report", "inf.json", "-o", "out"], "Infinity"),
    (["run", "nan.json", "--print-launch"], "NaN"),
    (["export", "inf.json", "--to", "deepspeed"], "Infinity"),
    # files that are not plans, or not files (bounded reads; a FIFO would block for ever)
    (["report", "prof.json", "-o", "out"], "'prof.json' is a ModelProfile (from meshplan profile), not a Plan"),
    (["run", "prof.json", "--print-launch"], "is a ModelProfile"),
    (["report", "sv_str.json", "-o", "out"], 'schema_version = "2": expected the integer 2'),
    (["report", "sv_none.json", "-o", "out"], "schema_version: missing"),
    (["report", "deep.json", "-o", "out"], "nests JSON too deeply"),
    (["export", "deep.json", "--to", "megatron"], "nests JSON too deeply"),
    (["report", "bigint.json", "-o", "out"], "an integer too long to read"),
    (["report", "/dev/zero", "-o", "out"], "is a device, not a regular file"),
    (["report", "fifo", "-o", "out"], "is a FIFO, not a regular file"),
    # model shapes
    (["plan", "--model", "llama-tiny", "--set", "kv_heads=0", "-o", "p.json"], "kv_heads=0 must be >= 1"),
    (["plan", "--set", "layers=2", "layers=3", "-o", "p.json"], "--set layers=2 and --set layers=3 contradict"),
    (["plan", "--num-gpus", "4", "--compression", "powersgd:rank=4,rank=8"], "rank is given twice"),
    (["plan", "--compile", "--elementwise", "fused"], "--compile and --elementwise fused contradict each other"),
    (["plan", "--fused-projections", "--no-fused-projections"], "contradict each other"),
    (["plan", "--num-gpus", "4", "--tp", "1", "--tp", "2"], "--tp 1 and --tp 2 contradict each other"),
    (["plan", "--set", "layers=" + "9" * 5000, "-o", "p.json"], "a 5000-digit number"),
    (["plan", "--model", "analytic:gpt", "--set", "layers=2", "hidden=0", "heads=2"], "hidden=0: expected a whole"),
    (["plan", "--model", "analytic:gpt", "--set", "layers=-2", "hidden=64", "heads=2"], "layers=-2: expected"),
    (["plan", "--model", "analytic:gpt", "--set", "layers=2", "hidden=64.5", "heads=2"], "hidden=64.5: expected"),
    (
        [
            "plan",
            "--model",
            "analytic:llama",
            "--set",
            "layers=2",
            "hidden=64",
            "heads=4",
            "kv_heads=0",
            "ffn_hidden=8",
        ],
        "kv_heads=0: expected",
    ),
    (
        [
            "plan",
            "--model",
            "analytic:llama",
            "--set",
            "layers=2",
            "hidden=64",
            "heads=4",
            "kv_heads=3",
            "ffn_hidden=8",
        ],
        "heads=4 is not a multiple of kv_heads=3",
    ),
    (["plan", "--model", "hf:tiny-llama", "--set", "layers=abc", "-o", "p.json"], "--set layers=abc: expected int"),
    (["plan", "--model", "hf:tiny-llama", "--set", "layerz=3", "-o", "p.json"], "config has no 'layerz'"),
    (["plan", "--model", "hf:tiny-llama", "--set", "layers=-2", "-o", "p.json"], "layers (num_hidden_layers) = -2"),
    (["plan", "--model", "hf:tiny-llama", "--set", "kv_heads=3", "-o", "p.json"], "not a multiple of num_key_value"),
    (["plan", "--model", "hf:hf5.json", "-o", "p.json"], "hidden size (64) is not a multiple"),
    # sizes whose search or launch would not end
    (["plan", "--global-batch", "99999999999999999999"], "--global-batch 99999999999999999999: at most"),
    (["plan", "--num-gpus", "99999999999"], "--num-gpus 99999999999: at most"),
    (["profile-links", "--nproc", "512"], "--nproc 512: at most"),
    (["profile", "--concurrent", "512", "-o", "p.json"], "--concurrent 512: at most"),
    (["plan", "--model", "gpt", "--set", "hidden=-64", "-o", "p.json"], "hidden=-64"),
    (["plan", "--set", "layers=0", "-o", "p.json"], "layers=0"),
    (["plan", "--set", "layers=2.5", "-o", "p.json"], "layers=2.5: expected an integer"),
    (["plan", "--model", "gpt", "--set", "heads=5", "hidden=64", "-o", "p.json"], "not divisible by heads 5"),
    (["plan", "--model", "gpt", "--set", "heads=0", "-o", "p.json"], "heads=0"),
    (["run", "heads3.json", "--print-launch"], "plan.model_config heads=3"),
    (["run", "nested.json", "--print-launch"], "plan.model_config nested="),
    (["plan", "--model", "empty.py:f", "-o", "p.json"], "no trainable parameters"),
    (["plan", "--model", "noparams.py:f", "-o", "p.json"], "no trainable parameters"),
    (["plan", "--model", "nochain.py:f", "-o", "p.json"], "fails on its example_batch of shape [2, 8]"),
    (["plan", "--model", "exit3.py:f", "-o", "p.json"], "called sys.exit(3)"),
    (["plan", "--model", "hardexit.py:f", "-o", "p.json"], "the factory called os._exit(0)"),
    (["plan", "--model", "pkgdir/:f", "-o", "p.json"], "'pkgdir/' is a directory"),
    (["profile", "--model", "analytic:gpt", "-o", "p.json"], "analytic models are closed-form profiles"),
    (["plan", "--profile", "zero_prof.json", "-o", "p.json"], "a model with no parameters"),
    (["plan", "--profile", "prof.json", "--model", "llama-tiny", "-o", "p.json"], "is a profile of"),
    (["report", "placement.json", "-o", "out"], "rank_placement"),
    (["export", "placement.json", "--to", "megatron"], "rank_placement"),
    (["plan", "--seq", "100000", "-o", "p.json"], "gpt-tiny handles at most 32"),
    # run flags
    (["run", "good.json", "--checkpoint-every", "-1", "--print-launch"], "--checkpoint-every -1"),
    (["run", "good.json", "--timeout", "-5", "--print-launch"], "--timeout -5"),
    (["run", "good.json", "--timeout", "0", "--print-launch"], "--timeout 0"),
    (["run", "good.json", "--steps", "0"], "--steps 0"),
    (
        ["run", "good.json", "--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1", "--print-launch"],
        "--node-rank 2",
    ),
    (["run", "good.json", "--nnodes", "2", "--print-launch"], "--rdzv-endpoint"),
    (["run", "good.json", "--resume", "--out-dir", "rd"], "checkpoints/latest is damaged"),
    (["run", "good.json", "--resume", "--out-dir", "empty_run"], "no complete checkpoint"),
    (["run", "good.json", "--out-dir", "dmg"], "holds checkpoints none of which is complete"),
    # --data and other run inputs, found before any rank starts (tests/bad_datasets.py)
    (["run", "good.json", "--data", "bad_datasets:not_a_dataset"], "returned a int, not a map-style dataset"),
    (["run", "good.json", "--data", "bad_datasets:short_sequences"], "has 7 tokens, the plan's seq_len is 32"),
    (["run", "good.json", "--data", "bad_datasets:ids_outside_vocab"], "token id 1000000, outside"),
    (["run", "good.json", "--data", "bad_datasets:raises"], "raises() raised RuntimeError: no data here"),
    (["run", "good.json", "--data", "bad_datasets:one_sample"], "1 samples, fewer than one global batch"),
    (["run", "good.json", "--data", "no_such_module:f"], "cannot import"),
    (
        ["run", "good.json", "--nnodes", "2", "--rdzv-endpoint", "no-such-host.invalid:29500"],
        "host 'no-such-host.invalid' does not resolve",
    ),
    (["run", "good.json", "--out-dir", "ckfile"], "is not the checkpoint directory"),
    (["run", "good.json", "--out-dir", "lockdir"], "its lock file .meshplan.lock is a directory"),
    (["run", "good.json", "--out-dir", "/proc/r"], "--out-dir /proc/r: cannot create it"),
    (["run", "planned/rel.json", "--print-launch"], "planned, where 'mm.py' is"),
    # pins every layout breaks: the rule they break, not another layout's ("dp=1: no replicas")
    (["plan", "--zero", "3", "--compression", "powersgd"], "compression=powersgd with zero_stage 3: runs with"),
    (["plan", "--tp", "2", "--sync", "master"], "sync=master with tensor_parallel_degree 2: needs DDP"),
    (["plan", "--zero", "2", "--sync", "local-sgd"], "sync=local-sgd with zero_stage 2: runs with zero_stage 0"),
    (["plan", "--pp", "2", "--comm-schedule", "bytescheduler"], "bytescheduler with pipeline_parallel_degree 2"),
    (["plan", "--sync", "local-sgd", "--compression", "fp16"], "sync=local-sgd with compression=fp16: those run"),
    (
        ["estimate", "--num-gpus", "2", "--sync", "master", "--compression", "fp16", *GEMM],
        "sync=master with compression=fp16",
    ),
    (["plan", "--dp-shard", "2", "--zero", "1"], "zero_stage 1 with data_parallel_shard_degree 2: ZeRO-0/1"),
    (["plan", "--dp-shard", "2", "--zero", "3", "--tp", "4"], "--dp-shard 2 does not divide the data-parallel"),
    (["plan", "--dp-shard", "3"], "--dp-shard 3 does not divide the data-parallel degree 4"),
    (["plan", "--sync", "local-sgd:group_size=3"], "group_size=3 with data-parallel degree 4: groups"),
    (["plan", "--sync", "local-sgd:group_size=2,group_period=4"], "group_period=4 with period=4"),
    (["plan", "--sync", "crossbow:learners=3"], "learners=3 with a local batch of 4 samples"),
    (["plan", "--sync", "dabmd:entropy=true,gradient_allreduce=true"], "entropy=true with gradient_allreduce=true"),
    (["plan", "--global-batch", "3", "--num-gpus", "2", "--pp", "2", "--schedule", "1f1b"], "microbatch count (3)"),
    # plan/cluster flags and a report of another world size
    (["plan", "--num-gpus", "0"], "--num-gpus 0"),
    (["plan", "--cluster", "tpu-v9"], "tpu-v9"),
    (["report", "good.json", "--run", "run4.json", "-o", "out"], "ran 4 ranks"),
]


def snapshot(root: Path) -> dict[str, tuple]:
    """Every path with, for files, size and modification time (a directory's own mtime changes
    when a refused run takes and drops its lock file, which is not a file left behind)."""
    return {
        str(p.relative_to(root)): (p.is_dir(), 0, 0) if p.is_dir() else (False, p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
    }


@pytest.mark.parametrize("args, needle", CASES, ids=[" ".join(a)[:60] for a, _ in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch, capsys, args, needle):
    make_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    before = snapshot(tmp_path)
    capsys.readouterr()
    try:
        code = main(args + ["--quiet"])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, (code, err)
    assert "Traceback" not in err + out
    assert len(lines) == 1, err
    assert needle in lines[0], lines[0]
    assert snapshot(tmp_path) == before


def test_at_least_forty_cases():
    assert len(CASES) >= 40


@pytest.mark.parametrize(
    "args, needle",
    [
        (
            ["plan", "--num-gpus", "2", "--pp", "1", "--schedule", "interleaved", "--virtual-stages", "3"],
            "warning: ignored --virtual-stages 3",
        ),
        (["plan", "--num-gpus", "2", "--tp", "1", "--sequence-parallel"], "warning: ignored --sequence-parallel"),
        (["plan", "--seq", "64"], "warning: --seq 64: gpt-tiny handles at most 32"),
        (["profile", "--concurrent", "2"], "warning: ignored --concurrent 2: --device meta times nothing"),
    ],
)
def test_dropped_pins_are_a_warning_line(capsys, args, needle):
    assert main(args + ["--quiet"]) == 0
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err


def test_o_writes_through_a_symlink_and_into_a_device_never_over_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "link.json").symlink_to("target.json")
    assert main(["plan", "-o", "link.json", "--quiet"]) == 0
    assert (tmp_path / "link.json").is_symlink() and json.loads((tmp_path / "target.json").read_text())
    assert main(["plan", "-o", "/dev/null", "--quiet"]) == 0
    assert Path("/dev/null").is_char_device()


def test_written_files_honour_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        schema.save(make_plan(), tmp_path / "plan.json")
    finally:
        os.umask(old)
    assert (tmp_path / "plan.json").stat().st_mode & 0o777 == 0o640


@pytest.mark.parametrize(
    "pins",
    [
        ["--dp-shard", "2"],
        ["--dp-shard", "4"],
        ["--dp-shard", "2", "--zero", "3"],
        ["--dp", "4", "--dp-shard", "2"],
        ["--dp", "2", "--dp-shard", "2"],
    ],
    ids=" ".join,
)
def test_a_pinned_dp_shard_is_the_plans(tmp_path, pins):
    """A pinned --dp-shard is every candidate's (planner/search/enumerate.py `_shards`): the plan
    shards over it, with ZeRO-2/3, and never falls back to a replicated ZeRO-0/1 plan."""
    out = tmp_path / "p.json"
    assert main(["plan", "--num-gpus", "4", *pins, "-o", str(out), "--quiet"]) == 0
    plan = json.loads(out.read_text())
    assert plan["data_parallel_shard_degree"] == int(pins[pins.index("--dp-shard") + 1])
    assert plan["zero_stage"] >= 2
    if "--dp" in pins:
        dp = plan["data_parallel_shard_degree"] * plan["data_parallel_replicate_degree"]
        assert dp == int(pins[pins.index("--dp") + 1])

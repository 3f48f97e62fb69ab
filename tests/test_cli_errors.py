"""User mistakes at the CLI: one line on stderr naming the value, non-zero exit, no traceback,
and no half-written output file. Every case runs in this process through meshplan.cli.main
(what the `meshplan` script calls), with stdout and stderr captured."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
from contract_fixtures import make_plan

from meshplan import schema
from meshplan.cli import main


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def meshplan(capsys):
    """Call the CLI in-process: argparse's exits (--help, usage errors) become return codes."""

    def call(*args) -> Result:
        capsys.readouterr()  # drop anything printed before this call
        try:
            code = main([str(a) for a in args])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return Result(code, out, err)

    return call


def assert_one_line_error(proc, needle):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert needle in lines[0], lines[0]


def test_run_rejects_plan_with_wrong_world_size(meshplan, tmp_path):
    data = schema.to_dict(make_plan())
    data["world_size"] = 6
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(data))
    assert_one_line_error(meshplan("run", str(path)), "world_size")


def test_report_rejects_malformed_json(meshplan, tmp_path):
    path = tmp_path / "plan.json"
    path.write_text('{"model_name": ')
    out = tmp_path / "out"
    assert_one_line_error(meshplan("report", str(path), "-o", str(out)), "not valid JSON")
    assert not out.exists()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["plan", "--num-gpus", "0"], "--num-gpus"),
        (["plan", "--cluster", "tpu-v9"], "tpu-v9"),
        (["plan", "--set", "layers"], "KEY=VALUE"),
        (["plan", "--set", "depth=3"], "depth"),
        (["plan", "--model", "gpt-huge"], "gpt-huge"),
        (["plan", "--schedule", "zigzag"], "zigzag"),
        (["plan", "--cluster", "missing-cluster.json"], "missing-cluster.json"),
    ],
)
def test_plan_bad_flags(meshplan, tmp_path, args, needle):
    out = tmp_path / "plan.json"
    proc = meshplan(*args, "-o", str(out))
    assert_one_line_error(proc, needle)
    assert not out.exists()


def test_estimate_rejects_tp_that_does_not_divide_kv_heads(meshplan):
    proc = meshplan(
        "estimate",
        "--model",
        "llama-tiny",
        "--num-gpus",
        "4",
        "--tp",
        "4",
        "--pp",
        "1",
        "--dp",
        "1",
        "--microbatch",
        "4",
        "--global-batch",
        "16",
        "--schedule",
        "1f1b",
        "--recompute",
        "none",
    )
    assert_one_line_error(proc, "kv_heads 2 not divisible by tp=4")


def test_help_describes_every_verb(meshplan):
    proc = meshplan("--help")
    assert proc.returncode == 0
    for verb in ("profile", "profile-links", "plan", "estimate", "run", "report", "export", "validate"):
        assert verb in proc.stdout
        sub = meshplan(verb, "--help")
        assert sub.returncode == 0 and "--json" in sub.stdout and len(sub.stdout) > 300, verb


def test_print_launch_names_the_plan_and_the_rendezvous(meshplan, tmp_path):
    path = tmp_path / "my plan.json"
    schema.save(make_plan(), path)
    proc = meshplan(
        "run",
        str(path),
        "--print-launch",
        "--nnodes",
        "2",
        "--node-rank",
        "1",
        "--rdzv-endpoint",
        "head:29500",
        "--steps",
        "7",
    )
    assert proc.returncode == 0, proc.stderr
    line = proc.stdout.strip()
    for piece in (
        "torch.distributed.run",
        "--nproc-per-node=2",
        "--nnodes=2",
        "--node-rank=1",
        "--rdzv-endpoint=head:29500",
        "--steps 7",
        f"'{path}'",
    ):
        assert piece in line, (piece, line)
    assert_one_line_error(meshplan("run", str(path), "--print-launch", "--nnodes", "3"), "--nnodes 3")


def test_repeated_set_flags_accumulate(meshplan):
    """`--set layers=4 --set hidden=128` keeps both overrides (the last --set used to replace the
    earlier ones and plan a different model without a word)."""
    knobs = (
        "--cluster",
        "a100-80g",
        "--num-gpus",
        "1",
        "--tp",
        "1",
        "--pp",
        "1",
        "--dp",
        "1",
        "--microbatch",
        "1",
        "--global-batch",
        "1",
        "--seq",
        "64",
        "--schedule",
        "1f1b",
        "--recompute",
        "none",
        "--json",
    )
    split = meshplan("estimate", "--model", "gpt", "--set", "layers=4", "--set", "hidden=128", "heads=4", *knobs)
    joined = meshplan("estimate", "--model", "gpt", "--set", "layers=4", "hidden=128", "heads=4", *knobs)
    assert split.returncode == joined.returncode == 0, split.stderr + joined.stderr
    a, b = json.loads(split.stdout), json.loads(joined.stdout)
    assert a["step_time_s"] == b["step_time_s"] and a["peak_memory_bytes"] == b["peak_memory_bytes"]
    assert a["stages"] == [["embed", "layers.0", "layers.1", "layers.2", "layers.3", "head"]]


# stdout that cannot take the output: one line on stderr, never a traceback, never exit 0 with
# nothing written. A shell gives the redirections (they need real file descriptors).
STDOUT_CASES = [
    ("presets > /dev/full", 2, "cannot write to stdout: the disk is full"),
    ("presets --json >&-", 2, "--json: stdout is closed"),
    ("presets --json > /dev/full", 2, "cannot write to stdout: the disk is full"),
]


@pytest.mark.parametrize("shell, rc, needle", STDOUT_CASES, ids=[c[0] for c in STDOUT_CASES])
def test_stdout_that_cannot_be_written_is_one_line(shell, rc, needle):
    import subprocess
    import sys

    cmd = shell.replace("presets", f"{sys.executable} -m meshplan presets", 1)
    done = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == rc and "Traceback" not in done.stderr, done.stderr
    assert needle in lines[-1] and len(lines) == 1, done.stderr


def test_json_stdout_is_only_json_when_the_model_prints(meshplan, tmp_path, monkeypatch):
    """A model file that prints at import and in its factory cannot corrupt --json output."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "loud.py").write_text(
        "import torch\nprint('hello at import')\ndef f():\n    print('building')\n"
        "    return torch.nn.Sequential(torch.nn.Linear(8, 8)), torch.randn(2, 8)\n"
    )
    done = meshplan("profile", "--model", "loud.py:f", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["model_name"]
    assert "hello at import" in done.stderr and "building" in done.stderr


@pytest.mark.parametrize("verb", ["plan", "estimate"])
def test_parameter_offload_below_zero_3_is_refused_in_one_line(meshplan, tmp_path, verb):
    """--offload nvme:params=true pages ZeRO-3's parameter shards: with --zero 2 pinned it is refused
    before any search, exit 2, naming both values and the fix; with --zero 3 it plans."""
    args = ["--model", "gpt-tiny", "--cluster", "local-cpu", "--num-gpus", "2", "--global-batch", "8"]
    if verb == "estimate":
        args += "--microbatch 4 --tp 1 --pp 1 --dp 2 --schedule 1f1b --recompute none".split()
    out = tmp_path / "plan.json"
    proc = meshplan(verb, *args, "--zero", "2", "--offload", "nvme:params=true", "-o", out)
    assert proc.returncode == 2
    assert_one_line_error(proc, "offload=nvme params=true with zero_stage 2: runs with zero_stage 3 only")
    assert "use --zero 3 or params=false" in proc.stderr and not out.exists()
    if verb == "plan":
        assert meshplan(verb, *args, "--zero", "3", "--offload", "nvme:params=true", "-o", out).returncode == 0
        assert json.loads(out.read_text())["dp_methods"]["offload"]["params"] == {"params": True}


@pytest.mark.parametrize(
    "args,needle",
    [
        (["plan", "--num-gpus", "abc"], "'abc'"),
        (["plan", "--bogus"], "meshplan plan: error: unrecognized arguments: --bogus"),
        (["estimate", "--model", "gpt-tiny", "--cluster", "a100-80g", "--num-gpus", "8"], "--schedule"),
        (["frobnicate"], "'frobnicate'"),
    ],
)
def test_argparse_mistakes_are_one_line_too(meshplan, args, needle):
    """What argparse itself refuses (a bad int, an unknown flag or verb, a missing required
    flag) is one line naming it, not the verb's whole usage block."""
    proc = meshplan(*args)
    assert proc.returncode == 2
    assert_one_line_error(proc, needle)
    assert "--help lists the flags" in proc.stderr

"""Job files (meshplan/config.py): `--config job.toml` gives the plan the same flags give, flags
override the file, `--save-config` writes the file of a command line, and a wrong key or type is
one line naming the key (exit 2; a JSON object under --json)."""

from __future__ import annotations

import json

import pytest

from meshplan import config
from meshplan.cli import build_parser, main, verb_parser

FLAGS = ["--model", "analytic:gpt", "--set", "layers=4", "hidden=256", "heads=4"]
FLAGS += ["--cluster", "a100-80g", "--num-gpus", "8", "--global-batch", "32", "--runtime", "megatron-core"]
PINS = ["--tp", "2", "--pp", "2", "--dp", "2", "--microbatch", "2", "--schedule", "1f1b", "--recompute", "none"]
JOB = """\
[model]
model = "analytic:gpt"
set = { layers = 4, hidden = 256, heads = 4 }

[cluster]
cluster = "a100-80g"
num_gpus = 8

[batch]
global_batch = 32
microbatch = 2

[parallelism]
tp = 2
pp = 2
dp = 2
schedule = "1f1b"
recompute = "none"

[runtime]
runtime = "megatron-core"
"""


def _plan_text(path, drop_config: bool = True) -> str:
    data = json.loads(path.read_text())
    if drop_config:
        assert data["provenance"].pop("config")["table"]["cluster"] == {"cluster": "a100-80g", "num_gpus": 8}
    if data.get("search"):
        data["search"]["search_time_s"] = 0.0  # measured
    return json.dumps(data, indent=2)


def test_a_job_file_and_its_flags_give_byte_identical_plans(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text(JOB)
    a, b = tmp_path / "flags.json", tmp_path / "file.json"
    assert main(["estimate", *FLAGS, *PINS, "-o", str(a), "-q"]) == 0
    assert main(["estimate", "--config", str(job), "-o", str(b), "-q"]) == 0
    assert "config" not in json.loads(a.read_text())["provenance"]  # flags only: nothing recorded
    assert _plan_text(b) == a.read_text().rstrip("\n")  # the same bytes but the recorded job file
    assert json.loads(b.read_text())["provenance"]["config"]["path"] == str(job)
    # plan reads the estimate's file less its [parallelism] pins, and searches the same way
    job.write_text(JOB.split("[parallelism]")[0] + "[runtime]\nruntime = 'megatron-core'\n")
    assert main(["plan", *FLAGS, "--microbatch", "2", "-o", str(a), "-q"]) == 0
    assert main(["plan", "--config", str(job), "-o", str(b), "-q"]) == 0
    assert _plan_text(b) == _plan_text(a, drop_config=False)


def test_flags_override_the_file_and_save_config_writes_the_command_line(tmp_path):
    job, saved = tmp_path / "job.toml", tmp_path / "saved.toml"
    job.write_text(JOB)
    argv = ["estimate", "--config", str(job), "--tp", "1", "--dp", "4", "--set", "layers=8"]
    assert main([*argv, "--save-config", str(saved), "-o", str(tmp_path / "a.json"), "-q"]) == 0
    plan = json.loads((tmp_path / "a.json").read_text())
    assert (plan["tensor_parallel_degree"], plan["data_parallel_replicate_degree"]) == (1, 4)
    assert plan["model_config"]["layers"] == 8  # --set merges with the file's set table, the flag wins
    text = saved.read_text()
    assert "tp = 1\n" in text and "dp = 4\n" in text and "set = { layers = 8, hidden = 256, heads = 4 }" in text
    assert "output =" in text and "quiet = true" in text
    assert main(["estimate", "--config", str(saved), "-o", str(tmp_path / "b.json"), "-q"]) == 0
    again = json.loads((tmp_path / "b.json").read_text())
    assert again["provenance"].pop("config")["path"] == str(saved)
    assert plan["provenance"].pop("config")["path"] == str(job)
    assert again == plan  # the saved file plans what its command line planned


@pytest.mark.parametrize(
    "body, needle, field",
    [
        ('[batch]\nglobal_batch = "32"\n', '[batch] global_batch = "32": expected an integer', "global_batch"),
        ("[batch]\nglobl_batch = 32\n", "[batch] globl_batch is not an option of meshplan plan", "globl_batch"),
        (
            "[model]\nnum_gpus = 32\n",
            "[model] num_gpus is not an option of meshplan plan; it belongs in [cluster]",
            "num_gpus",
        ),
        ("[cluster]\nnum_gpus = true\n", "[cluster] num_gpus = true: expected an integer", "num_gpus"),
        ('[parallelism]\nrecompute = "some"\n', 'recompute = "some": expected one of "none", "selective"', "recompute"),
        ("[runtime]\ndropout = 1\n", "[runtime] dropout = 1: expected true or false", "dropout"),
        (
            "[launch]\nnnodes = 2\n",
            "[launch] is not a section of meshplan plan (its sections: model, cluster,",
            "launch",
        ),
        ("tp = 2\n", "tp = 2 is outside any section; put it under [parallelism]", "tp"),
        ("[model\n", "not TOML", "--config"),
    ],
)
def test_a_wrong_key_or_type_is_one_line_naming_it(tmp_path, capsys, body, needle, field):
    job = tmp_path / "job.toml"
    job.write_text(body)
    assert main(["plan", "--config", str(job), "-o", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "p.json").exists()
    assert main(["plan", "--config", str(job), "--json"]) == 2
    error = json.loads(capsys.readouterr().out)["error"]
    assert error["code"] == 2 and error["field"] == field and needle in error["message"]


def test_the_sections_are_the_parsers_own_groups():
    parser = build_parser()
    plan = config.sections(verb_parser(parser, "plan"))
    assert list(plan) == ["model", "cluster", "batch", "parallelism", "methods", "runtime", "output"]
    assert "compile" not in plan["runtime"] and "elementwise" in plan["runtime"]  # --compile is an alias
    assert set(config.sections(verb_parser(parser, "run"))) == {"run", "launch", "output"}
    assert set(config.sections(verb_parser(parser, "report"))) == {"report", "output"}
    every = {a.dest for a in verb_parser(parser, "plan")._actions} - config.NOT_KEYS
    assert every == {a.dest for keys in plan.values() for a in keys.values()}


def test_run_and_report_take_their_positional_from_the_file(tmp_path, capsys):
    plan = tmp_path / "plan.json"
    assert main(["plan", "--model", "gpt-tiny", "-o", str(plan), "-q"]) == 0
    capsys.readouterr()
    job = tmp_path / "run.toml"
    job.write_text(
        f'[run]\nplan = "{plan}"\nsteps = 3\n\n[launch]\nnnodes = 2\nnode_rank = 1\nrdzv_endpoint = "h0:29500"\n'
    )
    assert main(["run", "--config", str(job), "--print-launch", "--steps", "9"]) == 0
    line = capsys.readouterr().out
    assert f"--plan {plan}" in line and "--steps 9" in line and "--node-rank=1" in line and "--nproc-per-node=2" in line
    assert main(["run", "--print-launch"]) == 2
    assert "required: plan" in capsys.readouterr().err

"""`meshplan estimate --stage-layers`: the stage boundaries an estimate prices, one layer count per pipeline stage
(pp x v of them, the embedding and the head one layer each); without it a balanced split."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from meshplan.cli import main

PINS = [
    "estimate", "--model", "analytic:gpt", "--set", "layers=8", "hidden=256", "heads=4", "vocab=1024", "seq=128",
    "--cluster", "a100-80g", "--num-gpus", "8", "--global-batch", "16", "--tp", "1", "--pp", "2", "--dp", "4",
    "--microbatch", "1", "--schedule", "1f1b", "--recompute", "none", "--zero", "0", "--quiet",
]  # fmt: skip


def run(*flags: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*PINS, *flags])
    return code, out.getvalue(), err.getvalue()


def predicted(tmp_path, *flags: str) -> dict:
    path = tmp_path / "plan.json"
    code, _, err = run(*flags, "-o", str(path))
    assert code == 0, err
    return json.loads(path.read_text())


def test_the_given_boundaries_are_the_ones_priced(tmp_path):
    balanced = predicted(tmp_path)
    assert [len(s) for s in balanced["stages"]] == [5, 5]  # embed + 4 blocks | 4 blocks + head
    lopsided = predicted(tmp_path, "--stage-layers", "2,8")
    assert lopsided["stages"][0] == ["embed", "layers.0"] and len(lopsided["stages"][1]) == 8
    # the second rank now holds 7 of the 8 blocks: the pipeline waits on it
    assert lopsided["prediction"]["step_time_s"] > 1.2 * balanced["prediction"]["step_time_s"]
    same = predicted(tmp_path, "--stage-layers", "5,5")
    assert same["stages"] == balanced["stages"] and same["prediction"] == balanced["prediction"]


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("3,3,4", "3 stages, but pp x virtual stages is 2"),
        ("4,4", "add up to the model's 10 layers"),
        ("0,10", "at least one layer"),
    ],
)
def test_counts_that_do_not_fit_the_pipeline_are_refused_in_one_line(value, says):
    code, out, err = run("--stage-layers", value)
    assert code != 0 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in err


def test_a_count_that_is_not_a_number_is_named():
    code, out, err = run("--stage-layers", "4,x")
    assert code == 2 and out == "" and "--stage-layers: '4,x'" in err and "Traceback" not in err


def test_a_job_file_keeps_the_boundaries(tmp_path):
    job = tmp_path / "job.toml"
    code, _, err = run("--stage-layers", "2,8", "--save-config", str(job))
    assert code == 0, err
    assert 'stage_layers = "2,8"' in job.read_text()
    pinned = predicted(tmp_path, "--stage-layers", "2,8")
    out = tmp_path / "from_job.json"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(["estimate", "--config", str(job), "--quiet", "-o", str(out)]) == 0
    assert json.loads(out.read_text())["stages"] == pinned["stages"]

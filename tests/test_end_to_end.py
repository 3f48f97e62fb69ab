"""The walking skeleton from the CLI: profile -> plan -> run on 4 gloo ranks -> report."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def meshplan(*args, cwd):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "meshplan", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600
    )
    assert proc.returncode == 0, f"meshplan {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_profile_plan_run_report(tmp_path):
    meshplan(
        "profile",
        "--model",
        "gpt-tiny",
        "--device",
        "cpu",
        "--microbatch",
        "1",
        "2",
        "4",
        "-o",
        "profile.json",
        "--quiet",
        cwd=tmp_path,
    )
    profile = json.loads((tmp_path / "profile.json").read_text())
    assert profile["num_layers"] == 4 and profile["num_params"] > 0

    out = meshplan(
        "plan",
        "--model",
        "gpt-tiny",
        "--profile",
        "profile.json",
        "--cluster",
        "local-cpu",
        "--num-gpus",
        "4",
        "--global-batch",
        "8",
        "--top",
        "6",
        "--json",
        "-o",
        "plan.json",
        cwd=tmp_path,
    )
    view = json.loads(out.stdout)
    assert view["pp"] * view["dp"] * view["tp"] * view["cp"] == 4
    assert view["step_time_s"] > 0 and view["search_time_s"] >= 0
    families = {(alt["pp"], alt["dp"], alt["tp"]) for alt in view["alternatives"]} | {
        (view["pp"], view["dp"], view["tp"])
    }
    assert len(families) >= 2, "the search must compare different splits"

    out = meshplan("run", "plan.json", "--steps", "3", "--out-dir", "run", "--json", cwd=tmp_path)
    run = json.loads(out.stdout)
    assert len(run["losses"]) == 3 and all(x > 0 for x in run["losses"])
    assert run["step_time_s"] > 0 and run["peak_memory_bytes"] > 0
    assert (tmp_path / "run" / "run.json").exists()

    meshplan("report", "plan.json", "--run", "run/run.json", "-o", "report", "--quiet", cwd=tmp_path)
    md = (tmp_path / "report" / "report.md").read_text()
    assert "predicted" in md.lower() and "measured" in md.lower()
    assert (tmp_path / "report" / "report.html").stat().st_size > 1000


def test_walking_skeleton_covers_dp_tp_pp_and_hybrid(tmp_path):
    """Each split family can be planned (pinned) for 4 local ranks."""
    for pins in (["--dp", "4"], ["--tp", "4"], ["--pp", "4"], ["--dp", "2", "--tp", "2"]):
        out = meshplan(
            "plan",
            "--model",
            "gpt-tiny",
            "--cluster",
            "local-cpu",
            "--num-gpus",
            "4",
            "--global-batch",
            "8",
            *pins,
            "--json",
            cwd=tmp_path,
        )
        view = json.loads(out.stdout)
        for flag, value in zip(pins[::2], pins[1::2]):
            assert view[flag.lstrip("-")] == int(value)

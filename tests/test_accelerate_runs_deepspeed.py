"""`accelerate launch` of a meshplan accelerate export, run for real: the export tools' accelerate and DeepSpeed
on 2 CPU ranks over gloo train benchmarks/deepspeed_model.py (tests/accelerate_deepspeed_train.py). A
--runtime deepspeed plan goes to accelerate's DeepSpeed plugin with ds_config.json beside the YAML
(meshplan/report/export_accelerate.py); the engine Accelerator.prepare builds must run the stage, bucket,
collective, overlap, accumulation and gradient width the plan was priced with, and the loss must fall.
tests/test_export_parsers.py holds the same files to accelerate's and DeepSpeed's config classes; this
holds them to the engine that trains."""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from meshplan import runtimes
from meshplan.cli import main
from meshplan.plan import Plan
from meshplan.report import export_plan
from meshplan.schema import load

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
ACCELERATE = ROOT / ".venv-exports" / "bin" / "accelerate"
TRAIN = ROOT / "tests" / "accelerate_deepspeed_train.py"
PLAN = ["plan", "--model", str(ROOT / "benchmarks" / "deepspeed_model.py") + ":build", "--cluster", "a100-80g"]
PLAN += "--num-gpus 2 --global-batch 16 --microbatch 4 --tp 1 --pp 1 --zero 2 --runtime deepspeed".split()
PLAN += "--precision fp32 --recompute none --no-overlap-dp-comm --reduce-bucket-elems 100000".split()
PLAN += "--zero2-grad-collective reduce_scatter".split()
"""A ZeRO-2 plan priced with every engine setting off DeepSpeed's defaults: no overlap, a 1e5-element
bucket, the reduce-scatter (use_multi_rank_bucket_allreduce false). fp32: DeepSpeed's CPU ranks."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    if not ACCELERATE.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{ACCELERATE} is missing in CI: `make test` builds it with `make export-tools`")
        pytest.skip("export tools venv missing: run `make export-tools` to run the accelerate export")
    from benchmarks.deepspeed_bytes import build_cpu_ops

    build_cpu_ops(timeout_s=300)  # once, before the ranks: two ranks compiling it at once can abort one
    folder = tmp_path_factory.mktemp("accelerate-deepspeed")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main([*PLAN, "-q", "-o", str(folder / "plan.json")]) == 0
    plan = load(Plan, folder / "plan.json", "plan")
    for name, text in export_plan(plan, "accelerate").items():
        (folder / name).write_text(text)
    argv = [str(ACCELERATE), "launch", "--config_file", "accelerate_config.yaml"]
    argv += ["--main_process_port", str(_free_port()), str(TRAIN)]
    env = {**os.environ, "PYTHONPATH": "", "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.Popen(argv, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=300)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and both ranks: nothing left behind
        proc.communicate()
        pytest.fail("accelerate launch did not finish in 300 s")
    report = folder / "engine_report.json"  # written by the main process (stdout interleaves the ranks)
    assert proc.returncode == 0 and report.is_file(), out[-3000:]
    return plan, json.loads(report.read_text())


def test_the_export_uses_the_deepspeed_plugin(trained):
    plan, got = trained
    assert plan.runtime == "deepspeed" and plan.zero_stage == 2 and plan.data_parallel_degree == 2
    assert (got["distributed_type"], got["engine"], got["optimizer"]) == (
        "DEEPSPEED",
        "DeepSpeedEngine",
        "DeepSpeedZeroOptimizer",
    )


def test_the_engine_runs_what_the_plan_priced(trained):
    plan, got = trained
    behaviours = plan.runtime_behaviours
    assert got["zero_stage"] == plan.zero_stage
    assert got["overlap_comm"] is behaviours["overlap_dp_comm"] is False
    assert got["reduce_bucket_size"] == behaviours["reduce_bucket_elems"] == 100_000
    assert got["multi_rank_bucket_allreduce"] is False and behaviours["zero2_grad_collective"] == "reduce_scatter"
    assert (got["micro_batch"], got["accumulation"]) == (plan.microbatch_size, plan.num_microbatches)
    assert got["data_parallel"] == plan.data_parallel_degree
    assert got["communication_bytes"] == runtimes.grad_reduce_bytes(behaviours, plan.precision, plan.zero_stage)


def test_it_trains(trained):
    _, got = trained
    assert got["last_loss"] < 0.8 * got["first_loss"]

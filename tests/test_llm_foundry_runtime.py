"""--runtime llm-foundry: MPT under Composer's FSDP or DDP (meshplan/runtimes.py). Data parallelism
only (behaviour model_parallel), flash-attn's fused cross-entropy (behaviour loss), one GEMM for Q,
K, V, and FSDP reduce-scattering every microbatch. Checked on a run its benchmarks publish: MPT-1B on
64 A100 40 GB, FULL_SHARD, microbatch 10, no activation checkpointing (scripts/train/benchmarking)."""

from __future__ import annotations

import contextlib
import io

import pytest

from meshplan.cli import main
from meshplan.planner import estimate
from meshplan.planner.search import search
from meshplan.validation.published import cli_inputs

MPT_1B = "layers=24 hidden=2048 heads=16 vocab=50368 seq=2048"
PUBLISHED = "--tp 1 --pp 1 --dp 64 --zero 3 --microbatch 10 --recompute none --schedule 1f1b"


def _argv(verb: str, runtime: str, pins: str = "") -> list[str]:
    argv = [verb, "--model", "analytic:gpt", "--set", *MPT_1B.split(), "--cluster", "a100-40g"]
    return argv + ["--num-gpus", "64", "--global-batch", "640", "--runtime", runtime, *pins.split()]


def _fits(plan) -> bool:
    return all(s.total_bytes <= s.capacity_bytes for s in plan.prediction.stage_memory)


def test_the_published_run_fits_as_llm_foundry_runs_it_and_not_with_torchs_loss():
    foundry = estimate(*cli_inputs(_argv("estimate", "llm-foundry", PUBLISHED)))
    titan = estimate(*cli_inputs(_argv("estimate", "torchtitan", PUBLISHED)))
    assert _fits(foundry) and not _fits(titan)
    assert foundry.runtime_behaviours["loss"] == "fused" and foundry.runtime_behaviours["fused_projections"]
    # the same prediction as torchtitan told MPT's two differences
    told = estimate(*cli_inputs(_argv("estimate", "torchtitan", f"{PUBLISHED} --loss fused --fused-projections")))
    assert foundry.prediction.step_time_s == pytest.approx(told.prediction.step_time_s, rel=1e-12)
    assert foundry.prediction.peak_memory_bytes == pytest.approx(told.prediction.peak_memory_bytes, rel=1e-12)


def test_the_search_offers_data_parallel_layouts_only():
    profile, cluster, request = cli_inputs(_argv("plan", "llm-foundry"))
    best = search(profile, cluster, request)
    degrees = (best.tensor_parallel_degree, best.pipeline_parallel_degree, best.context_parallel_degree)
    assert degrees == (1, 1, 1) and _fits(best)
    assert request.model_parallel == () and cli_inputs(_argv("plan", "torchtitan"))[2].model_parallel
    assert best.search is not None
    reasons = {r.reason for r in best.search.rejected}
    assert "runtime llm-foundry runs no tp > 1 (behaviour model_parallel)" in reasons, sorted(reasons)[:5]


def test_a_pinned_tensor_parallel_degree_is_predicted_with_one_warning_line():
    out, err = io.StringIO(), io.StringIO()
    pins = PUBLISHED.replace("--tp 1", "--tp 2").replace("--dp 64", "--dp 32")
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([*_argv("estimate", "llm-foundry", pins), "--quiet"])
    warned = [line for line in err.getvalue().splitlines() if "--tp 2: runtime llm-foundry runs no such" in line]
    assert rc == 0 and len(warned) == 1

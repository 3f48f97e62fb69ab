"""--runtime llm-foundry: MPT under Composer's FSDP or DDP (meshplan/runtimes.py). Data parallelism
only (behaviour model_parallel), flash-attn's fused cross-entropy (behaviour loss), one GEMM for Q,
K, V, FSDP reduce-scattering every microbatch, Composer's FSDP1 (PURE mixed precision: bf16 gathers
and reduce-scatters; BACKWARD_POST: a unit's parameters freed before the next is gathered). Checked
on a run its benchmarks publish: MPT-1B on 64 A100 40 GB, FULL_SHARD, microbatch 10, no activation
checkpointing (scripts/train/benchmarking)."""

from __future__ import annotations

import contextlib
import io

import pytest

from meshplan.cli import main
from meshplan.planner import estimate
from meshplan.planner.context import Context
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
    # the same prediction as torchtitan told MPT's and Composer's FSDP's differences
    composer = "--loss fused --fused-projections --fsdp-reduce-dtype bf16 --fsdp-unit-buffers backward_post"
    told = estimate(*cli_inputs(_argv("estimate", "torchtitan", f"{PUBLISHED} {composer}")))
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


def _buffers(pins: str) -> float:
    """The ZeRO-3 buffer bytes of the published run's stage under llm-foundry with `pins`."""
    got = estimate(*cli_inputs(_argv("estimate", "llm-foundry", f"{PUBLISHED} {pins}")))
    return got.prediction.stage_memory[0].buffers_bytes


def test_composer_fsdp1_holds_fewer_unit_buffers_than_fsdp2():
    """MPT-1B's largest FSDP unit is the root (tied wte 50368 x 2048 and wpe 2048 x 2048: 107.3M
    elements). Under BACKWARD_POST with PURE (bf16 everything) its backward peak holds the next unit's
    bf16 parameters and the unit's bf16 gradients, 4 bytes an element; BACKWARD_PRE also the unit's
    own parameters, 6; DEFAULT adds the fp32 reduce-scatter copy, 8; FSDP2 always copies into its
    reduce-scatter input, 3 x 2 + 2 = 8 under bf16 reduction, 10 under fp32."""
    unit = 50368 * 2048 + 2048 * 2048 + 2 * 2048  # the root: wte, wpe and the final LayerNorm
    assert _buffers("") == pytest.approx(4 * unit, rel=1e-3)
    assert _buffers("--fsdp-unit-buffers backward_pre") == pytest.approx(6 * unit, rel=1e-3)
    assert _buffers("--fsdp-reduce-dtype fp32") == pytest.approx(8 * unit, rel=1e-3)
    assert _buffers("--fsdp-unit-buffers fsdp2") == pytest.approx(8 * unit, rel=1e-3)
    assert _buffers("--fsdp-unit-buffers fsdp2 --fsdp-reduce-dtype fp32") == pytest.approx(10 * unit, rel=1e-3)


def test_the_reduce_dtype_sets_the_reduce_scatter_bytes_only():
    """PURE reduce-scatters bf16 gradients, DEFAULT fp32: the shard axis' bytes per step differ by
    the reduce-scatter's ring volume alone (every microbatch: 1 here); the gathers stay bf16."""
    pure, default = (
        estimate(*cli_inputs(_argv("estimate", "llm-foundry", f"{PUBLISHED} {pins}")))
        for pins in ("", "--fsdp-reduce-dtype fp32")
    )
    extra = default.prediction.comm_bytes_per_step["dp_shard"] - pure.prediction.comm_bytes_per_step["dp_shard"]
    params = pure.prediction.comm_bytes_per_step["dp_shard"] / 3  # two bf16 gathers and one bf16 scatter
    assert extra == pytest.approx(params, rel=0.01)
    assert default.prediction.step_time_s >= pure.prediction.step_time_s


def test_an_fp32_run_gathers_and_reduces_fp32_whatever_the_16_bit_default():
    """Composer's PURE reduces in the run's own dtype: under --precision fp32 the runtime's bf16
    defaults give way to 4 bytes (planner/context.py Context.spec)."""
    profile, cluster, request = cli_inputs(_argv("estimate", "llm-foundry", f"{PUBLISHED} --precision fp32"))
    spec = Context.build(profile, cluster, request).spec
    assert (spec.fsdp_gather_bytes, spec.fsdp_reduce_bytes) == (4, 4)

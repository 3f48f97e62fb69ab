"""Unfused memory-bound kernels (planner/cost/elementwise.py, behaviour `elementwise`): the bytes each
level adds, how they reach a layer's time, and the CLI / runtime / export wiring."""

from __future__ import annotations

import json

import pytest
from planner_profiles import candidate

from meshplan.cli import main
from meshplan.models.analytic import gpt_profile, llama_profile
from meshplan.planner import PlanRequest
from meshplan.planner.context import Context
from meshplan.planner.cost import elementwise as ew
from meshplan.planner.rank.layer_cost import layer_cost
from meshplan.presets import cluster_preset

H, KV, F, S = 512, 128, 1536, 1024
LLAMA = llama_profile(layers=2, hidden=H, heads=8, kv_heads=2, ffn_hidden=F, vocab=1000, seq=S)
GPT = gpt_profile(layers=2, hidden=H, heads=8, vocab=1000, seq=S, flash=True, dropout=False)


def test_eager_llama_block_bytes_are_the_counted_ops():
    """Per token: 2 RMSNorms x 32 B x h extra (replicated), rotary 16 B over q and k, the GQA
    repeat of K and V (r 2kv + w 2h each), SwiGLU 4 B over f and the attention output copy 4 B
    over h (split); backward twice the forward."""
    got = ew.extra_bytes_per_token(LLAMA.layers[1], "eager")
    split = 16 * (H + KV) + 4 * (H + KV) + 4 * F + 4 * H
    assert got["forward"] == (64 * H, split)
    assert got["backward"] == (128 * H, 2 * split)


def test_levels_order_and_fused_adds_nothing():
    block = LLAMA.layers[1]
    total = {lv: sum(sum(v) for v in ew.extra_bytes_per_token(block, lv).values()) for lv in ew.LEVELS}
    assert total["fused"] == 0 < total["compiled"] < total["eager"]
    # compiled keeps only the copies that feed SDPA and wo: repeated K, V (4h) and the output (4h)
    assert ew.extra_bytes_per_token(block, "compiled")["forward"] == (0.0, 8.0 * H)
    # a GPT block's eager kernels are single passes already: only the output copy, no GQA repeat
    assert ew.extra_bytes_per_token(GPT.layers[1], "eager")["forward"] == (0.0, 4.0 * H)
    assert ew.extra_bytes_per_token(LLAMA.layers[0], "eager")["forward"] == (0.0, 0.0)  # embedding
    with pytest.raises(ValueError, match="unknown"):
        ew.extra_bytes_per_token(block, "jit")


def test_fp8_casts_cost_only_outside_transformer_engine():
    block = LLAMA.layers[1]
    for level in ("compiled", "eager"):
        plain, fp8 = ew.extra_bytes_per_token(block, level), ew.extra_bytes_per_token(block, level, fp8=True)
        assert fp8["forward"][0] - plain["forward"][0] == 2 * H * ew.FP8_CAST_BYTES[level]  # the norm outputs
        assert fp8["backward"][1] > plain["backward"][1]
    assert ew.extra_bytes_per_token(block, "fused", fp8=True) == ew.extra_bytes_per_token(block, "fused")


def test_a_built_models_per_linear_shapes_read_as_the_closed_form():
    """The zoo's Llama (q, k, v, o, w1, w3, w2 listed one by one) gets the same extra bytes as
    the closed-form block of the same shape (fused [qkv], [w1 w3] GEMMs)."""
    from meshplan.inputs import build_profile

    built = build_profile("llama", ["layers=2", f"hidden={H}", "heads=8", "kv_heads=2", f"ffn_hidden={F}", f"seq={S}"])
    block = next(lp for lp in built.layers if lp.tp.kind == "block")
    assert len(block.gemm_shapes) == 7
    assert ew.extra_bytes_per_token(block, "eager") == ew.extra_bytes_per_token(LLAMA.layers[1], "eager")


def _layer_s(level: str, tp: int = 1, sp: bool = False, recompute: str = "none") -> float:
    n = max(tp, 1)
    req = PlanRequest(num_gpus=n, global_batch=4, elementwise=level)
    ctx = Context.build(LLAMA, cluster_preset("h100-80g", n), req)
    cand = candidate(tp=tp, microbatch=2, num_microbatches=2, sequence_parallel=sp)
    return layer_cost(ctx, ctx.profile.layers[1], cand).modes[recompute].time_s


def test_the_extra_bytes_reach_the_layer_time_at_hbm_bandwidth():
    hbm = cluster_preset("h100-80g", 1).device.hbm_gbps * 1e9
    extra = ew.extra_bytes_per_token(LLAMA.layers[1], "eager")
    per_token = sum(extra["forward"]) + sum(extra["backward"])
    assert _layer_s("eager") - _layer_s("fused") == pytest.approx(2 * S * per_token / hbm, rel=1e-9)
    # full recompute runs the forward's kernels again
    fwd = sum(extra["forward"])
    assert _layer_s("eager", recompute="full") - _layer_s("fused", recompute="full") == pytest.approx(
        2 * S * (per_token + fwd) / hbm, rel=1e-9
    )


def test_tensor_parallel_splits_the_norms_only_with_sequence_parallelism():
    hbm = cluster_preset("h100-80g", 2).device.hbm_gbps * 1e9
    (rep_f, split_f), (rep_b, split_b) = ew.extra_bytes_per_token(LLAMA.layers[1], "eager").values()
    tokens = 2 * S
    no_sp = _layer_s("eager", tp=2) - _layer_s("fused", tp=2)
    with_sp = _layer_s("eager", tp=2, sp=True) - _layer_s("fused", tp=2, sp=True)
    assert no_sp == pytest.approx(tokens * (rep_f + rep_b + (split_f + split_b) / 2) / hbm, rel=1e-9)
    assert with_sp == pytest.approx(tokens * (rep_f + rep_b + split_f + split_b) / 2 / hbm, rel=1e-9)


def _plan(path, *extra: str) -> dict:
    argv = ["plan", "--model", "llama-tiny", "--cluster", "h100-80g", "--num-gpus", "8", "--global-batch", "16"]
    zero = [] if "--zero" in extra else ["--zero", "3"]  # a flag given twice is refused
    assert main([*argv, "--tp", "1", "--pp", "1", "--dp", "8", *zero, "-q", "-o", str(path), *extra]) == 0
    return json.loads(path.read_text())


def test_cli_runtime_defaults_and_flags(tmp_path, capsys):
    """torchtitan runs eager unless --compile; --elementwise overrides any runtime; Megatron-Core
    is fused. Eager is never faster than compiled, compiled never faster than fused."""
    steps = {}
    for name, flags in {
        "titan": ["--runtime", "torchtitan"],
        "titan_compiled": ["--runtime", "torchtitan", "--compile"],
        "titan_fused": ["--runtime", "torchtitan", "--elementwise", "fused"],
        "megatron_core_eager": ["--runtime", "megatron-core", "--zero", "1", "--elementwise", "eager"],
        "megatron_core": ["--runtime", "megatron-core", "--zero", "1"],
    }.items():
        plan = _plan(tmp_path / f"{name}.json", *flags)
        steps[name] = plan["prediction"]["step_time_s"]
        steps[name + ":level"] = plan["runtime_behaviours"]["elementwise"]
    assert steps["titan:level"] == "eager" and steps["titan_compiled:level"] == "compiled"
    assert steps["megatron_core:level"] == "fused" and steps["megatron_core_eager:level"] == "eager"
    assert steps["titan"] > steps["titan_compiled"] > steps["titan_fused"]
    assert steps["megatron_core_eager"] > steps["megatron_core"]


def test_torchtitan_export_compiles_what_was_predicted_compiled(tmp_path, capsys):
    out = {}
    for name, flags in {"eager": [], "compiled": ["--compile"]}.items():
        plan = tmp_path / f"{name}.json"
        argv = ["plan", "--model", "llama-tiny", "--cluster", "h100-80g", "--num-gpus", "8", "--global-batch", "16"]
        assert main([*argv, "--runtime", "torchtitan", *flags, "-q", "-o", str(plan)]) == 0
        folder = tmp_path / name
        assert main(["export", str(plan), "--to", "torchtitan", "--target-version", "0.2", "-o", str(folder)]) == 0
        out[name] = (folder / "meshplan.toml").read_text()
        current = tmp_path / f"{name}-0.3"
        assert main(["export", str(plan), "--to", "torchtitan", "-o", str(current)]) == 0
        out[name + ":0.3"] = (current / "meshplan_torchtitan.py").read_text()
    capsys.readouterr()
    assert "[compile]\nenable = true" in out["compiled"] and "[compile]" not in out["eager"]
    assert "CompileConfig(enable=True)" in out["compiled:0.3"] and "CompileConfig(enable=False)" in out["eager:0.3"]


def test_split_projections_read_smaller_gemms_and_never_speed_a_layer_up():
    """`fused_projections` False (torchtitan, meshplan's zoo: wq, wk, wv, w1, w3 apart) reads each
    projection's GEMM on the curve at its own size: K and V of a GQA block are small, so at a small
    microbatch under TP the layer is slower; Megatron's fused QKV / gate+up is the default."""
    from meshplan.planner.cost.compute import layer_efficiency

    def eff(fused: bool, b: int, tp: int) -> float:
        req = PlanRequest(num_gpus=8, global_batch=8, fused_projections=fused)
        ctx = Context.build(LLAMA, cluster_preset("h100-80g", 8), req)
        return layer_efficiency(ctx, ctx.profile.layers[1], b, tp, 1)

    assert eff(False, 1, 8) < eff(True, 1, 8)
    for b, tp in ((1, 1), (4, 2), (8, 8)):
        assert eff(False, b, tp) <= eff(True, b, tp)

"""Section 6, the prepared GPU script: run it where a GPU is available.

    python -m benchmarks.gpu_check --out DIR [--quick]        # writes DIR/gpu_check.json

1. Per-layer profile timing: `profile_model(MODEL, device="cuda")` per microbatch size (CUDA
   events, medians), beside what the cost model would predict for the same layer from the
   device preset alone (FLOPs / (peak x GEMM efficiency)).
2. Memory: predicted peak (planner.estimate on the preset, one device) vs
   torch.cuda.max_memory_allocated of the executor running the same single-device plan, for
   several configurations (microbatch, recompute).
3. The bf16 GEMM efficiency curve: square bf16 matmuls timed with CUDA events, achieved FLOP/s
   over the preset's dense bf16 peak, beside the preset's `gemm_efficiency` curve.
4. Attention kernel rates (benchmarks/attention_rates.py): each SDPA backend (flash, cuDNN,
   memory-efficient), causal, 32 heads of 128, 1k-32k tokens, forward and backward, beside what
   the cost model charges a flash core of the same shape.
The preset is chosen from the GPU's name (H200 -> h200-141g, H100 -> h100-80g, ...).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

MODEL = "gpt"
CONFIG = {"layers": 4, "hidden": 1024, "heads": 16, "vocab": 32000, "seq": 1024}
"""A GPT small enough to profile in seconds, large enough for real GEMMs."""
MEMORY_CONFIGS = [
    dict(microbatch=1, recompute="none"),
    dict(microbatch=4, recompute="none"),
    dict(microbatch=4, recompute="full"),
    dict(microbatch=8, recompute="selective"),
    dict(microbatch=8, recompute="full"),
]
GEMM_SIZES = [256, 512, 1024, 2048, 4096, 8192]


def preset_for_gpu() -> str:
    import torch

    name = torch.cuda.get_device_name().upper()
    for key, preset in (("H200", "h200-141g"), ("H100", "h100-80g"), ("B200", "b200-180g"), ("A100", "a100-80g")):
        if key in name:
            return preset
    return "h100-80g"


def gemm_curve(sizes: list[int], repeats: int = 20) -> list[dict]:
    """Achieved bf16 FLOP/s of an n x n x n matmul (2 n^3 FLOPs), median over `repeats`."""
    import torch

    from meshplan.planner.cost.compute import gemm_efficiency
    from meshplan.presets import cluster_preset

    device = cluster_preset(preset_for_gpu(), 1).device
    peak = device.peak_flops["bf16"]
    rows = []
    for n in sizes:
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            a @ b
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            a @ b
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        flops = 2.0 * n**3
        achieved = flops / statistics.median(times)
        rows.append(
            {
                "n": n,
                "gemm_flops": flops,
                "time_s": statistics.median(times),
                "measured_efficiency": achieved / peak,
                "preset_efficiency": gemm_efficiency(device.gemm_efficiency, flops),
            }
        )
    return rows


def layer_timings(microbatches: list[int]) -> tuple[list[dict], object]:
    """Measured fwd/bwd per layer (the profiler on CUDA) beside the preset-only prediction
    forward FLOPs / (bf16 peak x GEMM efficiency at the layer's forward FLOPs), an optimistic
    bound since a layer is several smaller GEMMs; and the profile itself."""
    from meshplan.planner.cost.compute import gemm_efficiency
    from meshplan.presets import cluster_preset
    from meshplan.profiler import profile_model

    device = cluster_preset(preset_for_gpu(), 1).device
    profile = profile_model(MODEL, CONFIG, device="cuda", microbatch_sizes=microbatches)
    rows = []
    for layer in profile.layers:
        for t in getattr(layer, "timings", []) or []:
            rows.append(
                {
                    "layer": layer.name,
                    "kind": layer.kind,
                    "microbatch": t.microbatch_size,
                    "forward_s": t.forward_s,
                    "backward_s": t.backward_s,
                    "forward_flops": layer.forward_flops * t.microbatch_size,
                    "preset_forward_s": layer.forward_flops
                    * t.microbatch_size
                    / (
                        device.peak_flops["bf16"]
                        * gemm_efficiency(device.gemm_efficiency, layer.forward_flops * t.microbatch_size)
                    ),
                    "measured_peak_bytes": t.peak_bytes,
                    "predicted_peak_bytes": t.predicted_peak_bytes,
                    "reused_from": t.reused_from,
                }
            )
    return rows, profile


def memory_check(profile, configs: list[dict], steps: int = 3) -> list[dict]:
    """estimate() on the preset vs the executor's CUDA max allocated, one device per config."""
    from meshplan.errors import MeshplanError
    from meshplan.executor import run_plan
    from meshplan.planner import PlanRequest, estimate
    from meshplan.presets import cluster_preset

    cluster = cluster_preset(preset_for_gpu(), 1)
    rows = []
    for cfg in configs:
        req = PlanRequest(
            num_gpus=1,
            global_batch=cfg["microbatch"],
            precision="bf16",
            dp=1,
            tp=1,
            pp=1,
            microbatch=cfg["microbatch"],
            recompute=cfg["recompute"],
        )
        row = dict(cfg)
        try:
            plan = estimate(profile, cluster, req)
            with tempfile.TemporaryDirectory(prefix="meshplan-gpu-") as tmp:
                result = run_plan(plan, steps=steps, out_dir=tmp, quiet=True)
            row.update(
                predicted_bytes=plan.prediction.peak_memory_bytes,
                measured_bytes=result.peak_memory_bytes,
                error=plan.prediction.peak_memory_bytes / result.peak_memory_bytes - 1,
                predicted_step_s=plan.prediction.step_time_s,
                measured_step_s=result.step_time_s,
            )
        except MeshplanError as exc:
            row["error_message"] = str(exc)
        rows.append(row)
    return rows


def run(quick: bool = False) -> dict:
    import torch

    if not torch.cuda.is_available():
        return {"available": False, "note": "no CUDA device"}
    start = time.perf_counter()
    out = {
        "device": torch.cuda.get_device_name(),
        "preset": preset_for_gpu(),
        "torch_version": torch.__version__,
        "model": MODEL,
        "config": CONFIG,
    }
    out["gemm"] = gemm_curve(GEMM_SIZES[:4] if quick else GEMM_SIZES)
    layers, profile = layer_timings([1, 4] if quick else [1, 2, 4, 8])
    out["layers"] = layers
    out["memory"] = memory_check(profile, MEMORY_CONFIGS[:2] if quick else MEMORY_CONFIGS)
    errors = [abs(r["error"]) for r in out["memory"] if "error" in r]
    out["memory_mape"] = statistics.fmean(errors) if errors else None
    from benchmarks.attention_rates import SEQS, measure

    out["attention"] = measure(SEQS[:4] if quick else SEQS)
    for backend in sorted({r["backend"] for r in out["attention"] if "error" not in r}):
        ratios = [r["forward_over_priced"] for r in out["attention"] if r["backend"] == backend and "error" not in r]
        out.setdefault("attention_forward_over_priced_median", {})[backend] = statistics.median(ratios)
    out["time_s"] = round(time.perf_counter() - start, 1)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=".", help="folder for gpu_check.json")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    result = run(args.quick)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "gpu_check.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("layers",)}, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The plans the export tests feed to the real tools, made through the CLI with the closed-form models
(each plans in well under a second): GPT-3 175B on 1024 A100, Llama-3 70B on 64 H100 with --tp 8, Llama-3
8B FSDP under torchtitan, GPT-3 13B ZeRO-3 + CPU offload and + NVMe parameter offload (ZeRO-Infinity)
under DeepSpeed, an interleaved Megatron-Core
estimate, a DeepSpeed ZeRO-2 plan, Llama-3 8B tp 2 under DeepSpeed, Llama-3 70B fp8 under Megatron-Core, Llama-3
70B interleaved over pp 4 x tp 2 under torchtitan (its searched stage boundaries uneven)."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from meshplan import schema
from meshplan.cli import main
from meshplan.plan import Plan

GPT = ["--model", "analytic:gpt", "--set", "vocab=51200", "seq=2048"]
LLAMA = ["--model", "analytic:llama", "--set", "vocab=128256", "seq=8192", "kv_heads=8"]
LLAMA_8B = [*LLAMA, "layers=32", "hidden=4096", "heads=32", "ffn_hidden=14336"]
LLAMA_70B = [*LLAMA, "layers=80", "hidden=8192", "heads=64", "ffn_hidden=28672"]
H100, A100 = ["--cluster", "h100-80g"], ["--cluster", "a100-80g"]

PLAN_ARGS: dict[str, list[str]] = {
    "gpt3-175b-1024xa100": ["plan", *GPT, "layers=96", "hidden=12288", "heads=96", *A100, "--num-gpus", "1024",
                            "--global-batch", "1536"],
    "llama3-70b-64xh100-tp8": ["plan", *LLAMA_70B, *H100, "--num-gpus", "64", "--global-batch", "128", "--tp", "8"],
    "llama3-8b-fsdp-torchtitan": ["plan", *LLAMA_8B, *H100, "--num-gpus", "8", "--global-batch", "32", "--zero", "3",
                                  "--pp", "1", "--tp", "1", "--runtime", "torchtitan"],
    "gpt3-13b-zero3-offload-deepspeed": ["plan", *GPT, "layers=40", "hidden=5120", "heads=40", *A100, "--num-gpus",
                                         "16", "--global-batch", "64", "--zero", "3", "--offload", "cpu",
                                         "--runtime", "deepspeed"],
    "gpt3-13b-zero3-nvme-deepspeed": ["plan", *GPT, "layers=40", "hidden=5120", "heads=40", *A100, "--num-gpus",
                                      "16", "--global-batch", "64", "--zero", "3", "--offload", "nvme:params=true",
                                      "--runtime", "deepspeed"],
    "gpt3-6.7b-interleaved-megatron-core": ["estimate", *GPT, "layers=32", "hidden=4096", "heads=32", *H100,
                                            "--num-gpus", "32", "--global-batch", "64", "--tp", "2", "--pp", "4",
                                            "--dp", "4", "--microbatch", "1", "--schedule", "interleaved",
                                            "--virtual-stages", "2", "--recompute", "full", "--zero", "1",
                                            "--sequence-parallel", "--runtime", "megatron-core"],
    "gpt3-1.3b-zero2-deepspeed": ["plan", *GPT, "layers=24", "hidden=2048", "heads=16", *A100, "--num-gpus", "8",
                                  "--global-batch", "64", "--zero", "2", "--runtime", "deepspeed"],
    "gpt3-1.3b-zero2-buckets-deepspeed": ["plan", *GPT, "layers=24", "hidden=2048", "heads=16", *A100, "--num-gpus",
                                          "8", "--global-batch", "64", "--zero", "2", "--runtime", "deepspeed",
                                          "--reduce-bucket-elems", "200000000", "--zero2-grad-collective",
                                          "reduce_scatter", "--no-overlap-dp-comm"],
    "llama3-8b-tp2-deepspeed": ["plan", *LLAMA_8B, *H100, "--num-gpus", "16", "--global-batch", "32", "--tp", "2",
                                "--runtime", "deepspeed"],
    "llama3-70b-fp8-megatron-core": ["plan", *LLAMA_70B, *H100, "--num-gpus", "64", "--global-batch", "128",
                                     "--precision", "fp8", "--runtime", "megatron-core"],
    # searched, uneven stage boundaries (torchtitan runs module_fqns_per_model_part as given)
    "llama3-70b-pp4-interleaved-torchtitan": ["plan", *LLAMA_70B, *H100, "--num-gpus", "64", "--global-batch",
                                              "128", "--pp", "4", "--tp", "2", "--schedule", "interleaved",
                                              "--runtime", "torchtitan"],
}  # fmt: skip

HF_PLAN_ARGS: dict[str, list[str]] = {
    # the Llama-3 8B FSDP plan above, of the HF config: its profile records the architecture, so its exports are
    # the closed-form Llama's (torchtitan's llama3 8B, Megatron's Llama flags); 25 s to profile on meta
    "llama3.1-8b-hf-fsdp-torchtitan": ["plan", "--model", "hf:meta-llama/Llama-3.1-8B", *H100, "--num-gpus", "8",
                                       "--global-batch", "32", "--zero", "3", "--pp", "1", "--tp", "1",
                                       "--runtime", "torchtitan"],
}  # fmt: skip
"""Plans of HF configs, exported to the real tools by tests/test_export_parsers.py (not re-estimated by
tests/test_imports.py: an HF model is profiled again on every --import)."""

ALL_PLAN_ARGS = {**PLAN_ARGS, **HF_PLAN_ARGS}


def make_plan(name: str, out_dir: Path) -> Plan:
    """Plan `name` through `meshplan plan/estimate ... -o`; the Plan as the file holds it."""
    path = Path(out_dir) / f"{name}.json"
    if not path.exists():
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            code = main([*ALL_PLAN_ARGS[name], "--quiet", "-o", str(path)])
        assert code == 0, f"meshplan {' '.join(ALL_PLAN_ARGS[name])} exited {code}"
    return schema.load(Plan, path, "plan")

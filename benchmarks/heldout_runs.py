"""Held-out published runs predicted through the public CLI path (`meshplan estimate`, the same
parser and request builder as `meshplan plan`): nothing in the model was set from these rows.

Run alone: `python -m benchmarks.heldout_runs [--out DIR]` (a few seconds; writes DIR/heldout_runs.md
and prints the table). Rows: torchtitan's published benchmarks (pytorch/torchtitan benchmarks/),
each with `--runtime torchtitan`, the cluster preset of the hardware its file describes, and what
the row states (FSDP/TP/PP/CP degrees, local batch, activation checkpointing, torch.compile,
Float8, async TP):
- llama3_h100_202412_torchtitan.md: Llama 3.1 8B / 70B / 405B on H100 96 GB HBM2e at 500 W (Grand
  Teton; torch, torchao, torchtitan of 2024-12). PP rows are predicted with `--zero 2`:
  torchtitan's default reshard policy keeps parameters gathered under PP (README). The rows state
  the local batch, not the microbatch: torchtitan at the benchmarks' commit (9dec370, 2024-12-26)
  splits it into pipeline_parallel_degree microbatches when pipeline_parallel_microbatches is
  unset, whatever the schedule (parallelisms/pipelining_utils.py build_pipeline_schedule; one per
  stage of the whole pipeline only from 90567fc, 2025-01-07), and runs two stages per rank for a
  looped schedule such as Interleaved1F1B (generate_split_points), which `torchtitan_pp_pins`
  writes as --microbatch and --virtual-stages.
- docs/performance.md at 3faaa1a0d (2024-08): Llama 3 8B / 70B and Llama 2 13B / 70B under FSDP2 on
  64 A100 80 GB (local batch 1-2, op-level selective, full or no AC), Llama 3.1 405B under FSDP 16 x
  TP 8 on 128 of the H100 96 GB (bf16, Float8, Float8 + async TP); its "selective layer" rows are left
  out (--recompute states one mode for every block).
- asyncTP_llama3_h100_2025-06_torchtitan.md: Llama 3.1 70B (FSDP 32 x TP 8, full AC, local batch
  16) and 8B (FSDP 8 x TP 8, per-op selective AC, local batch 12) on the same H100s with
  torch.compile, vanilla and async TP, bf16 and Float8 tensorwise (its Float8 rowwise rows are
  left out: `--precision fp8` is the tensorwise recipe). No memory is stated.
- llama3-8b_h200_202506_trainy-whitefiber.md: Llama 3.1 8B FSDP on 32 and 64 H200 (the repo's
  llama3_8b.toml at e7c0cae: seq 8192, per-op selective AC; local batch 2, compile, Float8).
And one run of another FSDP2 stack on torch, predicted as `--runtime torchtitan` (the runtime row
of FSDP2 with torch's context parallelism): NeMo AutoModel's Llama 3.1 70B pretraining benchmark
(NVIDIA-NeMo/Automodel docs/performance-summary.mdx, DGX-H100 BF16; its recipe
custom_llama3_1_70b_pretrain_benchmark_8nodes.yaml: FSDP 32 x CP 2, seq 8192, local batch 1 with
4 accumulation steps, activation checkpointing per layer, compile, gradient sync every microbatch).
And llm-foundry's MPT benchmarks (mosaicml/llm-foundry scripts/train/benchmarking/README.md at
061f2c7): every row at MPT's training length, seq 2048, of its three bf16 tables (A100 80 GB and A100
40 GB with 1600 Gbps RoCE between nodes, H100 80 GB): MPT-125M to MPT-70B under Composer's FSDP
(FULL_SHARD), 8 to 128 GPUs, with and without activation checkpointing. MPT is a GPT without biases
(fused Wqkv, GELU MLP, learned positions, 50368-token vocabulary; the shapes of
scripts/train/yamls/pretrain/mpt-*.yaml, head dim 128 from 760M up), so `--model analytic:gpt`,
`--runtime llm-foundry` (one GEMM for Q, K, V, flash-attn's fused cross-entropy over the bf16
logits, FSDP reduce-scattering every microbatch, Composer's FSDP1 buffers under BACKWARD_POST:
docs/runtimes.md), each row's MP Mode as its reduce dtype (PURE bf16, DEFAULT fp32). No memory is
stated.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os

from meshplan.cli import main
from meshplan.imports.llm_foundry import MIXED_PRECISION

SOURCES = {
    "2024-12": ("pytorch/torchtitan benchmarks/llama3_h100_202412_torchtitan.md", "h100-96g", "torchtitan"),
    "2024-08 A100": (
        "pytorch/torchtitan docs/performance.md at 3faaa1a0d (2024-08-23), Llama 2 / 3 on 64 A100",
        "a100-80g",
        "torchtitan",
    ),
    "2024-08 405B": (
        "pytorch/torchtitan docs/performance.md at 3faaa1a0d (2024-08-23), Llama 3.1 405B on 128 H100 96 GB",
        "h100-96g",
        "torchtitan",
    ),
    "2025-06 async TP": (
        "pytorch/torchtitan benchmarks/asyncTP_llama3_h100_2025-06_torchtitan.md",
        "h100-96g",
        "torchtitan",
    ),
    "2025-06 H200": (
        "pytorch/torchtitan benchmarks/llama3-8b_h200_202506_trainy-whitefiber.md",
        "h200-141g",
        "torchtitan",
    ),
    "NeMo AutoModel": (
        "NVIDIA-NeMo/Automodel docs/performance-summary.mdx (pretraining, DGX-H100 BF16)",
        "h100-80g",
        "torchtitan",
    ),
    **{
        f"llm-foundry {gpu}": (
            f"mosaicml/llm-foundry scripts/train/benchmarking/README.md ({gpu} table)",
            cluster,
            "llm-foundry",
        )
        for gpu, cluster in (("A100 80GB", "a100-80g"), ("A100 40GB", "a100-40g"), ("H100 80GB", "h100-80g"))
    },
}
"""Short name -> (benchmark file, the cluster preset of the hardware it describes, --runtime)."""
SHAPES = {
    "8B": "layers=32 hidden=4096 heads=32 kv_heads=8 ffn_hidden=14336 vocab=128256",
    "70B": "layers=80 hidden=8192 heads=64 kv_heads=8 ffn_hidden=28672 vocab=128256",
    "405B": "layers=126 hidden=16384 heads=128 kv_heads=8 ffn_hidden=53248 vocab=128256",
    "Llama 2 13B": "layers=40 hidden=5120 heads=40 kv_heads=40 ffn_hidden=13824 vocab=32000",
    "Llama 2 70B": "layers=80 hidden=8192 heads=64 kv_heads=8 ffn_hidden=28672 vocab=32000",
    **{
        f"MPT-{name}": f"layers={layers} hidden={hidden} heads={heads} vocab=50368"
        for name, layers, hidden, heads in (
            ("125M", 12, 768, 12),
            ("350M", 24, 1024, 16),
            ("760M", 24, 1536, 12),
            ("1B", 24, 2048, 16),
            ("3B", 32, 2560, 20),
            ("7B", 32, 4096, 32),
            ("13B", 40, 5120, 40),
            ("30B", 48, 7168, 56),
            ("70B", 80, 8192, 64),
        )
    },
}
"""Closed-form shapes: Llama 3.1 (`analytic:llama`) and MPT (`analytic:gpt`, the MPT- names)."""
MPT_RUNS = {
    "A100 80GB": (  # (model, GPUs, microbatch, accumulation steps, activation checkpointing,
        # fsdp_config.mixed_precision, tokens/s/GPU)
        ("70B", 64, 8, 4, True, "PURE", 410),
        ("70B", 32, 2, 16, True, "PURE", 373),
        ("30B", 8, 3, 21, True, "DEFAULT", 916),
        ("13B", 8, 2, 3, False, "DEFAULT", 2262),
        ("7B", 8, 6, 2, False, "DEFAULT", 4641),
        ("3B", 8, 10, 2, False, "DEFAULT", 10811),
        ("1B", 8, 14, 4, False, "DEFAULT", 20513),
        ("760M", 8, 24, 2, False, "DEFAULT", 32434),
        ("350M", 8, 32, 2, False, "DEFAULT", 58782),
        ("125M", 8, 40, 2, False, "DEFAULT", 142830),
        ("125M", 8, 32, 2, False, "DEFAULT", 141737),
    ),
    "A100 40GB": (
        ("70B", 128, 4, 1, True, "PURE", 376),
        ("70B", 64, 2, 1, True, "PURE", 276),
        ("30B", 128, 6, 1, True, "PURE", 865),
        ("30B", 32, 4, 1, True, "PURE", 857),
        ("13B", 128, 16, 1, True, "PURE", 1972),
        ("13B", 64, 16, 1, True, "PURE", 1976),
        ("13B", 32, 14, 1, True, "PURE", 1998),
        ("13B", 16, 10, 1, True, "PURE", 1993),
        ("13B", 8, 4, 16, True, "PURE", 1668),
        ("7B", 128, 18, 1, True, "PURE", 3623),
        ("7B", 64, 18, 1, True, "PURE", 3665),
        ("7B", 32, 18, 1, True, "PURE", 3725),
        ("7B", 16, 16, 1, True, "PURE", 3645),
        ("7B", 8, 12, 4, True, "PURE", 3679),
        ("3B", 128, 6, 1, False, "PURE", 9538),
        ("3B", 64, 6, 1, False, "PURE", 9736),
        ("3B", 32, 6, 1, False, "PURE", 9914),
        ("3B", 16, 5, 1, False, "PURE", 9750),
        ("3B", 8, 5, 8, False, "PURE", 10065),
        ("1B", 128, 10, 1, False, "PURE", 18647),
        ("1B", 64, 10, 1, False, "PURE", 19001),
        ("1B", 32, 10, 1, False, "PURE", 15555),
        ("1B", 16, 8, 1, False, "PURE", 19085),
        ("1B", 8, 8, 8, False, "PURE", 19271),
        ("760M", 128, 12, 1, False, "PURE", 28940),
        ("760M", 64, 12, 1, False, "PURE", 29344),
        ("760M", 32, 12, 1, False, "PURE", 29648),
        ("760M", 16, 12, 1, False, "PURE", 29607),
        ("760M", 8, 12, 4, False, "PURE", 30173),
        ("350M", 128, 18, 1, False, "PURE", 51934),
        ("350M", 64, 18, 1, False, "PURE", 52689),
        ("350M", 32, 18, 1, False, "PURE", 53811),
        ("350M", 16, 18, 1, False, "PURE", 55413),
        ("350M", 8, 16, 4, False, "PURE", 55995),
        ("125M", 128, 26, 1, False, "PURE", 123936),
        ("125M", 64, 26, 1, False, "PURE", 125234),
        ("125M", 32, 26, 1, False, "PURE", 127122),
        ("125M", 16, 26, 1, False, "PURE", 130535),
        ("125M", 8, 26, 3, False, "PURE", 136334),
    ),
    "H100 80GB": (
        ("70B", 64, 8, 4, True, "DEFAULT", 1039),
        ("70B", 32, 2, 16, True, "DEFAULT", 882),
        ("30B", 32, 14, 3, True, "DEFAULT", 2308),
        ("30B", 16, 10, 3, True, "DEFAULT", 2263),
        ("30B", 8, 3, 21, True, "DEFAULT", 2002),
        ("13B", 64, 2, 1, False, "DEFAULT", 4800),
        ("13B", 32, 2, 1, False, "DEFAULT", 4811),
        ("13B", 16, 2, 1, False, "DEFAULT", 4767),
        ("13B", 8, 2, 1, False, "DEFAULT", 4792),
        ("7B", 8, 6, 1, False, "DEFAULT", 10643),
        ("3B", 64, 6, 3, False, "DEFAULT", 22525),
        ("3B", 32, 6, 3, False, "DEFAULT", 23021),
        ("3B", 16, 10, 3, False, "DEFAULT", 24142),
        ("1B", 64, 20, 1, False, "DEFAULT", 44402),
        ("1B", 32, 20, 1, False, "DEFAULT", 45130),
        ("1B", 16, 20, 1, False, "DEFAULT", 46037),
        ("1B", 8, 14, 1, False, "DEFAULT", 45455),
        ("760M", 32, 24, 1, False, "DEFAULT", 67971),
        ("760M", 16, 24, 1, False, "DEFAULT", 68551),
        ("760M", 8, 24, 2, False, "DEFAULT", 63147),
    ),
}
"""llm-foundry's MPT benchmark rows at seq 2048, as its tables give them (README at 061f2c7)."""
MPT_PINS = "--tp 1 --pp 1 --zero 3 --schedule 1f1b"
COMPILE, FP8 = "--compile", "--compile --precision fp8"
COMPILED_LOSS = "--loss fused"
"""The 2025-06 runs' torchtitan (820504e, e7c0cae) compiles the loss with the model
(components/loss.py build_cross_entropy_loss: torch.compile when training.compile); inductor's
cross-entropy saves the bf16 logits and per-row statistics, not an fp32 copy
(tests/test_loss_kernel.py), which is what --loss fused prices. At 9dec370 (2024-12) the loss ran
eager ("compiling loss function causes CUDA errors, turning off for now")."""
FSDP_SEL = "--tp 1 --pp 1 --zero 3 --microbatch 2 --recompute selective --schedule 1f1b"
LOOPED_STAGES_PER_RANK = 2
"""torchtitan's stages per rank for a looped schedule when no split points are given
(generate_split_points: num_stages_per_rank = 2 for a PipelineScheduleMulti, else 1)."""


def torchtitan_pp_pins(local_batch: int, pp: int, schedule: str) -> str:
    """--schedule, --virtual-stages and --microbatch as torchtitan (9dec370) runs a pipeline whose
    microbatch count is left at its default: pp microbatches (n_microbatches =
    pipeline_parallel_degree), each local_batch / pp samples, for any schedule."""
    stages_per_rank = LOOPED_STAGES_PER_RANK if schedule == "interleaved" else 1
    n_microbatches = pp
    assert local_batch % n_microbatches == 0, (local_batch, n_microbatches)  # torchtitan raises
    return f"--schedule {schedule} --virtual-stages {stages_per_rank} --microbatch {local_batch // n_microbatches}"


def _rows() -> list[dict]:
    rows = []

    def add(table, label, model, seq, gpus, batch, pins, measured_tps, measured_gib, source="2024-12"):
        rows.append(
            dict(
                source=source,
                table=table,
                label=label,
                model=model,
                seq=seq,
                gpus=gpus,
                batch=batch,
                pins=pins,
                measured=measured_tps,
                measured_gib=measured_gib,
            )
        )

    for tag, flags, tps, gib in (
        ("FSDP", "", 5762, 82.4),
        ("+compile", COMPILE, 6667, 77.0),
        ("+Float8", FP8, 8532, 76.8),
    ):
        add(1, tag, "8B", 8192, 8, 16, f"{FSDP_SEL} --dp 8 {flags}", tps, gib)
    for fsdp, cp, seq, tps, gib in ((8, 1, 32768, 3890, 83.9), (4, 2, 65536, 2540, 84.2), (2, 4, 131072, 1071, 84.0)):
        pins = f"--tp 1 --pp 1 --dp {fsdp} --cp {cp} --zero 3 --microbatch 1 --recompute full --schedule 1f1b {FP8}"
        add(2, f"FSDP {fsdp} CP {cp}", "8B", seq, 8, fsdp, pins, tps, gib)
    add(
        2,
        "FSDP 1 CP 8",
        "8B",
        262144,
        8,
        1,
        f"--tp 1 --pp 1 --dp 1 --cp 8 --zero 3 --microbatch 1 --recompute full --schedule 1f1b {FP8}",
        548,
        84.5,
    )
    for tag, flags, tps, gib in (
        ("FSDP", "", 5605, 67.0),
        ("+compile", COMPILE, 6514, 62.0),
        ("+Float8", FP8, 8380, 61.8),
    ):
        add(3, tag, "8B", 8192, 128, 256, f"{FSDP_SEL} --dp 128 {flags}", tps, gib)
    tp2d = f"--tp 8 --pp 1 --dp 32 --zero 3 --microbatch 16 --recompute full --sequence-parallel --schedule 1f1b {FP8}"
    add(4, "2D", "70B", 8192, 256, 512, tp2d + " --no-overlap-tp-comm", 829, 71.9)
    add(4, "2D + AsyncTP", "70B", 8192, 256, 512, tp2d + " --overlap-tp-comm", 876, 67.6)
    pp3d = f"--tp 8 --pp 8 --dp 8 --zero 2 --recompute full --sequence-parallel --overlap-tp-comm {FP8}"
    add(5, "1F1B", "405B", 8192, 512, 256, f"{pp3d} {torchtitan_pp_pins(32, 8, '1f1b')}", 100, 82.5)
    add(5, "Interleaved 1F1B", "405B", 8192, 512, 256, f"{pp3d} {torchtitan_pp_pins(32, 8, 'interleaved')}", 128, 72.7)
    for fsdp, cp, seq, tps, gib in (
        (8, 1, 32768, 76, 75.3),
        (4, 2, 65536, 47, 75.9),
        (2, 4, 131072, 31, 77.1),
        (1, 8, 262144, 16, 84.9),
    ):
        pins = f"--tp 8 --pp 8 --dp {fsdp} --cp {cp} --zero 2 --recompute full --sequence-parallel"
        add(
            6,
            f"FSDP {fsdp} CP {cp}",
            "405B",
            seq,
            512,
            8 * fsdp,
            f"{pins} --overlap-tp-comm {torchtitan_pp_pins(8, 8, '1f1b')} {FP8}",
            tps,
            gib,
        )
    _torchtitan_2024_08_rows(add)
    _async_tp_rows(add)
    for nodes, tps, gib in ((4, 10938, 47.96), (8, 10753, 46.97)):
        gpus = 8 * nodes
        pins = f"{FSDP_SEL} --dp {gpus} {FP8} {COMPILED_LOSS}"
        add(1, f"FSDP, {nodes} nodes", "8B", 8192, gpus, 2 * gpus, pins, tps, gib, source="2025-06 H200")
    automodel = "--tp 1 --pp 1 --dp 32 --cp 2 --zero 3 --microbatch 1 --recompute full --schedule 1f1b --compile"
    add(1, "FSDP 32 CP 2, 4 accumulation steps", "70B", 8192, 64, 128, automodel, 866.77, None, "NeMo AutoModel")
    for gpu, runs in MPT_RUNS.items():
        for model, gpus, mb, steps, ckpt, mixed, tps in runs:
            recompute = "full" if ckpt else "none"
            reduce = MIXED_PRECISION[mixed][1]  # the row's MP Mode, as `--import` reads it from a yaml
            pins = f"{MPT_PINS} --dp {gpus} --microbatch {mb} --recompute {recompute} --fsdp-reduce-dtype {reduce}"
            label = f"mb {mb} x {steps}, {'act. ckpt' if ckpt else 'no recompute'}"
            add(1, label, f"MPT-{model}", 2048, gpus, gpus * mb * steps, pins, tps, None, f"llm-foundry {gpu}")
    return rows


def _torchtitan_2024_08_rows(add) -> None:
    """docs/performance.md of 2024-08: FSDP2 on 64 A100 80 GB (local batch 1 or 2, global = local x 64)
    and FSDP 16 x TP 8 for 405B on 128 H100 96 GB (local batch 2). Its "selective layer" rows (every
    second block fully recomputed) are left out: --recompute states one mode for every block."""
    fsdp = "--tp 1 --pp 1 --dp 64 --zero 3 --schedule 1f1b"
    for model, seq, local, ac, tps in (
        ("8B", 8192, 1, "selective", 2973),
        ("70B", 8192, 1, "full", 331),
        ("Llama 2 13B", 4096, 2, "none", 2162),
        ("Llama 2 13B", 4096, 2, "selective", 1904),
        ("Llama 2 70B", 4096, 1, "selective", 355),
        ("Llama 2 70B", 4096, 2, "full", 353),
    ):
        label = f"FSDP, local batch {local}, AC {'selective op' if ac == 'selective' else ac}"
        pins = f"{fsdp} --microbatch {local} --recompute {ac}"
        add(1, label, model, seq, 64, 64 * local, pins, tps, None, "2024-08 A100")
    tp2d = "--tp 8 --pp 1 --dp 16 --zero 3 --microbatch 2 --recompute full --sequence-parallel --schedule 1f1b"
    for label, flags, tps in (
        ("FSDP 16 x TP 8", "", 109),
        ("+ Float8", "--precision fp8", 177),
        ("+ Float8 + async TP", "--precision fp8 --overlap-tp-comm", 185),
    ):
        add(1, label, "405B", 8192, 128, 32, f"{tp2d} {flags}", tps, None, "2024-08 405B")


def _async_tp_rows(add) -> None:
    """asyncTP_llama3_h100_2025-06_torchtitan.md: vanilla and async TP, bf16 and Float8 tensorwise."""
    shapes = (  # (table, model, GPUs, fsdp, local batch, AC, ((precision, vanilla, async), ...))
        (1, "70B", 256, 32, 16, "full", (("bf16", 597.3, 652.4), ("Float8", 809.8, 942.4))),
        (2, "8B", 64, 8, 12, "selective", (("bf16", 4378, 4809.4), ("Float8", 5078.1, 5570.1))),
    )
    for table, model, gpus, fsdp, local, ac, runs in shapes:
        base = (
            f"--tp 8 --pp 1 --dp {fsdp} --zero 3 --microbatch {local} --recompute {ac} "
            f"--sequence-parallel --schedule 1f1b --compile {COMPILED_LOSS}"
        )
        for precision, vanilla, async_tp in runs:
            flags = f"{base} --precision fp8" if precision == "Float8" else base
            for label, overlap, tps in (
                ("TP", "--no-overlap-tp-comm", vanilla),
                ("async TP", "--overlap-tp-comm", async_tp),
            ):
                add(
                    table,
                    f"{precision} {label}",
                    model,
                    8192,
                    gpus,
                    local * fsdp,
                    f"{flags} {overlap}",
                    tps,
                    None,
                    "2025-06 async TP",
                )


def command(row: dict) -> list[str]:
    return [
        "estimate",
        "--model",
        "analytic:gpt" if row["model"].startswith("MPT-") else "analytic:llama",
        "--set",
        *SHAPES[row["model"]].split(),
        f"seq={row['seq']}",
        "--cluster",
        SOURCES[row["source"]][1],
        "--num-gpus",
        str(row["gpus"]),
        "--global-batch",
        str(row["batch"]),
        "--runtime",
        SOURCES[row["source"]][2],
        *row["pins"].split(),
    ]


def predict(row: dict) -> dict:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main([*command(row), "--json", "--quiet"])
    if rc != 0:
        return {"error": err.getvalue().strip().splitlines()[-1]}
    view = json.loads(out.getvalue())
    return {
        "tps": view["tokens_per_s_per_gpu"],
        "gib": view["peak_memory_bytes"] / 2**30,
        "binding": view["binding_constraint"],
    }


def markdown(results: list[tuple[dict, dict]]) -> str:
    lines = [
        "# Held-out runs through the CLI (torchtitan's published benchmarks, one FSDP2 run of NeMo AutoModel, "
        "llm-foundry's MPT benchmarks)",
        "",
        "Predicted by `python -m benchmarks.heldout_runs` with `meshplan estimate`, the runtime and cluster",
        "preset of each source, and the row's stated settings; error = predicted / measured - 1.",
        "Nothing is fitted to them. Sources:",
        "",
        *(f"- {name}: {path} (`--cluster {cluster} --runtime {rt}`)" for name, (path, cluster, rt) in SOURCES.items()),
        "",
        "| source | table | model | GPUs | seq | run | measured tok/s/GPU | predicted | error | measured GiB | predicted GiB |",
        "|---|---:|---|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    errors: dict[str, list[float]] = {}
    for row, got in results:
        head = (
            f"| {row['source']} | {row['table']} | {row['model']} | {row['gpus']} | {row['seq']} | {row['label']} "
            f"| {row['measured']:,} |"
        )
        gib = "" if row["measured_gib"] is None else row["measured_gib"]
        if "error" in got:
            lines.append(f"{head} {got['error']} | | {gib} | |")
            continue
        err = got["tps"] / row["measured"] - 1
        errors.setdefault(row["source"], []).append(abs(err))
        oom = " (OOM)" if got["binding"].startswith("OOM") else ""
        lines.append(f"{head} {got['tps']:,.0f} | {err:+.1%} | {gib} | {got['gib']:.1f}{oom} |")
    every = [e for errs in errors.values() for e in errs]
    if every:
        lines += [
            "",
            f"Mean abs throughput error {sum(every) / len(every):.1%}, max {max(every):.1%}, over {len(every)} rows"
            + "".join(f"; {name}: {sum(e) / len(e):.1%} over {len(e)}" for name, e in errors.items())
            + ".",
        ]
    return "\n".join(lines) + "\n"


def run(out_dir: str | None = None) -> str:
    results = [(row, predict(row)) for row in _rows()]
    text = markdown(results)
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "heldout_runs.md"), "w") as fh:
            fh.write(text)
    return text


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="folder for heldout_runs.md (default: print only)")
    print(run(parser.parse_args().out), end="")

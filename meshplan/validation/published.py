"""Hold the cost model against published runs (meshplan/data/published-runs.csv; docs/validation.md).

Every row is predicted through the public path a user takes: the `meshplan plan` command line
(row_argv; the report prints it per row) parsed with the CLI's own options and turned into a
request by the CLI's own builder (meshplan.inputs.from_argv and resolve), then search(). The line pins what the row states
(degrees; microbatch, schedule and recompute where given) and names the runtime the row's source
ran (row_runtime: Megatron-LM for Narayanan 2021 and Korthikanti 2022, Megatron-Core for the 2024
README table); the runtime's documented behaviours (meshplan/runtimes.py) do the rest. Everything
else is searched. The error is on per-GPU throughput (tokens/s/GPU). No number here is fitted to a row.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable

from meshplan.errors import MeshplanError
from meshplan.planner import estimate
from meshplan.planner.search import search

GIB = 2**30

GPU_PRESETS = {
    "A100-SXM4-80GB": "a100-80g",
    "A100-SXM4-40GB": "a100-40g",
    "H100 96GB": "h100-96g",  # before "H100": the first prefix that matches wins
    "H100": "h100-80g",
    "H800": "h800-80g",
    "H200": "h200-141g",
    "B200": "b200-180g",
}


def _int(text: str) -> int | None:
    return int(float(text)) if text and text.strip() else None


def _float(text: str) -> float | None:
    return float(text) if text and text.strip() else None


def preset_for(gpu: str) -> str:
    for key, name in GPU_PRESETS.items():
        if gpu.startswith(key):
            return name
    raise MeshplanError(f"published row gpu {gpu!r} has no preset; add it to GPU_PRESETS")


def _schedule(text: str) -> tuple[str | None, int | None]:
    low = text.lower()
    if not low or "no pipeline" in low:
        return None, None
    if "interleaved" in low:
        chunks = re.search(r"(\d+)\s*chunks", low)
        return "Interleaved1F1B", int(chunks.group(1)) if chunks else None
    return ("1F1B", 1) if "1f1b" in low else (None, None)


def _recompute(text: str) -> tuple[str | None, bool | None]:
    low = text.lower()
    if not low:
        return None, None
    sp = False if "no sequence parallel" in low else True if "sequence parallel" in low else False
    mode = "selective" if "selective" in low else "full" if "full" in low else None
    return mode, sp


_ARCH = ("layers", "hidden", "heads", "seq_len", "vocab")


def _source_and_model(row: dict) -> tuple:
    """A row's publication (its source up to the parenthesised detail) and architecture."""
    return (row["source"].split("(")[0], *(row[k] for k in _ARCH))


def with_source_degrees(rows: list[dict]) -> list[dict]:
    """Rows that leave tp and pp unstated take them from a row of the same source and the same
    architecture that states them, when they divide the row's GPU count (the Megatron-LM README's
    strong-scaling 177B runs are the weak-scaling table's 177B model, stated there as tp 8, pp 6).
    The search would otherwise report the best split under the model, an optimistic bias."""
    stated: dict[tuple, tuple[str, str]] = {}
    for row in rows:
        if row["tp"].strip() and row["pp"].strip():
            stated.setdefault(_source_and_model(row), (row["tp"], row["pp"]))
    out = []
    for row in rows:
        degrees = stated.get(_source_and_model(row))
        if (
            degrees
            and not row["tp"].strip()
            and not row["pp"].strip()
            and int(row["num_gpus"]) % (int(degrees[0]) * int(degrees[1])) == 0
        ):
            row = {**row, "tp": degrees[0], "pp": degrees[1], "degrees_from": "same source, same model"}
        out.append(row)
    return out


RUNTIME_OF_SOURCE = (
    ("Megatron-Core", "megatron-core"),
    ("DeepSpeed", "deepspeed"),
    ("torchtitan", "torchtitan"),
    ("Megatron-LM", "megatron-lm"),
    ("Korthikanti", "megatron-lm"),  # arXiv 2205.05198 Sec 5: implemented in Megatron-LM (2022, before Core)
)
"""The software a row ran, from its source and notes (first match wins: the Megatron-LM README's 2024
rows say Megatron-Core r0.8.0). A row naming none is predicted as meshplan."""


def _software_text(row: dict) -> str:
    return f"{row['source']} {row['notes']} {row.get('software_from', '')}"


def row_runtime(row: dict) -> str:
    text = _software_text(row)
    return next((rt for key, rt in RUNTIME_OF_SOURCE if key in text), "meshplan")


def with_source_software(rows: list[dict]) -> list[dict]:
    """Rows whose notes name no software take the software statement of the other rows of the same
    publication (the Megatron-LM README's strong-scaling rows are its weak-scaling table's runs:
    Megatron-Core r0.8.0 with --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap)."""
    stated: dict[str, str] = {}
    for row in rows:
        if any(key in row["notes"] for key, _ in RUNTIME_OF_SOURCE):
            stated.setdefault(row["source"].split("(")[0], row["notes"])
    return [
        row
        if any(key in row["notes"] for key, _ in RUNTIME_OF_SOURCE) or row["source"].split("(")[0] not in stated
        else {**row, "software_from": stated[row["source"].split("(")[0]]}
        for row in rows
    ]


CAPTURED_MODEL = "gpt"
"""The zoo model a row's shape is also captured from (`--model gpt --set <shape> --seq S`): the
profile every user's module takes, beside the closed form."""


def row_argv(row: dict, verb: str = "plan", model: str = "analytic:gpt") -> list[str]:
    """The `meshplan plan` arguments that predict a published row: its model (closed-form, as the
    software ran it; or `model`, a built one of the same shape, captured on the meta device), GPUs,
    batch, runtime, and every knob the row states; the rest is searched."""
    schedule, v = _schedule(row["schedule"])
    recompute, sp = _recompute(row["recompute"])
    if _int(row["pp"]) == 1:
        schedule, v = None, None
    shape = {
        "layers": row["layers"],
        "hidden": row["hidden"],
        "heads": row["heads"],
        "vocab": row["vocab"],
        "seq": row["seq_len"],
    }
    argv = [
        verb,
        "--model",
        model,
        "--set",
        *(f"{k}={int(x)}" for k, x in shape.items()),
        *([] if model.startswith("analytic:") else ["--seq", str(int(shape["seq"]))]),
        "--cluster",
        preset_for(row["gpu"]),
        "--num-gpus",
        str(int(row["num_gpus"])),
        "--global-batch",
        str(int(row["global_batch"])),
        "--runtime",
        row_runtime(row),
        "--cp",
        str(_int(row["cp"]) or 1),
    ]
    pins = {
        "--tp": _int(row["tp"]),
        "--pp": _int(row["pp"]),
        "--dp": _int(row["dp"]),
        "--microbatch": _int(row["microbatch"]),
        "--schedule": schedule,
        "--virtual-stages": v,
        "--recompute": recompute,
        "--zero": _zero_stated(row),
    }
    for flag, value in pins.items():
        if value is not None:
            argv += [flag, {"Interleaved1F1B": "interleaved", "1F1B": "1f1b"}.get(str(value), str(value))]
    if sp is not None:
        argv.append("--sequence-parallel" if sp else "--no-sequence-parallel")
    return argv + (["--top", "1"] if verb == "plan" else [])


def _zero_stated(row: dict) -> int | None:
    """--overlap-param-gather exists only with Megatron's distributed optimizer (ZeRO-1)."""
    text = _software_text(row).lower()
    return 1 if "overlap-param-gather" in text or "distributed optimizer" in text else None


def command_line(row: dict, verb: str = "plan", model: str = "analytic:gpt") -> str:
    import shlex

    return shlex.join(["meshplan", *row_argv(row, verb, model)])


def cli_inputs(argv: list[str]):
    """(profile, cluster, request) exactly as `meshplan <argv>` builds them (the CLI's own options
    and request builder; its warnings are not printed)."""
    from meshplan.inputs import from_argv, resolve

    verb, *rest = argv
    got = resolve(from_argv(rest, verb))
    return got.profile, got.cluster, got.request


def row_note(row: dict) -> str:
    from meshplan.runtimes import runtime

    name = row_runtime(row)
    note = f"runtime {name}: {runtime(name).description}"
    if row.get("degrees_from"):
        note += f"; tp {row['tp']}, pp {row['pp']} from the {row['degrees_from']}"
    if row.get("software_from"):
        note += "; software and its flags from the same source's other rows"
    return note


def measured_tokens_per_s(row: dict, profile, peak_flops: float) -> tuple[float, str]:
    """Published per-GPU tokens/s, or derived from TFLOP/s or MFU with Eq. 7 model FLOPs."""
    tokens = _float(row["tokens_per_s_per_gpu"])
    if tokens:
        return tokens, "tokens/s/GPU as published (derived in the CSV)"
    flops_per_token = 3 * profile.forward_flops_per_sample / profile.seq_len  # fwd + 2x bwd
    tflops = _float(row["measured_tflops_per_gpu"])
    if tflops:
        return tflops * 1e12 / flops_per_token, "from measured TFLOP/s (Eq. 7 model FLOPs)"
    mfu_pct = _float(row["mfu_pct"])
    if mfu_pct is None:
        raise ValueError(f"published row {row['source']!r} states no tokens/s, TFLOP/s or MFU")
    return mfu_pct / 100 * peak_flops / flops_per_token, "from MFU (Eq. 7 model FLOPs)"


def validate_row(row: dict) -> dict:
    profile, cluster, req = cli_inputs(row_argv(row))
    note = row_note(row)
    measured, how = measured_tokens_per_s(row, profile, cluster.device.peak_flops["bf16"])
    out = {
        "model": row["model"],
        "source": row["source"].split("'")[0].strip(),
        "gpu": row["gpu"],
        "num_gpus": req.num_gpus,
        "global_batch": req.global_batch,
        "measured_tokens_per_s_per_gpu": measured,
        "measured_how": how,
        "assumed": note,
        "runtime": req.runtime,
        "command": command_line(row),
    }
    try:
        plan = search(profile, cluster, req)
    except MeshplanError as exc:
        return {**out, "error": str(exc), "predicted_tokens_per_s_per_gpu": None, "rel_error": None}
    pr = plan.predicted
    return {
        **out,
        **_captured(row, measured),
        "predicted_tokens_per_s_per_gpu": pr.tokens_per_s_per_gpu,
        "rel_error": pr.tokens_per_s_per_gpu / measured - 1,
        "predicted_mfu": pr.mfu,
        "predicted_hfu": pr.hfu,
        "predicted_model_tflops_per_gpu": pr.model_tflops_per_gpu,
        "step_time_s": pr.step_time_s,
        "plan": _describe(plan),
        "peak_memory_gib": pr.peak_memory_bytes / GIB,
    }


def _captured(row: dict, measured: float) -> dict:
    """The same row predicted from the captured zoo model of its shape (CAPTURED_MODEL)."""
    try:
        plan = search(*cli_inputs(row_argv(row, model=CAPTURED_MODEL)))
    except MeshplanError as exc:
        return {"captured_error": str(exc), "captured_tokens_per_s_per_gpu": None, "captured_rel_error": None}
    tps = plan.predicted.tokens_per_s_per_gpu
    return {
        "captured_tokens_per_s_per_gpu": tps,
        "captured_rel_error": tps / measured - 1,
        "captured_peak_memory_gib": plan.predicted.peak_memory_bytes / GIB,
        "captured_command": command_line(row, model=CAPTURED_MODEL),
    }


def _describe(plan) -> str:
    modes = sorted(set(plan.recompute.values()) - {"none"}) or ["none"]
    sched = plan.pipeline_schedule + (f" v={plan.virtual_stages}" if plan.virtual_stages > 1 else "")
    return (
        f"tp={plan.tensor_parallel_degree} pp={plan.pipeline_parallel_degree} dp={plan.data_parallel_degree} "
        f"b={plan.microbatch_size} {sched if plan.pipeline_parallel_degree > 1 else 'no pipeline'} "
        f"zero={plan.zero_stage}{' sp' if plan.sequence_parallel else ''} recompute={'+'.join(modes)}"
    )


_MEM = {
    "params_opt": r"params\+opt(?:imizer)? ([\d.]+) GiB",
    "act_none": r"activations without recompute ([\d.]+) GiB",
    "act_selective": r"activations with seq\+sel ([\d.]+) GiB",
}


def memory_checks(rows: list[dict]) -> list[dict]:
    """Korthikanti Fig. 1 per-GPU memory (Calculon's encoding) against the stage-0 prediction."""
    published: dict[str, dict] = {}
    for row in rows:
        if "Korthikanti" not in row["source"] or int(row["dp"] or 1) != 1:
            continue
        figs = published.setdefault(row["model"], {"row": row})
        for key, pattern in _MEM.items():
            hit = re.search(pattern, row["notes"])
            if hit:
                figs[key] = float(hit.group(1))
    out = []
    for model, figs in published.items():
        row = figs["row"]
        for key, mode, sp in (("act_none", "none", False), ("act_selective", "selective", True)):
            pinned = {
                **row,
                "recompute": f"{mode}{' + sequence parallel' if sp else ' (no sequence parallel)'}",
                "microbatch": row["microbatch"] or "1",
            }
            profile, cluster, req = cli_inputs(row_argv(pinned))
            plan = estimate(profile, cluster, req)
            st = plan.predicted.stage_memory[0]
            pairs = [(key, st.activations_bytes / GIB)]
            if key == "act_none":
                pairs.append(("params_opt", (st.params_bytes + st.grads_bytes + st.optimizer_bytes) / GIB))
            for what, predicted in pairs:
                if what in figs:
                    out.append(
                        {
                            "model": model,
                            "what": what,
                            "published_gib": figs[what],
                            "predicted_gib": predicted,
                            "rel_error": predicted / figs[what] - 1,
                        }
                    )
    return out


def validate_published(csv_path: str, on_row: Callable[[int, int], None] | None = None) -> list[dict]:
    """One dict per published row (throughput), then memory checks and orderings (kind key).
    `on_row(done, total)` after each published row is predicted (the CLI's progress bar)."""
    with open(csv_path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    results = []
    prepared = with_source_software(with_source_degrees(rows))
    for i, row in enumerate(prepared):
        results.append({"kind": "throughput", **validate_row(row)})
        if on_row is not None:
            on_row(i + 1, len(prepared))
    results += [{"kind": "memory", **m} for m in memory_checks(rows)]
    from meshplan.validation.orderings import published_orderings

    results += [{"kind": "ordering", **o} for o in published_orderings()]
    return results

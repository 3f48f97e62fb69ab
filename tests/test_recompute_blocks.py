"""--recompute full --recompute-blocks K: full recompute on the first K blocks of each pipeline stage (model chunk)
and none on the rest, as Megatron's --recompute-method block --recompute-num-layers K runs it. The Megatron
export writes such a plan as that block method, and `estimate --import` reads it back as the same plan (it
was read as full recompute on every block); the search honours the pin and the brute force agrees with it."""

from __future__ import annotations

import contextlib
import io
import json

import pytest
from planner_profiles import brute_force_best, cluster, small_gpt

from meshplan.cli import main
from meshplan.plan import Plan
from meshplan.planner import PlanRequest
from meshplan.planner.search import search
from meshplan.report import export_plan
from meshplan.schema import load

GPT_16 = [
    "--model", "analytic:gpt", "--set", "layers=24", "hidden=2048", "heads=16", "vocab=51200", "seq=2048",
    "--cluster", "a100-40g", "--num-gpus", "16", "--global-batch", "64", "--runtime", "megatron-core",
]  # fmt: skip
LAYOUT = ["--tp", "2", "--pp", "4", "--dp", "2", "--microbatch", "2", "--zero", "1", "--schedule", "1f1b"]


def run(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def stage_modes(plan: dict) -> list[str]:
    """Each stage's block modes in model order, one letter a block (f full, n none)."""
    per_layer = plan.get("recompute_per_layer") or plan["recompute"]
    return ["".join(per_layer[f][0] for f in stage if f.startswith("layers.")) for stage in plan["stages"]]


def test_estimate_recomputes_the_first_blocks_of_each_stage(tmp_path):
    code, _, err = run("estimate", *GPT_16, *LAYOUT, "--recompute", "full", "--recompute-blocks", "2", "-q",
                       "-o", str(tmp_path / "plan.json"))  # fmt: skip
    assert code == 0, err
    plan = json.loads((tmp_path / "plan.json").read_text())
    assert stage_modes(plan) == ["ffnnnn"] * 4
    code, _, _ = run("estimate", *GPT_16, *LAYOUT, "--recompute", "full", "-q", "-o", str(tmp_path / "all.json"))
    every = json.loads((tmp_path / "all.json").read_text())["prediction"]
    none_code, _, _ = run("estimate", *GPT_16, *LAYOUT, "--recompute", "none", "-q", "-o", str(tmp_path / "no.json"))
    none = json.loads((tmp_path / "no.json").read_text())["prediction"]
    got = plan["prediction"]
    assert none["step_time_s"] < got["step_time_s"] < every["step_time_s"]
    assert every["peak_memory_bytes"] < got["peak_memory_bytes"] < none["peak_memory_bytes"]


def test_megatron_block_recompute_reads_back_as_the_plan(tmp_path):
    """estimate -> Megatron export (--recompute-method block --recompute-num-layers 2) -> estimate --import: the
    same recompute of every layer, the same stages and the same step time and memory."""
    code, _, err = run("estimate", *GPT_16, *LAYOUT, "--recompute", "full", "--recompute-blocks", "2", "-q",
                       "-o", str(tmp_path / "plan.json"))  # fmt: skip
    assert code == 0, err
    plan = load(Plan, tmp_path / "plan.json", "plan")
    script = export_plan(plan, "megatron")["megatron_args.sh"]
    assert "--recompute-method block" in script and "--recompute-num-layers 2" in script
    (tmp_path / "megatron_args.sh").write_text(script)
    code, _, err = run("estimate", "--import", str(tmp_path / "megatron_args.sh"), "-q",
                       "-o", str(tmp_path / "back.json"))  # fmt: skip
    assert code == 0, err
    back = json.loads((tmp_path / "back.json").read_text())
    assert back["recompute"] == plan.recompute and back["stages"] == plan.stages
    assert back["prediction"]["step_time_s"] == pytest.approx(plan.prediction.step_time_s, rel=1e-12)
    assert back["prediction"]["peak_memory_bytes"] == pytest.approx(plan.prediction.peak_memory_bytes, rel=1e-12)


def test_the_search_honours_the_pin_on_every_model_chunk():
    code, out, err = run("plan", *GPT_16, "--recompute", "full", "--recompute-blocks", "3", "--pp", "4",
                         "--virtual-stages", "2", "--top", "4", "--json", "--quiet")  # fmt: skip
    assert code == 0, err
    view = json.loads(out)
    for plan in [view, *view["alternatives"]]:
        for modes in stage_modes(plan):
            k = min(3, len(modes))
            assert modes == "f" * k + "n" * (len(modes) - k), stage_modes(plan)


@pytest.mark.parametrize(
    ("blocks", "memory_gb", "v", "k"),
    [
        (4, 80.0, 1, 1),
        (8, 80.0, 2, 1),  # interleaved: a chunk of only the embedding or the head recomputes no block
        (8, 80.0, 2, 2),
        (12, 36.0, 2, 2),  # memory-tight: the fastest chunk layout does not fit, a slower one does
    ],
)
def test_the_search_equals_the_brute_force_under_the_pin(blocks, memory_gb, v, k):
    profile, spec = small_gpt(blocks), cluster(4, memory_gb)
    schedule = "Interleaved1F1B" if v > 1 else "1F1B"
    request = PlanRequest(num_gpus=4, global_batch=16 if blocks > 8 else 8, pp=2, tp=1, dp=2,
                          microbatch=2 if blocks > 8 else 1 if v > 1 else 2, schedule=schedule, virtual_stages=v,
                          zero=1, sequence_parallel=False, recompute="full", recompute_blocks=k)  # fmt: skip
    plan = search(profile, spec, request)
    brute, _ = brute_force_best(profile, spec, request)
    assert plan.dp_methods.offload.name == "none"
    assert plan.prediction.step_time_s == pytest.approx(brute, rel=1e-9)
    for stage in plan.stages:
        blocks_of = [f for f in stage if f.startswith("layers.")]
        full = min(k, len(blocks_of))
        assert [plan.recompute[f] for f in blocks_of] == ["full"] * full + ["none"] * (len(blocks_of) - full)


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--recompute-blocks", "2"], "--recompute-blocks 2: the first K >= 1 blocks"),
        (["--recompute", "full", "--recompute-blocks", "0"], "--recompute-blocks 0"),
        (["--recompute", "full", "--recompute-blocks", "2", "--recompute-num-layers", "2"], "give one of them"),
    ],
)
def test_bad_pins_are_one_line(flags, says):
    code, _, err = run("plan", *GPT_16, *LAYOUT, *flags)
    assert code != 0 and says in err and "Traceback" not in err

"""What a runtime runs beside pipeline and tensor parallelism: DeepSpeed's pipeline engine refuses ZeRO-2/3 and
runs 1F1B only, Megatron has no GPipe, DeepSpeed's AutoTP has no sequence parallelism (behaviours
pipeline_zero_stages, pipeline_schedules, sequence_parallel_modes). The search offers a runtime only what it
runs; a pin outside it is priced as pinned, with a warning that it will not run."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from meshplan import runtimes
from meshplan.cli import main

GPT = ["--model", "analytic:gpt", "--set", "layers=24", "hidden=2048", "heads=16", "--cluster", "a100-80g"]


def run(verb: str, *flags: str) -> tuple[int, dict, str]:
    out, err = io.StringIO(), io.StringIO()
    argv = [verb, *GPT, "--num-gpus", "16", "--global-batch", "64", *flags, "--json", "--quiet"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, (json.loads(out.getvalue()) if code == 0 else {}), err.getvalue()


def test_every_runtime_states_what_it_runs_beside_a_pipeline():
    for name in runtimes.NAMES:
        rt = runtimes.runtime(name)
        beside = rt.value("pipeline_zero_stages")
        assert set(beside) <= set(rt.value("zero_stages")), name
        assert set(rt.value("pipeline_schedules")) <= set(runtimes.TORCH_SCHEDULES), name
    assert runtimes.runtime("deepspeed").value("pipeline_zero_stages") == (0, 1)
    assert runtimes.runtime("deepspeed").value("pipeline_schedules") == ("1F1B",)
    for name in ("megatron-lm", "megatron-core"):
        assert "GPipe" not in runtimes.runtime(name).value("pipeline_schedules")


def _alternatives(plan: dict) -> list[dict]:
    return [plan, *plan.get("alternatives", [])]


@pytest.mark.parametrize("zero", [None, "2", "3"])
def test_the_search_offers_deepspeed_no_zero_2_or_3_beside_its_pipeline(zero):
    flags = ["--pp", "2", "--runtime", "deepspeed", *(["--zero", zero] if zero else [])]
    code, plan, err = run("plan", *flags, "--top", "10")
    assert code == 0, err
    if zero is None:  # searched: ZeRO-0/1 and 1F1B only
        assert len(_alternatives(plan)) > 1
        for alt in _alternatives(plan):
            assert alt["zero_stage"] in (0, 1) and alt["schedule"] == "1F1B", alt["zero_stage"]
    else:  # pinned: priced as pinned, and said
        assert plan["zero_stage"] == int(zero)
        assert f"--zero {zero} with --pp 2: runtime deepspeed runs ZeRO 0/1 only" in err


def test_megatron_is_not_offered_gpipe_nor_deepspeed_interleaving():
    code, plan, err = run("plan", "--pp", "4", "--runtime", "megatron-core", "--top", "20")
    assert code == 0, err
    assert len(_alternatives(plan)) > 1 and all(alt["schedule"] != "GPipe" for alt in _alternatives(plan))
    assert any("no GPipe schedule" in r["reason"] for r in plan["rejected"])
    pins = ["--tp", "1", "--pp", "2", "--dp", "8", "--microbatch", "1", "--recompute", "none", "--zero", "1"]
    code, plan, err = run("estimate", *pins, "--schedule", "interleaved", "--runtime", "deepspeed")
    assert code == 0 and plan["schedule"] == "Interleaved1F1B"
    assert "--schedule interleaved: runtime deepspeed runs 1F1B only" in err
    code, _, err = run("estimate", *pins, "--schedule", "1f1b", "--runtime", "deepspeed")
    assert code == 0 and "runs 1F1B only" not in err and "runs ZeRO" not in err


def test_deepspeed_autotp_is_not_offered_sequence_parallelism():
    """AutoTP keeps the norms' activations replicated: a DeepSpeed tp 2 search prices no sequence parallel
    (the same search for meshplan's executor picks it), and a pinned --sequence-parallel is priced as pinned
    and said."""
    flags = ["--tp", "2", "--pp", "1", "--top", "10"]
    code, plan, err = run("plan", *flags, "--runtime", "deepspeed")
    assert code == 0, err
    assert len(_alternatives(plan)) > 1 and not any(alt["sequence_parallel"] for alt in _alternatives(plan))
    assert any("behaviour sequence_parallel_modes" in r["reason"] for r in plan["rejected"])
    code, plan, err = run("plan", *flags, "--runtime", "meshplan")
    assert code == 0 and any(alt["sequence_parallel"] for alt in _alternatives(plan))
    code, plan, err = run("plan", *flags, "--runtime", "deepspeed", "--sequence-parallel")
    assert code == 0 and plan["sequence_parallel"]
    assert "--sequence-parallel: runtime deepspeed runs no sequence parallel on" in err
    for name in runtimes.NAMES:
        assert set(runtimes.runtime(name).value("sequence_parallel_modes")) <= {False, True}, name

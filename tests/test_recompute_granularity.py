"""Megatron runs one recompute granularity (behaviour recompute_assignments "granularity"): selective on every
block, or full on the blocks --recompute-method picks and none on the rest; never a mix of selective with
none or full. The search offers Megatron's runtimes only those, and the Megatron export writes a full/none
mix as --recompute-method block with the most blocks any stage recomputes."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json

import pytest
from report_fixtures import gpt_plan
from test_exports import megatron_args, warnings_in

from meshplan.cli import main
from meshplan.report import export_plan

LLAMA_8B = [
    "--model", "analytic:llama", "--set", "layers=32", "hidden=4096", "heads=32", "kv_heads=8", "ffn_hidden=14336",
    "vocab=128256", "seq=8192", "--cluster", "h100-80g", "--num-gpus", "16", "--global-batch", "64",
]  # fmt: skip


def searched(*flags: str) -> list[dict]:
    """The plan and its alternatives, as `plan --json` lists them."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["plan", *LLAMA_8B, *flags, "--top", "10", "--json", "--quiet"])
    assert code == 0, err.getvalue()
    view = json.loads(out.getvalue())
    return [view, *view["alternatives"]]


def block_modes(plan: dict) -> set[str]:
    return {mode for name, mode in plan["recompute_per_layer"].items() if name.startswith("layers.")}


@pytest.mark.parametrize("runtime", ["megatron-lm", "megatron-core"])
@pytest.mark.parametrize("pins", [[], ["--pp", "4"], ["--tp", "4"]])
def test_megatron_plans_use_one_granularity(runtime, pins):
    plans = searched("--runtime", runtime, *pins)
    assert len(plans) > 1
    for plan in plans:
        modes = block_modes(plan)
        assert modes in ({"none"}, {"selective"}, {"full"}) or modes == {"full", "none"}, modes


def test_per_layer_assignments_mix_modes_where_asked():
    """--recompute-assignments per-layer (a runtime that checkpoints any layer) lets the same Megatron search
    mix selective with none, what Megatron cannot run: the test above holds Megatron to a narrower space."""
    plans = searched("--runtime", "megatron-lm", "--pp", "4", "--recompute-assignments", "per-layer")
    assert any(len(block_modes(plan)) > 1 and "selective" in block_modes(plan) for plan in plans)


def _stages_with_full(counts: list[int]):
    plan = gpt_plan(pp=4, blocks=8)
    blocks = [[f for f in stage if f.startswith("layers.")] for stage in plan.stages]
    recompute = dict(plan.recompute)
    for stage, k in zip(blocks, counts):
        for i, name in enumerate(stage):
            recompute[name] = "full" if i >= len(stage) - k else "none"  # the last k: not a prefix
    return dataclasses.replace(plan, model_family="gpt", recompute=recompute)


def test_megatron_export_writes_a_full_none_mix_as_block_recompute():
    even = export_plan(_stages_with_full([1, 1, 1, 1]), "megatron")["megatron_args.sh"]
    args = megatron_args(even)
    assert (args["--recompute-method"], args["--recompute-num-layers"]) == ("block", "1")
    assert not any("recompute" in w for w in warnings_in(even))  # identical blocks: which ones does not matter
    uneven = export_plan(_stages_with_full([2, 1, 0, 1]), "megatron")["megatron_args.sh"]
    args = megatron_args(uneven)
    assert (args["--recompute-method"], args["--recompute-num-layers"]) == ("block", "2")
    assert any("the most any stage recomputes, 2" in w for w in warnings_in(uneven))

"""DeepSpeed's pipeline runs what the plan says (behaviours recompute_assignments "interval" and uniform_stages
False): a PipelineModule checkpoints every layer (activation_checkpoint_interval), so a --runtime deepspeed
search with pp > 1 gives every block one recompute mode, while without a pipeline checkpoint_blocks() wraps
any blocks and the search still picks per block; and the export builds the PipelineModule on the plan's stage
boundaries, so a searched, uneven split exports without a WARNING (tests/test_export_parsers.py reads the
parts the real PipelineModule sets)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json

import pytest

from meshplan import schema
from meshplan.cli import main
from meshplan.imports import read_config
from meshplan.plan import Plan
from meshplan.report import export_plan
from meshplan.report.export_deepspeed import rank_layers

LLAMA_8B_A100_40G = [
    "--model", "analytic:llama", "--set", "layers=32", "hidden=4096", "heads=32", "kv_heads=8", "ffn_hidden=14336",
    "vocab=128256", "seq=8192", "--cluster", "a100-40g", "--num-gpus", "8", "--global-batch", "64",
    "--runtime", "deepspeed",
]  # fmt: skip
"""Tight enough on a 40 GB card that per-layer recompute would mix full and none blocks."""


def searched(*flags: str, out=None) -> list[dict]:
    """The plan and its alternatives, as `plan --json` lists them (the plan also written to `out`)."""
    stdout, err = io.StringIO(), io.StringIO()
    written = ["-o", str(out)] if out is not None else []
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(err):
        code = main(["plan", *LLAMA_8B_A100_40G, *flags, "--top", "8", "--json", "--quiet", *written])
    assert code == 0, err.getvalue()
    view = json.loads(stdout.getvalue())
    return [view, *view["alternatives"]]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory):
    """The pp 4 search without TP (recompute needed): its plans, and the best one as a Plan file holds it."""
    out = tmp_path_factory.mktemp("deepspeed-pipeline") / "plan.json"
    plans = searched("--pp", "4", "--tp", "1", out=out)
    return plans, schema.load(Plan, out, "plan")


def block_modes(plan: dict) -> set[str]:
    return {mode for name, mode in plan["recompute_per_layer"].items() if name.startswith("layers.")}


def test_a_deepspeed_pipeline_recomputes_every_block_alike(pipeline):
    plans = searched("--pp", "4") + pipeline[0]
    assert len(plans) > 3
    assert all(len(block_modes(plan)) == 1 for plan in plans), [block_modes(p) for p in plans]
    assert any(block_modes(plan) == {"full"} for plan in plans)  # the space is tight: recompute is needed


def test_per_layer_assignments_mix_where_asked():
    """The same search as a runtime that checkpoints any layer mixes full and none blocks: the test above
    holds DeepSpeed's pipeline to a narrower space."""
    plans = searched("--pp", "4", "--recompute-assignments", "per-layer")
    assert any(block_modes(plan) == {"full", "none"} for plan in plans)


def test_without_a_pipeline_deepspeed_recomputes_per_block():
    """pp 1: the export's checkpoint_blocks() wraps exactly the plan's blocks, so the search picks per block."""
    plans = searched("--pp", "1", "--zero", "3")
    assert any(block_modes(plan) == {"full", "none"} for plan in plans)


def test_searched_uneven_stages_export_without_a_warning(pipeline):
    plan = pipeline[1]
    assert len(set(rank_layers(plan))) > 1  # 34 layers over 4 ranks
    files = export_plan(plan, "deepspeed")
    assert f"LAYERS_PER_STAGE = {rank_layers(plan)}" in files["meshplan_deepspeed.py"]
    assert "stage boundaries" not in files["launch_deepspeed.sh"]
    assert "not expressible in a PipelineModule" not in files["launch_deepspeed.sh"]


def test_the_export_reads_back_as_the_plan(pipeline, tmp_path):
    """`estimate --import ds_config.json` reads meshplan_deepspeed.py beside it: the layers of each pipeline rank
    (--stage-layers) and the checkpoint interval, so the read-back prices the plan's stages and recompute."""
    plan = pipeline[1]
    files = export_plan(plan, "deepspeed")
    assert not [line for text in files.values() for line in text.splitlines() if "WARNING" in line]
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    got = read_config(str(tmp_path / "ds_config.json")).values
    assert got["stage_layers"] == ",".join(map(str, rank_layers(plan)))
    out = tmp_path / "readback.json"
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(["estimate", "--import", str(tmp_path / "ds_config.json"), "-q", "-o", str(out)])
    assert code == 0
    back = json.loads(out.read_text())
    assert back["stages"] == plan.stages
    assert {m for f, m in plan.recompute.items() if f.startswith("layers.")} == {"full"}  # the PipelineModule's
    assert (back["recompute"], back["recompute_num_layers"]) == (plan.recompute, plan.recompute_num_layers)
    assert back["prediction"]["step_time_s"] == pytest.approx(plan.prediction.step_time_s, rel=1e-9)


def generated_module(plan: Plan, tmp_path, monkeypatch):
    """meshplan_deepspeed.py of the plan's export, imported beside an empty `deepspeed` (DeepSpeed is not in this
    venv; block_classes does not use it)."""
    import importlib.util
    import sys
    import types

    monkeypatch.setitem(sys.modules, "deepspeed", types.ModuleType("deepspeed"))

    path = tmp_path / "meshplan_deepspeed.py"
    path.write_text(export_plan(plan, "deepspeed")["meshplan_deepspeed.py"])
    spec = importlib.util.spec_from_file_location("meshplan_deepspeed_under_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_pipeline_module_checkpoints_only_the_blocks(pipeline, tmp_path, monkeypatch):
    """DeepSpeed's default checkpoints every layer with parameters, the embedding and the head too: the export
    names the block classes (checkpointable_layers), or leaves the default where a block's class is an end's.
    tests/test_export_parsers.py reads what the real PipelineModule then checkpoints."""
    import torch

    class Block(torch.nn.Linear):
        pass

    class Spec:  # a deepspeed.pipe.LayerSpec names its class as typename
        typename = Block

    mod = generated_module(pipeline[1], tmp_path, monkeypatch)
    embed, head = torch.nn.Embedding(4, 2), torch.nn.Linear(2, 4)
    assert mod.block_classes([embed, Block(2, 2), Spec(), head]) == ["Block"]
    assert mod.block_classes([embed, torch.nn.Linear(2, 2), head]) is None  # the head's class: not separable


def test_chunks_of_several_layers_warn_where_they_hold_an_end(pipeline):
    """A PipelineModule counts its interval's chunks from each stage's first layer and checkpoints only chunks of
    checkpointable layers: with N > 1 the first stage's first chunk holds the embedding and is not recomputed."""
    plan = pipeline[1]
    grouped = export_plan(dataclasses.replace(plan, recompute_num_layers=2), "deepspeed")
    assert "ACTIVATION_CHECKPOINT_INTERVAL = 2" in grouped["meshplan_deepspeed.py"]
    assert "first stage's first chunk" in grouped["launch_deepspeed.sh"]
    assert "first stage's first chunk" not in export_plan(plan, "deepspeed")["launch_deepspeed.sh"]

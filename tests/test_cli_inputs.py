"""The thin CLI: meshplan/inputs.py turns options into (profile, cluster, request, warnings) with
no printing and no argparse namespace; cli, validation and benchmarks reach it through its public
functions, so nothing below the CLI imports it; verbs that need no torch do not import it."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

from meshplan import inputs, options, runtimes
from meshplan.inputs import PlanOptions, from_argv, resolve
from tests.test_layering import ALL_MODULES, imports, under

GPT = ["--model", "analytic:gpt", "--set", "layers=4", "hidden=256", "heads=4", "--cluster", "a100-80g"]


@pytest.mark.parametrize("verb", options.PLAN_VERBS)
def test_every_option_is_an_input_field_or_an_output(verb):
    """A flag added to meshplan/options.py without a PlanOptions field would be silently dropped."""
    dests = {a.dest for a in options.plan_parser(verb)._actions if a.dest != "help"}
    fields = {f.name for f in dataclasses.fields(PlanOptions)}
    assert dests - fields - inputs.NOT_INPUTS - set(runtimes.BEHAVIOUR_DESTS) == set()  # behaviours: a mapping
    # estimate: no search knobs; plan: no --stage-layers (the search chooses the boundaries)
    assert fields - dests <= {"runnable", "top", "allow_cross_node_tp", "behaviours", "stage_layers"}


def test_nothing_below_the_cli_imports_it():
    below = [m for m in ALL_MODULES if m.startswith(("meshplan.validation", "meshplan.inputs", "meshplan.options"))]
    assert "meshplan.inputs" in below and any(m.startswith("meshplan.validation") for m in below)
    found = sorted(
        f"{m} imports {i}"
        for m in below
        for i in imports(ALL_MODULES[m])
        if under(i, ["meshplan.cli", "meshplan.commands"])
    )
    assert found == []


def test_resolve_returns_warnings_as_data_and_prints_nothing(capsys):
    got = resolve(from_argv([*GPT, "--num-gpus", "16", "--tp", "16", "--runtime", "megatron-core", "--zero", "3"]))
    assert got.request.tp == 16 and got.request.allow_cross_node_tp
    assert any("planned as cross-node tensor parallelism" in w for w in got.warnings)
    assert any(w.startswith("--zero 3: runtime megatron-core implements ZeRO") for w in got.warnings)
    assert capsys.readouterr() == ("", "")


def test_options_of_a_namespace_and_of_a_mapping_agree():
    ns = options.plan_parser("plan").parse_args([*GPT, "--tp", "2", "-o", "p.json"])
    assert PlanOptions.of(ns) == PlanOptions.of(vars(ns))
    assert PlanOptions.of(ns).runnable and PlanOptions.of(ns).overrides == ("layers=4", "hidden=256", "heads=4")


def test_a_runnable_plan_refuses_a_seq_beyond_the_model():
    from meshplan.errors import MeshplanError

    assert resolve(from_argv(["--seq", "64"])).warnings[-1].endswith("a what-if `meshplan run` refuses")
    with pytest.raises(MeshplanError, match="--seq 64: gpt-tiny handles at most 32"):
        resolve(from_argv(["--seq", "64", "-o", "plan.json"]))


def test_the_torch_free_table_names_the_zoos_families():
    from meshplan.models import catalog, zoo

    assert catalog.FAMILY_NAMES == tuple(zoo.FAMILIES)
    assert catalog.ZOO is zoo.ZOO


@pytest.mark.parametrize(
    "argv",
    [["presets"], ["presets", "--json"], ["plan", *GPT, "--num-gpus", "8"], ["estimate", *GPT, "--num-gpus", "8"]],
    ids=["presets", "presets-json", "plan-analytic", "estimate-analytic"],
)
def test_verbs_that_need_no_torch_do_not_import_it(argv):
    if argv[0] == "estimate":
        argv += [
            "--tp",
            "2",
            "--pp",
            "1",
            "--dp",
            "4",
            "--microbatch",
            "1",
            "--schedule",
            "1f1b",
            "--recompute",
            "none",
        ]
    code = f"import sys; from meshplan.cli import main; rc = main({argv!r}); print(rc, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.split()[-2:] == ["0", "False"], out.stderr[-2000:]

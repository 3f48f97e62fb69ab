"""User models (file.py:factory, module:factory) and HF configs, end to end, with their errors."""

import json
from pathlib import Path

import pytest
import torch

from meshplan.cli import main
from meshplan.errors import MeshplanError
from meshplan.models.loader import load_model
from meshplan.profiler import profile_model

FIXTURES = Path(__file__).parent / "fixtures" / "user_models"


def spec(name: str) -> str:
    return f"{FIXTURES / name}"


def test_sequential_file_model_is_split_into_its_children():
    p = profile_model(spec("mlp.py:build"))
    assert p.family == "user" and p.seq_len == 1
    assert [l.kind for l in p.layers] == ["linear", "gelu"] * 3 + ["linear"]
    assert p.num_params == 3 * (32 * 32 + 32) + 33
    assert p.layer("layers.0").forward_flops == 2 * 32 * 32
    assert p.layer("layers.0").backward_flops == 2 * 2 * 32 * 32
    assert p.layer("layers.6").output_bytes == 1 * 2  # one bf16 output per sample


def test_chain_module_split_preserves_the_forward():
    model = load_model(spec("chain.py:cnn"), device="cpu")
    assert model.layer_names() == [f"layers.{i}" for i in range(5)]
    assert model.chained
    x, y = model.example_batch(3)
    reference = torch.nn.Sequential(*model.layers.values())
    torch.testing.assert_close(model(x), reference(x))
    assert model.loss(model(x), y).ndim == 0


def test_non_chain_module_is_one_layer():
    p = profile_model(spec("chain.py:residual"))
    assert p.layer_names == ["layers.0"] and p.layers[0].kind == "residual"
    assert p.layers[0].forward_flops == 2 * 2 * 16 * 16


def test_plain_tensor_attributes_do_not_break_the_fake_run():
    p = profile_model(spec("chain.py:plain_attribute"))
    assert p.layers[0].forward_flops == 2 * 6 * 6


def test_factory_returning_a_layered_model_with_set_overrides():
    p = profile_model(spec("tokens.py:build"), {"layers": 3})
    assert p.layer_names == ["embed", "layers.0", "layers.1", "layers.2", "head"]
    assert p.family == "gpt" and p.seq_len == 16


def test_module_factory_form(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    p = profile_model("mlp:build", {"width": 8})
    assert p.num_params == 3 * (8 * 8 + 8) + 9


def test_example_batch_is_cut_or_tiled():
    model = load_model(spec("mlp.py:build"), device="cpu")
    for b in (3, 8, 20):
        x, y = model.example_batch(b)
        assert x.shape == (b, 32) and y.shape == (b, 1)


def test_user_model_timing_on_cpu():
    p = profile_model(spec("chain.py:cnn"), device="cpu", microbatch_sizes=[2])
    assert all(l.timings[0].forward_s > 0 for l in p.layers)


@pytest.mark.parametrize(
    "model,words",
    [
        ("nope.py:build", ["nope.py", "not found"]),
        ("mlp.py:missing", ["'missing'", "mlp.py", "functions there: build"]),
        ("broken.py:not_a_function", ["'not_a_function'"]),
        ("broken.py:wrong_type", ["returned Linear", "(torch.nn.Module, example_batch)"]),
        ("broken.py:raises", ["RuntimeError: weights file missing"]),
        ("broken.py:data_dependent", ["layers.0", "DataDependent", "nonzero"]),
        ("import_error.py:build", ["package_that_is_not_installed", "install"]),
    ],
)
def test_bad_user_models_give_one_clear_line(model, words):
    with pytest.raises(MeshplanError) as err:
        profile_model(spec(model))
    message = str(err.value)
    assert "\n" not in message
    for word in words:
        assert word in message


def test_missing_module_and_bad_set_key():
    with pytest.raises(MeshplanError, match="module 'no_such_pkg.models' not found"):
        profile_model("no_such_pkg.models:build")
    with pytest.raises(MeshplanError, match="--set width"):
        profile_model(spec("chain.py:cnn"), {"width": 3})


def test_cli_profiles_a_user_file_and_reports_bad_paths(capsys):
    assert main(["profile", "--model", spec("mlp.py:build"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["num_params"] == 3201 and data["num_layers"] == 7 and len(data["layers"]) == 7
    assert main(["profile", "--model", spec("missing_file.py:build")]) != 0
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "missing_file.py" in err and "not found" in err


def test_hf_without_transformers_names_the_extra(monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "transformers", None)
    with pytest.raises(MeshplanError, match=r"pip install 'meshplan\[hf\]'"):
        load_model("hf:gpt2")


def test_unknown_hf_name_lists_the_built_in_configs():
    pytest.importorskip("transformers", reason="transformers not installed (pip install 'meshplan[hf]')")
    with pytest.raises(MeshplanError, match="no built-in config"):
        load_model("hf:some-org/some-model")


@pytest.mark.parametrize(
    "model,overrides",
    [
        ("vit-tiny", None),
        ("moe-tiny", {"experts": 2}),
        ("resnet-tiny", None),
        (spec("tokens.py:build"), {"layers": 3}),
        (spec("mlp.py:build"), {"depth": 2}),
    ],
)
def test_model_config_rebuilds_the_same_model(model, overrides):
    """The executor rebuilds a plan's model with load_model(model_name, model_config)."""
    p = profile_model(model, overrides)
    again = load_model(model, p.model_config, "meta")
    assert again.layer_names() == p.layer_names
    assert sum(x.numel() for x in again.parameters()) == p.num_params


def test_a_layer_taking_the_tensors_crossing_its_cut_is_run_as_timing_runs_it():
    """The U-Net's dec2 layer takes enc1's and enc2's skips and up2's output: the profile's input
    spec lists the three, and the timing path (runner.make_input / forward_backward) builds and
    runs that tuple on a real copy, its returned tensors the ones crossing the next cut."""
    from meshplan.profiler.api import analyse_model
    from meshplan.profiler.runner import call, forward_backward, make_input, materialise_layer

    name = spec("any_models.py:unet")
    model = load_model(name, device="cpu")
    analysis = analyse_model(model, name)
    inputs = analysis.inputs["layers.4"]
    assert [shape for shape, _ in inputs.parts] == [(1, 8, 16, 16), (1, 16, 8, 8), (1, 16, 8, 8)]
    layer = materialise_layer(model, "layers.4", "cpu")
    x = make_input(model, inputs, 2, "cpu")
    forward_backward(layer, x)
    assert all(t.grad is not None for t in x)
    assert [tuple(t.shape) for t in call(layer, x)] == [(2, 8, 16, 16), (2, 8, 8, 8)]

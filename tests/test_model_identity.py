"""What a model is (models/identity.py): full state with non-persistent buffers, tied weights,
unique parameter counts and the structure hash; each checked against plain PyTorch."""

import copy

import pytest
import torch
from torch import nn

from meshplan.executor.materialize import materialize, state_source
from meshplan.models.identity import full_state, num_params, retie, structure_hash, tied_groups


class Rope(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.register_buffer("inv_freq", 1.0 / (10000 ** (torch.arange(0, 4, 2).float() / 4)), persistent=False)
        self.register_buffer("count", torch.tensor(3))

    def forward(self, x):
        return self.proj(x) * self.inv_freq.repeat(2)


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.out = nn.Linear(4, 10, bias=False)
        self.out.weight = self.emb.weight


def test_non_persistent_buffers_are_materialised_as_the_model_set_them():
    model = Rope()
    assert "inv_freq" not in model.state_dict()  # what used to break every RoPE model
    state = full_state(model)
    assert set(state) == {"proj.weight", "proj.bias", "inv_freq", "count"}
    meta = copy.deepcopy(model).to("meta")
    materialize(meta, torch.device("cpu"), state_source(state))
    torch.testing.assert_close(meta.inv_freq, model.inv_freq)
    x = torch.randn(2, 4)
    torch.testing.assert_close(meta(x), model(x))


def test_tied_weights_are_found_counted_once_and_retied():
    model = Tied()
    assert tied_groups(model) == [["emb.weight", "out.weight"]]
    assert num_params(model) == 40 == sum(p.numel() for p in set(model.parameters()))
    meta = model.to("meta")  # nn.Module.to() unties ...
    assert meta.emb.weight is not meta.out.weight
    assert retie(meta, [["emb.weight", "out.weight"]]).emb.weight is meta.out.weight  # ... retie fixes it


def test_frozen_parameters_are_counted_apart():
    model = Tied()
    model.emb.weight.requires_grad_(False)
    assert num_params(model, trainable=False) == 40 and num_params(model, trainable=True) == 0


def test_structure_hash_sees_shapes_classes_and_ties_but_not_values():
    a, b = Tied(), Tied()
    assert structure_hash(a) == structure_hash(b) == structure_hash(copy.deepcopy(a))
    untied = Tied()
    untied.out.weight = nn.Parameter(untied.emb.weight.detach().clone())
    assert structure_hash(untied) != structure_hash(a)
    wider = Tied()
    wider.emb = nn.Embedding(11, 4)
    assert structure_hash(wider) != structure_hash(a)


def test_profile_counts_a_tied_sequential_once():
    from pathlib import Path

    from meshplan.profiler import profile_model

    spec = f"{Path(__file__).parent / 'fixtures' / 'user_models' / 'tied.py'}:build"
    profile = profile_model(spec)
    import importlib.util

    loader = importlib.util.spec_from_file_location("tied_fixture", spec.rsplit(":", 1)[0])
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    model, _ = module.build()
    assert profile.num_params == sum(p.numel() for p in set(model.parameters())) == 4288
    assert profile.layer("layers.3").num_params == 0 and profile.layer("layers.3").num_tied_params == 64 * 32


def test_run_refuses_a_plan_whose_model_config_rebuilds_another_model(tmp_path):
    """Every --set key reaches the plan (kv_heads, ffn_hidden: not shape keys), and check_plan
    compares the rebuilt model's unique parameter count and structure hash with the plan's."""
    pytest.importorskip("transformers")
    from meshplan.cli import main
    from meshplan.errors import MeshplanError
    from meshplan.executor.check import check_plan
    from meshplan.executor.model import build_model_for_plan
    from meshplan.plan import Plan
    from meshplan.schema import load

    out = tmp_path / "p.json"
    sets = ["layers=2", "hidden=64", "heads=4", "kv_heads=2", "ffn_hidden=128", "vocab=256", "seq=32"]
    assert (
        main(
            [
                "plan",
                "--model",
                "hf:meta-llama/Llama-3.1-8B",
                "--set",
                *sets,
                "--num-gpus",
                "1",
                "--global-batch",
                "4",
                "-o",
                str(out),
            ]
        )
        == 0
    )
    plan = load(Plan, out)
    assert plan.model_config["kv_heads"] == 2 and plan.model_config["ffn_hidden"] == 128
    assert plan.model_num_params == num_params(build_model_for_plan(plan, "meta")) == 106_816
    check_plan(plan)
    plan.model_config.pop("ffn_hidden")  # what used to happen silently: a 5.6M-parameter model
    with pytest.raises(MeshplanError, match="106,816"):
        check_plan(plan)
    plan.model_config["ffn_hidden"], plan.model_structure_hash = 128, "0123456789abcdef"
    with pytest.raises(MeshplanError, match="structure"):
        check_plan(plan)

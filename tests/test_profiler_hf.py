"""HF transformers models from configs built in code (skipped without the [hf] extra)."""
import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install 'meshplan[hf]')")

from meshplan.cli import main  # noqa: E402
from meshplan.models.loader import load_model  # noqa: E402
from meshplan.models.tp_rules import tp_rules  # noqa: E402
from meshplan.models.hf import _config  # noqa: E402
from meshplan.profiler import profile_model  # noqa: E402


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-llama"])
def test_layered_wrapper_computes_the_hf_forward(name):
    layered = load_model(f"hf:{name}", device="cpu", seed=0)
    config, _ = _config(transformers, name, {})
    torch.manual_seed(0)
    reference = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    x, _ = layered.example_batch(2, torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(layered(x), reference(input_ids=x, use_cache=False).logits)


def test_hf_parameter_counts_match_the_published_shapes():
    gpt2 = profile_model("hf:gpt2")
    assert gpt2.num_params == 124_439_808  # published GPT-2 small: the LM head is the tied embedding
    assert gpt2.layer("head").num_tied_params == 50257 * 768
    llama = profile_model("hf:meta-llama/Llama-3.1-8B")
    assert llama.num_params == pytest.approx(8.03e9, rel=0.005)
    block = llama.layer("layers.0")
    assert block.tp.kind == "block" and block.tp.divisors == {"heads": 32, "kv_heads": 8, "ffn": 14336}
    s, h = 8192, 4096  # GQA: k/v projections are 1/4 of q; SwiGLU three h x f GEMMs
    gemm_flops = 2 * s * (2 * h * h + 2 * h * 1024 + 3 * h * 14336)
    assert block.forward_flops == pytest.approx(gemm_flops + 4 * s * s * h, rel=0.01)


def test_hf_tp_rule_names_real_linears_and_overrides_apply():
    model = load_model("hf:tiny-llama", {"layers": 3, "seq": 16})
    assert len(model.layers) == 3 and model.seq_len == 16
    rule = tp_rules(model)["layers.1"]
    for child in rule.column + rule.row + rule.replicated:
        model.layers["1"].get_submodule(child)
    assert "block.self_attn.o_proj" in rule.row


def test_cli_profiles_an_hf_config_end_to_end(capsys):
    assert main(["profile", "--model", "hf:tiny-llama", "--set", "layers=2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["family"] == "hf" and data["num_layers"] == 2 and len(data["layers"]) == 4
    assert data["forward_flops_per_sample"] > 0


def test_hf_model_config_rebuilds_the_same_model():
    p = profile_model("hf:tiny-gpt2", {"layers": 3, "vocab": 100})
    again = load_model("hf:tiny-gpt2", p.model_config, "meta")
    assert again.layer_names() == p.layer_names and p.vocab == 100
    assert sum(x.numel() for x in again.parameters()) == p.num_params

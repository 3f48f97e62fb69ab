"""HF transformers models from configs built in code (skipped without the [hf] extra)."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install 'meshplan[hf]')")

from meshplan.cli import main  # noqa: E402
from meshplan.errors import MeshplanError  # noqa: E402
from meshplan.models.hf import _config, build_from_config  # noqa: E402
from meshplan.models.loader import load_model  # noqa: E402
from meshplan.models.tp_rules import tp_rules  # noqa: E402
from meshplan.profiler import profile_model  # noqa: E402

ARCHITECTURES = {  # built-in tiny config -> the transformers class it builds, layers found
    "tiny-gpt2": ("GPT2LMHeadModel", 4),
    "tiny-llama": ("LlamaForCausalLM", 4),
    "tiny-mistral": ("MistralForCausalLM", 4),
    "tiny-qwen2": ("Qwen2ForCausalLM", 4),
    "tiny-qwen3": ("Qwen3ForCausalLM", 4),
    "tiny-mixtral": ("MixtralForCausalLM", 4),
    "tiny-qwen2-moe": ("Qwen2MoeForCausalLM", 4),
    "tiny-gpt-neox": ("GPTNeoXForCausalLM", 4),
    "tiny-opt": ("OPTForCausalLM", 4),
    "tiny-bert": ("BertForMaskedLM", 4),
    "tiny-t5": ("T5ForConditionalGeneration", 1),
    "tiny-bart": ("BartForConditionalGeneration", 1),
}


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_layered_wrapper_computes_the_hf_forward(name):
    """Split into embed / layers / head (or one layer), the model computes transformers' logits
    and has exactly its unique parameters."""
    layered = load_model(f"hf:{name}", device="cpu", seed=0)
    config, _ = _config(transformers, name, {})
    torch.manual_seed(0)
    reference = build_from_config(transformers, config)
    cls, num_layers = ARCHITECTURES[name]
    assert type(reference).__name__ == cls and len(layered.layer_names()) == num_layers
    assert sum(p.numel() for p in layered.parameters()) == sum(p.numel() for p in reference.parameters())
    x, _ = layered.example_batch(2, torch.Generator().manual_seed(0))
    kwargs = {"decoder_input_ids": x} if config.is_encoder_decoder else {}
    with torch.no_grad():
        torch.testing.assert_close(layered(x), reference(input_ids=x, use_cache=False, **kwargs).logits)


def test_local_config_json_and_directory_and_config_keys_pass_through(tmp_path):
    values = {
        "model_type": "mistral",
        "architectures": ["MistralForCausalLM"],
        "num_hidden_layers": 2,
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 64,
        "vocab_size": 128,
        "max_position_embeddings": 64,
        "transformers_version": "5.0.0",
    }
    (tmp_path / "config.json").write_text(json.dumps(values))
    by_dir = profile_model(f"hf:{tmp_path}", {"seq": 16, "rope_theta": 1234.0})
    by_file = profile_model(f"hf:{tmp_path / 'config.json'}", {"seq": 16})
    assert (
        by_dir.num_params == by_file.num_params == 2 * (3 * 32 * 32 + 3 * 32 * 64 + 64) + 2 * 128 * 32 + 32
    )  # GQA: k, v are half of q
    assert by_dir.model_config["rope_theta"] == 1234.0
    model = load_model(f"hf:{tmp_path}", by_dir.model_config)
    assert model.hf_config.rope_parameters["rope_theta"] == 1234.0 and model.seq_len == 16
    with pytest.raises(MeshplanError, match="no config.json"):
        load_model(f"hf:{tmp_path / 'missing'}")


def test_moe_expert_flops_are_counted():
    """Routed experts run data-dependently (no FLOPs on fake tensors): counted from their weights."""
    mixtral = profile_model("hf:tiny-mixtral").layer("layers.0")
    dense = profile_model("hf:tiny-mistral", {"ffn_hidden": 128}).layer("layers.0")
    s, h, f, k = 32, 64, 128, 2  # top-2 of 4 experts, each a SwiGLU MLP of width f
    experts = 2 * s * k * 3 * h * f
    attention_and_router = dense.forward_flops - 2 * s * 3 * h * f + 2 * s * h * 4
    assert mixtral.forward_flops == pytest.approx(attention_and_router + experts, rel=1e-6)
    assert mixtral.backward_flops >= 2 * experts


def test_hf_parameter_counts_match_the_published_shapes():
    gpt2 = profile_model("hf:gpt2")
    assert gpt2.num_params == 124_439_808  # published GPT-2 small: the LM head is the tied embedding
    assert gpt2.layer("head").num_tied_params == 50257 * 768
    llama = profile_model("hf:meta-llama/Llama-3.1-8B")
    assert llama.num_params == 8_030_261_248  # Meta's model card: untied output head
    small = profile_model("hf:meta-llama/Llama-3.2-1B")
    assert small.num_params == 1_235_814_400  # Llama 3.2 1B ties its output head to the embedding
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

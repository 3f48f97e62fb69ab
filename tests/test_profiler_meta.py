"""Profiles on fake tensors: FLOPs, activations, TP rules and the JSON shape of a ModelProfile."""

import pytest

from meshplan.model_profile import ModelProfile
from meshplan.models.loader import load_model
from meshplan.models.tp_rules import tp_rules
from meshplan.profiler import profile_model
from meshplan.profiler.activations import gpt_block_activation_bytes, gpt_block_selective_bytes
from meshplan.schema import from_dict, to_dict

# s != h != V so that every term of the formulas is distinguishable
S, H, A, V = 512, 256, 8, 1000
GPT = dict(layers=3, hidden=H, heads=A, vocab=V, seq=S)


@pytest.fixture(scope="module")
def gpt_profile() -> ModelProfile:
    return profile_model("gpt", GPT)


def test_gpt_block_forward_flops_match_korthikanti(gpt_profile):
    block = gpt_profile.layer("layers.1")
    # Korthikanti et al. 2022 App. A: 24bsh^2 + 4bs^2h per layer forward (b = 1 sample)
    expected = 24 * S * H * H + 4 * S * S * H
    assert block.forward_flops == pytest.approx(expected, rel=0.01)
    assert block.backward_flops == pytest.approx(2 * block.forward_flops, rel=0.01)


def test_logits_flops_are_2bshv(gpt_profile):
    head = gpt_profile.layer("head")
    assert head.forward_flops == pytest.approx(2 * S * H * V, rel=0.01)
    assert head.backward_flops == pytest.approx(4 * S * H * V, rel=0.01)


def test_block_activation_bytes_match_adapted_korthikanti(gpt_profile):
    block = gpt_profile.layer("layers.0")
    assert block.activation_bytes == pytest.approx(gpt_block_activation_bytes(S, 1, H, A), rel=0.05)
    assert block.selective_activation_bytes == pytest.approx(gpt_block_selective_bytes(S, 1, H, A), rel=0.05)
    assert block.selective_activation_bytes < block.activation_bytes
    assert block.recompute_flops_selective == pytest.approx(4 * S * S * H, rel=0.01)


def test_tp_replicated_activations_match_korthikanti_eq2(gpt_profile):
    """Eq. 2: sbh(10 + 24/t + 5as/(ht)); the unsplit 10sbh = two LayerNorm inputs 4sbh, the QKV and
    fc1 inputs 4sbh and two dropout masks 2sbh. No dropout here: 8sbh (+ LayerNorm stats)."""
    block = gpt_profile.layer("layers.0")
    assert block.tp_replicated_activation_bytes == pytest.approx(8 * S * H, rel=0.05)
    head = gpt_profile.layer("head")  # final-norm input and projection input stay whole
    assert head.tp_replicated_activation_bytes == pytest.approx(4 * S * H, rel=0.05)


def test_boundary_bytes_and_gemm_shapes(gpt_profile):
    block = gpt_profile.layer("layers.2")
    assert block.input_bytes == block.output_bytes == S * H * 2  # bf16 hidden state
    assert [S, 4 * H, H] in block.gemm_shapes and [S, H, 4 * H] in block.gemm_shapes
    assert gpt_profile.layer("embed").output_bytes == S * H * 2
    assert gpt_profile.layer("head").output_bytes == S * V * 2


def test_identical_blocks_reuse_one_capture(gpt_profile):
    blocks = [gpt_profile.layer(f"layers.{i}") for i in range(3)]
    assert len({(b.forward_flops, b.activation_bytes) for b in blocks}) == 1
    assert any("representative" in note for note in gpt_profile.notes)


def test_tp_rules_for_gpt():
    model = load_model("gpt-tiny")
    rules = tp_rules(model)
    assert list(rules) == model.layer_names()
    block = rules["layers.0"]
    assert block.column == ["attn.wq", "attn.wk", "attn.wv", "mlp.fc1"]
    assert block.row == ["attn.wo", "mlp.fc2"]
    assert set(block.replicated) == {"ln1", "ln2"}
    assert block.divisors == {"heads": 4, "ffn": 256} and block.num_allreduce_fwd == 2
    assert (rules["embed"].kind, rules["head"].kind, block.kind) == ("embedding", "head", "block")
    assert rules["head"].column == ["proj"] and rules["embed"].row == ["tok"]
    for fqn, rule in rules.items():  # every named child exists in the layer
        layer = model.get_submodule(fqn)
        for child in rule.column + rule.row + rule.replicated:
            layer.get_submodule(child)


def test_profile_json_round_trip(gpt_profile):
    data = to_dict(gpt_profile)
    for key in ("num_params", "forward_flops_per_sample", "num_layers", "layers"):
        assert key in data
    assert len(data["layers"]) == 5 and data["layers"][1]["tp"]["kind"] == "block"
    again = from_dict(ModelProfile, data)
    assert again.layer("head").forward_flops == gpt_profile.layer("head").forward_flops
    assert sum(l.num_params for l in again.layers) == again.num_params


def test_seq_override_changes_attention_flops():
    short = profile_model("gpt-tiny", {"seq": 64}).layer("layers.0")
    long = profile_model("gpt-tiny", {"seq": 128}).layer("layers.0")
    h = 64
    # doubling s doubles the 24sh^2 part and quadruples the 4s^2h part
    assert long.forward_flops - 2 * short.forward_flops == pytest.approx(4 * 128 * 128 * h - 2 * 4 * 64 * 64 * h)


@pytest.mark.slow  # a fresh process profiling 175B parameters on meta: ~25 s on 2 cores
def test_gpt3_175b_profiles_on_meta_in_bounded_time_and_memory():
    """Profiling the 175B GPT takes < 60 s and < 4 GiB RAM (measured in a fresh process)."""
    import json
    import subprocess
    import sys

    code = (
        "import json, resource, time\n"
        "t = time.perf_counter()\n"
        "from meshplan.profiler import profile_model\n"
        "p = profile_model('gpt3-175b')\n"
        "print(json.dumps({'s': time.perf_counter() - t, 'params': p.num_params,\n"
        "  'rss_kib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    stats = json.loads(out.stdout.strip().splitlines()[-1])
    assert stats["params"] > 175e9
    assert stats["s"] < 60
    assert stats["rss_kib"] * 1024 < 4 * 2**30

"""ModelProfile.architecture: a decoder's architecture beyond its shape, recorded from the config an HF model was
built from (models/hf_arch.py), the zoo's and the closed form's, and carried into the Plan for the exports."""

import dataclasses
import json

import pytest
from report_fixtures import gpt_plan

pytest.importorskip("transformers", reason="transformers not installed (pip install 'meshplan[hf]')")

from meshplan import schema  # noqa: E402
from meshplan.errors import MeshplanError  # noqa: E402
from meshplan.model_profile import ModelArchitecture, ModelProfile  # noqa: E402
from meshplan.models.analytic import from_spec, llama_architecture  # noqa: E402
from meshplan.plan import Plan  # noqa: E402
from meshplan.profiler import profile_model  # noqa: E402

TINY_LLAMA = {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2, "ffn_hidden": 160, "vocab": 256, "seq": 32}
"""hf:tiny-llama's shape (models/hf.py CONFIGS) as the zoo's and the closed form's `--set`."""


def test_an_hf_llama_records_the_architecture_of_the_zoo_and_closed_form_llama():
    hf = profile_model("hf:tiny-llama").architecture
    assert hf == profile_model("llama", TINY_LLAMA).architecture
    assert hf == from_spec("analytic:llama", TINY_LLAMA, flash=True, dropout=False).architecture
    assert hf == llama_architecture(kv_heads=2, ffn_hidden=160)
    assert profile_model("hf:meta-llama/Llama-3.1-8B").architecture == llama_architecture(8, 14336)


def test_an_hf_gpt2_records_its_tied_output_and_learned_positions():
    arch = profile_model("hf:tiny-gpt2").architecture
    assert arch == ModelArchitecture(
        model_type="gpt2",
        kv_heads=4,
        ffn_hidden=4 * 64,
        norm="LayerNorm",
        norm_eps=1e-5,
        activation="gelu",
        position="learned_absolute",
        bias=True,
        tied=True,
    )


def test_what_the_names_cannot_say_is_not_recorded():
    """Qwen2 (biases on q/k/v only), GPT-NeoX (parallel attention and MLP, rotary on a quarter of each head),
    Mixtral (experts), encoders and encoder-decoders: no architecture, so the exports say it is not recorded."""
    for name in ("tiny-qwen2", "tiny-gpt-neox", "tiny-mixtral", "tiny-bert", "tiny-t5"):
        assert profile_model(f"hf:{name}").architecture is None, name
    assert profile_model("hf:tiny-qwen3").architecture.qk_norm  # its per-head q/k norms: --qk-layernorm
    assert profile_model("moe").architecture is None


def test_the_architecture_round_trips_and_old_files_load():
    profile = profile_model("hf:tiny-llama")
    assert schema.from_dict(ModelProfile, json.loads(schema.dumps(profile))) == profile
    old = schema.to_dict(profile)
    old.pop("architecture")  # a profile written before it
    assert schema.from_dict(ModelProfile, old).architecture is None
    plan = dataclasses.replace(gpt_plan(), model_architecture=profile.architecture)
    assert schema.from_dict(Plan, json.loads(schema.dumps(plan))).model_architecture == profile.architecture
    assert "model_architecture" not in schema.to_dict(gpt_plan())  # absent when not recorded
    bad = {**schema.to_dict(profile), "architecture": {**old_arch(profile), "norm": "BatchNorm"}}
    with pytest.raises(MeshplanError, match=r"architecture\.norm = \"BatchNorm\": must be one of LayerNorm, RMSNorm"):
        schema.from_dict(ModelProfile, bad)
    bad["architecture"] = {**old_arch(profile), "rope_theta": 0.0}
    with pytest.raises(MeshplanError, match=r"architecture\.rope_theta = 0\.0: must be > 0 with rope"):
        schema.from_dict(ModelProfile, bad)


def old_arch(profile: ModelProfile) -> dict:
    return schema.to_dict(profile.architecture)

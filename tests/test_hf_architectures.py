"""Every kind of architecture the installed transformers builds from a small config: causal LMs
(dense, MoE, eager-only, ALiBi-style and rotary variants), encoders, encoder-decoders and
state-space models. Each loads through `hf:config.json` without a traceback, is split into
its layers where its structure allows (one whole layer otherwise, with the reason in the
profile's notes), computes exactly the model's own logits, never lets a position see a later
token in a causal model, and profiles on the meta device with exactly its unique parameter
count. A few run on 2 gloo ranks in tests/test_any_model.py and tests/test_model_fidelity.py.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install 'meshplan[hf]')")

from meshplan.models.hf import _config, build_from_config  # noqa: E402
from meshplan.models.loader import load_model  # noqa: E402
from meshplan.profiler import profile_model  # noqa: E402

TINY = dict(
    num_hidden_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    intermediate_size=128,
    vocab_size=256,
    max_position_embeddings=64,
    pad_token_id=0,
    head_dim=16,
)
EXTRA = {
    "gptj": dict(rotary_dim=8),
    "bloom": dict(n_head=4),
    "falcon": dict(num_kv_heads=4),
    "deepseek_v3": dict(num_key_value_heads=4),
    "cohere": dict(logit_scale=0.5),  # the head's own scaling, applied by the split's head too
    "granite": dict(logits_scaling=4.0),
}
DROP = {"falcon": {"head_dim"}, "deepseek_v3": {"head_dim"}}
"""TINY keys a config derives itself (a read-only property, MLA's head sizes)."""
ARCHITECTURES = {
    "causal": [
        "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi", "phi3", "stablelm", "falcon", "bloom",
        "gpt2", "gpt_neox", "gptj", "opt", "olmo2", "granite", "starcoder2", "cohere", "mixtral", "deepseek_v3",
    ],
    "encoder": ["bert", "roberta", "distilbert", "electra", "albert", "deberta-v2"],
    "encoder-decoder": ["t5", "bart", "pegasus"],
    "state-space": ["mamba", "falcon_mamba", "jamba"],
}  # fmt: skip
SPLITS = {
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi", "phi3", "stablelm", "falcon", "gpt2", "gpt_neox",
    "gptj", "opt", "olmo2", "granite", "starcoder2", "cohere", "mixtral", "deepseek_v3", "bert", "roberta", "mamba",
    "falcon_mamba", "jamba",
}  # fmt: skip
"""Split into layers today (a regression guard); the others are one whole layer, correctly."""
CASES = [(kind, mt) for kind, types in ARCHITECTURES.items() for mt in types]


def _spec(tmp_path, model_type: str) -> str:
    defaults = transformers.AutoConfig.for_model(model_type)
    values = {}
    for key, value in {**TINY, **EXTRA.get(model_type, {})}.items():
        if key in DROP.get(model_type, ()):
            continue
        name = defaults.attribute_map.get(key, key)
        if hasattr(defaults, name):
            values[name] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": model_type, **values, "seq": 8}))
    return f"hf:{path}"


def _plain(spec: str):
    torch.manual_seed(0)
    config, _ = _config(transformers, spec[3:], {})
    return build_from_config(transformers, config).eval()


def _logits(plain, ids):
    kwargs = {"decoder_input_ids": ids} if plain.config.is_encoder_decoder else {}
    return plain(input_ids=ids, use_cache=False, **kwargs).logits


@pytest.mark.parametrize("kind, model_type", CASES, ids=[mt for _, mt in CASES])
def test_architecture_computes_its_own_forward(tmp_path, kind, model_type):
    spec = _spec(tmp_path, model_type)
    plain = _plain(spec)
    model = load_model(spec, None, "cpu").eval()
    assert (len(model.layer_names()) > 1) == (model_type in SPLITS), model.notes
    ids = torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(ids)
        torch.testing.assert_close(out, _logits(plain, ids), rtol=1e-6, atol=1e-6)
        if kind in ("causal", "state-space"):  # a future token never moves a past position
            changed = ids.clone()
            changed[:, -1] = (changed[:, -1] + 1) % 256
            torch.testing.assert_close(model(changed)[:, :-1], out[:, :-1], rtol=0, atol=1e-6)
    profile = profile_model(spec)  # on meta, fake tensors
    assert profile.num_params == sum(p.numel() for p in set(plain.parameters()))
    if model_type not in SPLITS:
        assert any("is one layer" in note for note in profile.notes)

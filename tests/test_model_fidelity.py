"""Models whose forward is not a plain chain, held to what their own forward computes:
modules reused in forward (ALBERT-style weight sharing across depth, one activation called
twice), a Python `if` and an nn.ModuleDict with unused branches, dict outputs with a loss,
torchvision's in-place habits and a non-contiguous tensor at a cut, BatchNorm under
microbatching, and raw transformers models under eager attention (the causal mask) with their
own (ids, labels). Every run on 2 gloo ranks equals plain PyTorch on one process: the factory's
module itself, trained with torch.optim.SGD and clip_grad_norm_ on the same batches.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from executor_plans import make_plan
from torch.nn import functional as F

from meshplan.executor.launch import LaunchOptions, run_plans
from meshplan.profiler import profile_model

FIXTURES = Path(__file__).parent / "fixtures" / "user_models"
REUSE = f"{FIXTURES / 'reuse_models.py'}"
STEPS, LR, CLIP, REL_TOL = 3, 0.5, 1.0, 1e-4
PP = dict(pp=2, microbatches=2)


def _factory(name: str):
    import importlib.util
    import sys

    sys.path.insert(0, str(FIXTURES))  # reuse_models imports a helper beside it
    loader = importlib.util.spec_from_file_location("plain_reuse_models", REUSE)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return getattr(module, name)


def _loss(module, x, y) -> torch.Tensor:
    out = module(**x) if isinstance(x, dict) else module(x)
    if type(out) is dict:  # the user's {"loss": ...}
        return out["loss"]
    if not isinstance(out, torch.Tensor):
        out = out.logits
    return F.cross_entropy(out.flatten(0, -2), y.flatten())


def plain_losses(name: str, batch_size: int) -> list[float]:
    """Single-process plain PyTorch on the factory's batch tiled to batch_size."""
    torch.manual_seed(0)
    module, batch = _factory(name)()
    tile = lambda t: t.repeat(-(-batch_size // t.shape[0]), *([1] * (t.dim() - 1)))[:batch_size]  # noqa: E731
    x, y = (batch, None) if isinstance(batch, dict) else batch
    x = {k: tile(v) for k, v in x.items()} if isinstance(x, dict) else tile(x)
    y = None if y is None else tile(y)
    opt = torch.optim.SGD(module.parameters(), lr=LR, momentum=0.9)
    losses = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        loss = _loss(module, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), CLIP)
        opt.step()
        losses.append(loss.item())
    return losses


RUNS = {
    ("albert", "dp"): dict(dp=2),
    ("albert", "zero3"): dict(dp_shard=2, zero=3),
    ("albert", "pp"): PP,  # the shared block's copies on both stages: gradients summed
    ("albert_cpu", "pp"): PP,
    ("shared_act", "pp"): PP,
    ("dict_loss", "dp"): dict(dp=2),
    ("in_place", "pp"): PP,  # ReLU(inplace=True) first in a stage; a transposed tensor sent
    ("in_place", "zero3"): dict(dp_shard=2, zero=3),
    ("hf_eager_labels", "dp"): dict(dp=2),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("fidelity")
    plans = [make_plan(f"{REUSE}:{name}", **kwargs) for (name, _), kwargs in RUNS.items()]
    opts = LaunchOptions(
        steps=STEPS, out_dir=str(out / "run"), quiet=True, timeout_s=300, optimizer="sgd", lr=LR, grad_clip=CLIP
    )
    return dict(zip(RUNS, zip(plans, run_plans(plans, opts))))


@pytest.mark.slow
@pytest.mark.parametrize("key", list(RUNS), ids=lambda k: f"{k[0]}-{k[1]}")
def test_layout_equals_plain_pytorch(runs, key):
    plan, result = runs[key]
    ref = plain_losses(key[0], plan.global_batch_size)
    rel = max(abs(a - b) / abs(b) for a, b in zip(result.losses, ref))
    assert len(result.losses) == STEPS and rel <= REL_TOL, f"{key}: {result.losses} vs plain PyTorch {ref}"
    assert max(ref) - min(ref) > 1e-4, "the loss must move, or equality proves nothing"


@pytest.mark.parametrize(
    "name, num_params, num_layers",
    [("albert", 1_333, 6), ("albert_cpu", 1_333, 6), ("shared_act", 467, 3), ("in_place", 1_500, 0)],
)
def test_reused_modules_profile_once_with_every_use_a_layer(name, num_params, num_layers):
    """A block applied at every depth is one weight counted once, each application its own
    layer (so pipeline stages can split them); a factory taking `device` (profiled on meta)
    gets the same layers as one built on the CPU; fx's `act@1` for the second call is no error."""
    module, _ = _factory(name)()
    profile = profile_model(f"{REUSE}:{name}")
    assert profile.num_params == sum(p.numel() for p in set(module.parameters())) == num_params
    assert not num_layers or len(profile.layers) == num_layers


def test_albert_layers_share_one_weight():
    """The shared block's layers hold their own modules over the same Parameters: tied groups,
    which the executor keeps equal across stages (executor/tied.py)."""
    from meshplan.models.identity import tied_groups
    from meshplan.models.loader import load_model

    model = load_model(f"{REUSE}:albert_cpu", device="cpu")
    groups = tied_groups(model)
    weight = next(g for g in groups if g[0].endswith("block.fc1.weight"))
    assert len(weight) == 4 and len({n.split(".")[1] for n in weight}) == 4  # one FQN per depth
    assert model.layers["1"].get_submodule("block.fc1") is not model.layers["2"].get_submodule("block.fc1")


def test_unused_branches_are_named_in_a_warning():
    """A Python `if` on a flag and an nn.ModuleDict entry the forward never calls: the placed
    parameters are profiled exactly, the others are named (count and modules) in a warning, on
    stderr and in the profile's notes; nothing is dropped without a word."""
    module, _ = _factory("branches")()
    total = sum(p.numel() for p in module.parameters())
    unused = sum(p.numel() for p in [*module.gate.parameters(), *module.mixers["conv"].parameters()])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profile = profile_model(f"{REUSE}:branches")
    assert profile.num_params == total - unused
    (text,) = [str(w.message) for w in caught if "not used by its forward" in str(w.message)]
    assert f"{unused:,} of {total:,} parameters" in text and "gate" in text and "mixers.conv" in text
    assert any(note.startswith("warning: ") and "mixers.conv" in note for note in profile.notes)


def test_a_meta_split_the_cpu_build_does_not_reproduce_is_refused_before_launch(tmp_path, capsys):
    """A factory with a `device` parameter profiles on meta, where a cut is checked on shapes
    only: three layers, and a pp=2 plan of them. Built on the CPU, as every rank builds it, the
    module is one layer (its buffer counts forward calls). check_plan refuses the plan before any
    process starts, in one line naming both layer counts; `meshplan run` exits 2 on it."""
    from meshplan.cli import main
    from meshplan.errors import MeshplanError
    from meshplan.executor.check import check_plan
    from meshplan.models.loader import load_model
    from meshplan.schema import dumps

    spec = f"{REUSE}:warmup"
    assert len(load_model(spec, device="meta").layer_names()) == 3
    assert load_model(spec, device="cpu").layer_names() == ["layers.0"]
    plan = make_plan(spec, pp=2, microbatches=2)
    with pytest.raises(MeshplanError, match=r"built on the CPU has 1 layer\(s\).*the plan 3 from its meta-device"):
        check_plan(plan)
    check_plan(make_plan(f"{REUSE}:albert", pp=2, microbatches=2))  # a meta split the CPU reproduces
    (tmp_path / "plan.json").write_text(dumps(plan))
    assert main(["run", str(tmp_path / "plan.json"), "--steps", "1", "--out-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "meta-device profile" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_uneven_ignored_labels_weigh_by_token(tmp_path):
    """Labels with a different number of ignored (-100) positions per row, one row all ignored:
    under DP with accumulation (4 microbatches of 1 row over 2 replicas), DP alone and a 2-stage
    pipeline, the loss is the model's own cross-entropy over the whole batch (the mean over its
    counted labels), not the mean of per-microbatch means."""
    name, keys = "uneven_masks", ["dp_accum", "dp", "pp"]
    plans = [
        make_plan(f"{REUSE}:{name}", dp=2, microbatch=1, microbatches=2),
        make_plan(f"{REUSE}:{name}", dp=2),
        make_plan(f"{REUSE}:{name}", **PP),
    ]
    opts = LaunchOptions(
        steps=STEPS, out_dir=str(tmp_path / "run"), quiet=True, timeout_s=300, optimizer="sgd", lr=LR, grad_clip=CLIP
    )
    ref = plain_losses(name, 4)
    torch.manual_seed(0)
    module, (x, y) = _factory(name)()
    with torch.no_grad():
        out = module(x)
        per_row = [F.cross_entropy(out[i], y[i]) for i in range(3)]  # row 3 counts nothing
    assert abs(sum(per_row) / 3 - ref[0]) > 1e-3  # a mean of means would differ
    for key, result in zip(keys, run_plans(plans, opts)):
        rel = max(abs(a - b) / abs(b) for a, b in zip(result.losses, ref))
        assert len(result.losses) == STEPS and rel <= REL_TOL, f"{key}: {result.losses} vs plain PyTorch {ref}"


def test_batchnorm_under_microbatching_is_stated():
    from meshplan.executor.check import run_warnings

    spec = f"{REUSE}:batchnorm"
    (text,) = [t for t in run_warnings(make_plan(spec, pp=1, dp=2)) if "BatchNorm1d" in t]
    assert "batch statistics" in text and "global batch of 4" in text
    assert not [t for t in run_warnings(make_plan(spec, microbatch=4)) if "BatchNorm" in t]


def test_eager_attention_layers_are_causal_and_equal_the_models_own_loss():
    """A raw transformers model under eager attention, split into its layers: the logits equal
    its own forward's, changing the last token leaves every earlier position's logits unchanged,
    and meshplan's loss equals the model's own loss on the same targets."""
    from meshplan.models.loader import load_model

    torch.manual_seed(0)
    module, ids = _factory("hf_eager")()
    model = load_model(f"{REUSE}:hf_eager", device="cpu")  # seed 0 too: the same weights
    assert len(model.layer_names()) == 4  # embed, 2 layers, head: split, not whole
    module.eval(), model.eval()
    x, y = ids[:, :-1].contiguous(), ids[:, 1:].contiguous()
    with torch.no_grad():
        own = module(input_ids=x, labels=y, shift_labels=y, use_cache=False)
        out = model(x)
        torch.testing.assert_close(out, own.logits)
        torch.testing.assert_close(model.loss(out, y), own.loss)
        changed = x.clone()
        changed[:, -1] = (changed[:, -1] + 1) % 128
        torch.testing.assert_close(model(changed)[:, :-1], out[:, :-1], rtol=0, atol=0)


def test_eager_attention_prices_its_s2_probabilities_and_sdpa_does_not():
    """One Llama under eager attention and under SDPA: the eager profile's blocks keep the s x s
    probabilities (>= 2as^2 bytes per sample more than SDPA's), count them as the attention core
    selective recompute frees (with the 4s^2h FLOPs of QK^T and PV to redo), so the planner sees
    them as materialised and does not add them again when re-targeting to that kind; SDPA's core
    is its log-sum-exp only."""
    from meshplan.planner.attention import is_materialized, with_attention

    eager, sdpa = profile_model(f"{REUSE}:hf_eager"), profile_model(f"{REUSE}:hf_sdpa")
    a, s, h = eager.heads, eager.seq_len, eager.hidden
    assert (a, s, h) == (sdpa.heads, sdpa.seq_len, sdpa.hidden) == (4, 16, 32)
    for e, f in [(e, f) for e, f in zip(eager.layers, sdpa.layers) if e.tp.kind == "block"]:
        assert e.activation_bytes - f.activation_bytes >= 2 * a * s * s
        assert e.activation_bytes - e.selective_activation_bytes >= 2 * a * s * s
        assert e.recompute_flops_selective >= 4 * s * s * h
        assert is_materialized(e, a, s) and not is_materialized(f, a, s)
        assert f.activation_bytes - f.selective_activation_bytes == 4 * a * s  # fp32 log-sum-exp
    assert with_attention(eager, "materialized") is eager and with_attention(sdpa, "flash") is sdpa
    assert any("runs eager attention" in n for n in eager.notes)
    assert not any("runs eager attention" in n for n in sdpa.notes)


def test_sdpa_blocks_with_seq_equal_to_hidden_keep_only_the_log_sum_exp_as_core():
    """Under SDPA the hidden states are (b, s, h): with s == h (Llama-3 70B at 8192 tokens) they
    are square like a score matrix, yet selective recompute frees only SDPA's log-sum-exp; an
    eager-core test by shape alone counted them (and flipped the 70B example's plan)."""
    a, s = 4, 64
    prof = profile_model("llama", overrides=dict(layers=1, hidden=s, heads=a, kv_heads=2, seq=s, vocab=128))
    blocks = [layer for layer in prof.layers if layer.tp.kind == "block"]
    assert blocks
    for layer in blocks:
        assert layer.activation_bytes - layer.selective_activation_bytes == 4 * a * s  # fp32 log-sum-exp


def test_set_beside_a_saved_profile_is_accepted_when_it_restates_it(tmp_path, capsys):
    from meshplan.cli import main

    assert main(["profile", "--model", "gpt-tiny", "--set", "seq=16", "-o", str(tmp_path / "p.json")]) == 0
    plan = ["plan", "--profile", str(tmp_path / "p.json"), "--cluster", "local-cpu", "--num-gpus", "2"]
    plan += ["--global-batch", "4", "-o", str(tmp_path / "plan.json")]
    assert main([*plan, "--set", "seq=16"]) == 0
    assert main([*plan, "--set", "seq=64"]) == 2
    assert "--set seq=64: the saved --profile has seq = 16" in capsys.readouterr().err


def test_tp_on_blocks_without_rules_is_stated(tmp_path):
    """Phi-3's fused qkv_proj / gate_up_proj have no rule the executor applies: under --tp 2
    only embed and head are split, and the run says the blocks are whole on every TP rank."""
    import json

    from meshplan.executor.check import run_warnings
    from meshplan.models.tp_rules import tp_rules

    config = dict(model_type="phi3", num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                  num_key_value_heads=4, intermediate_size=128, vocab_size=256, max_position_embeddings=64,
                  pad_token_id=0, seq=16)  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = f"hf:{tmp_path / 'config.json'}"
    plan = make_plan(spec, tp=2)
    from meshplan.models.loader import load_model

    assert {r.kind for fqn, r in tp_rules(load_model(spec)).items() if fqn.startswith("layers.")} == {"none"}
    (text,) = [t for t in run_warnings(plan) if "tensor_parallel_degree" in t]
    assert "2 of 2 blocks (layers.0 .. layers.1)" in text and "run whole on every TP rank" in text
    assert not [t for t in run_warnings(make_plan("hf:tiny-llama", tp=2)) if "tensor_parallel_degree" in t]


def test_plan_names_the_blocks_tp_does_not_split(tmp_path, capsys):
    """`meshplan plan --tp 2` of a Phi-3 config says before any run which blocks TP leaves whole:
    on stderr and in plan.json's `warnings` (absent from a Llama plan, whose blocks all split, and
    from a plan at tp 1), and the plan loads back with it."""
    import json

    from meshplan.cli import main
    from meshplan.plan import Plan
    from meshplan.schema import load

    config = dict(model_type="phi3", num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                  num_key_value_heads=4, intermediate_size=128, vocab_size=256, max_position_embeddings=64,
                  pad_token_id=0, seq=16)  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    args = ["plan", "--cluster", "local-cpu", "--num-gpus", "2", "--global-batch", "4"]
    assert main([*args, "--model", f"hf:{tmp_path / 'config.json'}", "--tp", "2", "-o", str(tmp_path / "p.json")]) == 0
    err = capsys.readouterr().err
    (text,) = load(Plan, tmp_path / "p.json").warnings
    assert "2 of 2 blocks (layers.0 .. layers.1)" in text and "run whole on every TP rank" in text
    assert f"meshplan plan: warning: {text}" in err
    for extra in (["--model", "hf:tiny-llama", "--tp", "2"], ["--model", "hf:tiny-llama"]):
        assert main([*args, *extra, "-o", str(tmp_path / "q.json")]) == 0
        assert "warnings" not in json.loads((tmp_path / "q.json").read_text())


@pytest.mark.parametrize("arch", ["BertForSequenceClassification", "BertForMaskedLM"])
def test_hf_task_targets_equal_the_models_own_loss(tmp_path, arch):
    """An hf: config's own head decides the targets: a class per sequence for a classifier (not
    next tokens: 'batch 8 vs 512'), masked positions for a masked LM; meshplan's loss on them
    equals the model's own loss with those labels."""
    import json

    import transformers

    from meshplan.models.hf import _config, build_from_config
    from meshplan.models.loader import load_model

    config = dict(model_type="bert", architectures=[arch], num_hidden_layers=2, hidden_size=32,
                  num_attention_heads=4, intermediate_size=64, vocab_size=128, max_position_embeddings=64,
                  num_labels=3, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, seq=16)  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = f"hf:{tmp_path / 'config.json'}"
    model = load_model(spec, None, "cpu")
    x, y = model.example_batch(4, torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    plain = build_from_config(transformers, _config(transformers, spec[3:], {})[0])
    assert type(plain).__name__ == arch
    if arch.endswith("Classification"):
        assert y.shape == (4,) and int(y.max()) < 3
    else:
        assert y.shape == x.shape and ((y == -100).sum(1) == 16 - 2).all()  # 15% of 16 = 2 per sequence
    with torch.no_grad():
        torch.testing.assert_close(model.loss(model(x), y), plain(input_ids=x, labels=y).loss)

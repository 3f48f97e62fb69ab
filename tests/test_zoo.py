"""The model zoo: published parameter counts, TP-friendly attention, determinism, MoE routing."""

import copy

import pytest
import torch

from meshplan.models.loader import load_model
from meshplan.models.tp_rules import tp_rules
from meshplan.models.zoo import ZOO, build_model
from meshplan.models.zoo.moe import MoEConfig, MoEMLP
from meshplan.profiler import profile_model

TINY = ["gpt-tiny", "llama-tiny", "bert-tiny", "vit-tiny", "moe-tiny", "resnet-tiny"]


def narayanan_eq2(l: int, h: int, V: int, s: int) -> int:
    """Narayanan et al. 2021 Eq. 2: P = 12lh^2 (1 + 13/(12h) + (V + s)/(12lh)) = 12lh^2 + 13lh + (V+s)h."""
    return 12 * l * h * h + 13 * l * h + (V + s) * h


def our_gpt_params(l: int, h: int, V: int, s: int) -> int:
    """Exact count for models/zoo/gpt.py. Eq. 2 counts per block 12h^2 + 13h (QKV/out projections
    4h^2 + 4h, MLP 8h^2 + 5h, two LayerNorms 4h) and the token + learned position embeddings
    (V + s)h, with the output layer tied to the token embedding and the final LayerNorm left out.
    Our head is untied (Vh more) and has the final LayerNorm (2h more)."""
    return narayanan_eq2(l, h, V, s) + V * h + 2 * h


@pytest.mark.parametrize("name", ["gpt-tiny", "gpt2-125m", "gpt2-1.5b", "gpt3-13b", "megatron-1.7b"])
def test_gpt_params_equal_narayanan_eq2_closed_form(name):
    cfg = ZOO[name][1]
    expected = our_gpt_params(cfg["layers"], cfg["hidden"], cfg["vocab"], cfg["seq"])
    assert profile_model(name).num_params == expected


def test_gpt_params_with_overrides():
    p = profile_model("gpt", {"layers": 3, "hidden": 96, "heads": 6, "vocab": 1000, "seq": 77})
    assert p.num_params == our_gpt_params(3, 96, 1000, 77)
    assert p.num_params != narayanan_eq2(3, 96, 1000, 77)  # the difference is real, not rounding


@pytest.mark.parametrize("name,published", [("llama3-8b", 8.03e9), ("llama3-70b", 70.6e9), ("llama3-405b", 405.9e9)])
def test_llama3_params_within_half_percent_of_published(name, published):
    model = build_model(name, device="meta")
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(published, rel=0.005)
    rule = tp_rules(model)["layers.0"]
    assert rule.divisors["kv_heads"] == 8 and rule.divisors["heads"] == ZOO[name][1]["heads"]


@pytest.mark.parametrize("name,published", [("vit-b16", 86.6e6), ("vit-l16", 304.3e6), ("resnet50", 25.557e6)])
def test_vision_params_match_published(name, published):
    model = build_model(name, device="meta")
    assert sum(p.numel() for p in model.parameters()) == pytest.approx(published, rel=0.005)


@pytest.mark.parametrize("name", TINY)
def test_tiny_models_train_deterministically(name):
    outs = []
    for _ in range(2):
        model = load_model(name, device="cpu", seed=3)
        x, y = model.example_batch(2, torch.Generator().manual_seed(1))
        loss = model.loss(model(x), y)
        loss.backward()
        grad = sum(p.grad.abs().sum() for p in model.parameters() if p.grad is not None)
        outs.append((loss.item(), grad.item()))
    assert outs[0] == outs[1] and torch.isfinite(torch.tensor(outs[0])).all()


def _split(linear: torch.nn.Linear, dim: int, rank: int, t: int, keep_bias: bool) -> torch.nn.Linear:
    shard = copy.deepcopy(linear)
    with torch.no_grad():
        shard.weight = torch.nn.Parameter(linear.weight.chunk(t, dim)[rank].clone())
        if linear.bias is not None:
            bias = linear.bias.chunk(t, 0)[rank] if dim == 0 else linear.bias * float(keep_bias)
            shard.bias = torch.nn.Parameter(bias.clone())
    return shard


@pytest.mark.parametrize("name", ["gpt-tiny", "llama-tiny", "bert-tiny", "vit-tiny", "moe-tiny"])
def test_tp_rule_splits_compute_exactly(name):
    """Column/row splits of the rule's linears, summed over 2 ranks, equal the unsplit module
    (this also proves attention uses local heads through view(..., -1, head_dim))."""
    model = load_model(name, device="cpu")
    block = model.layers["0"]
    rule = tp_rules(model)["layers.0"]
    x = torch.randn(
        2,
        model.seq_len,
        block.ln1.normalized_shape[0] if hasattr(block, "ln1") else block.attn_norm.normalized_shape[0],
    )
    for parent in sorted({fqn.split(".")[0] for fqn in rule.column + rule.row}):
        full = block.get_submodule(parent)
        partial = torch.zeros_like(full(x))
        for rank in range(2):
            shard = copy.deepcopy(full)
            for fqn in rule.column + rule.row:
                if fqn.startswith(parent + "."):
                    child = fqn.split(".", 1)[1]
                    shard.set_submodule(
                        child,
                        _split(full.get_submodule(child), 0 if fqn in rule.column else 1, rank, 2, keep_bias=rank == 0),
                    )
            partial += shard(x)
        torch.testing.assert_close(partial, full(x), rtol=1e-5, atol=1e-6)


def test_tp_rules_name_real_children_for_every_tiny_model():
    for name in TINY:
        model = load_model(name)
        for fqn, rule in tp_rules(model).items():
            for child in rule.column + rule.row + rule.replicated:
                model.get_submodule(fqn).get_submodule(child)


def test_moe_matches_a_per_token_reference_and_is_batch_split_invariant():
    torch.manual_seed(0)
    moe = MoEMLP(MoEConfig(layers=1, hidden=16, heads=2, vocab=50, seq=8, experts=4, top_k=2))
    for p in moe.parameters():
        torch.nn.init.normal_(p, 0, 0.3)
    x = torch.randn(3, 8, 16)
    with torch.no_grad():
        y = moe(x)
        ref = torch.zeros_like(x)
        C, overflowed = moe.capacity(8), False
        for b in range(3):
            gates, experts = moe.router(x[b]).softmax(-1).topk(2, -1)
            fill = [0] * 4
            for e in range(4):  # slots fill in (expert, token, choice) order, C per expert
                for t in range(8):
                    for j in range(2):
                        if experts[t, j] == e and fill[e] < C:
                            hid = torch.nn.functional.gelu(x[b, t] @ moe.w1[e] + moe.b1[e, 0])
                            ref[b, t] += gates[t, j] * (hid @ moe.w2[e] + moe.b2[e, 0])
                        fill[e] += int(experts[t, j] == e)
            overflowed |= max(fill) > C
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(torch.cat([moe(x[i : i + 1]) for i in range(3)]), y)
    assert overflowed  # some tokens were over capacity, so dropping is covered too


def test_moe_flops_scale_with_capacity_not_all_experts():
    p = profile_model("moe-tiny")
    dense = profile_model("gpt-tiny")
    h, s, f, E = 64, 32, 256, 4
    C = -(-int(1.25 * s * 2) // E)
    moe_ffn = 2 * 2 * E * C * h * f + 2 * s * h * E  # experts' two GEMMs + router
    gpt_ffn = 2 * 2 * s * h * f
    delta = p.layer("layers.0").forward_flops - dense.layer("layers.0").forward_flops
    assert delta == pytest.approx(moe_ffn - gpt_ffn, rel=0.01)


def test_resnet_reuses_identical_blocks_only():
    p = profile_model("resnet50")
    assert len(p.layers) == 18 and p.num_layers == 16
    reps = p.notes[0]
    assert "10 representative" in reps  # stem, 4 stage-opening blocks, 4 repeated shapes, head
    assert p.forward_flops_per_sample == pytest.approx(2 * 4.09e9, rel=0.03)  # He et al.: 4.1 GMACs

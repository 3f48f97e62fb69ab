"""Any model a user brings, end to end: Hugging Face configs of every common
architecture, torchvision-style and user models with skips, dict inputs, tied and frozen weights.

For each model: the profile's parameter count equals `sum(p.numel())` over the plain model's
unique parameters (and a number written here); `meshplan plan` plans it for 2 ranks; and every
layout run on 2 gloo ranks (DP, ZeRO, TP, TP+SP, PP, and the planner's own choice) equals the
losses of *plain PyTorch* on one process: the transformers model or the factory's module itself,
trained with torch.optim.SGD and clip_grad_norm_ on the same global batches — not meshplan's
own 1-rank run.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

transformers = pytest.importorskip("transformers", reason="transformers not installed (pip install 'meshplan[hf]')")

from executor_plans import make_plan  # noqa: E402

from meshplan.cli import main  # noqa: E402
from meshplan.executor.data import step_generator  # noqa: E402
from meshplan.executor.launch import LaunchOptions, run_plans  # noqa: E402
from meshplan.models.hf import _config, build_from_config  # noqa: E402
from meshplan.plan import Plan  # noqa: E402
from meshplan.profiler import profile_model  # noqa: E402
from meshplan.schema import load  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "user_models"
ANY = f"{FIXTURES / 'any_models.py'}"
STEPS, LR, CLIP, REL_TOL = 3, 0.5, 1.0, 1e-4
TP_SP, PP = dict(tp=2, sp=True), dict(pp=2, microbatches=2)
PP_V2 = dict(pp=2, virtual=2, schedule="Interleaved1F1B", microbatches=2)
"""Four stages on two ranks: a long skip is sent across every stage boundary it spans."""


@dataclass
class Case:
    spec: str
    num_params: int
    """Unique parameters of the plain model (tied weights once)."""
    layouts: dict[str, dict] = field(default_factory=dict)
    """Layout name -> make_plan keywords, 2 ranks each."""
    tp_rules: bool = True
    """False: no layer TP splits (the planner must not choose tp > 1; pinning it is refused)."""
    num_layers: int = 0
    """Layers the profile must find (0: not checked); torchvision-style models are cut from
    their torch.fx graph where one tensor is live (skips inside a block stay in its layer) and
    between their modules, with every tensor crossing there (a U-Net's long skips)."""


CASES = {
    "llama": Case("hf:tiny-llama", 119_104, {"tp_sp": TP_SP, "pp": PP}),
    "mistral": Case("hf:tiny-mistral", 106_816, {"tp": dict(tp=2), "tp_sp": TP_SP}),
    "qwen2": Case("hf:tiny-qwen2", 107_072, {"tp_sp": TP_SP, "dp": dict(dp=2)}),
    "qwen3": Case("hf:tiny-qwen3", 106_880, {"zero3": dict(dp_shard=2, zero=3), "tp_sp": TP_SP}),  # q/k norms
    "mixtral": Case("hf:tiny-mixtral", 254_784, {"tp_sp": TP_SP, "zero3": dict(dp_shard=2, zero=3)}),
    "qwen2_moe": Case("hf:tiny-qwen2-moe", 181_440, {"pp": PP}),
    "gpt2_tied": Case("hf:tiny-gpt2", 182_016, {"tp_sp": TP_SP, "pp": PP}),
    "gpt_neox": Case("hf:tiny-gpt-neox", 99_840, {"pp": PP, "tp_sp": TP_SP}),  # fused QKV split per head group
    "opt_tied": Case("hf:tiny-opt", 87_680, {"pp": PP, "zero2": dict(dp_shard=2, zero=2)}),
    "bert": Case("hf:tiny-bert", 92_224, {"dp": dict(dp=2)}, tp_rules=False),
    "t5": Case("hf:tiny-t5", 181_248, {"dp": dict(dp=2)}, tp_rules=False),
    "bart": Case("hf:tiny-bart", 192_512, {"zero3": dict(dp_shard=2, zero=3)}, tp_rules=False),
    "resnet": Case(f"{ANY}:resnet", 11_122, {"dp": dict(dp=2), "pp": PP}, tp_rules=False, num_layers=7),
    "vit": Case(f"{ANY}:vit", 19_626, {"dp": dict(dp=2), "pp": PP}, tp_rules=False, num_layers=6),
    "unet_long_skips": Case(
        f"{ANY}:unet",
        7_473,
        {"zero3": dict(dp_shard=2, zero=3), "pp": PP, "pp_v2": PP_V2},
        tp_rules=False,
        num_layers=7,
    ),
    "resnet_long_skips": Case(f"{ANY}:resnet_long_skips", 15_794, {"pp": PP}, tp_rules=False, num_layers=8),
    "dict_inputs": Case(f"{ANY}:dict_inputs", 643, {"dp": dict(dp=2)}, tp_rules=False),
    "hf_dict_labels": Case(f"{ANY}:hf_dict_labels", 26_784, {"dp": dict(dp=2)}, tp_rules=False),
    "hf_raw_on_meta": Case(f"{ANY}:hf_raw", 26_784, {"pp": PP, "tp_sp": TP_SP}),
    "tied_sequential": Case(f"{FIXTURES / 'tied.py'}:build", 4_288, {"pp": PP, "dp": dict(dp=2)}, tp_rules=False),
    "frozen_backbone": Case(
        f"{ANY}:frozen_backbone",
        1_732,
        {"pp": PP, "dp": dict(dp=2), "zero2": dict(dp_shard=2, zero=2), "zero3": dict(dp_shard=2, zero=3)},
        tp_rules=False,
    ),
}


def _factory(spec: str):
    path, _, name = spec.rpartition(":")
    loader = importlib.util.spec_from_file_location(f"plain_{Path(path).stem}", path)
    module = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(module)
    return getattr(module, name)


def plain_model(spec: str, seed: int = 0):
    """(module, example_batch or None) built by plain transformers / the user's factory."""
    torch.manual_seed(seed)
    if spec.startswith("hf:"):
        config, seq = _config(transformers, spec[3:], {})
        return build_from_config(transformers, config), seq
    factory = _factory(spec)
    kwargs = {"device": "cpu"} if "device" in factory.__code__.co_varnames else {}
    return factory(**kwargs)


def _is_hf(module) -> bool:
    return isinstance(module, transformers.PreTrainedModel)


def plain_batch(module, example, batch_size: int, step: int):
    """The global batch meshplan trains on at `step`: random next-token data for language
    models (meshplan.executor.data's seeded generator), else the example tiled to batch_size."""
    if _is_hf(module) and not isinstance(example, dict):
        seq = example if isinstance(example, int) else example.shape[1]
        vocab, gen = module.config.vocab_size, step_generator(0, step)
        if _masked_lm(module):  # BERT's task: the tokens at 15% of positions (Devlin et al. 2019)
            ids = torch.randint(0, vocab, (batch_size, seq), generator=gen)
            k = max(1, round(0.15 * seq))  # the same count in every sequence
            low = torch.rand((batch_size, seq), generator=gen).topk(k, dim=1, largest=False).indices
            labels = torch.full_like(ids, -100).scatter(1, low, ids.gather(1, low))
            return ids, labels  # BERT's config names no mask token: the ids are kept
        tokens = torch.randint(0, vocab, (batch_size, seq + 1), generator=gen)
        return tokens[:, :-1], tokens[:, 1:]
    tile = lambda t: t.repeat(-(-batch_size // t.shape[0]), *([1] * (t.dim() - 1)))[:batch_size]  # noqa: E731
    inputs, targets = example if isinstance(example, tuple) else (example, None)
    inputs = {k: tile(v) for k, v in inputs.items()} if isinstance(inputs, dict) else tile(inputs)
    return inputs, None if targets is None else tile(targets)


def _masked_lm(module) -> bool:
    return type(module).__name__.endswith("ForMaskedLM")


def plain_loss(module, x, y) -> torch.Tensor:
    if isinstance(x, dict):
        out = module(**x)
    elif _is_hf(module) and _masked_lm(module):
        return module(input_ids=x, labels=y).loss  # the model's own loss
    elif _is_hf(module):
        kwargs = {"decoder_input_ids": x} if module.config.is_encoder_decoder else {}
        out = module(input_ids=x, use_cache=False, **kwargs)
    else:
        out = module(x)
    if not isinstance(out, torch.Tensor):
        out = out.loss if getattr(out, "loss", None) is not None else out.logits
    if y is None:
        return out.float().mean()
    if y.is_floating_point():
        return F.mse_loss(out, y)
    return F.cross_entropy(out.flatten(0, -2), y.flatten())


def plain_losses(spec: str, batch_size: int, steps: int = STEPS) -> list[float]:
    """Single-process plain PyTorch: SGD (momentum 0.9), global-norm clipping, fp32."""
    module, example = plain_model(spec)
    opt = torch.optim.SGD(module.parameters(), lr=LR, momentum=0.9)
    losses = []
    for step in range(steps):
        x, y = plain_batch(module, example, batch_size, step)
        opt.zero_grad(set_to_none=True)
        loss = plain_loss(module, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), CLIP)
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("name", list(CASES))
def test_profile_counts_exact_unique_parameters(name):
    case = CASES[name]
    module, _ = plain_model(case.spec)
    unique = sum(p.numel() for p in set(module.parameters()))
    profile = profile_model(case.spec)
    assert profile.num_params == unique == case.num_params
    frozen = sum(p.numel() for p in set(module.parameters()) if not p.requires_grad)
    assert sum(layer.num_frozen_params for layer in profile.layers) == frozen
    assert not case.num_layers or len(profile.layers) == case.num_layers


def _plan(spec: str, out: Path, *extra: str) -> int:
    return main(
        [
            "plan",
            "--model",
            spec,
            "--cluster",
            "local-cpu",
            "--num-gpus",
            "2",
            "--global-batch",
            "4",
            "-o",
            str(out),
            *extra,
        ]
    )


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if not c.tp_rules][:3])
def test_tp_is_never_planned_where_no_layer_splits(name, tmp_path, capsys):
    """A model without TP rules the executor applies: the search keeps tp = 1 and a pinned
    --tp 2 is refused with feasibility's reason (it would only duplicate compute)."""
    spec = CASES[name].spec
    assert _plan(spec, tmp_path / "p.json") == 0
    assert load(Plan, tmp_path / "p.json").tensor_parallel_degree == 1
    assert _plan(spec, tmp_path / "tp.json", "--tp", "2") != 0
    assert "no layer has tensor-parallel rules" in capsys.readouterr().err


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One 2-rank launch: every explicit layout and the planner's own 2-rank plan of each model."""
    out = tmp_path_factory.mktemp("any_model")
    keys, plans = [], []
    for name, case in CASES.items():
        for layout, kwargs in case.layouts.items():
            keys.append((name, layout))
            plans.append(make_plan(case.spec, **kwargs))
        assert _plan(case.spec, out / f"{name}.json") == 0  # profile -> plan
        keys.append((name, "planned"))
        plans.append(load(Plan, out / f"{name}.json"))
    results = run_plans(
        plans,
        LaunchOptions(
            steps=STEPS, out_dir=str(out / "run"), quiet=True, timeout_s=300, optimizer="sgd", lr=LR, grad_clip=CLIP
        ),
    )
    return {key: (plan, result) for key, plan, result in zip(keys, plans, results)}


@pytest.mark.slow
@pytest.mark.parametrize(
    "key",
    [(n, layout) for n, c in CASES.items() for layout in [*c.layouts, "planned"]],
    ids=lambda key: f"{key[0]}-{key[1]}",
)
def test_layout_equals_plain_pytorch(runs, key):
    plan, result = runs[key]
    ref = plain_losses(CASES[key[0]].spec, plan.global_batch_size)
    rel = max(abs(a - b) / abs(b) for a, b in zip(result.losses, ref))
    assert len(result.losses) == STEPS and rel <= REL_TOL, f"{key}: {result.losses} vs plain PyTorch {ref}"
    assert max(ref) - min(ref) > 1e-4, "the loss must move, or equality proves nothing"
    if not CASES[key[0]].tp_rules:
        assert plan.tensor_parallel_degree == 1


def test_layers_come_from_the_graph_not_two_random_passes():
    """An nn.Sequential with active dropout is its children; a torchvision-style ResNet is cut at
    its block boundaries (one tensor live), each skip inside its block; the fx layers keep the
    user's parameter names, and chained they compute the module's own forward."""
    assert profile_model(f"{ANY}:dropout_sequential").layer_names == [f"layers.{i}" for i in range(4)]
    from meshplan.models.loader import load_model

    model = load_model(f"{ANY}:resnet", device="cpu")
    names = {n.split(".", 2)[2] for n, _ in model.named_parameters()}
    module, (x, _) = plain_model(f"{ANY}:resnet")
    assert names == {n for n, _ in module.named_parameters()}
    with torch.no_grad():
        torch.testing.assert_close(model(x), module(x))


def _edge_bytes(profile) -> dict[tuple[int, int], float]:
    g = profile.graph()
    return {(int(a.split(".")[1]), int(b.split(".")[1])): nbytes for a, b, nbytes in g.edges(data="bytes")}


BF16 = 2
UNET_E1, UNET_E2, UNET_MID = 8 * 16 * 16 * BF16, 16 * 8 * 8 * BF16, 16 * 4 * 4 * BF16
"""The U-Net fixture's tensors per sample (c = 8 on 16 x 16 images; bf16 profile): enc1's output
(the long skip to the last layer), enc2's (the skip into dec2), the bottleneck's."""


def test_graph_edges_are_the_skips_with_their_bytes():
    """The U-Net's profile graph holds its real edges: enc1's output goes from layer 1 to the last
    layer, enc2's from layer 1 to dec2's layer 4, each with its tensor bytes; each cut sends every
    tensor crossing it once, and a layer's output bytes are that sum."""
    from meshplan.planner.cost.pipeline import crossing_bytes

    profile = profile_model(f"{ANY}:unet")
    assert _edge_bytes(profile) == {
        (0, 1): UNET_E1,  # enc1's conv, before its ReLU
        (1, 2): UNET_E2,
        (1, 4): UNET_E2,  # skip: enc2 -> dec2
        (1, 6): UNET_E1,  # skip: enc1 -> dec1, across five cuts
        (2, 3): UNET_MID,
        (3, 4): UNET_E2,  # up2: 16 channels at 8 x 8, like enc2
        (4, 5): UNET_E2 // 2,  # dec2: 8 channels at 8 x 8
        (5, 6): UNET_E1,  # up1
    }
    crossing = crossing_bytes(profile)
    assert crossing[:6] == [UNET_E1, UNET_E1 + UNET_E2, UNET_E1 + UNET_E2 + UNET_MID, UNET_E1 + 2 * UNET_E2,
                            UNET_E1 + UNET_E2 // 2, 2 * UNET_E1]  # fmt: skip
    assert crossing[:6] == [lp.output_bytes for lp in profile.layers[:6]]
    resnet = _edge_bytes(profile_model(f"{ANY}:resnet_long_skips"))  # c = 8 on 8 x 8, then 16 on 4 x 4
    assert {k: v for k, v in resnet.items() if k[1] > k[0] + 1} == {(2, 4): 8 * 8 * 8 * BF16, (5, 7): 16 * 4 * 4 * BF16}


def test_pipeline_boundary_crossed_by_a_skip_is_priced_with_every_tensor():
    """The planner's p2p for a stage boundary after the U-Net's layer 3 sends up2's output and
    both skips (enc1 and enc2), not one activation; a chain profile keeps its one tensor."""
    from meshplan.planner.context import Candidate, Context
    from meshplan.planner.cost.pipeline import p2p_per_microbatch_s
    from meshplan.planner.rank.stages import RankModel
    from meshplan.planner.request import PlanRequest
    from meshplan.presets import local_cpu

    profile = profile_model(f"{ANY}:unet")
    ctx = Context.build(profile, local_cpu(2), PlanRequest(num_gpus=2, global_batch=4, precision="fp32"))
    cand = Candidate(pp=2, dp_replicate=1, dp_shard=1, cp=1, tp=1, microbatch=2, num_microbatches=2,
                     schedule="1F1B", virtual_stages=1, zero=0, sequence_parallel=False)  # fmt: skip
    model = RankModel(ctx, cand, [])
    crossing = UNET_E1 + UNET_E2 + UNET_E2  # enc1, enc2 and up2 (16 x 8 x 8)
    assert model.p2p(0, [0, 1, 2, 3]) == p2p_per_microbatch_s(ctx, cand, crossing)
    assert model.p2p(1, [4, 5, 6]) == p2p_per_microbatch_s(ctx, cand, crossing)
    assert p2p_per_microbatch_s(ctx, cand, crossing) > p2p_per_microbatch_s(ctx, cand, 2 * UNET_E2)


FROZEN, TRAINED = 16 * 32 + 32 + 32 * 32 + 32, 32 * 4 + 4
"""The frozen backbone fixture: two frozen Linear layers, a trainable Linear(32, 4) head."""


def _frozen_estimate(**pinned):
    from meshplan.planner import PlanRequest, estimate
    from meshplan.presets import local_cpu

    profile = profile_model(f"{ANY}:frozen_backbone")
    req = PlanRequest(num_gpus=2, global_batch=4, precision="fp32", pp=1, tp=1, microbatch=2, **pinned)
    return estimate(profile, local_cpu(2), req).prediction


def test_frozen_parameters_cost_weights_only():
    """DDP over 2 ranks (fp32 torch layout: weights 4 B, grads 4 B + DDP's bucket copy 4 B, Adam
    8 B per parameter): the frozen backbone holds its weights and nothing else; only the head's
    gradients are all-reduced (ring: 2(N-1)/N of the fp32 payload). ZeRO-2: every weight is
    gathered for forward ((N-1) x this rank's shard), only the head's gradients reduce-scattered;
    ZeRO-3 gathers again in backward only where a gradient flows (the head), plus FSDP2's backward
    prefetch of the layer before it; the first frozen layer is gathered for forward only."""
    ddp = _frozen_estimate(dp=2, zero=0)
    (stage,) = ddp.stage_memory
    assert stage.params_bytes == 4 * (FROZEN + TRAINED)
    assert stage.grads_bytes == (4 + 4) * TRAINED
    assert stage.optimizer_bytes == 8 * TRAINED
    assert ddp.comm_bytes_per_step == {"dp_replicate": 2 * (2 - 1) * 4 * TRAINED // 2}
    zero2 = _frozen_estimate(dp=2, dp_shard=2, zero=2)
    assert zero2.comm_bytes_per_step == {"dp_shard": 4 * (FROZEN + TRAINED) // 2 + 4 * TRAINED // 2}
    zero3 = _frozen_estimate(dp=2, dp_shard=2, zero=3)
    second = 32 * 32 + 32  # the frozen layer before the head: prefetched for a backward that never runs
    again = 4 * (second + TRAINED) // 2  # ZeRO-3's backward gathers: the head, and that prefetch
    assert zero3.comm_bytes_per_step == {"dp_shard": 4 * (FROZEN + TRAINED) // 2 + again + 4 * TRAINED // 2}


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["dp", "zero2", "zero3"])
def test_frozen_backbone_bytes_counted_equal_predicted(runs, layout):
    """What the executor's DDP / FSDP2 put on the wire for the frozen backbone (their byte
    counters) equals the cost model's comm_bytes_per_step: frozen weights send no gradients."""
    from test_dp_methods_executor import predicted_bytes

    plan, result = runs[("frozen_backbone", layout)]
    assert result.comm_bytes_per_step == predicted_bytes(plan)


def test_fused_qkv_and_per_head_norms_are_split_as_their_layout_says():
    """GPT-NeoX's fused query_key_value is column-split (its rows run head by head) with dense
    row-split; Qwen3's q_norm/k_norm stay whole but as replicated DTensors reading this rank's
    heads (dim 2), so their gradients are summed over the TP ranks: checked on a one-rank mesh
    (the 2-rank launch checks the losses), forward unchanged."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Replicate, Shard

    from meshplan.executor.tensor_parallel import apply_tp
    from meshplan.models.loader import load_model
    from meshplan.models.tp_rules import tp_rules

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        for spec, fused, norms in [("hf:tiny-gpt-neox", "attention.query_key_value", []),
                                   ("hf:tiny-qwen3", "self_attn.q_proj", ["self_attn.q_norm", "self_attn.k_norm"])]:  # fmt: skip
            torch.manual_seed(0)
            model = load_model(spec, None, "cpu")
            x, _ = model.example_batch(2, torch.Generator().manual_seed(1))
            with torch.no_grad():
                ref = model(x)
            apply_tp(model, tp_rules(model), mesh, False)
            block = model.layers["0"].block
            assert block.get_submodule(fused).weight.placements == (Shard(0),)
            for name in norms:
                weight = block.get_submodule(name).weight
                assert isinstance(weight, DTensor) and weight.placements == (Replicate(),)
            with torch.no_grad():
                torch.testing.assert_close(model(x), ref)
    finally:
        dist.destroy_process_group()

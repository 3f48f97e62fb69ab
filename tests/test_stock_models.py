"""Stock torchvision classifiers, unedited: ReLU(inplace=True) first in a cut layer, BatchNorm,
squeeze-excitation, stochastic depth, a ViT whose patch embedding ends in a permute, Swin's
windows, ConvNeXt's layer scale. Each profiles with exactly its unique parameter count, plans
for 2 ranks, and runs DP / ZeRO-3 / PP on 2 gloo ranks with the losses of the module itself on
one process (plain PyTorch, tests/test_any_model.py).

torchvision is not in the test extra: its PyPI wheel is a CUDA build whose C++ ops do not load
beside the CPU torch, and on sys.path it breaks `import transformers`. `make test` installs it
into .venv/torchvision, which the fixture (tests/fixtures/user_models/stock_torchvision.py) puts
on sys.path only to import the classifiers' pure-Python code. Without it these tests skip here
and fail in CI.

BatchNorm takes its statistics over each forward's rows: under DP and ZeRO-3 a replica's half
of the batch, so the plain reference is the module's own mean loss over those halves (what the
replicas' averaged gradients descend); a pipeline with one microbatch of the whole batch is
held to the module's plain loss over the whole batch.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

FIXTURES = Path(__file__).parent / "fixtures" / "user_models"
sys.path.insert(0, str(FIXTURES))
import stock_torchvision  # noqa: E402

try:
    stock_torchvision.torchvision_models()
except ImportError as exc:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        raise RuntimeError(f"torchvision missing in CI ({exc})") from exc
    pytest.skip(f"torchvision not importable: {exc}", allow_module_level=True)

from executor_plans import make_plan  # noqa: E402
from test_any_model import CLIP, LR, plain_batch, plain_loss, plain_model  # noqa: E402

from meshplan.cli import main  # noqa: E402
from meshplan.executor.launch import LaunchOptions, run_plans  # noqa: E402
from meshplan.model_profile import ModelProfile  # noqa: E402
from meshplan.plan import Plan  # noqa: E402
from meshplan.schema import load  # noqa: E402

SPEC = f"{FIXTURES / 'stock_torchvision.py'}"
STEPS, REL_TOL, BATCH = 2, 1e-4, 4
DP, ZERO3 = dict(dp=2), dict(dp_shard=2, zero=3)
WHOLE_BATCH_PP = dict(pp=2, microbatch=4, microbatches=1, schedule="GPipe")
"""BatchNorm: every forward sees the whole batch of 4, as the single process does."""

NAMES = ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "convnext_tiny", "convnext", "vit", "swin"]
CASES = {  # name -> layouts (convnext_tiny: 28 M parameters, profiled and planned only)
    "resnet18": {"dp": DP, "pp": WHOLE_BATCH_PP},
    "mobilenet_v3_small": {"zero3": ZERO3},
    "efficientnet_b0": {"dp": DP},
    "convnext": {"dp": DP, "zero3": ZERO3, "pp": dict(pp=2, microbatches=2)},
    "vit": {"dp": DP, "zero3": ZERO3, "pp": dict(pp=2, microbatches=2)},
    "swin": {"dp": DP, "zero3": ZERO3, "pp": dict(pp=2, microbatches=2)},
}


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """name -> (profile, plan): `meshplan profile` then `meshplan plan --profile` for 2 ranks."""
    out, result = tmp_path_factory.mktemp("stock_plans"), {}
    for name in NAMES:
        profile, plan = out / f"{name}.profile.json", out / f"{name}.plan.json"
        assert main(["profile", "--model", f"{SPEC}:{name}", "-o", str(profile)]) == 0
        args = ["plan", "--profile", str(profile), "--cluster", "local-cpu", "--num-gpus", "2"]
        assert main([*args, "--global-batch", str(BATCH), "-o", str(plan)]) == 0
        result[name] = (load(ModelProfile, profile), load(Plan, plan))
    return result


@pytest.mark.parametrize("name", NAMES)
def test_profile_counts_exact_unique_parameters_and_plans(planned, name):
    module, _ = getattr(stock_torchvision, name)()
    profile, plan = planned[name]
    assert profile.num_params == sum(p.numel() for p in set(module.parameters()))
    assert len(profile.layers) > 2  # cut from the fx graph, not one whole layer
    assert plan.world_size == 2 and plan.global_batch_size == BATCH


def _has_batchnorm(module: torch.nn.Module) -> bool:
    return any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in module.modules())


def plain_chunked_losses(name: str, chunks: int) -> list[float]:
    """Plain PyTorch on one process, SGD (momentum 0.9) and global-norm clipping as in
    test_any_model.plain_losses, the loss the mean of the module's own loss over `chunks` equal
    row blocks of the batch (1: the whole batch)."""
    module, example = plain_model(f"{SPEC}:{name}")
    opt = torch.optim.SGD(module.parameters(), lr=LR, momentum=0.9)
    losses = []
    for step in range(STEPS):
        x, y = plain_batch(module, example, BATCH, step)
        opt.zero_grad(set_to_none=True)
        loss = sum(plain_loss(module, xc, yc) for xc, yc in zip(x.chunk(chunks), y.chunk(chunks))) / chunks
        loss.backward()
        torch.nn.utils.clip_grad_norm_(module.parameters(), CLIP)
        opt.step()
        losses.append(loss.item())
    return losses


def _forward_rows(plan: Plan) -> int:
    """Rows one forward sees: a replica's microbatch."""
    return plan.microbatch_size


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("stock")
    keys = [(name, layout) for name, layouts in CASES.items() for layout in layouts]
    plans = [make_plan(f"{SPEC}:{name}", **CASES[name][layout]) for name, layout in keys]
    opts = LaunchOptions(
        steps=STEPS, out_dir=str(out / "run"), quiet=True, timeout_s=600, optimizer="sgd", lr=LR, grad_clip=CLIP
    )
    return dict(zip(keys, zip(plans, run_plans(plans, opts))))


@pytest.mark.slow
@pytest.mark.parametrize("key", [(n, lay) for n, c in CASES.items() for lay in c], ids=lambda k: f"{k[0]}-{k[1]}")
def test_layout_equals_plain_pytorch(runs, key):
    plan, result = runs[key]
    module, _ = getattr(stock_torchvision, key[0])()
    chunks = BATCH // _forward_rows(plan) if _has_batchnorm(module) else 1
    ref = plain_chunked_losses(key[0], chunks)
    rel = max(abs(a - b) / abs(b) for a, b in zip(result.losses, ref))
    assert len(result.losses) == STEPS and rel <= REL_TOL, f"{key}: {result.losses} vs plain PyTorch {ref}"
    assert max(ref) - min(ref) > 1e-4
    if chunks > 1:  # BatchNorm's statistics depend on the rows: the whole-batch loss differs
        whole = plain_chunked_losses(key[0], 1)
        assert max(abs(a - b) / abs(b) for a, b in zip(result.losses, whole)) > REL_TOL

"""Stock torchvision classifiers, unedited: ReLU(inplace=True) first in a cut layer, BatchNorm,
a ViT whose patch embedding ends in a permute, Swin's windows. Each profiles with exactly its
unique parameter count; ViT, Swin and ResNet-18 run DP / ZeRO-3 / PP on 2 gloo ranks with the
losses of the module itself on one process (plain PyTorch, tests/test_any_model.py).

torchvision is not in the test extra: its PyPI wheel is a CUDA build whose C++ ops do not load
beside the CPU torch, and once installed `import transformers` fails on it. The fixture enters
the package without its `__init__` when only those ops are missing
(tests/fixtures/user_models/stock_torchvision.py); without torchvision these tests skip.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "user_models"
sys.path.insert(0, str(FIXTURES))
import stock_torchvision  # noqa: E402

try:
    stock_torchvision.torchvision_models()
except ImportError as exc:
    pytest.skip(
        f"torchvision not importable ({exc}); the PyPI wheel is a CUDA build: use a CPU build "
        "(pip install torchvision --index-url https://download.pytorch.org/whl/cpu)",
        allow_module_level=True,
    )

from executor_plans import make_plan  # noqa: E402
from test_any_model import plain_losses  # noqa: E402

from meshplan.executor.launch import LaunchOptions, run_plans  # noqa: E402
from meshplan.profiler import profile_model  # noqa: E402

SPEC = f"{FIXTURES / 'stock_torchvision.py'}"
STEPS, LR, CLIP, REL_TOL = 2, 0.5, 1.0, 1e-4
WHOLE_BATCH_PP = dict(pp=2, microbatch=4, microbatches=1, schedule="GPipe")
"""BatchNorm: every forward sees the whole batch of 4, as the single process does."""

CASES = {  # name -> layouts
    "resnet18": {"pp": WHOLE_BATCH_PP},
    "vit": {"dp": dict(dp=2), "zero3": dict(dp_shard=2, zero=3), "pp": dict(pp=2, microbatches=2)},
    "swin": {"pp": dict(pp=2, microbatches=2), "zero3": dict(dp_shard=2, zero=3)},
}


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v3_small", "efficientnet_b0", "vit", "swin"])
def test_profile_counts_exact_unique_parameters(name):
    module, _ = getattr(stock_torchvision, name)()
    profile = profile_model(f"{SPEC}:{name}")
    assert profile.num_params == sum(p.numel() for p in set(module.parameters()))
    assert len(profile.layers) > 2  # cut from the fx graph, not one whole layer


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("stock")
    keys = [(name, layout) for name, layouts in CASES.items() for layout in layouts]
    plans = [make_plan(f"{SPEC}:{name}", **CASES[name][layout]) for name, layout in keys]
    opts = LaunchOptions(
        steps=STEPS, out_dir=str(out / "run"), quiet=True, timeout_s=300, optimizer="sgd", lr=LR, grad_clip=CLIP
    )
    return dict(zip(keys, zip(plans, run_plans(plans, opts))))


@pytest.mark.slow
@pytest.mark.parametrize("key", [(n, lay) for n, c in CASES.items() for lay in c], ids=lambda k: f"{k[0]}-{k[1]}")
def test_layout_equals_plain_pytorch(runs, key):
    plan, result = runs[key]
    ref = plain_losses(f"{SPEC}:{key[0]}", plan.global_batch_size, STEPS)
    rel = max(abs(a - b) / abs(b) for a, b in zip(result.losses, ref))
    assert len(result.losses) == STEPS and rel <= REL_TOL, f"{key}: {result.losses} vs plain PyTorch {ref}"
    assert max(ref) - min(ref) > 1e-4

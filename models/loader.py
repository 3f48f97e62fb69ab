"""Load any model spec into a LayeredModel: zoo names, family names, user files, HF configs.

Specs (`meshplan profile --model SPEC`):
- a zoo or family name: "gpt-tiny", "llama3-8b", "gpt" (+ overrides such as {"layers": 4});
- "path/to/file.py:factory" or "package.module:factory": factory() -> (module, example_batch);
- "hf:NAME": a HuggingFace transformers model built from a config constructed in code.
"""

from __future__ import annotations

from typing import Any

from meshplan.errors import MeshplanError
from meshplan.models.zoo import build_model
from meshplan.models.zoo.base import LayeredModel

DEVICES = ("meta", "cpu", "cuda")


def check_device(device: str) -> str:
    """Validate a --device value ("meta", "cpu", "cuda" or "cuda:N")."""
    if device.split(":")[0] not in DEVICES:
        raise MeshplanError(f"--device {device!r} is not supported; use one of meta, cpu, cuda")
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise MeshplanError(f"--device {device}: CUDA is not available on this machine; use cpu or meta")
    return device


def load_model(spec: str, overrides: dict[str, Any] | None = None, device: str = "meta", seed: int = 0) -> LayeredModel:
    """A LayeredModel for `spec` on `device` (weights from init_weights unless on meta)."""
    check_device(device)
    if spec.startswith("hf:"):
        from meshplan.models.hf import load_hf_model

        return load_hf_model(spec[3:], overrides, device, seed)
    if ":" in spec:
        from meshplan.models.user_models import load_user_model

        return load_user_model(spec, overrides, device, seed)
    return build_model(spec, overrides, device, seed)

"""The model zoo's names and shapes, without torch: what `meshplan presets` lists.

models/zoo/ builds these (it imports torch); this table is its source of names, so listing them
costs no torch import.
"""

from __future__ import annotations

from typing import Any

FAMILY_NAMES = ("gpt", "llama", "bert", "vit", "moe", "resnet")
"""The families of models/zoo (FAMILIES there: the same names, checked on import)."""

# zoo name -> (family, config overrides). GPT shapes: Brown et al. 2020 Table 2.1 and the
# published-runs table (meshplan/data/published-runs.csv).
ZOO: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt-tiny": ("gpt", dict(layers=4, hidden=64, heads=4, vocab=256, seq=32)),
    "gpt2-125m": ("gpt", dict(layers=12, hidden=768, heads=12, vocab=50257, seq=1024)),
    "gpt2-350m": ("gpt", dict(layers=24, hidden=1024, heads=16, vocab=50257, seq=1024)),
    "gpt2-760m": ("gpt", dict(layers=24, hidden=1536, heads=16, vocab=50257, seq=1024)),
    "gpt2-1.5b": ("gpt", dict(layers=48, hidden=1600, heads=25, vocab=50257, seq=1024)),
    "gpt3-1.3b": ("gpt", dict(layers=24, hidden=2048, heads=16, vocab=51200, seq=2048)),
    "gpt3-2.7b": ("gpt", dict(layers=32, hidden=2560, heads=32, vocab=51200, seq=2048)),
    "gpt3-6.7b": ("gpt", dict(layers=32, hidden=4096, heads=32, vocab=51200, seq=2048)),
    "gpt3-13b": ("gpt", dict(layers=40, hidden=5120, heads=40, vocab=51200, seq=2048)),
    "gpt3-175b": ("gpt", dict(layers=96, hidden=12288, heads=96, vocab=51200, seq=2048)),
    # Narayanan et al. SC21 Table 1 and Korthikanti et al. 2022 Table 3 (V = 51200, s = 2048)
    **{
        f"megatron-{name}": ("gpt", dict(layers=l, hidden=h, heads=a, vocab=51200, seq=2048))
        for name, l, h, a in [
            ("1.7b", 24, 2304, 24),
            ("3.6b", 30, 3072, 32),
            ("7.5b", 36, 4096, 32),
            ("18.4b", 40, 6144, 48),
            ("22b", 48, 6144, 64),
            ("39.1b", 48, 8192, 64),
            ("76.1b", 60, 10240, 80),
            ("145.6b", 80, 12288, 96),
            ("310.1b", 96, 16384, 128),
            ("530b", 105, 20480, 128),
            ("1t", 128, 25600, 160),
        ]
    },
    # Llama 3 / 3.1 (Dubey et al. 2024, Table 3)
    "llama-tiny": ("llama", dict(layers=4, hidden=64, heads=4, kv_heads=2, vocab=256, seq=32, ffn_hidden=160)),
    "llama3-8b": (
        "llama",
        dict(layers=32, hidden=4096, heads=32, kv_heads=8, vocab=128256, seq=8192, ffn_hidden=14336),
    ),
    "llama3-70b": (
        "llama",
        dict(layers=80, hidden=8192, heads=64, kv_heads=8, vocab=128256, seq=8192, ffn_hidden=28672),
    ),
    "llama3-405b": (
        "llama",
        dict(layers=126, hidden=16384, heads=128, kv_heads=8, vocab=128256, seq=8192, ffn_hidden=53248),
    ),
    # BERT (Devlin et al. 2019)
    "bert-tiny": ("bert", dict(layers=4, hidden=64, heads=4, vocab=256, seq=32)),
    "bert-base": ("bert", dict(layers=12, hidden=768, heads=12, vocab=30522, seq=512)),
    "bert-large": ("bert", dict(layers=24, hidden=1024, heads=16, vocab=30522, seq=512)),
    # ViT (Dosovitskiy et al. 2021, Table 1)
    "vit-tiny": ("vit", dict(layers=4, hidden=64, heads=4, image=32, patch=8, classes=10)),
    "vit-b16": ("vit", dict(layers=12, hidden=768, heads=12, image=224, patch=16)),
    "vit-l16": ("vit", dict(layers=24, hidden=1024, heads=16, image=224, patch=16)),
    "vit-h14": ("vit", dict(layers=32, hidden=1280, heads=16, image=224, patch=14)),
    # mixture of experts: GPT blocks with top-2 routed experts (our shapes)
    "moe-tiny": ("moe", dict(layers=4, hidden=64, heads=4, vocab=256, seq=32, experts=4, top_k=2)),
    "moe-1.3b-e8": ("moe", dict(layers=24, hidden=2048, heads=16, vocab=51200, seq=2048, experts=8, top_k=2)),
    # ResNet (He et al. 2016) with GroupNorm
    "resnet-tiny": ("resnet", dict(blocks="1,1,1,1", width=8, image=32, classes=10, groups=4)),
    "resnet50": ("resnet", dict(blocks="3,4,6,3", width=64, image=224, classes=1000)),
    "resnet101": ("resnet", dict(blocks="3,4,23,3", width=64, image=224, classes=1000)),
}

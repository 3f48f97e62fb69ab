"""ModelProfiles and clusters for the planner tests, built from closed forms (no torch).

`brute_force_best` (meshplan.planner.bruteforce, re-exported here) is the reference the exactness
tests hold the search against: for every outer candidate it visits every contiguous split into
pp x v stages and every per-layer recompute choice, with no bounds, no heap merge, no frontier."""

from __future__ import annotations

import dataclasses

from meshplan.model_profile import LayerProfile, ModelProfile, TPRule
from meshplan.models.analytic import gpt_profile, llama_profile
from meshplan.planner.context import Candidate
from meshplan.planner.search.bruteforce import brute_force_best, brute_force_candidate  # noqa: F401 (re-exported)
from meshplan.presets import cluster_preset

GIB = 1024**3

CANDIDATE_DEFAULTS = dict(
    pp=1,
    dp_replicate=1,
    dp_shard=1,
    cp=1,
    tp=1,
    microbatch=1,
    num_microbatches=1,
    schedule="1F1B",
    virtual_stages=1,
    zero=0,
    sequence_parallel=False,
)


def candidate(**fields) -> Candidate:
    """A Candidate with one rank of everything, no pipeline, ZeRO-0 and no SP, but for `fields`."""
    return Candidate(**{**CANDIDATE_DEFAULTS, **fields})


def small_gpt(layers: int = 6) -> ModelProfile:
    return gpt_profile(layers=layers, hidden=4096, heads=32, vocab=51200, seq=2048, name="gpt-small")


def small_llama(layers: int = 6) -> ModelProfile:
    return llama_profile(
        layers=layers, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256, seq=4096, name="llama-small"
    )


def cnn_chain() -> ModelProfile:
    """A non-uniform chain (CNN-like): different sizes, boundaries and recompute options."""
    specs = [
        (2e6, 4e9, 6e6, 3e6),
        (8e6, 9e9, 5e6, 6e6),
        (3e7, 7e9, 2e6, 5e6),
        (5e7, 5e9, 1.5e6, 2e6),
        (9e7, 4e9, 1e6, 1.5e6),
        (2e8, 3e9, 4e5, 1e6),
        (1e8, 1e9, 1e5, 4e5),
    ]
    layers = []
    for i, (params, flops, act, inp) in enumerate(specs):
        layers.append(
            LayerProfile(
                name=f"layers.{i}",
                kind=f"conv{i}",
                num_params=int(params),
                param_bytes={"float32": int(4 * params)},
                forward_flops=flops,
                backward_flops=2 * flops,
                activation_bytes=act * 100,
                selective_activation_bytes=act * 60 if i % 2 else 0.0,
                recompute_flops_selective=flops * 0.1,
                input_bytes=inp,
                output_bytes=specs[i + 1][3] if i + 1 < len(specs) else 4e3,
                tp=TPRule(kind="conv", divisors={"channels": 64}),
                gemm_shapes=[[1024, 256, 256]],
            )
        )
    return ModelProfile(
        model_name="cnn-chain",
        family="resnet",
        seq_len=1,
        num_params=sum(lp.num_params for lp in layers),
        forward_flops_per_sample=sum(lp.forward_flops for lp in layers),
        num_layers=len(layers),
        layers=layers,
    )


def cluster(n: int, memory_gib: float, preset: str = "a100-80g", per_node: int = 4):
    base = cluster_preset(preset, n)
    dev = dataclasses.replace(base.device, memory_bytes=int(memory_gib * GIB))
    spec = dataclasses.replace(base, device=dev, devices_per_node=min(per_node, n), num_nodes=-(-n // per_node))
    return spec

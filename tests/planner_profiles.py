"""ModelProfiles and clusters for the planner tests, built from closed forms (no torch).

`brute_force_best` is the reference the exactness tests hold the search against: for every
outer candidate it tries every contiguous split into pp x v stages and every per-layer recompute
choice, with no bounds, no heap merge, no frontier."""
from __future__ import annotations

import dataclasses
import itertools
import math

from meshplan.model_profile import LayerProfile, ModelProfile, TPRule
from meshplan.planner.analytic import gpt_profile, llama_profile
from meshplan.planner.context import Context
from meshplan.planner.enumerate import Rejects, candidates
from meshplan.planner.layer_cost import CostTable
from meshplan.planner.memory import fits
from meshplan.planner.pipeline import p2p_per_microbatch_s
from meshplan.planner.stages import RankModel
from meshplan.presets import cluster_preset

GIB = 1024**3


def small_gpt(layers: int = 6) -> ModelProfile:
    return gpt_profile(layers=layers, hidden=4096, heads=32, vocab=51200, seq=2048, name="gpt-small")


def small_llama(layers: int = 6) -> ModelProfile:
    return llama_profile(layers=layers, hidden=4096, heads=32, kv_heads=8, ffn_hidden=14336, vocab=128256,
                         seq=4096, name="llama-small")


def cnn_chain() -> ModelProfile:
    """A non-uniform chain (CNN-like): different sizes, boundaries and recompute options."""
    specs = [(2e6, 4e9, 6e6, 3e6), (8e6, 9e9, 5e6, 6e6), (3e7, 7e9, 2e6, 5e6), (5e7, 5e9, 1.5e6, 2e6),
             (9e7, 4e9, 1e6, 1.5e6), (2e8, 3e9, 4e5, 1e6), (1e8, 1e9, 1e5, 4e5)]
    layers = []
    for i, (params, flops, act, inp) in enumerate(specs):
        layers.append(LayerProfile(
            name=f"layers.{i}", kind=f"conv{i}", num_params=int(params), param_bytes={"float32": int(4 * params)},
            forward_flops=flops, backward_flops=2 * flops, activation_bytes=act * 100,
            selective_activation_bytes=act * 60 if i % 2 else 0.0, recompute_flops_selective=flops * 0.1,
            input_bytes=inp, output_bytes=specs[i + 1][3] if i + 1 < len(specs) else 4e3,
            tp=TPRule(kind="conv", divisors={"channels": 64}), gemm_shapes=[[1024, 256, 256]]))
    return ModelProfile(model_name="cnn-chain", family="resnet", seq_len=1, num_params=sum(lp.num_params for lp in layers),
                        forward_flops_per_sample=sum(lp.forward_flops for lp in layers), num_layers=len(layers),
                        layers=layers)


def cluster(n: int, memory_gib: float, preset: str = "a100-80g", per_node: int = 4):
    base = cluster_preset(preset, n)
    dev = dataclasses.replace(base.device, memory_bytes=int(memory_gib * GIB))
    spec = dataclasses.replace(base, device=dev, devices_per_node=min(per_node, n), num_nodes=-(-n // per_node))
    return spec


def _compositions(n: int, parts: int):
    for cuts in itertools.combinations(range(1, n), parts - 1):
        bounds = (0,) + cuts + (n,)
        yield [list(range(bounds[i], bounds[i + 1])) for i in range(parts)]


def _rank_best(model: RankModel, ctx: Context, cand, rank: int, layers: list[int], costs) -> float:
    """Least feasible cost of one rank over every recompute assignment of its layers."""
    p2p = (p2p_per_microbatch_s(ctx, cand, ctx.layers[ctx.body[0]].output_bytes)
           if ctx.body is not None and cand.pp > 1 else model.p2p(rank, layers))
    best = math.inf
    for choice in itertools.product(*[list(costs[i].modes) for i in layers]):
        sol = model.finish(rank, layers, dict(zip(layers, choice)), p2p)
        if fits(model.memory_bytes(sol), model.capacity):
            best = min(best, sol.cost_s)
    return best


def brute_force_candidate(ctx: Context, cand, table: CostTable) -> float:
    costs = table.for_candidate(cand)
    model = RankModel(ctx, cand, costs)
    p, v = cand.pp, cand.virtual_stages
    memo: dict = {}
    best = math.inf
    for stages in _compositions(len(ctx.layers), p * v):
        worst = 0.0
        for r in range(p):
            layers = sorted(i for s in range(r, p * v, p) for i in stages[s])
            key = (r, tuple(layers))
            if key not in memo:
                memo[key] = _rank_best(model, ctx, cand, r, layers, costs)
            worst = max(worst, memo[key])
            if worst >= best:
                break
        best = min(best, worst)
    return best


def brute_force_best(profile, cluster_spec, request) -> tuple[float, dict]:
    """(best step time, {candidate: its brute-force optimum}) over every candidate."""
    ctx = Context.build(profile, cluster_spec, request)
    table = CostTable(ctx)
    per = {c: brute_force_candidate(ctx, c, table) for c in candidates(ctx, Rejects())}
    return min(per.values(), default=math.inf), per

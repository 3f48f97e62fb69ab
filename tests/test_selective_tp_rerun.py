"""The cost model's side of tests/test_recompute_comm.py: torchtitan's op-level selective recompute
pays the forward's all-gathers (sequence parallel) or all-reduces (without) once more; the
attention-core policy (Megatron) and no recompute pay none; full recompute the whole forward."""

from __future__ import annotations

import pytest

from meshplan.planner.context import Context
from meshplan.planner.rank.layer_cost import _tp_comm_s, base_cost
from meshplan.planner.search.enumerate import pinned_candidate
from meshplan.validation.published import cli_inputs

LLAMA = "layers=4 hidden=4096 heads=32 kv_heads=8 ffn_hidden=14336 vocab=128256 seq=8192"


def _ctx(runtime: str, sp: bool) -> Context:
    argv = ["estimate", "--model", "analytic:llama", "--set", *LLAMA.split(), "--cluster", "h100-80g"]
    argv += "--num-gpus 8 --global-batch 8 --tp 8 --pp 1 --dp 1 --microbatch 1 --schedule 1f1b".split()
    argv += ["--recompute", "selective", "--runtime", runtime, "--zero", "0" if runtime != "torchtitan" else "3"]
    argv += ["--sequence-parallel" if sp else "--no-sequence-parallel"]
    return Context.build(*cli_inputs(argv))


def _selective_tp_s(ctx: Context) -> tuple[float, float, float]:
    """(TP seconds of the selective mode, forward TP, backward TP) of a block; no overlap, no
    measured wrappers, so the mode's TP time is forward x runs + backward."""
    cand = pinned_candidate(ctx)
    layer = ctx.layers[1]
    base = base_cost(ctx, layer, cand.microbatch, cand.tp, cand.sequence_parallel, cand.cp)
    fwd, bwd = _tp_comm_s(ctx, layer, cand.microbatch, cand.tp, cand.cp, cand.sequence_parallel)
    return base.modes["selective"][2], fwd, bwd


@pytest.mark.parametrize("sp,share", [(True, 0.5), (False, 1.0)], ids=["sp", "no-sp"])
def test_op_level_selective_reruns_the_forward_collectives_it_does_not_keep(sp, share):
    selective, fwd, bwd = _selective_tp_s(_ctx("torchtitan", sp))
    assert fwd > 0 and bwd > 0
    assert selective == pytest.approx((1 + share) * fwd + bwd, rel=1e-9)


def test_the_attention_core_policy_reruns_no_collective():
    selective, fwd, bwd = _selective_tp_s(_ctx("megatron-lm", True))
    assert fwd > 0
    assert selective == pytest.approx(fwd + bwd, rel=1e-9)

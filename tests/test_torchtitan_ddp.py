"""torchtitan runs DDP on a 1-D mesh only (parallelize_llama: apply_ddp raises "DDP has not supported > 1D
parallelism" when tensor, pipeline or context parallelism is on; replicas beside them are HSDP): runtime
behaviour ddp_beside_model_parallel. The search never proposes ZeRO-0 replicas beside model parallelism
for it; a --zero 0 pin is predicted with a warning; other runtimes keep them."""

from __future__ import annotations

from meshplan.inputs import from_argv, resolve
from meshplan.planner.context import Context
from meshplan.planner.search.enumerate import DDP_ONE_DIM, Rejects, candidates

LLAMA = ["--model", "analytic:llama", "--set", "layers=8", "hidden=2048", "heads=16", "kv_heads=8",
         "ffn_hidden=5632", "vocab=32000", "seq=2048", "--cluster", "h100-80g", "--num-gpus", "16",
         "--global-batch", "32"]  # fmt: skip


def _resolved(*extra: str):
    return resolve(from_argv([*LLAMA, *extra], "plan"))


def _candidates(runtime: str, *extra: str) -> tuple[list, Rejects]:
    got = _resolved("--runtime", runtime, *extra)
    rej = Rejects()
    return candidates(Context.build(got.profile, got.cluster, got.request), rej), rej


def test_torchtitan_search_keeps_ddp_to_pure_data_parallelism():
    cands, rej = _candidates("torchtitan")
    zero0 = [c for c in cands if c.zero == 0 and c.dp > 1]
    assert zero0 and all(c.tp * c.pp * c.cp == 1 for c in zero0)
    assert any(c.zero >= 2 and c.dp > 1 and c.tp > 1 for c in cands)  # HSDP/FSDP beside TP stays
    assert any(reason == DDP_ONE_DIM for _, reason in rej.counts)


def test_other_runtimes_keep_ddp_beside_tensor_parallelism():
    for runtime in ("meshplan", "megatron-core", "deepspeed"):
        cands, rej = _candidates(runtime)
        assert any(c.zero == 0 and c.dp > 1 and c.tp > 1 for c in cands), runtime
        assert not any(reason == DDP_ONE_DIM for _, reason in rej.counts), runtime


def test_a_pinned_zero0_beside_tp_is_predicted_with_a_warning():
    pins = ("--zero", "0", "--tp", "2", "--dp", "8", "--pp", "1")
    warned = [w for w in _resolved("--runtime", "torchtitan", *pins).warnings if "--zero 0 with" in w]
    assert len(warned) == 1 and "DDP has not supported > 1D parallelism" in warned[0]
    assert not [w for w in _resolved("--runtime", "meshplan", *pins).warnings if "--zero 0 with" in w]
    assert not [
        w for w in _resolved("--runtime", "torchtitan", "--zero", "0", "--dp", "16").warnings if "--zero 0" in w
    ]


def test_a_zero0_pin_alone_keeps_the_search_to_what_torchtitan_runs():
    cands, _ = _candidates("torchtitan", "--zero", "0")
    assert cands and all(c.zero == 0 and c.tp * c.pp * c.cp == 1 for c in cands if c.dp > 1)
    pinned, _ = _candidates("torchtitan", "--zero", "0", "--tp", "2")
    assert pinned and all(c.tp == 2 and c.zero == 0 for c in pinned)  # both pinned: predicted as pinned

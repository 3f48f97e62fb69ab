"""The loss kernel (runtime behaviour `loss`, --loss): torch's cross-entropy over fp32 logits holds
the saved fp32 log-probabilities, the incoming dense nll gradient and the gradient it writes (three
fp32 logit-sized tensors at its backward peak); a fused cross-entropy over the bf16 logits
(flash-attn's CrossEntropyLoss, llm-foundry's MPT default) holds the saved bf16 logits and the bf16
gradient it writes: one fp32 logit size, and it moves the logits once forward, twice backward."""

from __future__ import annotations

import pytest

from meshplan.planner import estimate
from meshplan.planner.context import Context
from meshplan.planner.cost.memory import fp32_logit_bytes, head_keeps_logits, stage_buffer_bytes
from meshplan.validation.published import cli_inputs

SHAPE = "layers=4 hidden=768 heads=12 vocab=50368 seq=2048"
B = 8


def _inputs(model: str, *extra: str, runtime: str = "torchtitan"):
    argv = ["estimate", "--model", model]
    if model.startswith("analytic:"):
        argv += ["--set", *SHAPE.split()]
    argv += f"--cluster a100-40g --num-gpus 8 --global-batch {8 * B} --tp 1 --pp 1 --dp 8 --zero 2".split()
    argv += [f"--microbatch={B}", "--recompute", "none", "--schedule", "1f1b", "--runtime", runtime, *extra]
    return cli_inputs(argv)


def _head(ctx: Context):
    return next(lp for lp in ctx.layers if lp.tp.kind == "head")


@pytest.mark.parametrize(
    "model, runtime, held",
    [("analytic:gpt", "torchtitan", (2.0, 0.0)), ("gpt-tiny", "meshplan", (3.0, 0.5))],  # captured: its module
)
def test_fused_loss_holds_one_fp32_logit_size_where_torch_holds_three(model, runtime, held):
    torch_ce, fused = (
        Context.build(*_inputs(model, "--loss", loss, runtime=runtime)) for loss in ("cross_entropy", "fused")
    )
    head = _head(torch_ce)
    logits = fp32_logit_bytes(torch_ce, head)
    keeps = head_keeps_logits(head, logits)
    assert keeps == model.startswith("analytic:")  # a closed-form head counts its fp32 logits
    assert (torch_ce.spec.loss_held(keeps), fused.spec.loss_held(keeps)) == held
    # saved (a closed-form head's 4sbv) + held: 3 fp32 copies under torch, 1 fused
    saved = logits if keeps else 0.0
    assert saved + held[0] * logits == pytest.approx(3 * logits)
    assert saved + held[1] * logits == pytest.approx(logits if keeps else 0.5 * logits)
    one = [head]
    diff = stage_buffer_bytes(torch_ce, one, B, lambda lp: 1, 2, 1) - stage_buffer_bytes(
        fused, one, B, lambda lp: 1, 2, 1
    )
    assert diff == pytest.approx((held[0] - held[1]) * logits * B)


def test_a_fused_loss_fits_what_torch_s_cross_entropy_does_not_and_moves_fewer_bytes():
    torch_ce, fused = (estimate(*_inputs("analytic:gpt", "--loss", loss)) for loss in ("cross_entropy", "fused"))
    ctx = Context.build(*_inputs("analytic:gpt"))
    logits = fp32_logit_bytes(ctx, _head(ctx)) * B
    saved = torch_ce.prediction.peak_memory_bytes - fused.prediction.peak_memory_bytes
    assert saved == pytest.approx(2 * logits, rel=1e-9)
    # 6.5 + 5.0 fp32-logit passes against 0.5 + 1.0, at the HBM bandwidth
    hbm = ctx.cluster.device.hbm_gbps * 1e9
    faster = torch_ce.prediction.step_time_s - fused.prediction.step_time_s
    assert faster == pytest.approx((11.5 - 1.5) * logits / hbm, rel=0.02)


def _saved_logit_bytes(fn) -> tuple[float, list]:
    """Bytes autograd saves for backward of `fn(bf16 logits, labels)`, over the bf16 logits' size,
    counted with saved_tensors_hooks (each saved storage once)."""
    import torch

    n, v = 256, 8192
    pred = torch.randn(n, v, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, v, (n,))
    seen: dict[int, tuple] = {}

    def pack(t):
        seen.setdefault(t.untyped_storage().data_ptr(), (t.dtype, t.numel() * t.element_size()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = fn(pred, labels)
    loss.backward()
    assert pred.grad is not None and pred.grad.dtype == torch.bfloat16  # the gradient it writes: bf16
    return sum(b for _, b in seen.values()) / (n * v * 2), sorted(seen.values(), key=lambda x: -x[1])


@pytest.mark.slow
def test_a_compiled_cross_entropy_saves_what_the_fused_loss_prices():
    """torch's cross-entropy over .float() logits (torchtitan's loss) saves an fp32 logit-sized
    tensor (2x the bf16 logits); compiled (torchtitan compiles the loss with the model from 2025),
    inductor saves the bf16 logits and per-row statistics only: what --loss fused prices (saved bf16
    logits, a bf16 gradient)."""
    import torch
    import torch.nn.functional as F

    def loss(pred, labels):
        return F.cross_entropy(pred.float(), labels)

    eager, _ = _saved_logit_bytes(loss)
    assert eager == pytest.approx(2.0, abs=0.01)  # one fp32 copy: the log-probabilities
    try:
        compiled, tensors = _saved_logit_bytes(torch.compile(loss))
    except Exception as exc:  # no C++ toolchain for inductor on this host
        pytest.skip(f"torch.compile unavailable here: {type(exc).__name__}")
    assert compiled == pytest.approx(1.0, abs=0.01), tensors  # the bf16 logits, and a few bytes per row
    assert tensors[0][0] == torch.bfloat16


def test_the_executor_says_it_runs_torchs_loss_for_a_fused_loss_plan():
    from executor_plans import make_plan

    from meshplan.executor.check import run_warnings

    fused = make_plan(behaviours={"loss": "fused"})
    assert [w for w in run_warnings(fused) if "loss = 'fused'" in w]
    assert not [w for w in run_warnings(make_plan()) if "loss" in w]


def test_the_executor_says_it_runs_fsdp2_for_an_fsdp1_priced_plan():
    """A ZeRO-3 plan priced with Composer's FSDP1 behaviours (bf16 reduce-scatters, BACKWARD_POST
    buffers) but run by meshplan's executor (FSDP2, fp32) gets one warning naming them."""
    from executor_plans import make_plan

    from meshplan.executor.check import run_warnings

    fsdp1 = make_plan(dp_shard=2, zero=3, behaviours={"fsdp_reduce_bytes": 2, "fsdp_unit_buffers": "backward_post"})
    (said,) = [w for w in run_warnings(fsdp1) if "runs FSDP2" in w]
    assert "fsdp_reduce_bytes = 2" in said and "fsdp_unit_buffers = 'backward_post'" in said
    assert not [w for w in run_warnings(make_plan(dp_shard=2, zero=3)) if "runs FSDP2" in w]

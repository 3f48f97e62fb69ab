"""The dtype each runtime's gradient reduction is priced in (StateLayout.replica_reduce_bytes,
RuntimeSpec.replica_reduce_bytes / fsdp_reduce_bytes, runtimes.grad_reduce_bytes): DeepSpeed reduces
in the model's 16-bit dtype at every ZeRO stage (deepspeed/runtime/engine.py communication_data_type),
torch DDP and Megatron their fp32 gradients, and an fp32 run fp32."""

from __future__ import annotations

import pytest
from test_runtimes import DP, DP_PINS, _estimate, _inputs

from meshplan import runtimes
from meshplan.planner.context import Context
from meshplan.planner.search.predict import runtime_behaviours


def _dp(runtime: str, zero: int, *flags: str):
    return _estimate("--runtime", runtime, "--zero", str(zero), *flags, base=DP, pins=DP_PINS).prediction


def test_deepspeed_zero0_all_reduces_bf16_gradients_megatron_fp32():
    ds, mc = _dp("deepspeed", 0), _dp("megatron-core", 0)
    assert ds.comm_bytes_per_step["dp_replicate"] * 2 == mc.comm_bytes_per_step["dp_replicate"]
    assert _dp("meshplan", 0).comm_bytes_per_step == mc.comm_bytes_per_step  # torch DDP: fp32 gradients
    # exposed, the 2-byte all-reduce takes less time than DeepSpeed's own at fp32 gradients
    slow = _dp("deepspeed", 0, "--no-overlap-dp-comm", "--state-layout", "torch").breakdown["dp_comm"]
    fast = _dp("deepspeed", 0, "--no-overlap-dp-comm").breakdown["dp_comm"]
    assert 0 < fast < slow


def test_deepspeed_zero1_sends_16_bit_gradients_and_weights():
    """ZeRO-1's gradients (all-reduced) and its updated weights (all-gathered after the step: DeepSpeed's
    bit16 partitions, zero/stage_1_and_2.py step) both at 2 bytes, where ZeroRedundancyOptimizer's layout
    sends 4 of each."""
    ds0, ds1 = _dp("deepspeed", 0), _dp("deepspeed", 1)
    fp32_0, fp32_1 = (_dp("deepspeed", z, "--state-layout", "torch") for z in (0, 1))
    assert ds0.comm_bytes_per_step["dp_replicate"] * 2 == fp32_0.comm_bytes_per_step["dp_replicate"]
    exchange = lambda one, zero: one.comm_bytes_per_step["dp_replicate"] - zero.comm_bytes_per_step["dp_replicate"]  # noqa: E731
    assert exchange(ds1, ds0) * 2 == exchange(fp32_1, fp32_0) > 0  # the weights after the step
    exposed = [_dp("deepspeed", 1, "--no-overlap-dp-comm", *layout) for layout in ((), ("--state-layout", "torch"))]
    assert exposed[0].step_time_s < exposed[1].step_time_s  # the same sync, half the bytes
    slow = _dp("deepspeed", 1, "--no-overlap-dp-comm", "--precision", "fp32").breakdown["dp_comm"]
    assert _dp("deepspeed", 1, "--no-overlap-dp-comm").breakdown["dp_comm"] < slow  # an fp32 run sends fp32


def test_an_fp32_deepspeed_run_reduces_fp32():
    ds, mc = _dp("deepspeed", 0, "--precision", "fp32"), _dp("megatron-core", 0, "--precision", "fp32")
    assert ds.comm_bytes_per_step == mc.comm_bytes_per_step


@pytest.mark.parametrize("runtime", runtimes.NAMES)
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_the_exports_width_is_the_planners(runtime, precision):
    """runtimes.grad_reduce_bytes (what the DeepSpeed export writes communication_data_type from) resolves a
    plan's behaviours as Context.spec does, at ZeRO-0/1 and ZeRO-2/3."""
    _, _, request = _inputs(["estimate", *DP, *DP_PINS, "--runtime", runtime, "--precision", precision])
    profile, cluster, _ = _inputs(["estimate", *DP, *DP_PINS])
    spec = Context.build(profile, cluster, request).spec
    behaviours = runtime_behaviours(request)
    assert runtimes.grad_reduce_bytes(behaviours, precision, 1) == spec.replica_reduce_bytes
    assert runtimes.grad_reduce_bytes(behaviours, precision, 3) == spec.fsdp_reduce_bytes
    expected = 2 if runtime == "deepspeed" and precision == "bf16" else 4
    assert spec.replica_reduce_bytes == expected
    sixteen_bit_weights = runtime in ("deepspeed", "megatron-lm", "megatron-core") and precision == "bf16"
    assert spec.zero1_param_bytes == (2 if sixteen_bit_weights else 4)


def test_the_state_layouts_send_the_gradients_and_weights_they_keep():
    widths = {
        name: (layout.replica_reduce_bytes, layout.grad_bytes, layout.zero1_param_bytes, layout.weight_bytes)
        for name, layout in runtimes.STATE_LAYOUTS.items()
    }
    assert widths == {"torch": (4, 4, 4, 4), "megatron": (4, 4, 2, 2), "zero": (2, 2, 2, 2)}


def test_megatron_zero1_bytes_follow_the_reduce_scatter_it_runs():
    """Megatron's distributed optimizer reduce-scatters the fp32 main grads (15/16 x 4 bytes an element
    sent by each of 16 ranks) and all-gathers the updated bf16 weights (15/16 x 2): the byte count
    follows the collective the time is priced with (StateLayout.zero1_grad_collective), counted here
    from the profile's parameters."""
    profile, _, _ = _inputs(["estimate", *DP, *DP_PINS])
    sent = _dp("megatron-core", 1).comm_bytes_per_step["dp_replicate"]
    assert sent == pytest.approx(15 / 16 * (4 + 2) * profile.num_params, rel=1e-6)
    ddp = _dp("megatron-core", 0).comm_bytes_per_step["dp_replicate"]  # DDP all-reduces the fp32 grads
    assert ddp == pytest.approx(2 * 15 / 16 * 4 * profile.num_params, rel=1e-6)

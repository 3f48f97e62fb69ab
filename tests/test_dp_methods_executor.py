"""The data-parallel methods in the executor (executor/methods/): what each rank counts on the
wire equals the closed form from the model's parameter shapes (meshplan/comm_bytes.py's
convention, the one the cost model predicts), the methods train as they should, and check_plan
refuses what the feasibility rules refuse.

Expectations are written from first principles here, not from the executor's code:
- DDP: one all-reduce of every fp32 gradient per step (fp16: half the bytes);
- ZeRO-1: DDP + every rank's updated parameters broadcast over the group per step;
- FSDP2 (ZeRO-2/3): per unit (embed, each block, head; the root holds no parameters) an
  all-gather of the padded shard (dim 0 padded to a multiple of the shard degree) every forward
  and, for ZeRO-3, again in backward, per microbatch; one reduce-scatter of the padded gradients
  per step; HSDP also all-reduces the gradient shard over the replicas;
- PowerSGD: plain all-reduce before start_iter, then per tensor (n = dim 0, m = the rest,
  r = min(n, m, rank)) P (n r) and Q (m r) when n m > min_compression_rate (n + m) r, the
  tensor itself otherwise.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from executor_plans import make_plan, methods

from meshplan import dp_methods, feasibility
from meshplan.comm_bytes import wire_bytes
from meshplan.errors import MeshplanError
from meshplan.executor import check_plan
from meshplan.executor.launch import LaunchOptions, run_plans
from meshplan.executor.methods import MODULES
from meshplan.executor.model import build_named_model

STEPS = 4
TRAIN = dict(optimizer="sgd", lr=0.5, grad_clip=1.0)
FP32 = 4
PADDED = {"vocab": 255}
"""gpt-tiny with a vocabulary no shard degree divides: the embedding and head shards are padded."""


def test_every_registry_row_has_an_executor_module():
    assert set(MODULES.rows()) == {(m.axis, m.name) for m in dp_methods.METHODS}


@pytest.mark.parametrize(
    "make, reason",
    [
        (
            lambda: make_plan(dp=2, tp=2, compression="powersgd", validate=False),
            "compression=powersgd with tensor_parallel_degree 2: needs DDP",
        ),
        (
            lambda: make_plan(dp_shard=2, zero=2, compression="powersgd", validate=False),
            "compression=powersgd with zero_stage 2: runs with zero_stage 0/1 only",
        ),
        (
            lambda: make_plan(dp_shard=2, tp=2, compression="powersgd", zero=2, validate=False),
            "compression=powersgd with zero_stage 2: runs with zero_stage 0/1 only",
        ),
        (
            lambda: make_plan(pp=2, microbatches=3, validate=False),
            "1F1B needs the microbatch count (3) to be a multiple of pp = 2",
        ),
    ],
)
def test_check_plan_refuses_with_the_feasibility_reason(make, reason):
    plan = make()
    with pytest.raises(MeshplanError) as info:
        check_plan(plan)
    first = feasibility.first(plan.layout(), num_layers=len(plan.layers))
    assert str(info.value) == f"plan: {first}" and reason in first


# --- closed forms -----------------------------------------------------------------------------


def _shapes(config: dict | None = None) -> dict[str, list[tuple[int, ...]]]:
    """Parameter shapes per FSDP unit (embed, layers.i, head) of gpt-tiny."""
    model = build_named_model("gpt-tiny", dict(config or {}), "meta")
    return {fqn: [tuple(p.shape) for p in model.get_submodule(fqn).parameters()] for fqn in model.layer_names()}


def _numel(shape) -> int:
    return math.prod(shape)


def _grad_bytes(config=None) -> int:
    return FP32 * sum(_numel(s) for unit in _shapes(config).values() for s in unit)


def _steps(per_step: dict[str, Fraction]) -> dict[str, int]:
    return {axis: round(v) for axis, v in per_step.items()}


def ddp(g: int, config=None, fp16: bool = False) -> dict[str, int]:
    payload = _grad_bytes(config) // (2 if fp16 else 1)
    return _steps({"dp_replicate": wire_bytes("all_reduce", g, payload)})


def zero1(g: int, config=None) -> dict[str, int]:
    b = _grad_bytes(config)
    return _steps({"dp_replicate": wire_bytes("all_reduce", g, b) + wire_bytes("broadcast", g, b)})


def fsdp(
    shard: int, zero: int, microbatches: int = 1, replicate: int = 1, config=None, each: bool = False
) -> dict[str, int]:
    """Per unit: all-gathers of the padded shard, one reduce-scatter of the padded gradient (one per
    microbatch where the plan keeps gradient sync on: `each`)."""
    gathers = (2 if zero == 3 else 1) * microbatches
    total = {"dp_shard": Fraction(0), "dp_replicate": Fraction(0)}
    for unit in _shapes(config).values():
        shard_elems = sum(math.ceil(s[0] / shard) * _numel(s[1:]) for s in unit)
        total["dp_shard"] += gathers * wire_bytes("all_gather", shard, FP32 * shard_elems)
        scatters = microbatches if each else 1
        total["dp_shard"] += scatters * wire_bytes("reduce_scatter", shard, FP32 * shard_elems * shard)
        total["dp_replicate"] += wire_bytes("all_reduce", replicate, FP32 * shard_elems)
    return {a: v for a, v in _steps(total).items() if v}


def powersgd_compressed(g: int, rank: int, min_rate: float, config=None) -> dict[str, int]:
    """Bytes of one compressing step: P and Q of each compressible matrix, the rest dense."""
    elems = 0
    for unit in _shapes(config).values():
        for s in unit:
            n, m = s[0], _numel(s) // s[0]
            r = min(n, m, rank)
            elems += (n + m) * r if (n + m) * r * min_rate < n * m else n * m
    return _steps({"dp_replicate": wire_bytes("all_reduce", g, FP32 * elems)})


def mean_after_first(steps: list[dict[str, int]], warmup: int = 1) -> dict[str, int]:
    """The steady state: steps after the first and after PowerSGD's dense start iterations."""
    rest = steps[warmup:]
    return {a: round(Fraction(sum(s[a] for s in rest), len(rest))) for a in rest[0]}


EACH = {"fsdp_reduce_every_microbatch": True}
"""A plan that chose to reduce-scatter every microbatch's gradients (meshplan's executor, planned)."""
PSGD = {"rank": 2, "start_iter": 2, "min_compression_rate": 2.0}
DENSE = {"min_compression_rate": 1e9}

CASES = {
    2: {
        "ddp": (dict(dp=2), lambda: [ddp(2)] * STEPS),
        "fp16": (dict(dp=2, compression="fp16"), lambda: [ddp(2, fp16=True)] * STEPS),
        "zero1": (dict(dp=2, zero=1), lambda: [zero1(2)] * STEPS),
        "zero2": (dict(dp_shard=2, zero=2), lambda: [fsdp(2, 2)] * STEPS),
        "zero3": (dict(dp_shard=2, zero=3), lambda: [fsdp(2, 3)] * STEPS),
        "zero2_accum": (dict(dp_shard=2, zero=2, microbatches=2), lambda: [fsdp(2, 2, 2)] * STEPS),
        "zero3_accum_each": (
            dict(dp_shard=2, zero=3, microbatches=2, behaviours=EACH),
            lambda: [fsdp(2, 3, 2, each=True)] * STEPS,
        ),
        "zero3_accum": (dict(dp_shard=2, zero=3, microbatches=2), lambda: [fsdp(2, 3, 2)] * STEPS),
        "zero3_accum_padded": (
            dict(dp_shard=2, zero=3, microbatches=2, config=PADDED),
            lambda: [fsdp(2, 3, 2, config=PADDED)] * STEPS,
        ),
        "powersgd": (
            dict(dp=2, compression="powersgd", compression_params=PSGD),
            lambda: [ddp(2)] * 2 + [powersgd_compressed(2, 2, 2.0)] * (STEPS - 2),
        ),
        "powersgd_dense": (dict(dp=2, compression="powersgd", compression_params=DENSE), lambda: [ddp(2)] * STEPS),
    },
    4: {
        "ddp": (dict(dp=4), lambda: [ddp(4)] * STEPS),
        "fp16": (dict(dp=4, compression="fp16"), lambda: [ddp(4, fp16=True)] * STEPS),
        "zero1": (dict(dp=4, zero=1), lambda: [zero1(4)] * STEPS),
        "zero2": (dict(dp_shard=4, zero=2), lambda: [fsdp(4, 2)] * STEPS),
        "zero3_padded": (dict(dp_shard=4, zero=3, config=PADDED), lambda: [fsdp(4, 3, config=PADDED)] * STEPS),
        "hsdp": (dict(dp=2, dp_shard=2, zero=3), lambda: [fsdp(2, 3, replicate=2)] * STEPS),
        "powersgd": (
            dict(dp=4, compression="powersgd", compression_params={**PSGD, "rank": 1}),
            lambda: [ddp(4)] * 2 + [powersgd_compressed(4, 1, 2.0)] * (STEPS - 2),
        ),
    },
}


def _launch(world_size: int, tmp_path_factory) -> dict:
    names = list(CASES[world_size])
    plans = [make_plan(**CASES[world_size][n][0]) for n in names]
    out = tmp_path_factory.mktemp(f"dp_methods_ws{world_size}")
    results = run_plans(plans, LaunchOptions(steps=STEPS, out_dir=str(out), quiet=True, timeout_s=240, **TRAIN))
    for plan, result in zip(plans, results):
        result.plan = plan
    return dict(zip(names, results))


def _warmup(plan) -> int:
    c = plan.dp_methods.compression
    return max(1, c.params["start_iter"]) if c.name == "powersgd" else 1


def predicted_bytes(plan) -> dict[str, int]:
    """The cost model's comm_bytes_per_step for the same layout, through the public estimate()."""
    return estimate_plan(plan).prediction.comm_bytes_per_step


def estimate_plan(plan):
    """The public estimate() of the same layout and methods on local CPU ranks."""
    from meshplan.planner import PlanRequest, estimate
    from meshplan.presets import local_cpu
    from meshplan.profiler import profile_model

    profile = profile_model(plan.model_name, dict(plan.model_config), device="meta")
    methods = {axis: (c.name, dict(c.params)) for axis, c in plan.dp_methods.items()}
    req = PlanRequest(
        num_gpus=plan.world_size,
        global_batch=plan.global_batch_size,
        precision=plan.precision,
        tp=plan.tensor_parallel_degree,
        pp=plan.pipeline_parallel_degree,
        dp=plan.data_parallel_degree,
        dp_shard=plan.data_parallel_shard_degree,
        microbatch=plan.microbatch_size,
        zero=plan.zero_stage,
        schedule=plan.pipeline_schedule,
        methods=methods,
        fsdp_reduce_every_microbatch=plan.runtime_behaviours.get("fsdp_reduce_every_microbatch", False),
    )
    return estimate(profile, local_cpu(plan.world_size), req)


@pytest.fixture(scope="module")
def ws2(tmp_path_factory):
    return _launch(2, tmp_path_factory)


@pytest.fixture(scope="module")
def ws4(tmp_path_factory):
    return _launch(4, tmp_path_factory)


def _check_counts(result, expected_steps: list[dict[str, int]], world_size: int) -> None:
    assert result.comm_bytes_by_step == expected_steps
    mean = mean_after_first(expected_steps, _warmup(result.plan))
    assert result.comm_bytes_per_step_by_rank == [mean] * world_size
    assert result.comm_bytes_per_step == mean
    # and the cost model predicts the same integers (planner/rank/dp_cost.py, from the profile's shapes)
    assert predicted_bytes(result.plan) == result.comm_bytes_per_step


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES[2]))
def test_counted_bytes_equal_the_closed_form_on_2_ranks(ws2, name):
    _check_counts(ws2[name], CASES[2][name][1](), 2)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES[4]))
def test_counted_bytes_equal_the_closed_form_on_4_ranks(ws4, name):
    _check_counts(ws4[name], CASES[4][name][1](), 4)


def _max_rel(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


@pytest.mark.slow
def test_powersgd_sending_everything_dense_is_ddp(ws2):
    assert _max_rel(ws2["powersgd_dense"].losses, ws2["ddp"].losses) <= 1e-6


@pytest.mark.slow
def test_reducing_every_microbatch_trains_as_one_reduction(ws2):
    # the same gradients summed in the shards or unsharded then scattered: the same losses up to
    # fp32 summation order
    assert _max_rel(ws2["zero3_accum_each"].losses, ws2["zero3_accum"].losses) <= 1e-5


@pytest.mark.slow
def test_fp16_compression_stays_near_ddp(ws2, ws4):
    # fp16 rounds each averaged gradient to ~3 significant digits: 4 SGD steps move the loss
    # by ~1e-6 relative on gpt-tiny; 1e-4 leaves room and still catches a wrong average
    assert _max_rel(ws2["fp16"].losses, ws2["ddp"].losses) <= 1e-4
    assert _max_rel(ws4["fp16"].losses, ws4["ddp"].losses) <= 1e-4


@pytest.mark.slow
def test_powersgd_compressing_sends_fewer_bytes_and_changes_the_updates(ws2):
    psgd, plain = ws2["powersgd"], ws2["ddp"]
    assert psgd.comm_bytes_by_step[-1]["dp_replicate"] * 10 < plain.comm_bytes_by_step[-1]["dp_replicate"]
    assert psgd.losses[:3] == plain.losses[:3]  # dense until start_iter = 2 (its update shows at step 3)
    assert psgd.losses[3] != plain.losses[3]


def test_methods_build_resolved_parameters():
    m = methods("powersgd", {"rank": 4})
    assert m.compression.params == {
        "rank": 4,
        "start_iter": 2,
        "min_compression_rate": 2.0,
        "error_feedback": True,
        "warm_start": True,
    }


def test_a_period_steady_state_is_averaged_over_whole_periods():
    """Local SGD's traffic repeats every `period` steps: the steady state is the mean over whole
    periods (4 steps at period 2: the last 2 after the first, one averaging), not over the 3 steps
    after the first (1/3 of an averaging per step)."""
    from meshplan.comm_bytes import ByteCounter

    avg = 939_520
    counter = ByteCounter()
    counter.period = 2
    for step in range(4):
        if step % 2 == 0:
            counter.add("dp_replicate", "all_reduce", 2, avg)
        counter.end_step()
    assert counter.mean_after_first() == {"dp_replicate": avg // 2}
    counter.period = 8  # less than one period after the warm-up: all of those steps
    assert counter.mean_after_first() == {"dp_replicate": round(avg / 3)}


@pytest.mark.slow
def test_local_sgd_reports_bytes_per_step_over_whole_periods(tmp_path):
    """4 steps at period 2 on 2 gloo ranks report the cost model's bytes per step (469,760 B:
    one 939,520 B averaging all-reduce every 2 steps), not 2/3 of it."""
    from test_sync_methods import sync_plan

    plan = sync_plan("local-sgd", {"period": 2}, dp=2)
    (result,) = run_plans([plan], LaunchOptions(steps=4, out_dir=str(tmp_path), quiet=True, timeout_s=240, **TRAIN))
    assert result.comm_bytes_per_step == predicted_bytes(plan) == {"dp_replicate": 469_760}

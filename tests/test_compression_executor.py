"""The all-gather and adaptive compressors inside DDP on real gloo ranks (gpt-tiny, one run_plans launch per
world size): at their no-compression settings they train exactly as DDP (<= 1e-6 relative
loss, fp32), and what each hook counts per step equals both a closed form written here from the
parameter shapes and the cost model's comm_bytes_per_step through the public estimate().

Closed forms (per parameter tensor, n = numel; all-gather counts (N-1) x this rank's payload):
- top-k: 8 ceil(density n) (fp32 values + int32 indices)
- quantizers: ceil(n bits / 8) + 4 ceil(n / bucket_size) (+ 4 x 32 histogram for ALQ/AMQ)
- Accordion over PowerSGD: all-reduce of (n_0 + m) r or n (compression_wire.lowrank_elems);
  every step of a run shorter than `window` is at critical_rank, so critical_fraction = 1 is
  the exact prediction (the mix of a longer run is the planner's assumption, not a count);
  with start_iter the first steps send DDP's bytes and the steady state is left unchanged
- tensor-parallel replicas (tp = 2): the same codecs on each rank's DTensor shards, priced
  from the shard shapes (planner/compression.shard_shapes), equal to the count
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from executor_plans import make_plan
from test_dp_methods_executor import predicted_bytes

from meshplan.comm_bytes import wire_bytes
from meshplan.executor.launch import LaunchOptions, run_plans
from meshplan.executor.model import build_named_model

STEPS = 4
TRAIN = dict(optimizer="sgd", lr=0.5, grad_clip=1.0)


def _shapes() -> list[tuple[int, ...]]:
    model = build_named_model("gpt-tiny", {}, "meta")
    return [tuple(p.shape) for p in model.parameters()]


def _gather(g: int, per_tensor) -> dict[str, int]:
    return {"dp_replicate": round(sum(wire_bytes("all_gather", g, per_tensor(math.prod(s))) for s in _shapes()))}


def topk(g, density):
    return _gather(g, lambda n: 8 * max(1, min(n, math.ceil(density * n))))


def quant(g, bits, bucket=512, hist=False):
    return _gather(g, lambda n: math.ceil(n * bits / 8) + 4 * math.ceil(n / bucket) + (128 if hist else 0))


def lowrank(g, rank, rate=2.0):
    elems = 0
    for s in _shapes():
        n, m = (s[0], math.prod(s) // s[0]) if len(s) > 1 else (math.prod(s), 1)
        r = min(n, m, rank)
        elems += (n + m) * r if m > 1 and (n + m) * r * rate < n * m else n * m
    return {"dp_replicate": round(wire_bytes("all_reduce", g, Fraction(4 * elems)))}


ACC = {"critical_fraction": 1.0}
CASES = {
    "ddp": (dict(dp=4), None),
    "topk_dense": (dict(dp=4, compression="topk", compression_params={"density": 1.0}), lambda: topk(4, 1.0)),
    "topk": (dict(dp=4, compression="topk", compression_params={"density": 0.01}), lambda: topk(4, 0.01)),
    "dgc": (
        dict(
            dp=4,
            compression="topk",
            compression_params={"density": 0.05, "momentum_correction": True, "clip_norm": 1.0},
        ),
        lambda: topk(4, 0.05),
    ),
    "qsgd_off": (dict(dp=4, compression="qsgd", compression_params={"quantize": False}), None),
    "qsgd": (dict(dp=4, compression="qsgd"), lambda: quant(4, 4)),
    "nuqsgd": (
        dict(dp=4, compression="nuqsgd", compression_params={"bits": 3, "bucket_size": 128}),
        lambda: quant(4, 3, 128),
    ),
    "alq": (dict(dp=4, compression="alq", compression_params={"refit_every": 2}), lambda: quant(4, 3, hist=True)),
    "amq": (dict(dp=4, compression="amq"), lambda: quant(4, 3, hist=True)),
    "alq_off": (dict(dp=4, compression="alq", compression_params={"quantize": False}), None),
    "accordion_dense": (dict(dp=4, compression="accordion", compression_params={"min_compression_rate": 1e9}), None),
    "accordion": (dict(dp=4, compression="accordion", compression_params=ACC), lambda: lowrank(4, 2)),
    "accordion_topk_dense": (
        dict(dp=4, compression="accordion_topk", compression_params={"density": 1.0, "critical_density": 1.0}),
        None,
    ),
    "accordion_topk": (dict(dp=4, compression="accordion_topk", compression_params=ACC), lambda: topk(4, 0.1)),
    # tensor-parallel replicas: the same codecs in the replica reducer (compressed.py)
    "tp_ddp": (dict(dp=2, tp=2), None),
    "tp_topk_dense": (dict(dp=2, tp=2, compression="topk", compression_params={"density": 1.0}), None),
    "tp_qsgd": (dict(dp=2, tp=2, compression="qsgd"), None),
    "tp_accordion": (dict(dp=2, tp=2, compression="accordion", compression_params=ACC), None),
    # Accordion left to switch (window 2 inside 4 steps, the share unset): inside its band
    "accordion_switching": (dict(dp=4, compression="accordion", compression_params={"window": 2, "eta": 1e9}), None),
    "accordion_topk_switching": (
        dict(dp=4, compression="accordion_topk", compression_params={"window": 2, "eta": 1e9}),
        None,
    ),
    # Accordion's dense start: DDP's bytes for start_iter steps, then the steady state
    "accordion_start": (
        dict(dp=4, compression="accordion", compression_params={**ACC, "start_iter": 2}),
        None,
    ),
}
TP = ["tp_topk_dense", "tp_qsgd", "tp_accordion"]
EXACT = ["topk_dense", "qsgd_off", "alq_off", "accordion_dense", "accordion_topk_dense"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    names = list(CASES)
    plans = [make_plan(**CASES[n][0]) for n in names]
    out = tmp_path_factory.mktemp("compression_ws4")
    results = run_plans(plans, LaunchOptions(steps=STEPS, out_dir=str(out), quiet=True, timeout_s=400, **TRAIN))
    for plan, result in zip(plans, results):
        result.plan = plan
    return dict(zip(names, results))


def _max_rel(a, b) -> float:
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


@pytest.mark.slow
@pytest.mark.parametrize("name", EXACT)
def test_no_compression_setting_is_ddp(runs, name):
    assert _max_rel(runs[name].losses, runs["ddp"].losses) <= 1e-6


@pytest.mark.slow
def test_tensor_parallel_replicas_run_the_codecs(runs):
    assert _max_rel(runs["tp_topk_dense"].losses, runs["tp_ddp"].losses) <= 1e-6
    qsgd, dense = (
        runs["tp_qsgd"].comm_bytes_per_step["dp_replicate"],
        runs["tp_ddp"].comm_bytes_per_step["dp_replicate"],
    )
    assert 0 < qsgd < dense / 4 and all(math.isfinite(x) for x in runs["tp_qsgd"].losses)


@pytest.mark.slow
@pytest.mark.parametrize("name", TP)
def test_tensor_parallel_shards_are_priced_exactly(runs, name):
    """The replica reducer exchanges each rank's TP shards (column weights/biases on dim 0, row
    weights on dim 1, norms and row biases whole): the prediction counts the same shapes."""
    assert runs[name].comm_bytes_per_step_by_rank == [runs[name].comm_bytes_per_step] * 4
    assert predicted_bytes(runs[name].plan) == runs[name].comm_bytes_per_step


@pytest.mark.slow
def test_accordion_start_iter_is_dense_then_the_steady_state_the_planner_prices(runs):
    result, dense = runs["accordion_start"], runs["ddp"].comm_bytes_by_step[-1]
    assert result.comm_bytes_by_step == [dense] * 2 + [lowrank(4, 2)] * (STEPS - 2)
    assert result.comm_bytes_per_step == lowrank(4, 2) == predicted_bytes(result.plan)


@pytest.mark.slow
@pytest.mark.parametrize("name", [n for n, (_, form) in CASES.items() if form is not None])
def test_counted_bytes_equal_the_closed_form_and_the_prediction(runs, name):
    result, expected = runs[name], CASES[name][1]()
    assert result.comm_bytes_by_step == [expected] * STEPS
    assert result.comm_bytes_per_step_by_rank == [expected] * 4
    assert predicted_bytes(result.plan) == result.comm_bytes_per_step


@pytest.mark.slow
def test_compressing_changes_the_updates(runs):
    for name in ("topk", "dgc", "qsgd", "nuqsgd", "alq", "amq", "accordion", "accordion_topk"):
        assert runs[name].losses[-1] != runs["ddp"].losses[-1], name


@pytest.mark.slow
def test_accordion_reports_its_share_of_steps_at_each_setting(runs):
    # 4 steps inside the first window (100): every tensor-step at the critical (low-compression) setting
    assert "accordion: 100.0% of tensor-steps at rank 2 (critical), 0.0% at rank 1" in runs["accordion"].notes
    assert any(n.startswith("accordion: 100.0% of tensor-steps at density 0.1") for n in runs["accordion_topk"].notes)


def predicted_band(plan) -> dict[str, list[int]]:
    from test_dp_methods_executor import estimate_plan

    return estimate_plan(plan).prediction.comm_bytes_band


@pytest.mark.slow
@pytest.mark.parametrize("name", ["accordion", "accordion_switching", "accordion_topk", "accordion_topk_switching"])
def test_accordion_runs_land_inside_the_priced_band(runs, name):
    """The band's ends are the closed forms of every step at one setting (PowerSGD rank 1 and
    rank 2; top-k at density and critical_density), and every step of every rank lands in it."""
    result = runs[name]
    band = predicted_band(result.plan)
    params = result.plan.dp_methods.compression.params
    if name.startswith("accordion_topk"):
        ends = topk(4, params["density"]), topk(4, params["critical_density"])
    else:
        ends = lowrank(4, params["rank"]), lowrank(4, params["critical_rank"])
    assert band == {"dp_replicate": [ends[0]["dp_replicate"], ends[1]["dp_replicate"]]}
    lo, hi = band["dp_replicate"]
    assert all(lo <= step["dp_replicate"] <= hi for step in result.comm_bytes_by_step), result.comm_bytes_by_step
    if "switching" in name:  # the share unset: the expected value is the band's top
        assert predicted_bytes(result.plan) == {"dp_replicate": hi}

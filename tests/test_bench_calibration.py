"""Section 1's bracketed calibration (benchmarks/calibration.py): two profiles taken around a
launch, combined per measured time, and the launch's plans priced again from the combination."""

from __future__ import annotations

import copy

import pytest

from benchmarks import baselines
from benchmarks import calibration as bracket
from benchmarks import local_accuracy as la
from meshplan.model_profile import LayerTiming
from meshplan.planner import estimate
from meshplan.presets import local_cpu
from meshplan.profiler import profile_model


def _timed(scale: float, sizes=(1, 2, 4, 8)):
    """gpt-tiny's meta profile with made-up CPU timings `scale` times a base (ms per sample-ish)."""
    profile = profile_model("gpt-tiny")
    for i, layer in enumerate(profile.layers):
        layer.timings = [
            LayerTiming(microbatch_size=b, forward_s=scale * 1e-3 * (i + 1) * b, backward_s=scale * 2e-3 * (i + 1) * b)
            for b in sizes
        ]
        layer.optimizer_step_s = scale * 1e-4
        layer.framework_overhead_s = {"tp": scale * 5e-5}
    profile.step_overhead_s = {"ddp@4:b4": scale * 1e-3}
    profile.device = "cpu"
    return profile


def test_combined_profile_holds_the_middle_of_every_measured_time():
    before, after = _timed(1.0), _timed(3.0)
    both = bracket.combine_profiles([before, after])
    for lb, la_, lc in zip(before.layers, after.layers, both.layers):
        for tb, ta, tc in zip(lb.timings, la_.timings, lc.timings):
            assert tc.forward_s == pytest.approx((tb.forward_s + ta.forward_s) / 2)
            assert tc.backward_s == pytest.approx((tb.backward_s + ta.backward_s) / 2)
        assert lc.optimizer_step_s == pytest.approx(2e-4)
        assert lc.framework_overhead_s["tp"] == pytest.approx(1e-4)
    assert both.step_overhead_s == {"ddp@4:b4": pytest.approx(2e-3)}
    assert before.layers[0].timings[0].forward_s == pytest.approx(1e-3)  # the inputs are left as they were
    assert bracket.layer_drift(before, after) == pytest.approx(3.0)
    assert bracket.combine_profiles([before, after, _timed(100.0)]).layers[0].timings[0].forward_s == pytest.approx(
        3e-3
    )  # three or more: the median, not swayed by one outlier


def test_profiles_of_different_structure_are_refused():
    before = _timed(1.0)
    with pytest.raises(ValueError, match="microbatch sizes"):
        bracket.combine_profiles([before, _timed(1.0, sizes=(1, 2))])
    other = copy.deepcopy(before)
    other.layers = other.layers[:-1]
    with pytest.raises(ValueError, match="different layers"):
        bracket.combine_profiles([before, other])


def test_pins_of_reprice_the_searched_plan_exactly():
    cluster = local_cpu(4)
    profile = _timed(1.0)
    plan = baselines.planner_choice(profile, cluster)
    again = estimate(profile, cluster, la.request(la.pins_of(plan)))
    assert again.prediction.step_time_s == pytest.approx(plan.prediction.step_time_s, rel=1e-9)
    assert la.describe(again) == la.describe(plan)
    mixed = copy.deepcopy(plan)
    blocks = plan.layers[1:-1]
    mixed.recompute = {**plan.recompute, blocks[0]: "full", blocks[1]: "none"}
    with pytest.raises(ValueError, match="recomputes its blocks differently"):
        la.pins_of(mixed)


def test_a_launchs_plans_are_priced_from_both_profiles(monkeypatch):
    """Profiled 1x before and 3x after the launch: each plan is priced from the 2x middle, and
    the launch records the drift; a failed second profile keeps the first one's prices."""
    from benchmarks import run
    from meshplan.errors import MeshplanError

    cluster = local_cpu(4)
    before = _timed(1.0)
    plans, _ = la.predict_grid(before, cluster, [g for g in la.GRID if g[0] in ("ddp", "pp4-1f1b")])
    monkeypatch.setattr(run.la, "calibrate_model", lambda model, calibration, say, when="before": _timed(3.0))
    info: dict = {}
    priced = run._bracketed("gpt-tiny", before, plans, cluster, {}, info, lambda *_: None)
    assert info["drift"] == pytest.approx(3.0) and "kept_one_profile" not in info
    middle = _timed(2.0)
    for (name, plan), got in zip(plans, priced):
        expected = estimate(middle, cluster, la.request(la.pins_of(plan))).prediction.step_time_s
        assert got.prediction.step_time_s == pytest.approx(expected, rel=1e-9), name
        assert got.prediction.step_time_s > plan.prediction.step_time_s

    def fails(model, calibration, say, when="before"):
        raise MeshplanError("busy workers timed out")

    monkeypatch.setattr(run.la, "calibrate_model", fails)
    info = {}
    kept = run._bracketed("gpt-tiny", before, plans, cluster, {}, info, lambda *_: None)
    assert kept == [p for _, p in plans] and info["bracket_error"] == "busy workers timed out"


def test_bracket_drift_names_the_largest_move_and_both_mapes():
    from benchmarks.diagnostics import bracket_drift

    local = {
        "mape": 0.08,
        "mape_before": 0.15,
        "launches": [
            {"model": "a", "repetition": 0, "drift": 1.1},
            {"model": "b", "repetition": 0, "drift": 0.5},
            {"model": "a", "repetition": 1},
        ],
    }
    found = bracket_drift(local)
    assert found["value"] == {"drifts": [1.1, 0.5], "mape_before": 0.15, "mape": 0.08}
    assert "largest x0.50, b #1" in found["text"] and "15.0%" in found["text"] and "8.0%" in found["text"]
    assert bracket_drift({"mape": 0.1, "launches": [{"model": "a", "drift": 1.0}]}) is None

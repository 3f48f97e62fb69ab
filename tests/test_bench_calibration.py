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
        layer.framework_overhead_s = {"tp@2:b4": scale * 5e-5, "tp@2:b4:fwd": scale * 2e-5}
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
        assert lc.framework_overhead_s["tp@2:b4"] == pytest.approx(1e-4)
    assert both.step_overhead_s == {"ddp@4:b4": pytest.approx(2e-3)}
    assert before.layers[0].timings[0].forward_s == pytest.approx(1e-3)  # the inputs are left as they were
    assert bracket.layer_drift(before, after) == pytest.approx(3.0)
    assert bracket.combine_profiles([before, after, _timed(100.0)]).layers[0].timings[0].forward_s == pytest.approx(
        3e-3
    )  # three or more: the median, not swayed by one outlier


def test_a_profile_taken_during_the_launch_joins_every_measured_time():
    """Profiled 1x before, 2.5x between the launch's chunks and 3x after: every measured time,
    the in-place overheads included (most of a TP plan's price), is the median of the three,
    and the TP overheads' drift is read per profile."""
    before, mid, after = _timed(1.0), _timed(2.5), _timed(3.0)
    both = bracket.combine_profiles([before, mid, after])
    for lb, lc in zip(before.layers, both.layers):
        for tb, tc in zip(lb.timings, lc.timings):
            assert tc.forward_s == pytest.approx(2.5 * tb.forward_s)
            assert tc.backward_s == pytest.approx(2.5 * tb.backward_s)
        assert lc.optimizer_step_s == pytest.approx(2.5e-4)
        assert lc.framework_overhead_s["tp@2:b4"] == pytest.approx(2.5 * 5e-5)
    assert both.step_overhead_s == {"ddp@4:b4": pytest.approx(2.5e-3)}
    assert "median of 3 profiles" in both.notes[-1]
    assert bracket.tp_overhead_drift(before, mid) == pytest.approx(2.5)
    mid.layers[1].framework_overhead_s["tp@2:b4"] *= 10  # one layer's TP overhead moves: the sum moves
    total = sum(lp.framework_overhead_s["tp@2:b4"] for lp in before.layers)
    moved = 2.5 * (total + 9 * before.layers[1].framework_overhead_s["tp@2:b4"]) / total
    assert bracket.tp_overhead_drift(before, mid) == pytest.approx(moved)
    for layer in before.layers:
        layer.framework_overhead_s = {"recompute_full@1:b1": 1e-3}
    assert bracket.tp_overhead_drift(before, mid) is None  # nothing measured under TP


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

    mid_info: dict = {}
    with_mid = run._bracketed("gpt-tiny", before, plans, cluster, {}, mid_info, lambda *_: None, [_timed(2.5)])
    assert mid_info["mid_drift"] == [pytest.approx(2.5)]
    assert mid_info["tp_drift"] == pytest.approx(3.0) and mid_info["tp_mid_drift"] == [pytest.approx(2.5)]
    median = _timed(2.5)
    for (name, plan), got in zip(plans, with_mid):  # every measured time at the median, 2.5x
        expected = estimate(median, cluster, la.request(la.pins_of(plan))).prediction.step_time_s
        assert got.prediction.step_time_s == pytest.approx(expected, rel=1e-9), name

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


def _result(times: list[float], peak: int = 100):
    from meshplan.executor.run_history import median_step_s
    from meshplan.run_result import RunResult

    return RunResult(
        world_size=4,
        steps=len(times),
        losses=[1.0] * len(times),
        step_time_s=median_step_s(times, "cpu"),
        step_times_s=times,
        tokens_per_s=1.0,
        peak_memory_bytes=peak,
        phase_times_s={"forward": times[-1] / 2},
    )


def test_a_plan_run_twice_is_timed_over_both_runs_steps_after_warm_up():
    """Each run's warm-up and tracker steps (the first two on CPU) are left out; the median is
    over the timed steps of both runs, the peak the larger, the phases the mean."""
    merged = la.merge_passes(_result([9.0, 8.0, 1.0, 2.0], 100), _result([7.0, 6.0, 3.0, 5.0], 300))
    assert merged.step_time_s == pytest.approx(2.5)  # median of 1, 2, 3, 5
    assert merged.step_times_s == [9.0, 8.0, 1.0, 2.0, 3.0, 5.0]
    assert merged.peak_memory_bytes == 300
    assert merged.phase_times_s == {"forward": pytest.approx(1.75)}
    assert la.merge_passes(None, _result([1.0, 1.0, 1.0])) is None


def test_a_round_runs_its_plans_in_mirrored_passes(monkeypatch, tmp_path):
    """A B C then C B A in one launch; each plan's result merges its own two runs, whatever the
    rotation, and the launch reports the second pass over the first (the host moving within it)."""
    launched = []

    def run_batch(plans, steps, work, say):
        launched.append(list(plans))
        slow = {p: 2.0 for p in plans}  # every plan's second run twice as slow
        seen = set()
        out = []
        for p in plans:
            t = p * (slow[p] if p in seen else 1.0)
            seen.add(p)
            out.append(_result([9.0, 9.0, t, t]))
        return out

    monkeypatch.setattr(la, "_run_batch", run_batch)
    plans = [("a", 1.0), ("b", 10.0), ("c", 100.0)]
    results, info = la.measure_round("m", plans, 1, 4, tmp_path, lambda *_: None)
    assert launched == [[100.0, 1.0, 10.0, 10.0, 1.0, 100.0]]  # rotated by 5 % 3 = 2, then mirrored
    assert [r.step_time_s for r in results] == [pytest.approx(1.5), pytest.approx(15.0), pytest.approx(150.0)]
    assert info["pass_ratio"] == pytest.approx(2.0)


def test_a_round_in_chunks_times_the_layers_between_its_launches(monkeypatch, tmp_path):
    """chunks=2: the mirrored sequence runs as two consecutive launches with `between` called
    once between them; each plan still merges its own two runs."""
    events = []

    def run_batch(plans, steps, work, say):
        events.append(("launch", list(plans), work.name))
        return [_result([9.0, 9.0, p, p]) for p in plans]

    monkeypatch.setattr(la, "_run_batch", run_batch)
    plans = [("a", 1.0), ("b", 10.0), ("c", 100.0)]
    results, info = la.measure_round(
        "m", plans, 0, 4, tmp_path, lambda *_: None, chunks=2, between=lambda k: events.append(("between", k))
    )
    assert events == [("launch", [1.0, 10.0, 100.0], "m-0-0"), ("between", 1), ("launch", [100.0, 10.0, 1.0], "m-0-1")]
    assert [r.step_time_s for r in results] == [pytest.approx(1.0), pytest.approx(10.0), pytest.approx(100.0)]
    assert info["chunks"] == 2
    assert la.split_evenly(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert la.split_evenly([1, 2], 5) == [[1], [2]]


def test_pass_drift_names_the_launch_that_moved_most():
    from benchmarks.diagnostics import pass_drift

    local = {
        "launches": [
            {"model": "a", "repetition": 0, "pass_ratio": 1.1},
            {"model": "b", "repetition": 1, "pass_ratio": 0.7},
        ]
    }
    check = pass_drift(local)
    assert check["value"]["ratios"] == [1.1, 0.7] and "largest x0.70, b #2" in check["text"]
    assert pass_drift({"launches": [{"model": "a"}]}) is None


def test_tp_drift_names_the_profile_whose_tp_overheads_moved_most():
    from benchmarks.diagnostics import tp_drift

    local = {
        "launches": [
            {"model": "a", "repetition": 0, "tp_drift": 1.1, "tp_mid_drift": [0.95]},
            {"model": "b", "repetition": 0, "tp_drift": 1.3, "tp_mid_drift": [0.6]},
            {"model": "c", "repetition": 0, "drift": 1.0},  # no TP measured
        ]
    }
    check = tp_drift(local)
    assert check["value"]["ratios"] == [1.1, 0.95, 1.3, 0.6] and "largest x0.60, b #1" in check["text"]
    assert tp_drift({"launches": [{"model": "a", "drift": 1.0}]}) is None

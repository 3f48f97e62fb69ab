"""The benchmark harness's cheap parts: metrics on known inputs, the report's keys and text,
the baseline and grid logic on a real (meta-device) profile. No ranks are launched here;
`python -m benchmarks.run --quick` is the end-to-end run."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/ is not installed; `pytest` alone

from benchmarks import baselines, memory_accuracy
from benchmarks import local_accuracy as la
from benchmarks.common import geomean, kendall_tau, mape, spread, top1_regret
from benchmarks.run import _overall, write


def test_mape_on_known_values():
    assert mape([110, 90], [100, 100]) == pytest.approx(0.10)
    assert mape([2.0], [1.0]) == pytest.approx(1.0)


def test_kendall_tau_known_rankings():
    assert kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert kendall_tau([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    # one swapped pair of 6: (C - D) / 6 = (5 - 1) / 6
    assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6)
    # tau-b with a tie in the first list: C=5, D=0, ties_a=1 -> 5 / sqrt(5 * 6)
    assert kendall_tau([1, 1, 2, 3], [1, 2, 3, 4]) == pytest.approx(5 / math.sqrt(30))


def test_top1_regret_is_measured_time_of_the_predicted_best():
    assert top1_regret([1.0, 2.0, 3.0], [5.0, 4.0, 6.0]) == pytest.approx(5.0 / 4.0)
    assert top1_regret([3.0, 1.0], [2.0, 1.0]) == pytest.approx(1.0)


def test_spread_and_geomean():
    assert spread([1.0, 1.5, 2.0]) == pytest.approx(1.0)
    assert geomean([1.0, 4.0]) == pytest.approx(2.0)


def _row(name, pred, meas, mem_pred=2e6, mem_meas=1e6):
    return {
        "name": name,
        "config": name,
        "predicted_s": pred,
        "measured_s": meas,
        "breakdown_s": {},
        "measured_runs_s": [meas],
        "spread_runs": 0.0,
        "step_min_s": meas,
        "step_max_s": meas,
        "runs": 1,
        "predicted_memory_bytes": mem_pred,
        "measured_memory_bytes": mem_meas,
        "error": pred / meas - 1,
    }


def test_summaries_and_baseline_speedups_from_rows():
    rows = [
        _row("ddp", 1.0, 2.0),
        _row("zero3", 2.0, 4.0),
        _row("megatron", 3.0, 1.0),
        {"name": "broken", "config": "x", "predicted_s": 0.5, "predicted_memory_bytes": 1.0, "runs": 0},
    ]
    s = la.summarize(rows)
    assert s["choice"] == "ddp" and s["best_measured"] == "megatron" and s["failed"] == ["broken"]
    assert s["num_plans"] == 3 and s["top1_regret"] == pytest.approx(2.0)
    assert s["kendall_tau"] == pytest.approx(-1 / 3)
    assert baselines.speedups(rows, "ddp") == {"ddp": 1.0, "zero3": 2.0, "megatron": 0.5}
    # the planner's own result is its choice; a configuration measured twice is pooled
    search = {**_row("planner-search", 1.5, 2.6), "config": "megatron", "measured_runs_s": [1.2, 0.8]}
    s2 = la.summarize(rows + [search])
    assert s2["choice"] == "planner-search"
    assert s2["top1_regret"] == pytest.approx(1.0)  # megatron's samples 1.0, 1.2, 0.8 -> median 1.0 (best)
    worse = {**_row("planner-search", 0.1, 2.0), "config": "zero3", "measured_runs_s": [4.0, 5.0]}
    assert la.summarize(rows + [worse])["top1_regret"] == pytest.approx(4.0 / 1.0)
    combined = baselines.combine({"a": {"ddp": 1.0, "zero3": 4.0}, "b": {"ddp": 1.0, "zero3": 1.0}})
    assert combined == {"ddp": pytest.approx(1.0), "zero3": pytest.approx(2.0)}
    mem = memory_accuracy.summarize({"m": rows})
    assert mem["num_plans"] == 3 and mem["mape"] == pytest.approx(1.0)


def _results() -> dict:
    rows = [_row("ddp", 1.0, 2.0), _row("zero3", 2.0, 4.0), _row("megatron", 3.0, 1.0)]
    model = {**la.summarize(rows), "rows": rows, "skipped": [], "baseline_speedups": {"ddp": 1.0}}
    local = {**_overall({"gpt-tiny": model}), "models": {"gpt-tiny": model}, "targets": {}}
    return {
        "quick": True,
        "machine": {"cpu": "test"},
        "torch_version": "2.x",
        "local_accuracy": local,
        "baselines": {"ddp": 1.0, "zero3": 2.0, "by_model": {"gpt-tiny": {"ddp": 1.0}}},
        "planner_speed": [
            {"model": "gpt3-175b", "cluster": "a100-80g", "num_gpus": 8, "search_time_s": 0.1, "candidates": 10}
        ],
        "memory": memory_accuracy.summarize({"gpt-tiny": rows}),
        "executor_overhead": {"ratio": 1.01},
        "gpu": {"available": False, "note": "none"},
        "broken": float("nan"),
    }


def test_report_has_the_documented_keys_and_says_no_gpu(tmp_path):
    write(_results(), tmp_path)
    data = json.loads((tmp_path / "benchmarks.json").read_text())
    assert {
        "local_accuracy",
        "baselines",
        "planner_speed",
        "memory",
        "executor_overhead",
        "machine",
        "torch_version",
    } <= set(data)
    assert {"mape", "kendall_tau", "top1_regret", "num_plans", "models"} <= set(data["local_accuracy"])
    assert {"model", "cluster", "num_gpus", "search_time_s", "candidates"} <= set(data["planner_speed"][0])
    assert {"mape", "num_plans"} <= set(data["memory"]) and "ratio" in data["executor_overhead"]
    assert data["broken"] is None  # NaN is not JSON
    md = (tmp_path / "benchmarks.md").read_text()
    assert "No GPU was available in this run" in md and "Kendall tau" in md and "megatron" in md


def test_report_records_a_failed_section(tmp_path):
    results = _results()
    results["executor_overhead"] = {"error": "RunError: rank 1 died"}
    write(results, tmp_path)
    assert "This section failed:** `RunError: rank 1 died`" in (tmp_path / "benchmarks.md").read_text()


def test_grid_spans_the_required_families():
    pins = [p for _, p in la.GRID]
    assert len(la.GRID) >= 12
    assert any(p.get("zero") == 3 for p in pins) and any(p.get("tp", 1) > 1 for p in pins)
    assert {p.get("schedule") for p in pins if p.get("pp", 1) > 1} >= {"GPipe", "1F1B"}
    assert any(p.get("recompute") for p in pins) and len({p["microbatch"] for p in pins}) >= 3
    assert any(p.get("tp", 1) > 1 and (p.get("dp", 1) > 1 or p.get("pp", 1) > 1) for p in pins)
    assert set(la.QUICK_GRID) <= {name for name, _ in la.GRID}


def test_megatron_heuristic_on_real_profiles():
    """TP over the node where the heads allow it (gpt-tiny: 4 heads -> tp 4; llama-tiny: 2 KV
    heads -> tp 2 and dp 2), pipeline 1 when memory fits."""
    from meshplan.presets import local_cpu
    from meshplan.profiler import profile_model

    cluster = local_cpu(4)
    gpt = baselines.megatron_pins(profile_model("gpt-tiny"), cluster, 4, 16)
    assert (gpt["tp"], gpt["pp"], gpt["dp"]) == (4, 1, 1)
    llama = baselines.megatron_pins(profile_model("llama-tiny"), cluster, 4, 16)
    assert (llama["tp"], llama["pp"], llama["dp"]) == (2, 1, 2)
    plans, skipped = la.predict_grid(profile_model("gpt-tiny"), cluster, la.GRID)
    assert len(plans) == len(la.GRID) and not skipped
    assert all(p.prediction.step_time_s > 0 for _, p in plans)


def test_diagnostics_name_the_causes_found_in_the_data():
    from benchmarks.diagnostics import diagnose

    def row(name, pred, meas, tp, recompute, buffers, mem_meas):
        r = _row(name, pred, meas, mem_pred=buffers + 1e6, mem_meas=mem_meas)
        r.update(
            degrees={"pp": 1, "dp": 4 // tp, "tp": tp, "zero": 0},
            recompute=recompute,
            config=f"tp={tp}" + (" recompute=full" if recompute else ""),
            predicted_memory_breakdown={"buffers_bytes": buffers},
        )
        return r

    rows = [
        row("ddp", 1.0, 2.0, 1, [], 50e6, 1e6),
        row("ddp-rc", 1.0, 2.0, 1, ["full"], 50e6, 1e6),
        row("tp", 1.0, 5.0, 2, [], 0.0, 2e6),
    ]
    local = {
        "models": {"m": {"rows": rows}},
        "calibration": {
            "load_average": [1.0],
            "layer_timings_s": {"m": {"layers.0": {"4": [1.0, 1.0], "8": [2.0, 7.0]}}},
        },
        "launches": [{"repetition": 0, "load_average": [12.0]}, {"repetition": 0, "load_average": [10.0]}],
    }
    found = {d["check"]: d for d in diagnose(local, {})}
    assert found["host_load"]["value"] == [{"calibration": 1.0, "grid_median": 11.0}]
    assert found["error_by_family"]["value"] == {"tp": 5.0, "no_tp": 2.0}
    assert found["memory_without_buffers"]["value"]["mape"] == pytest.approx((0 + 0 + 0.5) / 3)
    assert found["recompute_blind_spot"]["value"] == 1
    assert found["profile_outliers"]["value"] == ["m layers.0 backward mb 4->8: x7.0"]
    assert "calibration_drift" not in found  # one round: nothing to compare


def test_calibration_drift_is_the_worst_ratio_of_one_layer_over_rounds():
    from benchmarks.diagnostics import calibration_drift

    def cal(fb4, fb8):
        return {"layer_timings_s": {"m": {"layers.0": {"4": fb4, "8": fb8}, "head": {"4": [1.0, 1.0]}}}}

    found = calibration_drift([cal([1.0, 1.0], [2.0, 2.0]), cal([2.0, 2.5], [2.0, 2.2]), cal([1.0, 1.5], [2.0, 2.0])])
    assert found["value"] == {"m": pytest.approx(2.25)}  # layers.0 at mb 4: 4.5 ms over 2.0 ms
    assert "layers.0 mb 4" in found["text"]


def fake_plan(t: float):
    """A stand-in Plan (a DDP configuration predicted at `t` seconds) for the row logic."""
    from types import SimpleNamespace as NS

    return NS(
        pipeline_parallel_degree=1,
        data_parallel_degree=4,
        tensor_parallel_degree=1,
        zero_stage=0,
        microbatch_size=4,
        num_microbatches=1,
        pipeline_schedule="1F1B",
        sequence_parallel=False,
        recompute={},
        prediction=NS(step_time_s=t, breakdown={}, peak_memory_bytes=1e6, stage_memory=[]),
    )


def test_plan_rows_keep_the_one_profile_prediction_beside_the_bracketed_one():
    from types import SimpleNamespace as NS

    result = NS(step_time_s=2.0, step_times_s=[9.0, 2.0], peak_memory_bytes=1e6)
    row = la.plan_row("ddp", [(fake_plan(2.2), result, fake_plan(3.0)), (fake_plan(1.8), result, fake_plan(1.0))])
    assert row["predicted_s"] == pytest.approx(2.0) and row["error"] == pytest.approx(0.0)
    assert row["predicted_before_s"] == pytest.approx(2.0)  # the median of 3.0 and 1.0
    row = la.plan_row("ddp", [(fake_plan(2.2), result, fake_plan(3.0))])
    assert row["error_before"] == pytest.approx(0.5) and row["error"] == pytest.approx(0.1)
    exact = NS(step_time_s=4.0, step_times_s=[4.0, 4.0], peak_memory_bytes=1e6)
    other = la.plan_row("zero3", [(fake_plan(4.0), exact, fake_plan(4.0))])
    assert la.summarize([row, other])["mape_before"] == pytest.approx(0.25)


def test_a_failed_calibration_round_is_skipped_and_recorded(monkeypatch):
    from types import SimpleNamespace as NS

    from benchmarks import run
    from meshplan.errors import MeshplanError

    plan = fake_plan

    calls = iter([None, MeshplanError("busy workers timed out")] + [None] * 10)

    def calibrate_links(quick, say):
        failure = next(calls)
        if failure:
            raise failure
        return None, {"load_average": [1.0]}

    monkeypatch.setattr(run.la, "MODELS", ("m",))
    monkeypatch.setattr(run.la, "calibrate_links", calibrate_links)
    monkeypatch.setattr(run.la, "calibrate_model", lambda model, calibration, say, when="before": None)
    monkeypatch.setattr(run, "_bracketed", lambda model, before, plans, *a: [p for _, p in plans])
    monkeypatch.setattr(
        run,
        "_predict_model",
        lambda *a: ([(b, plan(t)) for b, t in (("ddp", 1.0), ("zero3", 2.0), ("megatron", 3.0))], []),
    )
    result = NS(step_time_s=2.0, step_times_s=[9.0, 2.0], peak_memory_bytes=1e6)
    monkeypatch.setattr(
        run.la,
        "measure_round",
        lambda model, plans, rep, steps, work, say, *chunking: (
            [result] * len(plans),
            {"model": model, "repetition": rep, "wall_s": 1.0, "load_average": [2.0]},
        ),
    )
    local, _, _ = run.local_sections(quick=False, say=lambda *_: None)
    assert local["failed_rounds"] == [{"round": 1, "error": "busy workers timed out"}]
    rounds = local["repeats"]
    assert len(local["calibrations"]) == rounds - 1 and local["models"]["m"]["rows"][0]["runs"] == rounds - 1


def test_rounds_sets_the_full_sections_calibration_count(monkeypatch, capsys):
    """--rounds N runs the full grid with N calibrations (one round: the single-calibration claim),
    and rejects what is not a positive count, or --quick, with one line."""
    from benchmarks import run

    seen = []

    def calibrate_links(quick, say):
        seen.append(quick)
        raise run.MeshplanError("stop after counting")

    monkeypatch.setattr(run.la, "calibrate_links", calibrate_links)
    with pytest.raises(run.MeshplanError, match="every round failed"):
        run.local_sections(quick=False, say=lambda *_: None, rounds=2)
    assert seen == [False, False]
    seen.clear()
    with pytest.raises(run.MeshplanError):
        run.local_sections(quick=False, say=lambda *_: None)
    assert len(seen) == run.FULL_ROUNDS
    for argv, message in ((["--rounds", "0"], "positive whole number"), (["--rounds", "1", "--quick"], "drop --quick")):
        with pytest.raises(SystemExit) as exc:
            run.main(argv)
        assert exc.value.code != 0 and message in f"{exc.value.code} {capsys.readouterr().err}"


def test_planner_speed_brute_force_columns_and_report(tmp_path):
    """A finished brute force gives a measured speedup and the same optimum; a capped one gives
    no measured speedup, a lower bound and an estimate, and the report marks it as estimated."""
    from planner_profiles import small_gpt

    from benchmarks import planner_speed

    profile = small_gpt(2)
    row = planner_speed.measure("gpt-small", "a100-80g", 16, profile, 8)
    done = {**row, **planner_speed.compare_brute_force(row, profile, cap_s=60.0)}
    assert done["brute_force_finished"] and done["brute_force_agrees"]
    assert done["brute_force_evaluated"] == done["brute_force_plans"] > done["candidates"]
    assert done["speedup"] == pytest.approx(done["brute_force_s"] / done["search_time_s"], rel=0.02)
    capped = {**row, **planner_speed.compare_brute_force(row, small_gpt(6), cap_s=0.0)}
    assert not capped["brute_force_finished"] and capped["brute_force_s"] is None and capped["speedup"] is None
    assert capped["brute_force_plans"] > capped["brute_force_evaluated"] > 0
    assert capped["speedup_estimate"] > capped["speedup_lower_bound"] > 0
    results = {**_results(), "planner_speed": [done, capped]}
    write(results, tmp_path)
    md = (tmp_path / "benchmarks.md").read_text()
    assert (
        f"**{done['speedup']:.0f}x**" in md and "(est.)" in md and "Brute force (`meshplan.planner.bruteforce`)" in md
    )
    assert json.loads((tmp_path / "benchmarks.json").read_text())["planner_speed"][1]["brute_force_finished"] is False


def test_launch_drift_divides_each_launchs_common_factor_out():
    from benchmarks.diagnostics import launch_drift

    # round 0 ran on a host 2x faster than its calibration said, round 1 as calibrated; plan b is
    # 10% over-predicted relative to plan a in both rounds; round 1 of plan c failed
    rows = {
        "m": [
            {"rounds": [[2.0, 1.0], [1.0, 1.0]]},
            {"rounds": [[2.2, 1.0], [1.1, 1.0]]},
            {"rounds": [[2.0, 1.0], [1.0, None]]},
        ]
    }
    found = launch_drift(rows)
    assert found["value"]["factors"] == {"m": [2.0, pytest.approx(1.05)]}
    # ratios / factor: a 1.0 and 1/1.05; b 1.1 and 1.1/1.05; c 1.0
    expected = [abs((1.0 + 1 / 1.05) / 2 - 1), abs((1.1 + 1.1 / 1.05) / 2 - 1), 0.0]
    assert found["value"]["mape_between_plans"] == pytest.approx(sum(expected) / 3)
    assert launch_drift({"m": [{"rounds": [[2.0, 1.0]]}]}) is None  # one round: nothing to divide out


def test_diagnostics_heading_says_whether_a_target_was_missed():
    from benchmarks.report import markdown

    results = {**_results(), "diagnostics": [{"check": "host_load", "value": 1, "text": "load moved."}]}
    assert "## Why targets were missed" in markdown(results)  # MAPE of _results() is far above 10%
    local = {**results["local_accuracy"], "mape": 0.05, "kendall_tau": 0.9, "top1_regret": 1.0}
    met = markdown({**results, "local_accuracy": local})
    assert "## Where the error comes from" in met and "Why targets were missed" not in met
    assert "## Why targets were missed" in markdown(
        {**results, "local_accuracy": local, "executor_overhead": {"ratio": 1.2}}
    )


def test_sections_run_alone_and_keep_the_others_from_the_earlier_run(monkeypatch, tmp_path):
    """`--sections compression` runs that section only; every other section's results stay as the
    earlier run measured them, and the report says which run that was."""
    import types

    from benchmarks import run

    fake = types.ModuleType("fake_compression_bench")
    fake.bench_section = lambda quick, say: {"rows": [{"method": "topk", "quick": quick}]}
    fake.markdown = lambda result: f"| method |\n|---|\n| {result['rows'][0]['method']} |"
    monkeypatch.setitem(sys.modules, "fake_compression_bench", fake)
    monkeypatch.setitem(run.METHOD_SECTIONS, "compression", "fake_compression_bench")
    previous = {**_results(), "started_utc": "2026-11-30 04:32:16", "git": {"commit": "abc1234"}}
    results = run.run_all(True, lambda *_: None, ("compression",), previous)
    assert results["compression"] == {"rows": [{"method": "topk", "quick": True}]}
    for key in ("local_accuracy", "baselines", "memory", "planner_speed", "executor_overhead", "gpu"):
        assert results[key] == previous[key]
    assert "sync" not in results and "offload" not in results  # never measured: not invented
    assert results["section_runs"]["local"]["commit"] == "abc1234"
    assert results["section_runs"]["compression"]["started_utc"] == results["started_utc"]
    write(results, tmp_path)
    md = (tmp_path / "benchmarks.md").read_text()
    assert "## 7. Gradient compression on slow links" in md and "| topk |" in md
    assert "Kept from an earlier run: local (started 2026-11-30 04:32:16 UTC, commit abc1234)" in md


def test_unknown_section_is_one_line():
    from benchmarks import run

    with pytest.raises(SystemExit, match="unknown section \\['nope'\\]; choose from local"):
        run.main(["--sections", "local,nope"])


def test_a_reading_is_shown_only_under_the_run_it_was_written_about(tmp_path, monkeypatch):
    """benchmarks/notes.json: a section's hand-written reading names the run it reads; once the
    section is measured again (another start time) the reading is dropped, not left under new numbers."""
    import json

    from benchmarks import report

    notes = tmp_path / "notes.json"
    notes.write_text(json.dumps({"sync": {"started_utc": "2026-12-02 03:00:00", "text": "the all-reduce misses"}}))
    monkeypatch.setattr(report, "NOTES", notes)
    same = {"section_runs": {"sync": {"started_utc": "2026-12-02 03:00:00"}}}
    later = {"section_runs": {"sync": {"started_utc": "2026-12-03 03:00:00"}}}
    assert report._reading("sync", same) == ["Reading (written after this run): the all-reduce misses", ""]
    assert report._reading("sync", later) == [] and report._reading("offload", same) == []
    notes.write_text(json.dumps({"local": {"started_utc": "2026-12-02 03:00:00", "text": "llama's layers drift"}}))
    local = {"local_accuracy": {"models": {}}, "section_runs": {"local": {"started_utc": "2026-12-02 03:00:00"}}}
    assert report._local(local)[-2:] == ["Reading (written after this run): llama's layers drift", ""]


def test_a_search_that_chose_differently_between_rounds_is_pooled_per_round():
    """The planner's row chose DDP in two rounds and ZeRO-1 in three: each round's measurement is a
    sample of the configuration that ran, pooled with the grid's rows of it, and the regret is the
    median over the rounds of the chosen configuration's pooled time over the best pooled one."""
    ddp = {**_row("ddp", 1.0, 2.0), "config": "zero=0", "rounds": [[1.0, m] for m in (2.0, 2.2, 1.8)]}
    ddp["round_configs"] = ["zero=0"] * 3
    zero1 = ["zero=1", "zero=0", "zero=1", "zero=0", "zero=1"]
    search = {
        **_row("planner-search", 1.0, 3.0),
        "config": "zero=0 | zero=1",
        "rounds": [[1.0, m] for m in (1.5, 3.0, 1.6, 2.4, None)],
        "round_configs": zero1,
    }
    assert la.measured_samples(search) == [("zero=1", 1.5), ("zero=0", 3.0), ("zero=1", 1.6), ("zero=0", 2.4)]
    pooled = la.pooled_measured_s([ddp, search])
    assert pooled == {"zero=0": pytest.approx(2.2), "zero=1": pytest.approx(1.55)}  # 1.8 2.0 2.2 2.4 3.0 | 1.5 1.6
    # the search's measured rounds chose zero=1, zero=0, zero=1, zero=0: median of 1.55, 2.2, 1.55, 2.2
    assert la.summarize([ddp, search])["top1_regret"] == pytest.approx((1.55 + 2.2) / 2 / 1.55)
    assert la.measured_samples({**search, "round_configs": None}) == [("zero=0 | zero=1", 3.0)]


def test_a_planner_row_of_two_configurations_keeps_the_tables_columns(tmp_path):
    """When the search chose differently between rounds its row's config joins both with " | "
    (local_accuracy); the accuracy and memory tables still have one cell per column."""
    rows = [_row("ddp", 1.0, 2.0), {**_row("planner-search", 1.1, 2.1), "config": "zero=0 | zero=1"}]
    model = {**la.summarize(rows), "rows": rows, "skipped": [], "baseline_speedups": {"ddp": 1.0}}
    results = _results()
    results["local_accuracy"] = {**_overall({"gpt-tiny": model}), "models": {"gpt-tiny": model}, "targets": {}}
    results["memory"] = memory_accuracy.summarize({"gpt-tiny": rows})
    write(results, tmp_path)
    md = (tmp_path / "benchmarks.md").read_text().splitlines()
    for heading in ("| plan | configuration | predicted ms", "| model | plan | configuration | predicted MB"):
        start = next(i for i, line in enumerate(md) if line.startswith(heading))
        table = md[start : next(i for i in range(start, len(md)) if not md[i].startswith("|"))]
        assert {line.count("|") for line in table} == {table[0].count("|")}, table
        assert any("zero=0, or zero=1" in line for line in table)
